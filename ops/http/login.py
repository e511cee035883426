"""The UI's login and logout: POST /api/login opens a session (ops/http/session.py), POST
/api/logout ends it; /api/whoami tells the page who it is and its CSRF token.

The login takes a JSON object or a form (``application/x-www-form-urlencoded``, the only non-JSON
body this API accepts: ops/http/crosssite.py) with ``username`` and ``password``, checked exactly as
the API's Basic credentials are (ops/operator.py ``Gatekeeper.login``: the same users, loopback-only
rule, remembered verifications, and the bounded login pool -- 503 when it is full).  Answers: 200
``{"name", "tags", "grants", "csrf_token"}`` with the session cookie; 401 for a wrong login (without
a Basic challenge, so that a browser shows no prompt); 403 for a user without a management tag
(RabbitMQ's UI refuses those too).
"""

from __future__ import annotations

from aiohttp import web

from raftmq.node.auth import LoginBusy

from ..operator import ADMINISTRATOR, MANAGEMENT, MONITORING, POLICYMAKER, Operator
from .common import HttpError, bad_request, body, context, forbidden, reply, request_session
from .session import COOKIE, stored_secret

FORM = "application/x-www-form-urlencoded"
MAX_FIELD = 1024  # characters of a user name or password


def grants(op: Operator) -> list[str]:
    """The tags ``op``'s tags grant (administrator grants them all): what the page shows is decided
    by these, computed by the one rule the API enforces (``Operator.has``)."""
    return [tag for tag in (MANAGEMENT, POLICYMAKER, MONITORING, ADMINISTRATOR) if op.has(tag)]


async def _credentials(request: web.Request) -> tuple[str, str]:
    if request.content_type == FORM:
        form = await request.post()
        data = {key: form.get(key) for key in ("username", "password")}
    else:
        data = await body(request)
    user, password = data.get("username", data.get("user")), data.get("password")
    if not isinstance(user, str) or not isinstance(password, str) or not user:
        raise bad_request("username and password are needed")
    if len(user) > MAX_FIELD or len(password) > MAX_FIELD:
        raise bad_request("username or password too long")
    return user, password


async def login(request: web.Request) -> web.Response:
    ctx = context(request)
    user, password = await _credentials(request)
    op = ctx.gatekeeper.login(user, password, request.remote, cached_only=True)
    if op is None:
        try:
            op = await ctx.broker.auth.pool.run(ctx.gatekeeper.login, user, password, request.remote)
        except LoginBusy:
            raise HttpError(503, "busy", "too many logins in progress; try again") from None
    if op is None:
        raise HttpError(401, "not_authorized", "Login failed")
    if not op.has(MANAGEMENT):
        raise forbidden("Not management user")
    stored = stored_secret(ctx.broker, user)
    if stored is None:  # deleted between the check and now
        raise HttpError(401, "not_authorized", "Login failed")
    previous = request_session(request)
    if previous is not None:  # a new login replaces the browser's old session
        ctx.sessions.close(previous[0])
    session_id, session = ctx.sessions.open(user, stored)
    response = reply({"name": op.name, "tags": sorted(op.tags), "grants": grants(op), "csrf_token": session.csrf})
    response.set_cookie(COOKIE, session_id, path="/", httponly=True, samesite="Strict", secure=request.secure,
                        max_age=int(ctx.sessions.ttl))
    return response


async def logout(request: web.Request) -> web.Response:
    """End the request's session (the middleware checked its CSRF token) and clear the cookie."""
    found = request_session(request)
    if found is not None:
        context(request).sessions.close(found[0])
    response = web.Response(status=204)
    response.del_cookie(COOKIE, path="/", httponly=True, samesite="Strict", secure=request.secure)
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_post("/api/login", login)
    app.router.add_post("/api/logout", logout)
