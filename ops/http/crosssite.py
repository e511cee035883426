"""Cross-site request forgery and framing: what a page on another site can make a browser do here.

A browser that has logged in with Basic credentials sends them again with every request to this
origin, whoever's page asks (issue 31: a form on another site posted text/plain definitions to
/api/definitions and created an administrator, 204).  RabbitMQ's UI avoids this by not using browser
Basic auth; this API keeps Basic (rabbitmqadmin and the page use it) and refuses what a cross-site
page can send instead:

* a request that changes state (any method but GET, HEAD, OPTIONS) must carry its body as
  ``application/json`` (parameters such as charset allowed) and must not carry another Content-Type
  at all, even without a body: 415 otherwise, as RabbitMQ's cowboy handlers answer for other types.
  A cross-site form can only send text/plain, urlencoded or multipart bodies; a cross-site fetch() of
  application/json needs a CORS preflight, which this API never grants.  One exception: /api/login
  takes a urlencoded form too (it changes nothing but opens a session, and the Origin check holds).
* such a request with an ``Origin`` header (or, without one, a ``Referer``) naming another host
  and port than its ``Host`` header is refused 403, and so is ``Origin: null`` (sandboxed frames).
  Browsers send Origin with every cross-site POST, PUT and DELETE.
* every response carries ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and a
  Content-Security-Policy (the page's own, or ``default-src 'none'`` for the API), so that no other
  site can frame the page to click through it.
"""

from __future__ import annotations

from aiohttp import web
from yarl import URL

from .common import HttpError

SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
# The login form may post a form body (ops/http/login.py); the Origin/Referer check still applies.
FORM_PATHS = frozenset(("/api/login", "/api/login/"))
API_CSP = "default-src 'none'; frame-ancestors 'none'"
DEFAULT_PORTS = {"http": 80, "https": 443}


def _authority(host: str, port: int | None) -> str:
    return f"{host.lower()}:{port}" if port is not None else host.lower()


def _host_header(request: web.Request) -> str:
    host = (request.headers.get("Host") or "").strip().lower()
    for default in (":80", ":443"):
        if host.endswith(default):
            return host[: -len(default)]
    return host


def _source(value: str) -> str | None:
    """host[:port] of an Origin or Referer value, the scheme's default port left out; None if opaque."""
    try:
        url = URL(value.strip())
    except ValueError:
        return None
    if not url.host:
        return None
    port = url.explicit_port
    if port is not None and port == DEFAULT_PORTS.get(url.scheme):
        port = None
    host = f"[{url.host}]" if ":" in url.host else url.host
    return _authority(host, port)


def refusal(request: web.Request) -> HttpError | None:
    """Why a state-changing request looks cross-site or non-JSON, or None."""
    if request.method in SAFE_METHODS:
        return None
    origin = request.headers.get("Origin")
    source = origin if origin is not None else request.headers.get("Referer")
    if source is not None and _source(source) != _host_header(request):
        return HttpError(403, "cross_origin_refused",
                         f"cross-site request refused: {'Origin' if origin is not None else 'Referer'} "
                         f"{source[:200]!r} is not this host")
    has_type = "Content-Type" in request.headers
    form_ok = request.path in FORM_PATHS and request.content_type == FORM
    if (has_type or request.body_exists) and request.content_type != JSON and not form_ok:
        given = request.headers.get("Content-Type", "none")[:100]
        return HttpError(415, "unsupported_media_type", f"changes take an application/json body, not {given}")
    return None


@web.middleware
async def cross_site(request: web.Request, handler):
    """Refuse cross-site and non-JSON changes before authentication (see the module docstring)."""
    error = refusal(request)
    if error is not None:
        return error.response()
    return await handler(request)


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: no framing, no sniffing, and a CSP on every response."""
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Content-Security-Policy", API_CSP)
