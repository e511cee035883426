"""Vhost and user limits over HTTP, with RabbitMQ's paths, bodies and rules (issue 31 item 7).

  GET    /api/vhost-limits[/{vhost}]          [{"vhost": v, "value": {"max-queues": 10, ...}}], the
                                              vhosts the operator may see (rabbit_mgmt_wm_limits)
  PUT    /api/vhost-limits/{vhost}/{name}     body {"value": N}: administrators (rabbit_mgmt_wm_limit)
  DELETE /api/vhost-limits/{vhost}/{name}
  GET    /api/user-limits[/{user}]            [{"user": u, "value": {...}}]: administrators, or a user
                                              for itself (rabbit_mgmt_wm_user_limits)
  PUT    /api/user-limits/{user}/{name}       body {"value": N}: administrators (rabbit_mgmt_wm_user_limit)
  DELETE /api/user-limits/{user}/{name}

A negative value means no limit; 0 allows none (store/core/limits.py).  An unknown vhost is 404, an
unknown user 404 (a user of the configuration file may have limits, as it may have permissions), an
unknown limit name or a value that is not an integer 400.  Each change is one replicated command
(LIMITS_SET).  The limits also travel in definitions (ops/http/users.py): vhosts' and users'
``limits`` objects, and RabbitMQ's older ``parameters`` of component ``vhost-limits``.
"""

from __future__ import annotations

from aiohttp import web

from raftmq.store.core import queries as Q
from raftmq.store.core.limits import check_limits, limit_of

from ..operator import ADMINISTRATOR
from .common import (
    bad_request,
    body,
    columns,
    context,
    forbidden,
    not_found,
    operator,
    require,
    require_vhost,
)


def vhost_limits(broker, vhost: str) -> dict[str, int]:
    return Q.vhost_limits(broker.machine, vhost)


def user_limits(broker, user: str) -> dict[str, int]:
    return Q.user_limits(broker.machine, user)


def _is_user(broker, name: str) -> bool:
    return Q.has_user(broker.machine, name) or name in broker.config.users


async def list_vhost_limits(request: web.Request) -> web.Response:
    broker, op = context(request).broker, operator(request)
    wanted = request.match_info.get("vhost")
    if wanted is not None:
        require_vhost(request, wanted)
        names = [wanted]
    else:
        names = [v for v in Q.limited_vhosts(broker.machine) if op.may_see_vhost(v)]
    rows = [{"vhost": v, "value": limits} for v in names if (limits := vhost_limits(broker, v))]
    return columns(request, rows)


async def list_user_limits(request: web.Request) -> web.Response:
    broker, op = context(request).broker, operator(request)
    wanted = request.match_info.get("user")
    if not op.has(ADMINISTRATOR) and wanted != op.name:
        raise forbidden("Not administrator user")
    if wanted is not None:
        if not _is_user(broker, wanted):
            raise not_found()
        names = [wanted]
    else:
        names = Q.limited_users(broker.machine)
    rows = [{"user": u, "value": limits} for u in names if (limits := user_limits(broker, u))]
    return columns(request, rows)


async def _value(request: web.Request, scope: str, name: str) -> int:
    data = await body(request)
    if "value" not in data:
        raise bad_request("[{key_missing,value}]")
    value = data["value"]
    if isinstance(value, str):  # RabbitMQ's UI sends the number as a string
        try:
            value = int(value)
        except ValueError:
            raise bad_request(f"limit '{name}' must be an integer, not {value!r}") from None
    reason = check_limits(scope, {name: value})
    if reason is not None:
        raise bad_request(reason)
    return value


async def put_vhost_limit(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if not Q.has_vhost(context(request).broker.machine, vhost):
        raise not_found()
    value = await _value(request, "vhost", name)
    await context(request).control.set_limits("vhost", vhost, {name: value})
    return web.Response(status=204)


async def delete_vhost_limit(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    if not Q.has_vhost(context(request).broker.machine, vhost):
        raise not_found()
    if check_limits("vhost", {name: None}) is None:  # clearing an unknown name is a no-op (RabbitMQ: 204)
        await context(request).control.set_limits("vhost", vhost, {name: None})
    return web.Response(status=204)


async def put_user_limit(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    user, name = request.match_info["user"], request.match_info["name"]
    if not _is_user(context(request).broker, user):
        raise not_found()
    value = await _value(request, "user", name)
    await context(request).control.set_limits("user", user, {name: value})
    return web.Response(status=204)


async def delete_user_limit(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    user, name = request.match_info["user"], request.match_info["name"]
    if not _is_user(context(request).broker, user):
        raise not_found()
    if check_limits("user", {name: None}) is None:
        await context(request).control.set_limits("user", user, {name: None})
    return web.Response(status=204)


def limit_changes(data: dict) -> list[tuple[str, str, dict]]:
    """The limits a definitions file sets, in import order: ``vhosts[].limits``, ``parameters`` of
    component ``vhost-limits`` (RabbitMQ 3.x exports), ``users[].limits``.  Each is checked here, so
    that a bad one refuses the file (400) before anything of it is imported."""
    changes: list[tuple[str, str, dict]] = []
    for vhost in data.get("vhosts") or []:
        if vhost.get("limits"):
            changes.append(("vhost", str(vhost["name"]), vhost["limits"]))
    for param in data.get("parameters") or []:
        if param.get("component") == "vhost-limits" and isinstance(param.get("value"), dict):
            changes.append(("vhost", str(param.get("vhost", "/")), param["value"]))
    for user in data.get("users") or []:
        if user.get("limits"):
            changes.append(("user", str(user["name"]), user["limits"]))
    for scope, name, limits in changes:
        if not isinstance(limits, dict):
            raise bad_request(f"limits of {scope} '{name}' must be an object")
        reason = check_limits(scope, limits)
        if reason is not None:
            raise bad_request(f"{scope} '{name}': {reason}")
    return changes


def check_queue_limits(broker, data: dict, changes: list[tuple[str, str, dict]]) -> None:
    """400 unless the file's queues fit each vhost's ``max-queues`` (issue 31), checked before any
    change, as RabbitMQ's rabbit_definitions validate_limits ("Import aborted!"): the limit in
    force once the file's own limits are set, against the vhost's queues now plus the file's queues
    that do not exist yet (each name once).  A queue declared by a client between this check and the
    import's declares can still meet the limit there (the state machine's check, store/core/limits.py)."""
    machine = broker.machine
    limits: dict[str, dict[str, int]] = {}
    for scope, name, values in changes:
        if scope == "vhost":
            merged = limits.setdefault(name, Q.vhost_limits(machine, name))
            for key, value in values.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
    new: dict[str, set[str]] = {}
    for queue in data.get("queues") or []:
        vhost, name = str(queue["vhost"]), str(queue["name"])
        if not Q.has_queue(machine, vhost, name):
            new.setdefault(vhost, set()).add(name)
    for vhost, names in sorted(new.items()):
        limit = limit_of(limits.get(vhost, Q.vhost_limits(machine, vhost)), "max-queues")
        count = Q.queue_count(machine, vhost)
        if limit is not None and count + len(names) > limit:
            raise bad_request(f"adding {len(names)} queue(s) to vhost '{vhost}' would pass its max-queues "
                              f"limit of {limit} (it has {count} queue(s)); nothing was imported")


async def import_limits(request: web.Request, changes: list[tuple[str, str, dict]]) -> None:
    """Definitions: the limits of :func:`limit_changes`, after the vhosts and users exist.  Each
    object sets the limits it names (others stay)."""
    control = context(request).control
    for scope, name, limits in changes:
        await control.set_limits(scope, name, limits)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/vhost-limits", list_vhost_limits)
    r.add_get("/api/vhost-limits/{vhost}", list_vhost_limits)
    r.add_put("/api/vhost-limits/{vhost}/{name}", put_vhost_limit)
    r.add_delete("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit)
    r.add_get("/api/user-limits", list_user_limits)
    r.add_get("/api/user-limits/{user}", list_user_limits)
    r.add_put("/api/user-limits/{user}/{name}", put_user_limit)
    r.add_delete("/api/user-limits/{user}/{name}", delete_user_limit)
