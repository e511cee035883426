"""A tiny client of the RabbitMQ-style management HTTP API (urllib: no extra dependency), used
against raftmq and RabbitMQ alike."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from urllib.parse import quote

GUEST = ("guest", "guest")


def basic_auth(auth: tuple[str, str]) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()}


def path(*parts: str) -> str:
    """``/api/queues/%2F/name``: every part percent-encoded, ``/`` included (RabbitMQ's URLs)."""
    return "/api/" + "/".join(quote(p, safe="") if i else p for i, p in enumerate(parts))


def call(base: str, method: str, url_path: str, auth: tuple[str, str] | None = GUEST, body=None,
         timeout: float = 15.0) -> tuple[int, object]:
    """(status, decoded JSON body or None) of one request; never raises for an HTTP error status."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + url_path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if auth is not None:
        request.headers.update(basic_auth(auth))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw.decode("utf-8", "replace")
