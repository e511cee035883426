"""ops/http/crosssite.py: which state-changing requests are refused as cross-site or non-JSON.

Origins compare as host:port with the scheme's default port left out (RFC 6454 4: an origin is
scheme, host, port); requests are aiohttp's own request objects (make_mocked_request), no broker.
"""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from raftmq.ops.http.crosssite import refusal


def status(method: str, host: str, **headers: str) -> int | None:
    request = make_mocked_request(method, "/api/definitions", headers={"Host": host, **headers})
    error = refusal(request)
    return None if error is None else error.status


@pytest.mark.parametrize(("host", "origin"), [
    ("localhost:15672", "http://localhost:15672"),
    ("LocalHost:15672", "http://localhost:15672"),
    ("example.org", "https://example.org"),  # 443 behind a TLS proxy, Host without a port
    ("example.org:443", "https://example.org:443"),
    ("[::1]:15672", "http://[::1]:15672"),
])
def test_same_origin_json_is_accepted(host, origin):
    assert status("POST", host, Origin=origin, **{"Content-Type": "application/json"}) is None


@pytest.mark.parametrize(("host", "headers"), [
    ("localhost:15672", {"Origin": "http://localhost:8080"}),
    ("localhost:15672", {"Origin": "http://evil.example:15672"}),
    ("localhost:15672", {"Origin": "null"}),
    ("localhost:15672", {"Origin": "not a url"}),
    ("localhost:15672", {"Referer": "http://evil.example/x"}),
    ("localhost:15672", {"Origin": "http://evil.example", "Referer": "http://localhost:15672/"}),  # Origin decides
])
def test_cross_site_changes_are_403(host, headers):
    assert status("PUT", host, **{"Content-Type": "application/json", **headers}) == 403


def test_content_types():
    host = "localhost:15672"
    assert status("POST", host, **{"Content-Type": "text/plain"}) == 415
    assert status("DELETE", host, **{"Content-Type": "application/x-www-form-urlencoded"}) == 415
    assert status("POST", host, **{"Content-Type": "application/json; charset=utf-8"}) is None
    assert status("DELETE", host) is None  # no body, no content type
    assert status("GET", host, Origin="http://evil.example", **{"Content-Type": "text/plain"}) is None  # reads


def test_login_form_body_only_on_the_login_path():
    """/api/login alone takes a urlencoded form (the UI's login form, ops/http/login.py); the Origin
    check still holds there, and every other path still refuses form bodies."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    login = make_mocked_request("POST", "/api/login", headers={"Host": "localhost:15672", **form})
    assert refusal(login) is None
    evil = make_mocked_request("POST", "/api/login", headers={"Host": "localhost:15672", "Origin": "http://evil.example",
                                                              **form})
    assert refusal(evil).status == 403
    other = make_mocked_request("POST", "/api/logout", headers={"Host": "localhost:15672", **form})
    assert refusal(other).status == 415
