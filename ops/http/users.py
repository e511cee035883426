"""Users, permissions, vhosts and definitions: administrator territory (RabbitMQ's rules).

Users created here are the replicated users (store/core/users.py); users of the configuration file are
listed (without their password) and keep their password and tags from that file, unless replaced by
a replicated user of the same name -- but their permissions are set and cleared here like anyone's
(a replicated overlay on top of the file's, store/core/users.py), as RabbitMQ makes no such distinction.  A password given in clear is hashed here (PBKDF2, node/auth.py) before the
command is proposed; a ``password_hash`` from RabbitMQ definitions (rabbit_password_hashing_sha256,
sha512 or md5) is kept as it is and checked RabbitMQ's way, so users imported from RabbitMQ keep
their passwords.

/api/definitions exports and imports RabbitMQ's JSON format: users, vhosts, permissions, queues,
exchanges, bindings.  Policies, parameters and topic permissions raftmq does not have: importing
them is refused (400) rather than silently dropped; empty lists are accepted.
"""

from __future__ import annotations

import re

from aiohttp import web

from raftmq.node.auth import HASH_SCHEME, RABBIT_HASHES, hash_password
from raftmq.node.group_figures import vhost_infos
from raftmq.store.core import queries as Q
from raftmq.store.core.users import overlaid

from ..control import AdminError
from ..operator import ADMINISTRATOR
from .common import (
    bad_request,
    body,
    columns,
    context,
    not_found,
    operator,
    reply,
    reply_one,
    require,
    require_vhost,
)
from .limits import add_routes as add_limit_routes
from .limits import check_queue_limits, import_limits, limit_changes, user_limits, vhost_limits
from .views import (
    MANAGEMENT_VERSION,
    PRODUCT,
    binding_view,
    by_name,
    exchange_view,
    is_default_exchange,
    permission_view,
)

HASHING_ALGORITHM = "raftmq_pbkdf2_sha256"  # how raftmq's own hashes are labelled in definitions


def _tags(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list):
        return [str(t) for t in value]
    raise bad_request("tags must be a string or a list")


def _users(broker) -> list[dict]:
    rows = []
    for user in Q.users(broker.machine):
        algorithm, stored = _exported_hash(user.password_hash)
        rows.append({"name": user.name, "password_hash": stored, "hashing_algorithm": algorithm,
                     "tags": list(user.tags), "limits": user_limits(broker, user.name)})
    for name, user in broker.config.users.items():
        if not Q.has_user(broker.machine, name):
            rows.append({"name": name, "password_hash": "", "hashing_algorithm": "", "tags": list(user.tags),
                         "limits": user_limits(broker, name), "source": "config"})
    return sorted(rows, key=lambda r: r["name"])


def _exported_hash(stored: str) -> tuple[str, str]:
    if stored.startswith("rabbit-"):
        algorithm, _, encoded = stored[len("rabbit-"):].partition("$")
        return f"rabbit_password_hashing_{algorithm}", encoded
    return HASHING_ALGORITHM, stored


def _imported_hash(data: dict) -> str | None:
    """The stored form of a user's password from PUT /api/users or definitions; None: none given."""
    if "password" in data and data["password"] is not None:
        return hash_password(str(data["password"]))
    if data.get("password_hash") is None:
        return None
    algorithm = data.get("hashing_algorithm") or "rabbit_password_hashing_sha256"
    stored = str(data["password_hash"])
    if algorithm == HASHING_ALGORITHM:
        if not stored.startswith(HASH_SCHEME + "$"):
            raise bad_request("password_hash is not a raftmq hash")
        return stored
    if algorithm not in RABBIT_HASHES:
        raise bad_request(f"unsupported hashing_algorithm '{algorithm}'")
    if stored == "":
        return None  # RabbitMQ: a user without a password cannot log in with one
    return f"rabbit-{RABBIT_HASHES[algorithm]}${stored}"


async def list_users(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    return columns(request, _users(context(request).broker))


async def get_user(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    return reply_one(_users(context(request).broker), name=request.match_info["name"])


async def put_user(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    name = request.match_info["name"]
    data = await body(request)
    existed = Q.has_user(context(request).broker.machine, name)
    await _put_user(request, name, data)
    return web.Response(status=204 if existed else 201)


async def _put_user(request: web.Request, name: str, data: dict) -> None:
    if "password" not in data and "password_hash" not in data:
        raise bad_request("[{key_missing,password}]")
    stored = _imported_hash(data)
    if stored is None:
        # RabbitMQ accepts a user without a password (it can only use other mechanisms);
        # raftmq's logins are passwords only: a random one nobody knows.
        import secrets

        stored = hash_password(secrets.token_urlsafe(24))
    # Loopback-only stays as it was: RabbitMQ keeps it in its configuration (loopback_users), so
    # definitions imported from RabbitMQ -- which list guest -- must not open guest to the network.
    broker = context(request).broker
    record, configured = Q.user(broker.machine, name), broker.config.users.get(name)
    loopback_only = record.loopback_only if record is not None else bool(configured and configured.loopback_only)
    await context(request).control.put_user(name, stored, _tags(data.get("tags")), loopback_only)


async def delete_user(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    name = request.match_info["name"]
    broker = context(request).broker
    if not Q.has_user(broker.machine, name):
        if name in broker.config.users:
            raise AdminError(405, f"user '{name}' is defined in the configuration file")
        raise not_found()
    await context(request).control.delete_user(name)
    return web.Response(status=204)


def _permissions(broker) -> list[dict]:
    rows = []
    machine = broker.machine
    for managed in Q.users(machine):
        rows += [permission_view(managed.name, vh, p) for vh, p in sorted(managed.permissions.items())]
    for name, user in broker.config.users.items():
        if not Q.has_user(machine, name):
            permissions = overlaid(user.permissions, Q.permission_overlay(machine, name))
            rows += [permission_view(name, vh, p) for vh, p in sorted(permissions.items())]
    return rows


async def list_permissions(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    return columns(request, _permissions(context(request).broker))


async def user_permissions(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    name = request.match_info["name"]
    broker = context(request).broker
    if not Q.has_user(broker.machine, name) and name not in broker.config.users:
        raise not_found()
    return reply([p for p in _permissions(broker) if p["user"] == name])


async def vhost_permissions(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    name = request.match_info["name"]
    require_vhost(request, name)
    return reply([p for p in _permissions(context(request).broker) if p["vhost"] == name])


def _permission_key(request: web.Request) -> tuple[str, str]:
    return request.match_info["vhost"], request.match_info["user"]


async def get_permission(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    vhost, user = _permission_key(request)
    return reply_one(_permissions(context(request).broker), vhost=vhost, user=user)


async def put_permission(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    vhost, user = _permission_key(request)
    require_vhost(request, vhost)
    data = await body(request)
    await _set_permission(request, user, vhost, data)
    return web.Response(status=201)


async def _set_permission(request: web.Request, user: str, vhost: str, data: dict) -> None:
    patterns = []
    for key in ("configure", "write", "read"):
        if key not in data:
            raise bad_request(f"[{{key_missing,{key}}}]")
        try:
            re.compile(str(data[key]))
        except re.error as exc:
            raise bad_request(f"bad regular expression for {key}: {exc}") from None
        patterns.append(str(data[key]))
    broker = context(request).broker
    if not Q.has_user(broker.machine, user) and user not in broker.config.users:
        raise bad_request(f"no user '{user}'")
    await context(request).control.set_permissions(user, vhost, *patterns)


async def delete_permission(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    vhost, user = _permission_key(request)
    broker = context(request).broker
    if not any(p["user"] == user and p["vhost"] == vhost for p in _permissions(broker)):
        raise not_found()
    await context(request).control.clear_permissions(user, vhost)
    return web.Response(status=204)


def _vhost_view(broker, vhost: Q.VhostInfo) -> dict:
    ready, unacked = vhost.messages_ready, vhost.messages_unacknowledged
    return {"name": vhost.name, "description": "", "tags": [], "tracing": False,
            "metadata": {"description": "", "tags": []}, "default_queue_type": "classic",
            "messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
            "cluster_state": {f"raftmq@{node}": "running" for node in (broker.members or {broker.config.node_id: 0})}}


async def list_vhosts(request: web.Request) -> web.Response:
    broker, op = context(request).broker, operator(request)
    visible = [v for v in sorted(Q.vhosts(broker.machine), key=by_name) if op.may_see_vhost(v.name)]
    rows = [_vhost_view(broker, v) for v in await vhost_infos(broker, visible)]  # issue 34: queue groups' too
    return columns(request, rows)


async def get_vhost(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    require_vhost(request, name)
    broker = context(request).broker
    vhost = Q.vhost(broker.machine, name)
    if vhost is None:  # (require_vhost answered 404 already)
        raise not_found()
    (vhost,) = await vhost_infos(broker, [vhost])  # issue 34: with the queue groups' messages
    return reply(_vhost_view(broker, vhost))


async def put_vhost(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    name = request.match_info["name"]
    broker = context(request).broker
    existed = Q.has_vhost(broker.machine, name)
    await context(request).control.add_vhost(name)
    creator = operator(request).name
    if not existed and (Q.has_user(broker.machine, creator) or creator in broker.config.users):
        # RabbitMQ gives the user who creates a vhost full permissions on it (rabbit_vhost:add),
        # a user of the configuration file too (the permission overlay, store/core/users.py).
        await context(request).control.set_permissions(creator, name, ".*", ".*", ".*")
    return web.Response(status=204 if existed else 201)


async def delete_vhost(request: web.Request) -> web.Response:
    """RabbitMQ's DELETE /api/vhosts/:name: administrators only, 204, 404 for an unknown vhost.  Its
    queues, exchanges, bindings and permissions go, its connections are closed (320), through one
    replicated command (store/core/topology.py vhost_delete).  ``/`` may be deleted, as in RabbitMQ."""
    require(request, ADMINISTRATOR)
    name = request.match_info["name"]
    if not Q.has_vhost(context(request).broker.machine, name):
        raise not_found()
    await context(request).control.delete_vhost(name)
    return web.Response(status=204)


# ------------------------------------------------------------------ definitions

def export_definitions(broker) -> dict:
    machine = broker.machine
    queues, exchanges, bindings = [], [], []
    for vhost in sorted(Q.vhost_names(machine)):
        for q in sorted(Q.queues(machine, vhost), key=by_name):
            if q.durable and q.exclusive_owner is None:  # RabbitMQ exports what survives a restart
                queues.append({"name": q.name, "vhost": vhost, "durable": True, "auto_delete": q.auto_delete,
                               "arguments": q.arguments})
        for e in sorted(Q.exchanges(machine, vhost), key=by_name):
            if e.durable and not is_default_exchange(e.name):
                view = exchange_view(e)
                view.pop("user_who_performed_action")
                view.pop("policy")
                exchanges.append(view)
        bindings += [_binding_definition(binding_view(vhost, b)) for b in Q.bindings(machine, vhost)]
    users = [{k: v for k, v in u.items() if k != "source"} for u in _users(broker) if u.get("source") != "config"]
    return {
        "rabbit_version": MANAGEMENT_VERSION,
        "rabbitmq_version": MANAGEMENT_VERSION,
        "product_name": PRODUCT,
        "product_version": MANAGEMENT_VERSION,
        "users": users,
        "vhosts": [{"name": name, "limits": vhost_limits(broker, name)} for name in sorted(Q.vhost_names(machine))],
        "permissions": [p for p in _permissions(broker) if Q.has_user(machine, p["user"])],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [],
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


def _binding_definition(view: dict) -> dict:
    view.pop("properties_key")
    return view


async def get_definitions(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    return reply(export_definitions(context(request).broker))


async def post_definitions(request: web.Request) -> web.Response:
    """Import: vhosts, users, permissions, exchanges, queues, bindings in that order, each one a
    log command.  What can be known before (the file's form, its limits, the queues against each
    vhost's max-queues) is checked first: such a file is refused whole (400).  An error met later
    (a command refused by the state machine) stops the import there; what came before stays, as in
    RabbitMQ."""
    require(request, ADMINISTRATOR)
    data = await body(request, context(request).broker.config.http_max_json_elements)
    for unsupported in ("policies", "parameters", "topic_permissions"):
        items = data.get(unsupported) or []
        if unsupported == "parameters":  # vhost limits are parameters in RabbitMQ 3.x exports
            items = [p for p in items if not (isinstance(p, dict) and p.get("component") == "vhost-limits")]
        if items:
            raise bad_request(f"raftmq has no {unsupported.replace('_', ' ')}: remove them to import the rest")
    check_definitions(data)
    changes = limit_changes(data)
    check_queue_limits(context(request).broker, data, changes)
    control = context(request).control
    for vhost in data.get("vhosts") or []:
        await control.add_vhost(str(vhost["name"]))
    for user in data.get("users") or []:
        await _put_user(request, str(user["name"]), user)
    for perm in data.get("permissions") or []:
        await _set_permission(request, str(perm["user"]), str(perm["vhost"]), perm)
    await import_limits(request, changes)  # before the queues: max-queues holds for them too
    for e in data.get("exchanges") or []:
        await control.declare_exchange(str(e["vhost"]), str(e["name"]), str(e["type"]), bool(e.get("durable", True)),
                                       bool(e.get("auto_delete", False)), bool(e.get("internal", False)),
                                       e.get("arguments") or {})
    for q in data.get("queues") or []:
        await control.declare_queue(str(q["vhost"]), str(q["name"]), bool(q.get("durable", True)),
                                    bool(q.get("auto_delete", False)), q.get("arguments") or {})
    for b in data.get("bindings") or []:
        await control.bind(str(b["vhost"]), str(b["source"]), str(b["destination"]),
                           b.get("destination_type", "queue") == "queue", str(b.get("routing_key", "")),
                           b.get("arguments") or {})
    return web.Response(status=204)


# Each section of a definitions file: the fields its items must have as strings, and those that, when
# present and not null, must be strings, objects or lists.  Checked before anything is imported, so
# that a malformed file is refused whole with 400 and the reason (issue 31: 4 of 8 got 500).
DEFINITION_FIELDS: dict[str, tuple[tuple[str, ...], dict[str, type | tuple[type, ...]]]] = {
    "vhosts": (("name",), {}),
    "users": (("name",), {"password": str, "password_hash": str, "hashing_algorithm": str, "tags": (str, list)}),
    "permissions": (("user", "vhost", "configure", "write", "read"), {}),
    "exchanges": (("vhost", "name", "type"), {"arguments": dict}),
    "queues": (("vhost", "name"), {"arguments": dict}),
    "bindings": (("vhost", "source", "destination"), {"destination_type": str, "routing_key": str,
                                                      "arguments": dict}),
}


def check_definitions(data: dict) -> None:
    """400 with the first reason a definitions file cannot be imported as it is."""
    for section, (required, optional) in DEFINITION_FIELDS.items():
        items = data.get(section)
        if items is None:
            continue
        if not isinstance(items, list):
            raise bad_request(f"{section} must be a list")
        for index, item in enumerate(items):
            where = f"{section}[{index}]"
            if not isinstance(item, dict):
                raise bad_request(f"{where} must be an object")
            for key in required:
                if not isinstance(item.get(key), str):
                    raise bad_request(f"{where}.{key} must be a string")
            for key, kinds in optional.items():
                if item.get(key) is not None and not isinstance(item[key], kinds):
                    raise bad_request(f"{where}.{key} has the wrong type")
            if section == "users" and isinstance(item.get("tags"), list) and not all(
                    isinstance(t, str) for t in item["tags"]):
                raise bad_request(f"{where}.tags must be strings")
            if section == "bindings" and item.get("destination_type", "queue") not in ("queue", "exchange"):
                raise bad_request(f"{where}.destination_type must be queue or exchange")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/users", list_users)
    r.add_get("/api/users/{name}", get_user)
    r.add_put("/api/users/{name}", put_user)
    r.add_delete("/api/users/{name}", delete_user)
    r.add_get("/api/users/{name}/permissions", user_permissions)
    r.add_get("/api/vhosts/{name}/permissions", vhost_permissions)
    r.add_get("/api/permissions", list_permissions)
    r.add_get("/api/permissions/{vhost}/{user}", get_permission)
    r.add_put("/api/permissions/{vhost}/{user}", put_permission)
    r.add_delete("/api/permissions/{vhost}/{user}", delete_permission)
    r.add_get("/api/vhosts", list_vhosts)
    r.add_get("/api/vhosts/{name}", get_vhost)
    r.add_put("/api/vhosts/{name}", put_vhost)
    r.add_delete("/api/vhosts/{name}", delete_vhost)
    r.add_get("/api/definitions", get_definitions)
    r.add_post("/api/definitions", post_definitions)
    add_limit_routes(app)  # /api/vhost-limits, /api/user-limits (ops/http/limits.py)
