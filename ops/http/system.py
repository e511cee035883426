"""The node and its clients: /api/overview, /api/nodes (with Raft), /api/connections, /api/channels,
/api/aliveness-test, /api/health/checks/*.

Connections and channels are every member's, gathered over the Raft port (ops/http/members.py: a
client is connected to one node); queues, consumers and the rest are the replicated state, the same
on every node.  /api/nodes lists every cluster
member; a member's ``raft`` object tells its role as this node sees it, and, for the answering
node, its commit and applied indexes; the leader also knows each follower's lag in entries.
"""

from __future__ import annotations

import os
import resource
import shutil
import time

from aiohttp import web

from raftmq.node.group_figures import vhost_infos
from raftmq.node.group_status import group_views
from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import ROUTED

from ..operator import MONITORING, POLICYMAKER
from .common import (
    bad_request,
    columns,
    context,
    forbidden,
    not_found,
    operator,
    reply,
    reply_one,
    require,
    require_vhost,
)
from .login import grants
from .members import client_endpoints, connection_name, connection_view
from .views import MANAGEMENT_VERSION, PRODUCT, node_name

STARTED = time.time()
EXCHANGE_TYPES = [{"name": t, "description": "", "enabled": True} for t in ("direct", "fanout", "topic", "headers",
                                                                     "x-delayed-message", "x-message-deduplication")]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("raftmq")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0"


# ------------------------------------------------------------------ overview

async def overview(request: web.Request) -> web.Response:
    ctx, op = context(request), operator(request)
    broker = ctx.broker
    vhosts = [v for v in Q.vhosts(broker.machine) if op.may_see_vhost(v.name)]
    vhosts = await vhost_infos(broker, vhosts)  # issue 34: with the queue groups' messages
    ready = sum(v.messages_ready for v in vhosts)
    unacked = sum(v.messages_unacknowledged for v in vhosts)
    connections, _missing = await _cluster_rows(request, "connections")
    config = broker.config
    listeners = [{"node": node_name(broker), "protocol": "amqp", "ip_address": config.host, "port": config.port}]
    if config.tls_port:
        listeners.append({"node": node_name(broker), "protocol": "amqp/ssl", "ip_address": config.host,
                          "port": config.tls_port})
    if config.http_port:
        listeners.append({"node": node_name(broker), "protocol": "http", "ip_address": config.host,
                          "port": config.http_port})
    return reply({
        "management_version": MANAGEMENT_VERSION,
        "rates_mode": "basic",
        "exchange_types": EXCHANGE_TYPES,
        "product_version": _version(),
        "product_name": PRODUCT,
        "rabbitmq_version": MANAGEMENT_VERSION,
        "cluster_name": f"raftmq@{config.host}",
        "node": node_name(broker),
        "disable_stats": False,
        "enable_queue_totals": True,
        "statistics_db_event_queue": 0,
        "message_stats": ctx.rates.message_stats(),
        "queue_totals": {"messages": ready + unacked, "messages_ready": ready,
                         "messages_unacknowledged": unacked,
                         # raftmq: held by x-delayed-message exchanges (store/core/delayed.py)
                         "messages_delayed": Q.counters(broker.machine).delayed_messages},
        "object_totals": {
            "connections": len(connections),  # every member's (members.py), as RabbitMQ's
            "channels": sum(row["channels"] for row in connections),
            "consumers": sum(v.consumers for v in vhosts),
            "exchanges": sum(v.exchanges for v in vhosts),
            "queues": sum(v.queues for v in vhosts),
        },
        "listeners": listeners,
        "contexts": [{"node": node_name(broker), "description": "raftmq management", "path": "/",
                      "port": str(config.http_port)}],
    })


# ------------------------------------------------------------------ nodes

def node_members(broker) -> list[dict]:
    """Every member as /api/nodes lists it (also the Cluster page's rows: ops/http/raftview.py)."""
    log = broker.log
    raft = log.raft_status()
    config = broker.config
    me = node_name(broker)
    try:
        disk_free = shutil.disk_usage(config.resolved_data_dir()).free
    except OSError:
        disk_free = 0
    local = {
        "name": me,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((time.time() - STARTED) * 1000),
        "mem_used": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "mem_limit": config.memory_high_watermark,
        "mem_alarm": broker.alarm == "low on memory",
        "disk_free": disk_free,
        "disk_free_limit": config.disk_free_limit,
        "disk_free_alarm": broker.alarm == "low on disk",
        "fd_used": len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0,
        "sockets_used": len(broker.endpoints),
        "proc_used": 0,
        "processors": os.cpu_count() or 1,
        "partitions": [],
        "applications": [],
        "exchange_types": EXCHANGE_TYPES,
        "rates_mode": "basic",
        "being_drained": False,
    }
    if raft is None:
        applied = Q.counters(broker.machine).applied_index
        local["raft"] = {"role": "single", "leader": True, "term": 0, "commit_index": applied,
                         "applied_index": applied, "lag": 0}
        if broker.group_host is not None:  # issue 34: every group of this node
            local["raft"]["groups"] = group_views(broker)
        return [local]
    connected = set(raft.connected_partners)
    nodes = []
    for node_id, (raft_address, amqp) in sorted(broker.members.items()):
        is_me = node_id == config.node_id
        leading = raft_address == log.leader
        view = dict(local) if is_me else {"name": node_name(broker, node_id), "type": "disc",
                                          "running": raft_address in connected, "partitions": []}
        view["raft"] = {
            "address": raft_address,
            "amqp_address": amqp,
            "role": "leader" if leading else ("follower" if (is_me or raft_address in connected) else "unknown"),
            "leader": leading,
            "term": raft.term,
            "commit_index": raft.commit_index if is_me else None,
            "applied_index": raft.applied_index if is_me else None,
            # Entries behind the leader's commit index; known on the leader only.
            "lag": (0 if leading else raft.lags.get(raft_address)) if log.is_leader else None,
        }
        if is_me:  # issue 29: why this node does not vote, if it does not (known to itself only)
            view["raft"]["storage_repair"] = raft.repair
            if broker.group_host is not None:  # issue 34: every group's replica on this node
                view["raft"]["groups"] = group_views(broker)
        nodes.append(view)
    return nodes


async def list_nodes(request: web.Request) -> web.Response:
    require(request, MONITORING)
    return columns(request, node_members(context(request).broker))


async def get_node(request: web.Request) -> web.Response:
    require(request, MONITORING)
    return reply_one(node_members(context(request).broker), name=request.match_info["name"])


# ------------------------------------------------------------------ connections and channels
# Every member's (ops/http/members.py gathers them over the Raft port); the ``node`` field says
# whose.  A member that did not answer is named in the X-Raftmq-Members-Missing header.


def _may_see(request: web.Request, row: dict) -> bool:
    """Monitoring users see every connection, others their own (RabbitMQ's rule)."""
    op = operator(request)
    return op.has(MONITORING) or row.get("user") == op.name


async def _cluster_rows(request: web.Request, kind: str) -> tuple[list[dict], list[str]]:
    gathered = await context(request).members.gather()
    return [row for row in gathered.rows(kind) if _may_see(request, row)], gathered.missing


def _missing_header(response: web.Response, missing: list[str]) -> web.Response:
    if missing:
        response.headers["X-Raftmq-Members-Missing"] = ",".join(missing)
    return response


def _connections(request: web.Request) -> list[tuple[str, object]]:
    """This node's client connections the user may see: all for monitoring, else its own."""
    op = operator(request)
    return [(conn_id, endpoint) for conn_id, endpoint in client_endpoints(context(request).broker)
            if op.has(MONITORING) or endpoint.principal.name == op.name]


async def list_connections(request: web.Request) -> web.Response:
    rows, missing = await _cluster_rows(request, "connections")
    return _missing_header(columns(request, rows), missing)


def _find_connection(request: web.Request):
    wanted = request.match_info["name"]
    for conn_id, endpoint in _connections(request):
        if wanted in (connection_name(endpoint, context(request).broker.config), conn_id):
            return conn_id, endpoint
    raise not_found()


async def get_connection(request: web.Request) -> web.Response:
    """This node's connection, else another member's (as it last told: members.py)."""
    wanted = request.match_info["name"]
    for conn_id, endpoint in _connections(request):
        if wanted in (connection_name(endpoint, context(request).broker.config), conn_id):
            return reply(connection_view(context(request).broker, conn_id, endpoint))
    rows, _missing = await _cluster_rows(request, "connections")
    for row in rows:
        if wanted in (row["name"], row.get("raftmq_id")):
            return reply(row)
    raise not_found()


async def delete_connection(request: web.Request) -> web.Response:
    """Close a connection: an administrator any, a management user its own (as RabbitMQ).  Only
    this node's: another member's connection is closed through that member's API."""
    conn_id, endpoint = _find_connection(request)
    op = operator(request)
    if endpoint.principal.name != op.name and not op.has("administrator"):
        raise forbidden("Not administrator user")
    context(request).control.close_connection(conn_id, request.headers.get("X-Reason", ""))
    return web.Response(status=204)


async def list_channels(request: web.Request) -> web.Response:
    rows, missing = await _cluster_rows(request, "channels")
    return _missing_header(columns(request, rows), missing)


# ------------------------------------------------------------------ health

async def aliveness(request: web.Request) -> web.Response:
    """Declare a queue named aliveness-test, publish to it and get the message back (RabbitMQ's
    test: a round trip through the log on a healthy cluster)."""
    vhost = request.match_info["vhost"]
    require_vhost(request, vhost, change=True)
    control = context(request).control
    await control.declare_queue(vhost, "aliveness-test", False)
    body = b"test_message"
    outcome = await control.publish(vhost, "", "aliveness-test", encode_properties(BasicProperties()), body,
                                    False, None, None)
    fetched = await control.get(vhost, "aliveness-test", 1, "ack_requeue_false")
    if outcome != ROUTED or not fetched or fetched[0].body != body:
        return reply({"status": "failed", "reason": "the test message did not come back"}, status=503)
    return reply({"status": "ok"})


async def alarms(request: web.Request) -> web.Response:
    alarm = context(request).broker.alarm
    if alarm:
        return reply({"status": "failed", "reason": f"resource alarm in effect: {alarm}",
                      "alarms": [{"node": node_name(context(request).broker), "resource":
                                  "memory" if "memory" in alarm else "disk"}]}, status=503)
    return reply({"status": "ok"})


async def virtual_hosts_check(request: web.Request) -> web.Response:
    """Every vhost is up when this node can make progress (has a leader); none otherwise."""
    broker = context(request).broker
    if not broker.accepting:
        return reply({"status": "failed", "reason": "no cluster leader: no vhost can make progress",
                      "virtual-hosts": sorted(Q.vhost_names(broker.machine))}, status=503)
    return reply({"status": "ok"})


async def port_listener(request: web.Request) -> web.Response:
    """Whether this node listens on a port (RabbitMQ's check of AMQP, TLS and HTTP listeners)."""
    config = context(request).broker.config
    try:
        port = int(request.match_info["port"])
    except ValueError:
        raise bad_request("a port is a number") from None
    ports = {p for p in (config.port, config.tls_port, config.http_port, config.admin_port, config.metrics_port) if p}
    if port in ports:
        return reply({"status": "ok", "port": port})
    return reply({"status": "failed", "reason": f"no listener on port {port}", "missing": port,
                  "ports": sorted(ports)}, status=503)


async def cluster_name(request: web.Request) -> web.Response:
    return reply({"name": f"raftmq@{context(request).broker.config.host}"})


async def whoami(request: web.Request) -> web.Response:
    """RabbitMQ's {"name", "tags"}; to the UI (logged in by a session cookie) also the tags granted
    (ops/http/login.py) and the session's CSRF token.  Basic-auth callers get RabbitMQ's answer."""
    op = operator(request)
    out: dict = {"name": op.name, "tags": sorted(op.tags)}
    session = request.get("session")
    if session is not None:
        out["grants"] = grants(op)
        out["csrf_token"] = session.csrf
    return reply(out)


async def extensions(request: web.Request) -> web.Response:
    return reply([])


async def list_policies(request: web.Request) -> web.Response:
    """raftmq has no policies (nor parameters): an empty list, as RabbitMQ shows with none set."""
    return reply([])


async def put_policy(request: web.Request) -> web.Response:
    require(request, POLICYMAKER)
    raise bad_request("raftmq has no policies: set queue arguments (x-message-ttl, x-max-length...) instead")


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/overview", overview)
    r.add_get("/api/nodes", list_nodes)
    r.add_get("/api/nodes/{name}", get_node)
    r.add_get("/api/connections", list_connections)
    r.add_get("/api/connections/{name}", get_connection)
    r.add_delete("/api/connections/{name}", delete_connection)
    r.add_get("/api/channels", list_channels)
    r.add_get("/api/aliveness-test/{vhost}", aliveness)
    r.add_get("/api/health/checks/alarms", alarms)
    r.add_get("/api/health/checks/local-alarms", alarms)
    r.add_get("/api/health/checks/virtual-hosts", virtual_hosts_check)
    r.add_get("/api/health/checks/port-listener/{port}", port_listener)
    r.add_get("/api/healthchecks/node", alarms)  # (deprecated in RabbitMQ 3.8, still probed by monitors)
    r.add_get("/api/cluster-name", cluster_name)
    r.add_get("/api/whoami", whoami)
    r.add_get("/api/extensions", extensions)
    for kind in ("policies", "operator-policies", "parameters"):
        r.add_get(f"/api/{kind}", list_policies)
        r.add_get(f"/api/{kind}/{{vhost}}", list_policies)
        r.add_put(f"/api/{kind}/{{vhost}}/{{name}}", put_policy)
        r.add_delete(f"/api/{kind}/{{vhost}}/{{name}}", put_policy)
