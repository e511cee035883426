"""The UI's login session and CSRF token against one real node (issue 35 part one, steps 1-2).

Plain HTTP over loopback (http.client), the cookie handled by hand so that its attributes can be
read.  Checked:

1. POST /api/login (JSON and form bodies) with a right password answers the user, its tags and a
   CSRF token, and sets ``raftmq_session``: HttpOnly, SameSite=Strict, Path=/, not Secure on plain
   HTTP (RFC 6265 4.1.2.5-6; SameSite: RFC 6265bis 4.1.2.7); /api/whoami answers with the cookie
   alone (and gives the same token); /api/logout ends the session (401 afterwards).
2. A wrong password or unknown user: 401 without a ``WWW-Authenticate`` challenge (the page shows
   its own form); a user without a management tag: 403 (RabbitMQ's UI refuses it too).
3. CSRF: a change (PUT /api/queues/...) with the cookie and no ``X-CSRF-Token``, or a wrong one, is
   403 and changes nothing; with the session's token it is 201.  Logout needs the token too.
4. Basic auth is unchanged: a change with Basic credentials and no cookie or token works, and a
   request without credentials still gets 401 with RabbitMQ's Basic challenge (rabbitmqadmin,
   Flower: tests/integration/test_http_api.py, test_flower.py).
5. A session acts with the user's current tags and ends when the password changes.
6. The Queues/Exchanges pages' server-side paging equals the whole list filtered and cut by hand.
7. On a TLS listener the cookie is also Secure.
8. The login pool full (node/logins.py: ``login_workers`` hashing, ``login_queue_limit`` pending):
   concurrent form logins with passwords never verified before are answered 401 or, beyond the
   bound, 503 ``busy`` at once, with no session cookie; a right login works afterwards.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.http_api import call, path

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    http_port = free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("ui-session"), extra_args=["--http-port", str(http_port)])
    node.http_port = http_port
    node.http_base = f"http://127.0.0.1:{http_port}"
    with node:
        deadline = time.monotonic() + 10
        while call(node.http_base, "GET", "/api/overview")[0] != 200:
            assert time.monotonic() < deadline, node.log_tail(20)
            time.sleep(0.1)
        yield node


def request(node, method: str, url: str, body=None, headers: dict | None = None, form: bool = False):
    """(status, headers, decoded body) of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=15)
    headers = dict(headers or {})
    data = None
    if body is not None:
        if form:
            data = urllib.parse.urlencode(body).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        else:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
    try:
        conn.request(method, url, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, response.headers, (json.loads(raw) if raw else None)
    finally:
        conn.close()


def login(node, user: str, password: str, form: bool = False) -> tuple[str, dict, str]:
    """(cookie header value, login answer, raw Set-Cookie) of a successful login."""
    status, headers, answer = request(node, "POST", "/api/login", {"username": user, "password": password}, form=form)
    assert status == 200, (status, answer)
    set_cookie = headers["Set-Cookie"]
    return set_cookie.split(";", 1)[0], answer, set_cookie


def add_user(node, name: str, password: str, tags: str, permissions: bool = True) -> None:
    assert call(node.http_base, "PUT", path("users", name), body={"password": password, "tags": tags})[0] in (201, 204)
    if permissions:
        status, _ = call(node.http_base, "PUT", path("permissions", "/", name),
                         body={"configure": ".*", "write": ".*", "read": ".*"})
        assert status == 201


def test_login_whoami_logout(node):
    cookie, answer, set_cookie = login(node, "guest", "guest")
    assert answer["name"] == "guest" and answer["tags"] == ["administrator"]
    assert answer["grants"] == ["management", "policymaker", "monitoring", "administrator"]
    attributes = {part.strip().split("=")[0].lower(): part.strip() for part in set_cookie.split(";")[1:]}
    assert cookie.startswith("raftmq_session=") and len(cookie.split("=", 1)[1]) == 43, cookie
    assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict"
    assert attributes["path"] == "Path=/" and "secure" not in attributes  # plain HTTP listener
    status, _, me = request(node, "GET", "/api/whoami", headers={"Cookie": cookie})
    assert status == 200 and me["name"] == "guest" and me["csrf_token"] == answer["csrf_token"]
    status, _, overview = request(node, "GET", "/api/overview", headers={"Cookie": cookie})
    assert status == 200 and overview["node"].startswith("raftmq@")
    # Logout is a change: it needs the token; then the cookie opens nothing.
    assert request(node, "POST", "/api/logout", headers={"Cookie": cookie})[0] == 403
    status, headers, _ = request(node, "POST", "/api/logout",
                                 headers={"Cookie": cookie, "X-CSRF-Token": answer["csrf_token"]})
    assert status == 204 and 'raftmq_session=""' in headers["Set-Cookie"]
    status, headers, body = request(node, "GET", "/api/whoami", headers={"Cookie": cookie})
    assert status == 401 and body["error"] == "not_authorized" and "WWW-Authenticate" not in headers


def test_form_login(node):
    """The login form may post ``application/x-www-form-urlencoded`` (the one non-JSON body)."""
    cookie, answer, _ = login(node, "guest", "guest", form=True)
    assert answer["name"] == "guest"
    assert request(node, "GET", "/api/whoami", headers={"Cookie": cookie})[0] == 200
    # ... but not from another site: the Origin check of ops/http/crosssite.py still holds.
    status, _, body = request(node, "POST", "/api/login", {"username": "guest", "password": "guest"}, form=True,
                              headers={"Origin": "http://evil.example"})
    assert status == 403 and body["error"] == "cross_origin_refused"


def test_refused_logins(node):
    for user, password in (("guest", "wrong"), ("nobody", "guest")):
        status, headers, body = request(node, "POST", "/api/login", {"username": user, "password": password})
        assert status == 401 and body == {"error": "not_authorized", "reason": "Login failed"}
        assert "WWW-Authenticate" not in headers and "Set-Cookie" not in headers
    add_user(node, "ui-plain", "plainpw", "")  # an AMQP-only user: no management tag
    status, headers, body = request(node, "POST", "/api/login", {"username": "ui-plain", "password": "plainpw"})
    assert status == 403 and body["reason"] == "Not management user" and "Set-Cookie" not in headers
    assert request(node, "POST", "/api/login", {"username": "guest"})[0] == 400


def test_csrf_token_needed_for_changes_with_the_cookie(node):
    cookie, answer, _ = login(node, "guest", "guest")
    queue_url = path("queues", "/", "ui-csrf")
    for headers in ({"Cookie": cookie}, {"Cookie": cookie, "X-CSRF-Token": "forged"}):
        status, _, body = request(node, "PUT", queue_url, {"durable": True}, headers=headers)
        assert status == 403 and body["error"] == "csrf_token_invalid", (status, body)
    assert call(node.http_base, "GET", queue_url)[0] == 404  # nothing was declared
    status, _, _ = request(node, "PUT", queue_url, {"durable": True},
                           headers={"Cookie": cookie, "X-CSRF-Token": answer["csrf_token"]})
    assert status == 201
    status, _, _ = request(node, "DELETE", queue_url, headers={"Cookie": cookie})
    assert status == 403 and call(node.http_base, "GET", queue_url)[0] == 200
    # Reads need no token.
    assert request(node, "GET", queue_url, headers={"Cookie": cookie})[0] == 200
    # Another session's token is not this one's.
    _, other, _ = login(node, "guest", "guest")
    assert request(node, "DELETE", queue_url, headers={"Cookie": cookie, "X-CSRF-Token": other["csrf_token"]})[0] == 403
    assert request(node, "DELETE", queue_url, headers={"Cookie": cookie, "X-CSRF-Token": answer["csrf_token"]})[0] == 204


def test_basic_auth_unchanged(node):
    queue_url = path("queues", "/", "ui-basic")
    assert call(node.http_base, "PUT", queue_url, body={"durable": True})[0] == 201  # Basic, no token
    assert call(node.http_base, "DELETE", queue_url)[0] == 204
    status, headers, body = request(node, "GET", "/api/overview")
    assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="RabbitMQ Management"'
    # The UI's script says so, and then gets no challenge.
    status, headers, _ = request(node, "GET", "/api/whoami", headers={"X-Requested-With": "XMLHttpRequest"})
    assert status == 401 and "WWW-Authenticate" not in headers


def test_session_follows_the_user(node):
    """Tags are read at each request (a management user gets 403 on admin calls, as with Basic);
    changing the password ends the session."""
    add_user(node, "ui-mgmt", "pw1", "management")
    cookie, answer, _ = login(node, "ui-mgmt", "pw1")
    assert answer["grants"] == ["management"]
    status, _, body = request(node, "GET", "/api/users", headers={"Cookie": cookie})
    assert status == 403 and body["reason"] == "Not administrator user"
    assert call(node.http_base, "PUT", path("users", "ui-mgmt"), body={"password": "pw1", "tags": "monitoring"})[0] == 204
    status, _, me = request(node, "GET", "/api/whoami", headers={"Cookie": cookie})
    # PUT with a password rehashes it (a new salt): the stored hash changed, the session ended.
    assert status == 401, me
    cookie, answer, _ = login(node, "ui-mgmt", "pw1")
    assert answer["grants"] == ["management", "monitoring"] and answer["tags"] == ["monitoring"]
    assert request(node, "GET", "/api/nodes", headers={"Cookie": cookie})[0] == 200


def test_queue_pages_match_the_whole_list(node):
    """The Queues and Exchanges pages' server-side paging (RabbitMQ's page, page_size, name,
    use_regex; rows made for the page only, ops/http/common.py ``columns``) answers what the whole
    list, filtered and cut by hand, holds -- with a sort and ``columns`` too."""
    names = [f"ui-page-{i:02d}" for i in range(25)]
    for name in names:
        assert call(node.http_base, "PUT", path("queues", "/", name), body={"durable": False})[0] in (201, 204)
    status, whole = call(node.http_base, "GET", "/api/queues")
    assert status == 200
    mine = [q for q in whole if q["name"].startswith("ui-page-")]
    assert [q["name"] for q in mine] == names
    status, page = call(node.http_base, "GET", "/api/queues?page=2&page_size=10&name=ui-page-&use_regex=false")
    assert status == 200 and page["items"] == mine[10:20]
    assert (page["page"], page["page_count"], page["filtered_count"], page["total_count"]) == (2, 3, 25, len(whole))
    status, page = call(node.http_base, "GET", "/api/queues?page=1&page_size=100&name=%5Eui-page-1%5B2-4%5D%24"
                                               "&use_regex=true&columns=name,messages")
    assert status == 200 and page["items"] == [{"name": n, "messages": 0} for n in names[12:15]]
    status, page = call(node.http_base, "GET", "/api/queues?page=1&page_size=5&name=ui-page-&sort=name&sort_reverse=true")
    assert status == 200 and [q["name"] for q in page["items"]] == names[::-1][:5]
    assert call(node.http_base, "GET", "/api/queues?page=4&page_size=10&name=ui-page-")[0] == 400  # out of range
    assert call(node.http_base, "GET", "/api/queues?page=1&name=%5B&use_regex=true")[0] == 400  # bad regex
    exchanges = [e for e in call(node.http_base, "GET", "/api/exchanges/%2F")[1] if "amq." in e["name"]]
    status, page = call(node.http_base, "GET", "/api/exchanges/%2F?page=2&page_size=3&name=amq.&use_regex=false")
    assert status == 200 and page["items"] == exchanges[3:6] and page["filtered_count"] == len(exchanges) > 3
    for name in names:
        assert call(node.http_base, "DELETE", path("queues", "/", name))[0] == 204


def test_secure_cookie_on_a_tls_listener(tmp_path):
    """Over https (http_tls_cert/http_tls_key) the session cookie is also ``Secure`` (RFC 6265
    4.1.2.5: the browser sends it over TLS only), and the session works there."""
    import ssl

    from tests.integration.test_tls import self_signed

    cert, key = self_signed(tmp_path)
    port = free_port()
    with RaftmqNode(tmp_path / "n", extra_args=["--http-port", str(port)],
                    env={"RAFTMQ_HTTP_TLS_CERT": str(cert), "RAFTMQ_HTTP_TLS_KEY": str(key)}):
        context = ssl.create_default_context(cafile=str(cert))

        def https(method: str, url: str, body=None, headers: dict | None = None):
            conn = http.client.HTTPSConnection("localhost", port, timeout=10, context=context)
            try:
                data = json.dumps(body).encode() if body is not None else None
                conn.request(method, url, body=data, headers={**({"Content-Type": "application/json"} if data else {}),
                                                                 **(headers or {})})
                response = conn.getresponse()
                return response.status, response.headers, response.read()
            finally:
                conn.close()

        deadline = time.monotonic() + 10
        while True:
            try:
                status, headers, raw = https("POST", "/api/login", {"username": "guest", "password": "guest"})
                break
            except (ConnectionError, ssl.SSLError, OSError):
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert status == 200, raw
        attributes = [part.strip().lower() for part in headers["Set-Cookie"].split(";")]
        assert "secure" in attributes and "httponly" in attributes and "samesite=strict" in attributes
        cookie, token = headers["Set-Cookie"].split(";", 1)[0], json.loads(raw)["csrf_token"]
        status, _, raw = https("GET", "/api/whoami", headers={"Cookie": cookie})
        assert status == 200 and json.loads(raw)["csrf_token"] == token and json.loads(raw)["name"] == "guest"


def test_login_pool_full_answers_503(tmp_path):
    """Check 8: one hashing thread and one pending login at most; 30 logins at once (PBKDF2 each:
    a managed user's wrong passwords are never remembered)."""
    from tests.integration.helpers import http_node

    n = http_node(tmp_path)
    config = n.config
    config.write_text("login_workers = 1\nlogin_queue_limit = 1\n" + config.read_text())
    n.http_port, n.http_base = int(n.http.rsplit(":", 1)[1]), n.http
    with n:
        deadline = time.monotonic() + 10
        while call(n.http, "GET", "/api/overview")[0] != 200:
            assert time.monotonic() < deadline, n.log_tail(20)
            time.sleep(0.1)
        add_user(n, "pooled", "right", "management")

        def attempt(i: int):
            status, headers, answer = request(n, "POST", "/api/login", {"username": "pooled", "password": f"wrong-{i}"},
                                              form=True)
            return status, headers.get("Set-Cookie"), answer

        with ThreadPoolExecutor(30) as pool:
            answers = list(pool.map(attempt, range(30)))
        statuses = [status for status, _cookie, _answer in answers]
        assert set(statuses) <= {401, 503}, statuses
        busy = [answer for status, _cookie, answer in answers if status == 503]
        assert busy, statuses  # at most 1 pending: the others were refused at once
        assert all(answer["error"] == "busy" and "too many logins" in answer["reason"] for answer in busy)
        assert all(cookie is None for _status, cookie, _answer in answers)
        login(n, "pooled", "right")  # the pool drained: a right login works
