"""The gRPC admin service of a node (ops/proto/admin.proto) and the client side of `raftmq admin`.

The service runs grpc's thread-pool server beside the node's event loop. Every handler hands its
work to the loop (``run_coroutine_threadsafe``) because the state machine belongs to the loop
thread; changes (declare, delete, purge) are commands through the log like any client's, issued
on the admin's own channel, so they replicate and answer with the same errors.

Bind address: the node's host, port ``admin_port`` (``raftmq cluster up`` uses 15672+i). There is no
authentication yet: keep it on loopback or a private network.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import time
from concurrent import futures
from typing import TYPE_CHECKING

import grpc

from raftmq.store.commands import ERR, Op

from .proto import admin_pb2 as pb
from .proto import admin_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

log = logging.getLogger(__name__)

ADMIN_CHANNEL = 1
GRPC_CODES = {404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.FAILED_PRECONDITION,
              406: grpc.StatusCode.FAILED_PRECONDITION, 403: grpc.StatusCode.PERMISSION_DENIED}


class AdminEndpoint:
    """The admin's pseudo-connection: receives the replies to its commands."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.conn_id = broker.register(self)
        self._tokens = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._channel_open = False

    async def command(self, op: Op, *args):
        """Apply a command through the log on the admin channel; its result value (raises on ERR)."""
        if not self._channel_open:
            self._channel_open = True
            await self._request([Op.CHANNEL_OPEN, self.conn_id, None, ADMIN_CHANNEL])
        return await self._request([op, self.conn_id, None, ADMIN_CHANNEL, *args])

    async def _request(self, command: list):
        token = next(self._tokens)
        command[2] = token
        future = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        self.broker.submit(command)
        result = await asyncio.wait_for(future, 10)
        if result[0] == ERR:
            if result[1] not in (404, 405, 406, 403):
                self._channel_open = False  # a hard error closed the admin channel
            raise AdminError(result[1], result[2])
        return result[1]

    def on_reply(self, token, result, channel) -> None:
        future = self._waiting.pop(token, None) if token is not None else None
        if future is not None and not future.done():
            future.set_result(result)
        elif token is None and result[0] == ERR:
            self._channel_open = False

    def on_deliver(self, *args) -> None:
        pass

    def on_transfer(self, *args) -> None:
        pass

    def on_cancel(self, *args) -> None:
        pass

    def on_session_detached(self, *args) -> None:
        pass

    def on_forced_close(self, *args) -> None:
        self._channel_open = False

    def flush(self) -> None:
        pass

    def set_blocked(self, reason) -> None:
        pass


class AdminError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def _typed(value: str):
    return int(value) if value.lstrip("-").isdigit() else value


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, broker: Broker, loop: asyncio.AbstractEventLoop) -> None:
        self.broker = broker
        self.loop = loop
        self.endpoint: AdminEndpoint | None = None

    def _run(self, coro, context):
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(15)
        except AdminError as exc:
            context.abort(GRPC_CODES.get(exc.code, grpc.StatusCode.INTERNAL), exc.text)

    async def _endpoint(self) -> AdminEndpoint:
        if self.endpoint is None:
            self.endpoint = AdminEndpoint(self.broker)
        return self.endpoint

    # ------------------------------------------------------------------ reads

    def Status(self, request, context):  # noqa: N802 - gRPC method names
        return self._run(self._status(), context)

    async def _status(self):
        from raftmq.node.status import status_of

        broker = self.broker
        st = status_of(broker)
        connected = set(st.get("connected_partners") or [])
        replica = getattr(broker.log, "replica", None)
        lags = _member_lags(replica) if replica is not None and st["role"] == "leader" else {}
        members = [pb.Member(node_id=node_id, raft_address=raft, amqp_address=amqp,
                             connected=node_id == broker.config.node_id or raft in connected,
                             lag=lags.get(raft, 0))
                   for node_id, (raft, amqp) in broker.members.items()]
        return pb.ClusterStatus(
            node_id=broker.config.node_id, role=st["role"], leader_node=st.get("leader_node") or "",
            term=replica.raftCurrentTerm if replica else 0, commit_index=st.get("commit_index") or 0,
            applied_index=st.get("raft_applied") or broker.machine.applied_index, members=members,
            connections=sum(1 for e in broker.endpoints.values() if not isinstance(e, AdminEndpoint)),
            ready=bool(st.get("ready")))

    def Health(self, request, context):  # noqa: N802
        accepting = self.broker.accepting
        return pb.HealthReply(serving=accepting, detail="" if accepting else "no cluster leader")

    def ListQueues(self, request, context):  # noqa: N802
        return self._run(self._list_queues(), context)

    async def _list_queues(self):
        out = []
        for vhost in self.broker.machine.vhosts.values():
            for q in vhost.queues.values():
                out.append(pb.QueueInfo(vhost=vhost.name, name=q.name, durable=q.durable,
                                        exclusive=q.exclusive_owner is not None, auto_delete=q.auto_delete,
                                        messages_ready=len(q.ready), messages_unacked=q.unacked_count,
                                        consumers=len(q.consumers)))
        return pb.QueueList(queues=out)

    def ListExchanges(self, request, context):  # noqa: N802
        return self._run(self._list_exchanges(), context)

    async def _list_exchanges(self):
        return pb.ExchangeList(exchanges=[
            pb.ExchangeInfo(vhost=v.name, name=e.name, type=e.type, durable=e.durable, bindings=len(e.bindings))
            for v in self.broker.machine.vhosts.values() for e in v.exchanges.values()])

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
            pb.ConsumerInfo(vhost=v.name, queue=q.name, tag=c.tag, connection=c.channel.conn,
                            channel=c.channel.number, prefetch=c.prefetch, unacked=c.unacked,
                            ack_required=not c.no_ack)
            for v in self.broker.machine.vhosts.values() for q in v.queues.values() for c in q.consumers])

    # ------------------------------------------------------------------ changes (through the log)

    def DeclareExchange(self, request, context):  # noqa: N802
        return self._run(self._declare_exchange(request), context)

    async def _declare_exchange(self, r):
        endpoint = await self._endpoint()
        args = {k: _typed(v) for k, v in r.arguments.items()}
        await endpoint.command(Op.EXCHANGE_DECLARE, r.vhost or "/", r.name, r.type or "direct", False, r.durable,
                               r.auto_delete, r.internal, args)
        return pb.ExchangeInfo(vhost=r.vhost or "/", name=r.name, type=r.type or "direct", durable=r.durable)

    def DeleteExchange(self, request, context):  # noqa: N802
        return self._run(self._delete_exchange(request), context)

    async def _delete_exchange(self, r):
        endpoint = await self._endpoint()
        await endpoint.command(Op.EXCHANGE_DELETE, r.vhost or "/", r.name, r.if_unused)
        return pb.Empty()

    def DeclareQueue(self, request, context):  # noqa: N802
        return self._run(self._declare(request), context)

    async def _declare(self, r):
        endpoint = await self._endpoint()
        args = {k: _typed(v) for k, v in r.arguments.items()}
        name, messages, consumers = await endpoint.command(
            Op.QUEUE_DECLARE, r.vhost or "/", r.name, False, r.durable, False, r.auto_delete, args)
        return pb.QueueInfo(vhost=r.vhost or "/", name=name, durable=r.durable, auto_delete=r.auto_delete,
                            messages_ready=messages, consumers=consumers)

    def DeleteQueue(self, request, context):  # noqa: N802
        return self._run(self._queue_op(Op.QUEUE_DELETE, request, False, False), context)

    def PurgeQueue(self, request, context):  # noqa: N802
        return self._run(self._queue_op(Op.QUEUE_PURGE, request), context)

    async def _queue_op(self, op, r, *extra):
        endpoint = await self._endpoint()
        count = await endpoint.command(op, r.vhost or "/", r.name, *extra)
        return pb.Count(count=count or 0)

    def CloseConnection(self, request, context):  # noqa: N802
        return self._run(self._close(request), context)

    async def _close(self, r):
        endpoint = self.broker.endpoints.get(r.id)
        if endpoint is None or isinstance(endpoint, AdminEndpoint):
            raise AdminError(404, f"no connection '{r.id}' on this node")
        endpoint.close_connection(320, f"CONNECTION_FORCED - {r.reason or 'closed by an administrator'}")
        endpoint.flush()
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
        managed = self.broker.machine.users
        users = [_user_info(u.name, u.tags, u.loopback_only, u.permissions, "cluster") for u in managed.values()]
        users += [_user_info(name, [], u.loopback_only, u.permissions, "config")
                  for name, u in self.broker.config.users.items() if name not in managed]
        return pb.UserList(users=sorted(users, key=lambda u: u.name))

    def PutUser(self, request, context):  # noqa: N802
        if not request.name or not request.password:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a user needs a name and a password")
        from raftmq.node.auth import hash_password

        # Hashed here, with fresh salt: the log and every node's store only ever see the hash.
        password_hash = hash_password(request.password)
        return self._run(self._user_command(request.name, Op.USER_PUT, password_hash, list(request.tags),
                                            request.loopback_only), context)

    def DeleteUser(self, request, context):  # noqa: N802
        self._run(self._user_command(request.name, Op.USER_DELETE), context)
        return pb.Empty()

    def SetPermissions(self, request, context):  # noqa: N802
        patterns = (request.configure, request.write, request.read)
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad regular expression {pattern!r}: {exc}")
        return self._run(self._user_command(request.user, Op.PERMISSION_SET, request.vhost or "/", *patterns),
                         context)

    def ClearPermissions(self, request, context):  # noqa: N802
        return self._run(self._user_command(request.user, Op.PERMISSION_CLEAR, request.vhost or "/"), context)

    async def _user_command(self, name: str, op: Op, *args):
        if op != Op.USER_PUT and name not in self.broker.machine.users and name in self.broker.config.users:
            raise AdminError(405, f"user '{name}' is defined in the configuration file; create it here "
                                  "(put-user) to manage it through the cluster")
        endpoint = await self._endpoint()
        await endpoint.command(op, name, *args)
        user = self.broker.machine.users.get(name)
        if user is None:
            return pb.UserInfo(name=name)
        return _user_info(user.name, user.tags, user.loopback_only, user.permissions, "cluster")

    # ------------------------------------------------------------------ Raft log compaction

    def CompactLog(self, request, context):  # noqa: N802
        """Snapshot the whole state at the applied index and cut the journal to it (what the node
        does by itself every ``snapshot_entries`` entries or ``snapshot_seconds``)."""
        replica = getattr(self.broker.log, "replica", None)
        if replica is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "a single node keeps no Raft log: its state is in LMDB (raftmq snapshot copies it)")
        target = replica.last_applied
        replica.forceLogCompaction()
        deadline = time.monotonic() + 60
        while True:
            try:
                head, snapshot_index, entries = replica.journal[0][1], replica.journal[1][1], len(replica.journal)
            except IndexError:  # the tick thread is rewriting the journal right now
                head = snapshot_index = entries = 0
            if head >= target - 1 and entries:
                return pb.CompactReply(snapshot_index=snapshot_index, journal_entries=entries)
            if time.monotonic() > deadline:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no snapshot at index {target} within 60 s")
            time.sleep(0.05)


def _user_info(name: str, tags, loopback_only: bool, permissions: dict, source: str) -> pb.UserInfo:
    return pb.UserInfo(name=name, tags=list(tags), loopback_only=loopback_only, source=source,
                       permissions=[pb.Permission(vhost=vh, configure=p[0], write=p[1], read=p[2])
                                    for vh, p in sorted(permissions.items())])


def _member_lags(replica) -> dict[str, int]:
    """On the leader: per member Raft address, committed entries it has not acknowledged yet."""
    commit = replica.commit_index
    return {address: max(0, commit - index) for address, index in replica.match_indexes().items()}


ADMIN_SERVICE = "raftmq.admin.Admin"
HEALTH_INTERVAL = 0.5  # seconds between refreshes of the standard health service


def serve_admin(broker: Broker, loop: asyncio.AbstractEventLoop, host: str, port: int) -> grpc.Server:
    """The admin service, plus the standard ``grpc.health.v1.Health`` service (for load balancers
    and orchestrators: SERVING while the node can make progress, i.e. has a cluster leader)."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="raftmq-admin"))
    pb_grpc.add_AdminServicer_to_server(AdminService(broker, loop), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    config = broker.config
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


def admin_stub(address: str, tls_ca: str | None = None) -> pb_grpc.AdminStub:
    """A client of a node's admin API; ``tls_ca``: a PEM file to verify a TLS admin port with."""
    if tls_ca:
        with open(tls_ca, "rb") as fh:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=fh.read()))
    else:
        channel = grpc.insecure_channel(address)
    return pb_grpc.AdminStub(channel)
