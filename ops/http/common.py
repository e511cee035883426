"""What every management HTTP handler shares: the node's context, RabbitMQ's error bodies, the
authentication middleware and the checks of tags and vhost permissions.

RabbitMQ's status codes, measured on RabbitMQ 3.10.8: 401 ``{"error": "not_authorized", "reason":
"Login failed"}`` with ``WWW-Authenticate: Basic realm="RabbitMQ Management"`` for missing or wrong
credentials; for a user lacking a tag or a vhost permission RabbitMQ answers 401 too
(``not_authorised``, "Not administrator user"), while raftmq answers ``FORBIDDEN_STATUS`` (403,
HTTP's code for an authenticated but unauthorized request) with the same body.  404 ``{"error":
"Object Not Found", "reason": "Not Found"}`` for a missing object.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from aiohttp import web

from raftmq.node.auth import LoginBusy
from raftmq.node.core.access import Access, AccessRefused
from raftmq.store.core import queries as Q

from ..control import ACTOR, Actor, AdminError, Control
from ..operator import MANAGEMENT, Gatekeeper, Operator
from .bodies import SMALL_BODY_VALUES, BodyError, read_json
from .session import COOKIE, CSRF_HEADER, Session, SessionStore, session_operator

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

    from .members import MemberViews
    from .rates import Rates

FORBIDDEN_STATUS = 403
# The management page itself holds no data: it is the login form and the script (issue 35); every
# /api path but the login needs a login (a session cookie or Basic credentials).
PROTECTED_PAGES = frozenset(("/api",))
PUBLIC_API = frozenset(("/api/login", "/api/login/"))
REALM = 'Basic realm="RabbitMQ Management"'
SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))


@dataclass
class Context:
    broker: Broker
    control: Control
    gatekeeper: Gatekeeper
    rates: Rates
    members: MemberViews  # every member's connections, channels and Raft numbers (members.py)
    sessions: SessionStore = field(default_factory=SessionStore)


CONTEXT = web.AppKey("raftmq_context", Context)


def context(request: web.Request) -> Context:
    return request.app[CONTEXT]


def operator(request: web.Request) -> Operator:
    return request["operator"]


def jsonable(value):
    """Field-table values (bytes, Decimal, nested tables) as JSON can carry them."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return float(value)
    return value


def reply(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(jsonable(data)), status=status, content_type="application/json")


def columns(request: web.Request, rows: list, view: Callable[[Any], dict] | None = None) -> web.Response:
    """A list, shaped by RabbitMQ's query parameters: ``name`` filters by a substring of the name
    (``use_regex=true``: a regular expression), ``sort``/``sort_reverse`` order by a (dotted) field,
    ``columns=a,b.c`` keeps only those fields (rabbitmqadmin asks for what it shows), and ``page``
    with ``page_size`` answers one page wrapped as RabbitMQ does ({"items": ..., "page_count"...}).

    With ``view``, ``rows`` are objects with a ``name`` attribute and ``view`` makes each one's JSON
    row: filtered by name and paged first, only the rows of the page are made (the UI's Queues page
    with 10,000 queues: bench/ui_queues_page.py), unless a sort needs every row first."""
    query = request.query
    item_count = len(rows)
    if view is not None:
        if not query.get("sort") and "page" in query:
            rows = _by_name(query, rows, lambda item: item.name)
            return _page(query, rows, item_count, view)
        rows = [view(item) for item in rows]
    rows = _by_name(query, rows, lambda row: str(row.get("name", "")))
    if query.get("sort"):
        key = query["sort"].split(".")

        def sort_key(row: dict):
            value = row
            for part in key:
                value = value.get(part) if isinstance(value, dict) else None
            return (value is None, str(type(value)), value if value is not None else 0)

        rows = sorted(rows, key=sort_key, reverse=query.get("sort_reverse") == "true")
    if "page" not in query:
        return reply(_keep_columns(query, rows))
    return _page(query, rows, item_count, None)


def _by_name(query, rows: list, name_of: Callable[[Any], str]) -> list:
    name_filter = query.get("name")
    if not name_filter:
        return rows
    if query.get("use_regex") == "true":
        try:
            pattern = re.compile(name_filter)
        except re.error as exc:
            raise bad_request(f"bad regular expression: {exc}") from None
        return [r for r in rows if pattern.search(name_of(r))]
    return [r for r in rows if name_filter in name_of(r)]


def _keep_columns(query, rows: list[dict]) -> list[dict]:
    wanted = query.get("columns")
    if not wanted:
        return rows
    keep = [c.split(".")[0] for c in wanted.split(",") if c]
    return [{k: r[k] for k in keep if k in r} for r in rows]


def _page(query, rows: list, item_count: int, view: Callable[[Any], dict] | None) -> web.Response:
    try:
        page, page_size = int(query["page"]), int(query.get("page_size", 100))
    except ValueError:
        raise bad_request("page and page_size must be integers") from None
    if page < 1 or not 1 <= page_size <= 500:
        raise bad_request("page must be >= 1 and page_size between 1 and 500")
    page_count = max(1, -(-len(rows) // page_size))
    if page > page_count:
        raise bad_request(f"page out of range: there are {page_count}")
    items = rows[(page - 1) * page_size: page * page_size]
    if view is not None:
        items = [view(item) for item in items]
    items = _keep_columns(query, items)
    return reply({"items": items, "page": page, "page_count": page_count, "page_size": page_size,
                  "filtered_count": len(rows), "item_count": item_count, "total_count": item_count})


class HttpError(Exception):
    """An error answered with RabbitMQ's JSON body (by the ``authenticate`` middleware)."""

    def __init__(self, status: int, error: str, reason: str, headers: dict | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def response(self) -> web.Response:
        return web.Response(text=json.dumps({"error": self.error, "reason": self.reason}), status=self.status,
                            content_type="application/json", headers=self.headers)


def not_found() -> HttpError:
    return HttpError(404, "Object Not Found", "Not Found")


def reply_one(rows: list[dict], **wanted: str) -> web.Response:
    """The row whose fields have the ``wanted`` values (an object's GET), or 404."""
    for row in rows:
        if all(row.get(key) == value for key, value in wanted.items()):
            return reply(row)
    raise not_found()


def bad_request(reason: str) -> HttpError:
    return HttpError(400, "bad_request", reason)


def forbidden(reason: str) -> HttpError:
    return HttpError(FORBIDDEN_STATUS, "not_authorised", reason)


def from_admin_error(exc: AdminError) -> HttpError:
    """A command's AMQP error as RabbitMQ's management API answers it."""
    if exc.code == 404:
        return HttpError(404, "not_found", exc.text)
    if exc.code in (403,):
        return forbidden(exc.text)
    if exc.code == 405:
        return HttpError(405, "method_not_allowed", exc.text)
    return bad_request(exc.text)  # 406 precondition failed and the rest: RabbitMQ's 400


def require(request: web.Request, tag: str) -> Operator:
    op = operator(request)
    if not op.has(tag):
        raise forbidden(f"Not {tag if tag != 'monitoring' else 'monitor'} user")
    return op


def require_vhost(request: web.Request, vhost: str, *, change: bool = False) -> None:
    """404 for an unknown vhost; refused without permissions there (monitoring users see all)."""
    ctx, op = context(request), operator(request)
    if not Q.has_vhost(ctx.broker.machine, vhost):
        raise HttpError(404, "Object Not Found", "Not Found")
    allowed = op.may_use_vhost(vhost) if change else op.may_see_vhost(vhost)
    if not allowed:
        raise forbidden("User not authorised to access virtual host")


def access_in(request: web.Request, vhost: str) -> Access:
    """The operator's permissions in ``vhost``, for the control to authorize each command by the rule
    every protocol uses (node/core/access.py); a refusal answers 403 (see ``authenticate``) and is
    noted in the audit history with the operator and address (node/audit.py)."""
    access = Access(operator(request).principal, vhost)
    principal = [access.principal.name, "http", request.remote or "", ""]
    audit = context(request).broker.audit
    access.on_refused = lambda operation, permission, kind, resource: audit.refused_as(
        principal, vhost, None, operation, permission, kind, resource)
    return access


async def body(request: web.Request, max_values: int = SMALL_BODY_VALUES) -> dict:
    """The JSON object of the request, within http_max_body and ``max_values`` (413) and parsed off
    the loop when large (ops/http/bodies.py); 400 if it is not a JSON object."""
    if not request.can_read_body:
        return {}
    try:
        data = await read_json(request, context(request).broker.config, max_values)
    except BodyError as exc:
        error = {400: "bad_request", 408: "request_timeout"}.get(exc.status, "payload_too_large")
        raise HttpError(exc.status, error, exc.reason) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise bad_request("body must be a JSON object")
    return data


def _login_failed(request: web.Request) -> HttpError:
    """401; with RabbitMQ's Basic challenge for tools, without it for the UI's script (a challenge
    makes a browser show its own login prompt instead of the page's form)."""
    ui = request.headers.get("X-Requested-With") == "XMLHttpRequest" or COOKIE in request.cookies
    return HttpError(401, "not_authorized", "Login failed", headers={} if ui else {"WWW-Authenticate": REALM})


def request_session(request: web.Request) -> tuple[str, Session] | None:
    """(id, session) of the request's session cookie when it names a live session, else None."""
    session_id = request.cookies.get(COOKIE)
    if not session_id:
        return None
    session = context(request).sessions.get(session_id)
    return (session_id, session) if session is not None else None


def _session_login(request: web.Request) -> Operator | None:
    """The operator of the request's session cookie, or None without a live one.  A change made with
    the cookie must carry the session's CSRF token (403 otherwise): the browser sends the cookie
    whoever's page asks, only a page of this origin has the token (ops/http/session.py)."""
    found = request_session(request)
    if found is None:
        return None
    _session_id, session = found
    op = session_operator(context(request).broker, session, request.remote)
    if op is None:
        return None
    if request.method not in SAFE_METHODS:
        token = request.headers.get(CSRF_HEADER, "")
        if not secrets.compare_digest(token.encode("utf-8", "replace"), session.csrf.encode()):
            raise HttpError(FORBIDDEN_STATUS, "csrf_token_invalid",
                            f"a change made with the session cookie needs the session's {CSRF_HEADER} header")
    request["session"] = session
    return op


@web.middleware
async def authenticate(request: web.Request, handler):
    """Every /api path but /api/login needs a management user (RabbitMQ has no anonymous management
    access): by the session cookie of a UI login, else by Basic credentials (rabbitmqadmin, Flower)."""
    try:
        if (request.path.startswith("/api/") or request.path in PROTECTED_PAGES) and request.path not in PUBLIC_API:
            op = _session_login(request)
            if op is None:
                # A login not seen before costs a PBKDF2 verification (~5 ms): in the bounded login
                # pool (node/logins.py), so that wrong passwords cannot stall the broker's loop.
                # Credentials verified before are answered here (a dashboard polling keeps working
                # while the pool is busy).
                ctx, header = context(request), request.headers.get("Authorization")
                op = ctx.gatekeeper.login_header(header, request.remote, cached_only=True)
                if op is None and header is not None:
                    try:
                        op = await ctx.broker.auth.pool.run(ctx.gatekeeper.login_header, header, request.remote)
                    except LoginBusy:
                        raise HttpError(503, "busy", "too many logins in progress; try again") from None
            if op is None:
                raise _login_failed(request)
            if not op.has(MANAGEMENT):
                raise forbidden("Not management user")
            request["operator"] = op
            ACTOR.set(Actor(op.name, "http", request.remote or ""))  # this request's task only
        return await handler(request)
    except AdminError as exc:
        return from_admin_error(exc).response()
    except AccessRefused as exc:
        return forbidden(exc.text).response()
    except HttpError as exc:
        return exc.response()
    except TimeoutError:
        return HttpError(503, "timeout", "the cluster did not answer in time (no leader?)").response()
