"""Changes an operator makes -- declare, delete, purge, bind, publish, get, users -- as log commands.

Both management front ends (the gRPC admin, ops/admin.py, and the HTTP API, ops/http/) change the
broker only through here: every change is a command through the log, issued on the admin's own
pseudo-connection and channel, so it replicates and answers with the same errors as a client's.
Runs on the broker's event loop (the state machine belongs to it).
"""

from __future__ import annotations

import asyncio
import itertools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.store.core.commands import (
    ERR,
    Ack,
    ChannelClose,
    ChannelOpen,
    Command,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    Get,
    LimitsSet,
    Nack,
    PermissionClear,
    PermissionSet,
    Publish,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    UserDelete,
    UserPut,
    VhostAdd,
    VhostDelete,
)

if TYPE_CHECKING:
    from raftmq.node.broker import Broker, Endpoint
    from raftmq.node.core.access import Access
    from raftmq.store.core.model import Message

ADMIN_CHANNEL = 1


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asks for an administrative change: the operator's user, the API (``http``, ``grpc``)
    and the address it came from.  Set by each API once it has checked the credentials."""

    user: str
    protocol: str
    address: str


# The actor of the request being served (a context variable: the HTTP handler's task, or the task a
# gRPC call runs in, copied from the gRPC thread that set it).  Read by Control's administrative
# changes for their audit note (node/audit.py, issue 36); None: the node itself (configuration).
ACTOR: ContextVar[Actor | None] = ContextVar("raftmq_admin_actor", default=None)


class AdminError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class AdminEndpoint:
    """The admin's pseudo-connection: receives the replies to its commands."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.conn_id = broker.register(self)
        self._tokens = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._channel_open = False
        self._opening = asyncio.Lock()  # concurrent requests reopen the channel once

    async def command(self, kind: type, *args, access: Access | None = None):
        """Apply a command through the log on the admin channel; its result value (raises on ERR).

        ``access``: the operator's permissions in the vhost (HTTP management users): the command
        is authorized by the rule every protocol uses (node/core/access.py; AccessRefused) before
        anything is submitted.  None: an administrator acting as the broker (gRPC admin, definitions)."""
        command = kind(self.conn_id, None, ADMIN_CHANNEL, *args)
        if access is not None:
            access.authorize(command)
        if not self._channel_open:
            async with self._opening:
                if not self._channel_open:
                    # After an error the channel may be closed (a channel exception) or still open
                    # (a connection-level code such as 530): close it either way -- a no-op when it
                    # is gone -- and open it afresh.
                    await self._request(ChannelClose(self.conn_id, None, ADMIN_CHANNEL))
                    await self._request(ChannelOpen(self.conn_id, None, ADMIN_CHANNEL))
                    self._channel_open = True
        return await self._request(command)

    def reset_channel(self) -> None:
        """Close the admin channel now (what it holds unacked goes back to its queues); the next
        command opens it again."""
        self._channel_open = False
        self.broker.submit(ChannelClose(self.conn_id, None, ADMIN_CHANNEL))

    async def add_vhost(self, name: str) -> None:
        """VhostAdd has no channel (the reply still comes here)."""
        await self._request(VhostAdd(self.conn_id, None, name))

    async def delete_vhost(self, name: str) -> None:
        """VhostDelete has no channel either; 404 (AdminError) for an unknown vhost."""
        await self._request(VhostDelete(self.conn_id, None, name))

    async def _request(self, command: Command):
        token = next(self._tokens)
        command = command._replace(token=token)
        future = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        self.broker.submit(command)
        try:
            result = await asyncio.wait_for(future, 10)
        finally:
            self._waiting.pop(token, None)
        if result.status == ERR:
            self._channel_open = False  # see command()
            raise AdminError(result.code, result.text)
        return result.value

    def on_reply(self, token, result, channel) -> None:
        future = self._waiting.pop(token, None) if token is not None else None
        if future is not None and not future.done():
            future.set_result(result)
        elif token is None and result.status == ERR:
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

    def resume_flow(self) -> None:
        pass  # never paused for flow: the broker pauses the front ends that read publishers


@dataclass(frozen=True, slots=True)
class Fetched:
    """One message taken by ``Control.get``."""

    message: Message
    redelivered: bool
    remaining: int  # messages left ready in the queue after this one
    body: bytes


GET_ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")


class Control:
    """The operations, each one command (or a few) on one admin endpoint created on first use."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._endpoint: AdminEndpoint | None = None

    @property
    def endpoint(self) -> AdminEndpoint:
        if self._endpoint is None:
            self._endpoint = AdminEndpoint(self.broker)
        return self._endpoint

    async def declare_queue(self, vhost: str, name: str, durable: bool, auto_delete: bool = False,
                            arguments: dict | None = None, access: Access | None = None) -> tuple[str, int, int]:
        """(name, ready messages, consumers): queue.declare's answer; 406 for different properties."""
        return await self.endpoint.command(QueueDeclare, vhost, name, False, durable, False, auto_delete,
                                           arguments or {}, access=access)

    async def delete_queue(self, vhost: str, name: str, if_unused: bool = False, if_empty: bool = False,
                           access: Access | None = None) -> int:
        return await self.endpoint.command(QueueDelete, vhost, name, if_unused, if_empty, access=access) or 0

    async def purge_queue(self, vhost: str, name: str, access: Access | None = None) -> int:
        return await self.endpoint.command(QueuePurge, vhost, name, access=access) or 0

    async def declare_exchange(self, vhost: str, name: str, type_: str, durable: bool, auto_delete: bool = False,
                               internal: bool = False, arguments: dict | None = None,
                               access: Access | None = None) -> None:
        await self.endpoint.command(ExchangeDeclare, vhost, name, type_, False, durable, auto_delete,
                                    internal, arguments or {}, access=access)

    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False,
                              access: Access | None = None) -> None:
        await self.endpoint.command(ExchangeDelete, vhost, name, if_unused, access=access)

    async def bind(self, vhost: str, source: str, destination: str, to_queue: bool, routing_key: str,
                   arguments: dict | None = None, access: Access | None = None) -> None:
        # queue.bind takes (queue, exchange); exchange.bind (destination, source): the same order.
        op = QueueBind if to_queue else ExchangeBind
        await self.endpoint.command(op, vhost, destination, source, routing_key, arguments or {}, access=access)

    async def unbind(self, vhost: str, source: str, destination: str, to_queue: bool, routing_key: str,
                     arguments: dict | None = None, access: Access | None = None) -> None:
        op = QueueUnbind if to_queue else ExchangeUnbind
        await self.endpoint.command(op, vhost, destination, source, routing_key, arguments or {}, access=access)

    async def publish(self, vhost: str, exchange: str, routing_key: str, properties: bytes, body: bytes,
                      persistent: bool, priority: int | None, expiration_ms: int | None,
                      access: Access | None = None) -> int:
        """The publish outcome: store.core.commands ROUTED, UNROUTABLE or REJECTED."""
        return await self.endpoint.command(Publish, vhost, exchange, routing_key, False, properties, body,
                                           persistent, priority, expiration_ms, access=access)

    async def get(self, vhost: str, queue: str, count: int, ackmode: str,
                  access: Access | None = None) -> list[Fetched]:
        """Up to ``count`` messages by basic.get, then settled all together by ``ackmode`` (RabbitMQ's
        management semantics: with a requeue mode the same message is not fetched twice in one call,
        as each stays unacked until the end)."""
        if ackmode not in GET_ACK_MODES:
            raise AdminError(400, f"ackmode must be one of {', '.join(GET_ACK_MODES)}")
        fetched: list[Fetched] = []
        refs: list[tuple[int, int]] = []
        try:
            for _ in range(count):
                got = await self.endpoint.command(Get, vhost, queue, False, access=access)
                if got is None:
                    break
                qid, seq, redelivered, message, remaining, body = got
                refs.append((qid, seq))
                fetched.append(Fetched(message, redelivered, remaining, body))
            if refs:
                if ackmode == "ack_requeue_false":
                    await self.endpoint.command(Ack, refs)
                else:
                    await self.endpoint.command(Nack, refs, ackmode.endswith("requeue_true"))
        except BaseException:
            # Failed or cancelled half way (a timeout, the caller gone): whatever was taken must not
            # stay unacked on the admin channel for good -- closing it requeues it.
            if refs:
                self.endpoint.reset_channel()
            raise
        return fetched

    # Administrative changes: each one that took effect is noted for the audit history, with who
    # asked (``ACTOR``) and what changed -- never a password or its hash (node/audit.py, issue 36).

    async def put_user(self, name: str, password_hash: str, tags: list[str], loopback_only: bool = False) -> None:
        """``password_hash``: made by the caller (node.auth.hash_password) before the command, so that
        apply never draws random salt and the log never sees the password."""
        await self.endpoint.command(UserPut, name, password_hash, list(tags), loopback_only)
        self._noted(f"put_user user={name!r} tags={','.join(tags)!r} loopback_only={bool(loopback_only)}")

    async def delete_user(self, name: str) -> None:
        await self.endpoint.command(UserDelete, name)
        self._noted(f"delete_user user={name!r}")

    async def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        await self.endpoint.command(PermissionSet, user, vhost, configure, write, read)
        self._noted(f"set_permissions user={user!r} configure={configure!r} write={write!r} read={read!r}", vhost)

    async def clear_permissions(self, user: str, vhost: str) -> None:
        await self.endpoint.command(PermissionClear, user, vhost)
        self._noted(f"clear_permissions user={user!r}", vhost)

    async def add_vhost(self, name: str) -> None:
        await self.endpoint.add_vhost(name)
        self._noted(f"add_vhost vhost={name!r}", name)

    async def set_limits(self, scope: str, name: str, limits: dict) -> None:
        """Set (int) or clear (None) limits of a vhost or user (store/core/limits.py)."""
        await self.endpoint.command(LimitsSet, scope, name, dict(limits))
        changes = ",".join(f"{key}={value}" for key, value in sorted(limits.items()))
        self._noted(f"set_limits {scope}={name!r} {changes}", name if scope == "vhost" else "")

    async def delete_vhost(self, name: str) -> None:
        """Everything in the vhost goes, and its connections are closed (store/core/topology.py)."""
        await self.endpoint.delete_vhost(name)
        self._noted(f"delete_vhost vhost={name!r}", name)

    def _noted(self, what: str, vhost: str = "") -> None:
        actor = ACTOR.get()
        if actor is None:
            self.broker.audit.admin_change("", "node", "", what, vhost)
        else:
            self.broker.audit.admin_change(actor.user, actor.protocol, actor.address, what, vhost)

    def close_connection(self, conn_id: str, reason: str) -> None:
        """Close a client connection of this node (320 CONNECTION_FORCED, as rabbitmqctl does)."""
        endpoint = self.broker.endpoints.get(conn_id)
        if endpoint is None or isinstance(endpoint, AdminEndpoint) or not hasattr(endpoint, "close_connection"):
            raise AdminError(404, f"no connection '{conn_id}' on this node")
        endpoint.close_connection(320, f"CONNECTION_FORCED - {reason or 'closed by an administrator'}")
        endpoint.flush()


if TYPE_CHECKING:  # the broker's interface (node/broker.py), checked by mypy
    _endpoint: type[Endpoint] = AdminEndpoint
