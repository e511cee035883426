"""The gRPC admin service of a node (ops/proto/admin.proto) and the client side of `raftmq admin`.

The service runs grpc's thread-pool server beside the node's event loop. Every handler hands its
work to the loop (``run_coroutine_threadsafe``) because the state machine belongs to the loop
thread; changes (declare, delete, purge) are commands through the log like any client's, issued
on the admin's own channel, so they replicate and answer with the same errors.

Bind address: the node's host, port ``admin_port`` (``raftmq cluster up`` uses 15680+i).  Every call
but the standard health service needs a broker user with the administrator tag, as HTTP basic
auth in the ``authorization`` metadata (ops/operator.py; ``raftmq admin --user/--password``,
guest/guest by default, which RabbitMQ also admits from loopback only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from concurrent import futures
from typing import TYPE_CHECKING

import grpc

from raftmq.node.group_figures import consumer_infos, queue_infos
from raftmq.raft.log import NotReplicated
from raftmq.store.core import queries as Q
from raftmq.store.core.limits import SCOPES, check_limits
from raftmq.store.core.users import overlaid

from .control import ACTOR, Actor, AdminEndpoint, AdminError, Control
from .operator import ADMINISTRATOR, Gatekeeper, basic_header
from .proto import admin_pb2 as pb
from .proto import admin_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

__all__ = ["AdminEndpoint", "AdminError", "AdminService", "admin_stub", "serve_admin"]

log = logging.getLogger(__name__)

GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
              405: grpc.StatusCode.FAILED_PRECONDITION, 406: grpc.StatusCode.FAILED_PRECONDITION,
              403: grpc.StatusCode.PERMISSION_DENIED}


def _typed(value: str):
    return int(value) if value.lstrip("-").isdigit() else value


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.control = Control(broker)

    def _run(self, coro, context):
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(15)
        except AdminError as exc:
            context.abort(GRPC_CODES.get(exc.code, grpc.StatusCode.INTERNAL), exc.text)

    # ------------------------------------------------------------------ reads

    def Status(self, request, context):  # noqa: N802 - gRPC method names
        return self._run(self._status(), context)

    async def _status(self):
        from raftmq.node.status import status_of

        broker = self.broker
        st = status_of(broker)
        connected = set(st.get("connected_partners") or [])
        lags = st.get("member_lags") or {}
        members = [pb.Member(node_id=node_id, raft_address=raft, amqp_address=amqp,
                             connected=node_id == broker.config.node_id or raft in connected,
                             lag=lags.get(raft, 0))
                   for node_id, (raft, amqp) in broker.members.items()]
        return pb.ClusterStatus(
            node_id=broker.config.node_id, role=st["role"], leader_node=st.get("leader_node") or "",
            term=st.get("term") or 0, commit_index=st.get("commit_index") or 0,
            applied_index=st.get("raft_applied") or Q.counters(broker.machine).applied_index, members=members,
            connections=sum(1 for e in broker.endpoints.values() if not isinstance(e, AdminEndpoint)),
            ready=bool(st.get("ready")))

    def Health(self, request, context):  # noqa: N802
        accepting = self.broker.accepting
        return pb.HealthReply(serving=accepting, detail="" if accepting else "no cluster leader")

    def ListQueues(self, request, context):  # noqa: N802
        return self._run(self._list_queues(), context)

    async def _list_queues(self):
        machine = self.broker.machine
        queues = [q for vhost in Q.vhost_names(machine) for q in Q.queues(machine, vhost)]
        queues, _figures = await queue_infos(self.broker, queues)  # issue 34: queue groups' figures
        out = [pb.QueueInfo(vhost=q.vhost, name=q.name, durable=q.durable, exclusive=q.exclusive_owner is not None,
                            auto_delete=q.auto_delete, messages_ready=q.messages_ready,
                            messages_unacked=q.messages_unacknowledged, consumers=q.consumers)
               for q in queues]
        return pb.QueueList(queues=out)

    def ListExchanges(self, request, context):  # noqa: N802
        return self._run(self._list_exchanges(), context)

    async def _list_exchanges(self):
        machine = self.broker.machine
        return pb.ExchangeList(exchanges=[
            pb.ExchangeInfo(vhost=e.vhost, name=e.name, type=e.type, durable=e.durable, bindings=e.bindings)
            for v in Q.vhost_names(machine) for e in Q.exchanges(machine, v)])

    def ListConnections(self, request, context):  # noqa: N802
        return self._run(self._list_connections(), context)

    async def _list_connections(self):
        out = []
        for conn_id, endpoint in self.broker.endpoints.items():
            if isinstance(endpoint, AdminEndpoint):
                continue
            protocol = "0-10" if type(endpoint).__name__.startswith("Amqp010") else "0-9-1"
            principal = getattr(endpoint, "principal", None)
            out.append(pb.ConnectionInfo(id=conn_id, peer=getattr(endpoint, "peer", ""), protocol=protocol,
                                         user=principal.name if principal else "",
                                         vhost=getattr(endpoint, "vhost", "")))
        return pb.ConnectionList(connections=out)

    def ListConsumers(self, request, context):  # noqa: N802
        return self._run(self._list_consumers(), context)

    async def _list_consumers(self):
        return pb.ConsumerList(consumers=[
            pb.ConsumerInfo(vhost=c.vhost, queue=c.queue, tag=c.tag, connection=c.connection, channel=c.channel,
                            prefetch=c.prefetch, unacked=c.unacked, ack_required=not c.no_ack)
            for c in await consumer_infos(self.broker)])  # issue 34: queue groups' consumers too

    # ------------------------------------------------------------------ changes (through the log)

    def DeclareExchange(self, request, context):  # noqa: N802
        return self._run(self._declare_exchange(request), context)

    async def _declare_exchange(self, r):
        args = {k: _typed(v) for k, v in r.arguments.items()}
        await self.control.declare_exchange(r.vhost or "/", r.name, r.type or "direct", r.durable, r.auto_delete,
                                            r.internal, args)
        return pb.ExchangeInfo(vhost=r.vhost or "/", name=r.name, type=r.type or "direct", durable=r.durable)

    def DeleteExchange(self, request, context):  # noqa: N802
        return self._run(self._delete_exchange(request), context)

    async def _delete_exchange(self, r):
        await self.control.delete_exchange(r.vhost or "/", r.name, r.if_unused)
        return pb.Empty()

    def DeclareQueue(self, request, context):  # noqa: N802
        return self._run(self._declare(request), context)

    async def _declare(self, r):
        args = {k: _typed(v) for k, v in r.arguments.items()}
        name, messages, consumers = await self.control.declare_queue(r.vhost or "/", r.name, r.durable,
                                                                     r.auto_delete, args)
        return pb.QueueInfo(vhost=r.vhost or "/", name=name, durable=r.durable, auto_delete=r.auto_delete,
                            messages_ready=messages, consumers=consumers)

    def DeleteQueue(self, request, context):  # noqa: N802
        return self._run(self._count(self.control.delete_queue(request.vhost or "/", request.name)), context)

    def PurgeQueue(self, request, context):  # noqa: N802
        return self._run(self._count(self.control.purge_queue(request.vhost or "/", request.name)), context)

    async def _count(self, coro):
        return pb.Count(count=await coro)

    def CloseConnection(self, request, context):  # noqa: N802
        return self._run(self._close(request), context)

    async def _close(self, r):
        self.control.close_connection(r.id, r.reason)
        return pb.Empty()


    # ------------------------------------------------------------------ audit history

    def SnapshotHistory(self, request, context):  # noqa: N802
        store = self.broker.events
        if store is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this node keeps no message history (audit_retention is none)")
        if not request.path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a snapshot needs a path")
        try:
            # Runs in the gRPC worker thread: the copy reads through its own LMDB transaction,
            # so the broker and the history writer go on meanwhile.
            info = store.snapshot(request.path)
            if self.broker.group_host is not None:  # issue 34: each queue group's history beside it
                from raftmq.store.disk.history import snapshot

                from .group_dirs import queue_group_histories

                for group, events in queue_group_histories(self.broker.config.resolved_data_dir()):
                    snapshot(events, os.path.join(request.path, "groups", f"g{group}"))
        except (ValueError, OSError) as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.SnapshotReply(path=request.path, raft_index=info.raft_index or 0, first_seq=info.first_seq,
                                last_seq=info.last_seq, events=info.events, messages=info.messages)


    # ------------------------------------------------------------------ membership

    def AddMember(self, request, context):  # noqa: N802
        return self._membership("add", request, context)

    def RemoveMember(self, request, context):  # noqa: N802
        return self._membership("remove", request, context)

    def _membership(self, action: str, request, context):
        """The same change as ``raftmq cluster add|remove`` (pysyncobj's admin protocol on the Raft
        port, through the leader), started from this node with its cluster configuration."""
        from . import cluster_admin

        if not self.broker.config.clustered:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a single node has no cluster membership")
        if not request.raft_address:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a member is named by its Raft address host:port")
        try:
            result = cluster_admin.change(self.broker.config, action, request.raft_address)
        except SystemExit as exc:  # cluster_admin reports refusals this way, for its CLI
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:  # noqa: BLE001 - unreachable leader and the like
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{action} {request.raft_address}: {exc}")
        return pb.MemberReply(result=result)

    # ------------------------------------------------------------------ users and permissions

    def ListUsers(self, request, context):  # noqa: N802
        return self._run(self._list_users(), context)

    async def _list_users(self):
        machine = self.broker.machine
        users = [_user_info(u.name, u.tags, u.loopback_only, u.permissions, "cluster") for u in Q.users(machine)]
        users += [_user_info(name, u.tags, u.loopback_only, self._config_permissions(name), "config")
                  for name, u in self.broker.config.users.items() if not Q.has_user(machine, name)]
        return pb.UserList(users=sorted(users, key=lambda u: u.name))

    def PutUser(self, request, context):  # noqa: N802
        if not request.name or not request.password:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a user needs a name and a password")
        from raftmq.node.auth import hash_password

        # Hashed here, with fresh salt: the log and every node's store only ever see the hash.
        password_hash = hash_password(request.password)
        return self._run(self._user_command(request.name, "put_user", password_hash, list(request.tags),
                                            request.loopback_only), context)

    def DeleteUser(self, request, context):  # noqa: N802
        self._run(self._user_command(request.name, "delete_user"), context)
        return pb.Empty()

    def SetPermissions(self, request, context):  # noqa: N802
        patterns = (request.configure, request.write, request.read)
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad regular expression {pattern!r}: {exc}")
        return self._run(self._user_command(request.user, "set_permissions", request.vhost or "/", *patterns),
                         context)

    def ClearPermissions(self, request, context):  # noqa: N802
        return self._run(self._user_command(request.user, "clear_permissions", request.vhost or "/"), context)

    async def _user_command(self, name: str, operation: str, *args):
        machine, configured = self.broker.machine, self.broker.config.users
        if operation != "put_user" and not Q.has_user(machine, name):
            if name not in configured:
                raise AdminError(404, f"NOT_FOUND - no user '{name}'")
            if operation == "delete_user":
                raise AdminError(405, f"user '{name}' is defined in the configuration file; create it here "
                                      "(put-user) to manage it through the cluster")
            # Permissions of a configuration-file user: the replicated overlay (store/core/users.py).
        await getattr(self.control, operation)(name, *args)
        user = Q.user(machine, name)  # as the command left it
        if user is None:
            config = configured.get(name)
            if config is None:
                return pb.UserInfo(name=name)
            return _user_info(name, config.tags, config.loopback_only, self._config_permissions(name), "config")
        return _user_info(user.name, user.tags, user.loopback_only, user.permissions, "cluster")

    def _config_permissions(self, name: str) -> dict:
        return overlaid(self.broker.config.users[name].permissions, Q.permission_overlay(self.broker.machine, name))

    # ------------------------------------------------------------------ vhost and user limits

    def SetLimits(self, request, context):  # noqa: N802
        return self._run(self._set_limits(request), context)

    def ClearLimits(self, request, context):  # noqa: N802
        return self._run(self._clear_limits(request), context)

    def ListLimits(self, request, context):  # noqa: N802
        return self._run(self._list_limits(request), context)

    def _limits_target(self, r) -> tuple[str, str, dict[str, int]]:
        """(scope, name, its limits now); 400 for an unknown scope, 404 for an unknown vhost or user
        (a user of the configuration file may have limits, as over HTTP: ops/http/limits.py)."""
        scope = r.scope
        if scope not in SCOPES:
            raise AdminError(400, f"unknown limit scope '{scope}' (vhost or user)")
        machine = self.broker.machine
        if scope == "vhost":
            name = r.name or "/"
            if not Q.has_vhost(machine, name):
                raise AdminError(404, f"NOT_FOUND - no vhost '{name}'")
            return scope, name, Q.vhost_limits(machine, name)
        name = r.name
        if not Q.has_user(machine, name) and name not in self.broker.config.users:
            raise AdminError(404, f"NOT_FOUND - no user '{name}'")
        return scope, name, Q.user_limits(machine, name)

    async def _set_limits(self, r):
        """rabbitmqctl's set_vhost_limits replaces the vhost's limits with the definition
        (rabbit_vhost_limit:set); set_user_limits adds the definition's to the user's others
        (internal_user:update_limits add)."""
        scope, name, current = self._limits_target(r)
        try:
            definition = json.loads(r.definition)
        except ValueError as exc:
            raise AdminError(400, f"the limits are not JSON: {exc}") from None
        if not isinstance(definition, dict) or not definition:
            raise AdminError(400, 'the limits must be a JSON object such as {"max-queues": 100}')
        if any(value is None for value in definition.values()):
            raise AdminError(400, f"a limit is an integer (clear it with clear-{scope}-limits)")
        reason = check_limits(scope, definition)
        if reason is not None:
            raise AdminError(400, reason)
        changes: dict[str, int | None] = dict(definition)
        if scope == "vhost":
            changes.update({key: None for key in current if key not in definition})
        await self.control.set_limits(scope, name, changes)
        return self._limits_info(scope, name)

    async def _clear_limits(self, r):
        """One limit, or every one ("" or "all", as clear_user_limits' ``all``)."""
        scope, name, current = self._limits_target(r)
        if r.limit in ("", "all"):
            names = list(current)
        else:
            reason = check_limits(scope, {r.limit: None})
            if reason is not None:
                raise AdminError(400, reason)
            names = [r.limit] if r.limit in current else []
        if names:
            await self.control.set_limits(scope, name, dict.fromkeys(names))
        return self._limits_info(scope, name)

    async def _list_limits(self, r):
        if r.name:
            scope, name, _ = self._limits_target(r)
            return pb.LimitsList(limits=[self._limits_info(scope, name)])
        if r.scope not in SCOPES:
            raise AdminError(400, f"unknown limit scope '{r.scope}' (vhost or user)")
        machine = self.broker.machine
        names = Q.limited_vhosts(machine) if r.scope == "vhost" else Q.limited_users(machine)
        return pb.LimitsList(limits=[self._limits_info(r.scope, name) for name in names])

    def _limits_info(self, scope: str, name: str) -> pb.LimitsInfo:
        machine = self.broker.machine
        limits = Q.vhost_limits(machine, name) if scope == "vhost" else Q.user_limits(machine, name)
        return pb.LimitsInfo(scope=scope, name=name, value=json.dumps(limits, sort_keys=True))

    # ------------------------------------------------------------------ Raft log compaction

    def CompactLog(self, request, context):  # noqa: N802
        """Snapshot the whole state at the applied index and cut the journal to it (what the node
        does by itself every ``snapshot_entries`` entries or ``snapshot_seconds``)."""
        try:
            done = self.broker.log.compact(timeout=60)
        except NotReplicated as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TimeoutError as exc:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        return pb.CompactReply(snapshot_index=done.snapshot_index, journal_entries=done.journal_entries)


def _user_info(name: str, tags, loopback_only: bool, permissions: dict, source: str) -> pb.UserInfo:
    return pb.UserInfo(name=name, tags=list(tags), loopback_only=loopback_only, source=source,
                       permissions=[pb.Permission(vhost=vh, configure=p[0], write=p[1], read=p[2])
                                    for vh, p in sorted(permissions.items())])


class CredentialsInterceptor(grpc.ServerInterceptor):
    """Every admin call needs a user with the administrator tag (basic auth in the ``authorization``
    metadata): UNAUTHENTICATED without valid credentials, PERMISSION_DENIED without the tag.  The
    standard health service stays open, as load balancers probe it without credentials."""

    def __init__(self, gatekeeper: Gatekeeper) -> None:
        self.gatekeeper = gatekeeper

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(f"/{ADMIN_SERVICE}/"):
            return handler
        if handler.unary_unary is None:
            return None  # the admin service has unary methods only: any other is UNIMPLEMENTED, never open
        inner, gatekeeper = handler.unary_unary, self.gatekeeper

        def checked(request, context):
            metadata = dict(context.invocation_metadata())
            operator = gatekeeper.login_header(metadata.get("authorization"), _peer_host(context.peer()))
            if operator is None:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "login failed: the admin API needs a user "
                              "and password (raftmq admin --user/--password)")
            if not operator.has(ADMINISTRATOR):
                context.abort(grpc.StatusCode.PERMISSION_DENIED, f"user '{operator.name}' is not an administrator")
            # Who asks, for the audit notes of administrative changes (ops/control.py ACTOR): the
            # coroutine this call runs on the loop copies this thread's context.
            ACTOR.set(Actor(operator.name, "grpc", context.peer()))
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(checked, request_deserializer=handler.request_deserializer,
                                                   response_serializer=handler.response_serializer)


def _peer_host(peer: str) -> str | None:
    """gRPC's peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``) -> the host."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


ADMIN_SERVICE = "raftmq.admin.Admin"
HEALTH_INTERVAL = 0.5  # seconds between refreshes of the standard health service


def serve_admin(broker: Broker, loop: asyncio.AbstractEventLoop, host: str, port: int,
                gatekeeper: Gatekeeper | None = None) -> grpc.Server:
    """The admin service, plus the standard ``grpc.health.v1.Health`` service (for load balancers
    and orchestrators: SERVING while the node can make progress, i.e. has a cluster leader)."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    config = broker.config
    # Sockets that never finish the HTTP/2 handshake, idle connections and their number are
    # bounded (issue 31: grpc core keeps a silent socket for 120 s, an idle one for ever, and
    # accepts any number): measured here with grpc 1.85, silent and preface-only sockets closed.
    options = [("grpc.server_handshake_timeout_ms", int(config.admin_handshake_timeout * 1000)),
               ("grpc.max_connection_idle_ms", int(config.admin_idle_timeout * 1000)),
               ("grpc.max_allowed_incoming_connections", config.admin_max_connections)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="raftmq-admin"),
                         interceptors=[CredentialsInterceptor(gatekeeper or Gatekeeper(broker))], options=options)
    pb_grpc.add_AdminServicer_to_server(AdminService(broker, loop), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if config.admin_tls_cert:
        with open(config.admin_tls_key, "rb") as key, open(config.admin_tls_cert, "rb") as cert:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        server.add_secure_port(f"{host}:{port}", credentials)
    else:
        server.add_insecure_port(f"{host}:{port}")
    server.start()

    async def refresh_health() -> None:
        serving = health_pb2.HealthCheckResponse.SERVING
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        while True:
            status = serving if broker.accepting else not_serving
            for service in ("", ADMIN_SERVICE):
                health_servicer.set(service, status)
            await asyncio.sleep(HEALTH_INTERVAL)

    server.health_task = loop.create_task(refresh_health())  # cancelled with the loop's other tasks
    log.info("admin gRPC on %s:%d", host, port)
    return server


class _Credentials(grpc.UnaryUnaryClientInterceptor):
    """Adds basic-auth metadata to every call (also over plaintext: the admin port is meant for
    loopback or a private network unless admin_tls_cert is set)."""

    def __init__(self, header: str | None) -> None:
        self.header = header

    def intercept_unary_unary(self, continuation, client_call_details, request):
        if self.header is not None:
            metadata = list(client_call_details.metadata or []) + [("authorization", self.header)]
            client_call_details = client_call_details._replace(metadata=metadata)
        return continuation(client_call_details, request)


def admin_stub(address: str, tls_ca: str | None = None, user: str | None = "guest",
               password: str = "guest") -> pb_grpc.AdminStub:
    """A client of a node's admin API; ``tls_ca``: a PEM file to verify a TLS admin port with;
    ``user`` None sends no credentials (for tests of the refusal)."""
    if tls_ca:
        with open(tls_ca, "rb") as fh:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=fh.read()))
    else:
        channel = grpc.insecure_channel(address)
    header = basic_header(user, password) if user is not None else None
    return pb_grpc.AdminStub(grpc.intercept_channel(channel, _Credentials(header)))
