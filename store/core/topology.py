"""Vhosts, exchanges, queues and bindings: declaring, binding, deleting, and routing a message to its queues.

A concern of the state machine: how the concerns meet is in store/core/machine.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from . import events as EV
from .commands import (
    OUT_CANCEL,
    OUT_VHOST_CLOSED,
    DeclaredQueue,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    OutCancel,
    OutVhostClosed,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    VhostAdd,
    VhostDelete,
)
from .dedup import DedupCache
from .errors import CommandError
from .exchange_types import LOCAL_RANDOM, PLUGIN_TYPES, pick_local_random, validate_binding
from .exchange_types import validate as validate_plugin_exchange
from .groups import GroupPending
from .headers import message_headers
from .message import AMQP091, Properties, codec
from .model import Exchange, Message, Queue, ReadyList, VHost
from .persistence import binding_key
from .queue_args import EQUIVALENCE_ARGS, QueueSettings, parse_queue_arguments
from .routing import Binding

if TYPE_CHECKING:
    from .machine import StateMachine


EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
DEFAULT_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
    ("amq.failover", "failover"),
)
def _b(flag: bool) -> str:
    return "true" if flag else "false"


class _DependsOnMessage(Exception):
    """A route that reads the message's headers (``Topology.route_static``)."""


def _headers_needed() -> dict:
    raise _DependsOnMessage


class Topology:
    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def vhost_add(self, cmd: VhostAdd) -> None:
        m = self.m
        name = cmd.name
        if name in m.vhosts:
            return None
        vhost = m.vhosts[name] = VHost(name)
        for ex_name, ex_type in DEFAULT_EXCHANGES:
            vhost.exchanges[ex_name] = Exchange(name, ex_name, ex_type, True, False, False, {})
            m.definition_event(EV.EXCHANGE_DECLARED, name, exchange=ex_name, detail=ex_type,
                                   definition=(True, False, False, {}))
        if m._persist is not None:
            m._persist.put_vhost(name)
        return None

    def vhost_delete(self, cmd: VhostDelete) -> None:
        """Delete a vhost as RabbitMQ's rabbit_vhost:delete does: every queue (its messages released,
        its consumers cancelled with the protocol's cancel, unacknowledged deliveries dropped), every
        exchange and binding, every user's permissions on it; then every connection open on it is
        closed with 320 CONNECTION_FORCED (``OUT_VHOST_CLOSED``: each node closes its own).

        The default vhost ``/`` may be deleted too, as in RabbitMQ (rabbitmqctl delete_vhost /);
        a vhost listed in the node's configuration (``vhosts``) is added again when a node starts
        (node/broker.py), as it was before.  Deterministic: the queues and exchanges go in their
        dicts' order, the same on every replica (insertion order, kept by snapshots).  Audit events
        are those of the queue, exchange and binding deletes (delete_queue, delete_exchange)."""
        m = self.m
        name = cmd.name
        vhost = m.vhosts.get(name)
        if vhost is None:
            raise CommandError(404, f"no vhost '{name}'")
        for queue in list(vhost.queues.values()):
            self.delete_queue(queue)
        for exchange in list(vhost.exchanges.values()):
            self.delete_exchange(exchange)
        del m.vhosts[name]
        m.user_commands.forget_vhost(name)
        m.limit_commands.forget("vhost", name)
        if m._persist is not None:
            m._persist.delete_vhost(name)
        m._out.append(OutVhostClosed(None, OUT_VHOST_CLOSED, name, 320, f"CONNECTION_FORCED - vhost '{name}' is deleted"))
        return None

    def exchange_declare(self, cmd: ExchangeDeclare) -> None:
        m = self.m
        (conn, number, vhost_name, name, type_, passive, durable, auto_delete, internal, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.name, cmd.type, cmd.passive, cmd.durable, cmd.auto_delete,
            cmd.internal, cmd.arguments)
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        existing = vhost.exchanges.get(name)
        if name == "":
            # Passive too: "The server MUST NOT allow clients to access the default exchange except
            # by specifying an empty exchange name in the Queue.Bind and content Publish methods"
            # (0-9-1 reference 1.6, class exchange; 0-10 default-exchange rule); RabbitMQ answers this 403.
            raise CommandError(403, "operation not permitted on the default exchange")
        if passive:
            if existing is None:
                raise CommandError(404, f"no exchange '{name}' in vhost '{vhost_name}'")
            return None
        if type_ == "failover" and existing is None:
            # 0-10 11.1.2.3 only_one_failover_exchange: amq.failover is the one.
            raise CommandError(530, "exchanges of type 'failover' cannot be declared")
        if name.startswith("amq.") and existing is None:
            raise CommandError(
                403, f"exchange name '{name}' contains reserved prefix 'amq.*'"
            )
        if existing is not None:
            for what, got, have in (
                ("type", type_, existing.type),
                ("durable", durable, existing.durable),
                ("auto_delete", auto_delete, existing.auto_delete),
                ("internal", internal, existing.internal),
            ):
                if got != have:
                    got_s = got if isinstance(got, str) else _b(got)
                    have_s = have if isinstance(have, str) else _b(have)
                    raise CommandError(
                        406,
                        f"inequivalent arg '{what}' for exchange '{name}' in vhost '{vhost_name}': "
                        f"received '{got_s}' but current is '{have_s}'",
                    )
            return None
        if type_ not in EXCHANGE_TYPES and type_ not in PLUGIN_TYPES and type_ != LOCAL_RANDOM:
            raise CommandError(503, f"unknown exchange type '{type_}'")
        validate_plugin_exchange(type_, args)
        vhost.exchanges[name] = Exchange(vhost_name, name, type_, durable, auto_delete, internal, args)
        m.definition_event(EV.EXCHANGE_DECLARED, vhost_name, exchange=name, detail=type_,
                               definition=(bool(durable), bool(auto_delete), bool(internal), args))
        if durable and m._persist is not None:
            m._persist.put_exchange(vhost_name, name, type_, auto_delete, internal, args)
        return None

    def exchange_delete(self, cmd: ExchangeDelete) -> None:
        m = self.m
        conn, number, vhost_name, name, if_unused = cmd.conn, cmd.channel, cmd.vhost, cmd.name, cmd.if_unused
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        if name == "":
            raise CommandError(403, "operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise CommandError(403, f"exchange '{name}' in vhost '{vhost_name}' is reserved")
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            return None  # RabbitMQ answers delete-ok for a missing exchange
        if if_unused and exchange.bindings:
            raise CommandError(406, f"exchange '{name}' in vhost '{vhost_name}' in use")
        self.delete_exchange(exchange)
        return None

    def delete_exchange(self, exchange: Exchange) -> None:
        m = self.m
        vhost = m.vhosts[exchange.vhost]
        if vhost.exchanges.get(exchange.name) is not exchange:
            return
        # Gone first: removing its last binding below would otherwise auto-delete it again.
        del vhost.exchanges[exchange.name]
        m.plugin_exchanges.forget_exchange(exchange)
        for binding in list(exchange.bindings):
            self.remove_binding(vhost, exchange, binding)
        for binding in list(m.inbound.get((vhost.name, False, exchange.name), ())):
            source = vhost.exchanges.get(binding.source)
            if source is not None:
                self.remove_binding(vhost, source, binding)
        m.definition_event(EV.EXCHANGE_DELETED, vhost.name, exchange=exchange.name, detail=exchange.type)
        if exchange.durable and m._persist is not None:
            m._persist.delete_exchange(vhost.name, exchange.name)

    @overload
    def binding_endpoints(self, vhost: VHost, source: str, dest_is_queue: Literal[True], dest: str,
                          conn: str) -> tuple[Exchange, Queue]: ...

    @overload
    def binding_endpoints(self, vhost: VHost, source: str, dest_is_queue: Literal[False], dest: str,
                          conn: str) -> tuple[Exchange, Exchange]: ...

    def binding_endpoints(self, vhost: VHost, source: str, dest_is_queue: bool, dest: str,
                          conn: str) -> tuple[Exchange, Queue | Exchange]:
        """The source exchange and the destination (a queue or an exchange, as ``dest_is_queue`` says)
        of a binding, or the refusal."""
        m = self.m
        if source == "" or (not dest_is_queue and dest == ""):
            raise CommandError(403, "operation not permitted on the default exchange")
        exchange = m.exchange(vhost, source)
        target: Queue | Exchange
        if dest_is_queue:
            target = m.queue(vhost, dest, conn)
        else:
            target = m.exchange(vhost, dest)
        return exchange, target

    def exchange_bind(self, cmd: ExchangeBind) -> None:
        m = self.m
        (conn, number, vhost_name, destination, source, routing_key, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.destination, cmd.source, cmd.routing_key, cmd.arguments)
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        exchange, target = self.binding_endpoints(vhost, source, False, destination, conn)
        validate_binding(exchange.type, False, routing_key)
        self.add_binding(vhost, exchange, Binding(source, False, destination, routing_key, args),
                          target.durable)

    def exchange_unbind(self, cmd: ExchangeUnbind) -> None:
        m = self.m
        (conn, number, vhost_name, destination, source, routing_key, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.destination, cmd.source, cmd.routing_key, cmd.arguments)
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        exchange = self.unbind_source(vhost, source, False, destination, conn)
        if exchange is not None:
            self.unbind(vhost, exchange, Binding(source, False, destination, routing_key, args))

    def add_binding(self, vhost: VHost, exchange: Exchange, binding: Binding, dest_durable: bool) -> None:
        m = self.m
        if exchange.find_binding(binding) >= 0:
            return
        exchange.bindings.append(binding)
        exchange.rebuild()
        m.inbound.setdefault((vhost.name, binding.dest_is_queue, binding.destination), []).append(binding)
        self.binding_event(EV.BOUND, vhost, binding)
        if exchange.durable and dest_durable and m._persist is not None:
            m._persist.put_binding(self.binding_key(vhost, binding))

    @staticmethod
    def binding_key(vhost: VHost, b: Binding) -> bytes:
        return binding_key(vhost.name, b.source, b.dest_is_queue, b.destination,
                                         b.routing_key, b.arguments)

    def unbind_source(self, vhost: VHost, source: str, dest_is_queue: bool, dest: str,
                      conn: str) -> Exchange | None:
        """The exchange to unbind from, or None when the source or the destination no longer
        exists: then there is no binding to remove and the unbind succeeds, as RabbitMQ's
        rabbit_binding:remove does (it ignores not-found resources, ``absent_errs_only``; bind
        keeps 404). Clients rely on it: aio-pika's RPC pattern unbinds from a dead-letter exchange
        that auto-deleted with its queue. The default exchange is still refused (403) and an
        existing exclusive queue of another connection still locked (405). 0-10, whose spec wants
        not-found here, refuses first in store/core/session_rules.py."""
        if source == "" or (not dest_is_queue and dest == ""):
            raise CommandError(403, "operation not permitted on the default exchange")
        exchange = vhost.exchanges.get(source)
        target = vhost.queues.get(dest) if dest_is_queue else vhost.exchanges.get(dest)
        if exchange is None or target is None:
            return None
        if dest_is_queue:
            self.m.queue(vhost, dest, conn)  # the exclusive-owner check
        return exchange

    def unbind(self, vhost: VHost, exchange: Exchange, wanted: Binding) -> None:
        i = exchange.find_binding(wanted)
        if i >= 0:
            self.remove_binding(vhost, exchange, exchange.bindings[i])

    def binding_event(self, kind: int, vhost: VHost, b: Binding) -> None:
        m = self.m
        m.definition_event(kind, vhost.name, queue=b.destination if b.dest_is_queue else "",
                               exchange=b.source, routing_key=b.routing_key, detail=b.destination,
                               definition=(b.dest_is_queue, b.arguments))

    def remove_binding(self, vhost: VHost, exchange: Exchange, binding: Binding) -> None:
        m = self.m
        exchange.bindings.remove(binding)
        exchange.rebuild()
        self.binding_event(EV.UNBOUND, vhost, binding)
        inbound = m.inbound.get((vhost.name, binding.dest_is_queue, binding.destination))
        if inbound is not None:
            inbound.remove(binding)
            if not inbound:
                del m.inbound[(vhost.name, binding.dest_is_queue, binding.destination)]
        if exchange.durable and m._persist is not None:
            m._persist.delete_binding(self.binding_key(vhost, binding))
        if exchange.auto_delete and not exchange.bindings:
            self.delete_exchange(exchange)

    def queue_declare(self, cmd: QueueDeclare) -> tuple:
        m = self.m
        (conn, number, vhost_name, name, passive, durable, exclusive, auto_delete, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.name, cmd.passive, cmd.durable, cmd.exclusive,
            cmd.auto_delete, cmd.arguments)
        server_named = cmd.server_named  # the front end generated the name
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        existing = vhost.queues.get(name)
        if existing is not None and m.group_count > 1:
            m.groups.placed_existing(existing)  # a forwarded redeclare carries the placement
        if passive:
            queue = m.queue(vhost, name, conn)
            return DeclaredQueue(name, len(queue.ready), len(queue.consumers))
        if existing is not None:
            m.queue(vhost, name, conn)  # exclusive-lock check
            if bool(exclusive) != (existing.exclusive_owner is not None):
                # RabbitMQ checks the owner first and strictly (rabbit_amqqueue:assert_equivalence):
                # a declare whose exclusive flag differs from the queue's is 405, not 406.
                raise CommandError(
                    405,
                    f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost_name}'. "
                    "It could be originally declared on another connection or the exclusive property "
                    "value does not match that of the original declaration.",
                )
            for what, got, have in (
                ("durable", durable, existing.durable),
                ("auto_delete", auto_delete, existing.auto_delete),
            ):
                if got != have:
                    raise CommandError(
                        406,
                        f"inequivalent arg '{what}' for queue '{name}' in vhost '{vhost_name}': "
                        f"received '{_b(got)}' but current is '{_b(have)}'",
                    )
            for key in EQUIVALENCE_ARGS:
                if args.get(key) != existing.arguments.get(key):
                    raise CommandError(
                        406,
                        f"inequivalent arg '{key}' for queue '{name}' in vhost '{vhost_name}': "
                        f"received {args.get(key)!r} but current is {existing.arguments.get(key)!r}",
                    )
            self.touch(existing)
            return DeclaredQueue(name, len(existing.ready), len(existing.consumers))
        if name.startswith("amq.") and not server_named:
            raise CommandError(403, f"queue name '{name}' contains reserved prefix 'amq.*'")
        settings = parse_queue_arguments(args, name, vhost_name)  # refused before anything changes
        m.limit_commands.check_queue_limit(conn, vhost_name, len(vhost.queues), name)  # max-queues (store/core/limits.py)
        owner = (m._caller_owner or conn) if exclusive else None  # 0-10: the session owns it
        if m.group_count > 1 or m.forwarded_placement is not None:
            qid, group = m.groups.place(args, conn, number)  # issue 34: decided by the metadata group
        else:
            qid, group = m.next_qid, 0
            m.next_qid += 1
        queue = Queue(qid, vhost_name, name, durable, owner, auto_delete, args, group=group)
        self.configure_queue(queue, settings)
        self.register_queue(vhost, queue)
        m.definition_event(EV.QUEUE_DECLARED, vhost_name, queue=name, detail=owner or "",
                               definition=(bool(durable), bool(exclusive), bool(auto_delete), args))
        if durable and not exclusive and m._persist is not None:
            m._persist.put_queue(vhost_name, name, queue.qid, auto_delete, args)
        return DeclaredQueue(name, 0, 0)

    def configure_queue(self, queue: Queue, settings: QueueSettings) -> None:
        """Give a new queue its x-argument settings (validated already: parse_queue_arguments)."""
        m = self.m
        queue.message_ttl = settings.message_ttl
        queue.max_length = settings.max_length
        queue.max_length_bytes = settings.max_length_bytes
        queue.max_priority = settings.max_priority
        queue.dead_letter_exchange = settings.dead_letter_exchange
        queue.dead_letter_routing_key = settings.dead_letter_routing_key
        queue.overflow = settings.overflow
        queue.delivery_limit = settings.delivery_limit
        queue.delivery_header = settings.delivery_header
        queue.no_local = settings.no_local
        if settings.deduplicate:
            ttl = settings.cache_ttl * 1000 if settings.cache_ttl is not None else None
            queue.dedup = DedupCache(settings.cache_size, ttl)
        queue.ready = ReadyList(queue.max_priority)
        if settings.expires is not None and queue.group == m.group:  # a stub never expires on its own
            m.idle_expiring[queue.qid] = queue
            m.queue_last_used[queue.qid] = m._now

    def register_queue(self, vhost: VHost, queue: Queue) -> None:
        m = self.m
        vhost.queues[queue.name] = queue
        m.queues_by_id[queue.qid] = queue
        if queue.exclusive_owner is not None:
            m.exclusive_queues.setdefault(queue.exclusive_owner, {})[queue.qid] = queue

    def touch(self, queue: Queue) -> None:
        m = self.m
        if queue.qid in m.idle_expiring:
            m.queue_last_used[queue.qid] = m._now

    def queue_bind(self, cmd: QueueBind) -> None:
        m = self.m
        (conn, number, vhost_name, queue_name, exchange_name, routing_key, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.queue, cmd.exchange, cmd.routing_key, cmd.arguments)
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        exchange, queue = self.binding_endpoints(vhost, exchange_name, True, queue_name, conn)
        validate_binding(exchange.type, True, routing_key)
        if exchange.type == "failover" and queue.exclusive_owner is None:
            # 0-10 11.1.2.3 failover_exchange_disallow_shared_queues
            raise CommandError(530, f"only exclusive queues may be bound to '{exchange_name}'")
        self.add_binding(vhost, exchange, Binding(exchange_name, True, queue_name, routing_key, args),
                          queue.durable and queue.exclusive_owner is None)
        if exchange.type == "failover":
            self.failover_update([queue])  # failover_exchange_behavior 1: an update at once

    def failover_update(self, queues: list[Queue] | None = None) -> None:
        """Write a failover update (empty body, header amq.failover = member URLs) into queues bound
        to amq.failover: the given ones, or all of them when the member set changed."""
        m = self.m
        if queues is None:
            queues = []
            for vhost in m.vhosts.values():
                failover = vhost.exchanges.get("amq.failover")
                for binding in failover.bindings if failover else ():
                    queue = vhost.queues.get(binding.destination)
                    if queue is not None and queue not in queues:
                        queues.append(queue)
        if not queues:
            return
        urls = [f"amqp:tcp:{amqp}" for _raft, amqp in m.members.values()]
        props = codec(AMQP091).encode(Properties(headers={"amq.failover": urls}))
        for queue in queues:
            message = Message(m.next_msg_id, "amq.failover", "", props, 0, False, 0, m._now, live=1)
            m.next_msg_id += 1
            m.delivery.enqueue(queue, message, None)
            m.delivery.keep_body(message, b"")

    def queue_unbind(self, cmd: QueueUnbind) -> None:
        m = self.m
        (conn, number, vhost_name, queue_name, exchange_name, routing_key, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.queue, cmd.exchange, cmd.routing_key, cmd.arguments)
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        exchange = self.unbind_source(vhost, exchange_name, True, queue_name, conn)
        if exchange is not None:
            self.unbind(vhost, exchange, Binding(exchange_name, True, queue_name, routing_key, args))

    def queue_purge(self, cmd: QueuePurge) -> int:
        m = self.m
        conn, number, vhost_name, name = cmd.conn, cmd.channel, cmd.vhost, cmd.name
        m.channel(conn, number)
        queue = m.queue(m.vhost(vhost_name), name, conn)
        if queue.group != m.group:
            m.groups.check_own(queue)
        count = 0
        for entry in queue.ready.drain():
            m.event(EV.PURGED, queue, entry.message)
            m.delivery.drop(queue, entry)
            count += 1
        queue.ready_bytes = 0
        return count

    def queue_delete(self, cmd: QueueDelete) -> int | GroupPending:
        m = self.m
        (conn, number, vhost_name, name, if_unused, if_empty) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.name, cmd.if_unused, cmd.if_empty)
        m.channel(conn, number)
        vhost = m.vhost(vhost_name)
        queue = vhost.queues.get(name)
        if queue is None:
            return 0  # RabbitMQ: deleting a missing queue succeeds with a count of 0
        m.queue(vhost, name, conn)
        if queue.group != m.group:
            m.groups.check_own(queue)
        if if_unused and queue.consumers:
            raise CommandError(406, f"queue '{name}' in vhost '{vhost_name}' in use")
        if if_empty and len(queue.ready):
            raise CommandError(406, f"queue '{name}' in vhost '{vhost_name}' is not empty")
        count = len(queue.ready)
        if m.group_count > 1:
            m.groups.deleting_for = (conn, cmd.token)
            self.delete_queue(queue)
            return m.groups.delete_reply(count, True)
        self.delete_queue(queue)
        return count

    def delete_queue(self, queue: Queue) -> None:
        m = self.m
        vhost = m.vhosts[queue.vhost]
        if vhost.queues.get(queue.name) is not queue:
            return
        del vhost.queues[queue.name]
        del m.queues_by_id[queue.qid]
        m.expiring.pop(queue.qid, None)
        m.idle_expiring.pop(queue.qid, None)
        m.queue_last_used.pop(queue.qid, None)
        m.queue_counts.pop(queue.qid, None)
        if queue.exclusive_owner is not None:
            m.exclusive_queues.get(queue.exclusive_owner, {}).pop(queue.qid, None)
        for consumer in [*queue.consumers, *queue.browsers]:
            m._out.append(OutCancel(consumer.channel.conn, OUT_CANCEL, consumer.channel.number, consumer.tag))
            consumer.channel.consumers.pop(consumer.tag, None)
        queue.consumers.clear()
        queue.browsers.clear()
        queue.selective.clear()
        m.rescan.pop(queue.qid, None)
        # Unacked entries are discarded with the queue; their holders forget them.
        if queue.unacked_count:
            for ch_map in m.channels.values():
                for ch in ch_map.values():
                    for key in [k for k in ch.unacked if k[0] == queue.qid]:
                        entry = ch.unacked.pop(key)[1]
                        m.event(EV.DELETED, queue, entry.message, "unacked")
                        m.delivery.release_message(entry)
        m.delivery.release_deleted(queue, queue.ready.take_all())
        for binding in list(m.inbound.get((vhost.name, True, queue.name), ())):
            source = vhost.exchanges.get(binding.source)
            if source is not None:
                self.remove_binding(vhost, source, binding)
        m._dirty.pop(queue.qid, None)
        m.definition_event(EV.QUEUE_DELETED, vhost.name, queue=queue.name)
        if queue.durable and queue.exclusive_owner is None and m._persist is not None:
            m._persist.delete_queue(vhost.name, queue.name, queue.qid)
        if m.group_count > 1:
            m.groups.deleted(queue)

    def route(self, vhost: VHost, exchange: Exchange, routing_key: str, message: Message) -> list[Queue]:
        if exchange.name == "":
            queue = vhost.queues.get(routing_key)
            return [queue] if queue is not None else []
        headers_cache: list[dict] = []

        def headers() -> dict:
            if not headers_cache:
                headers_cache.append(message_headers(message.properties, message.format))
            return headers_cache[0]

        found: dict[int, Queue] = {}
        visited: dict[str, None] = {}
        self.route_into(vhost, exchange, routing_key, headers, found, visited, message.id)
        return list(found.values())

    def route_static(self, vhost: VHost, exchange: Exchange, routing_key: str) -> list[Queue] | None:
        """The queues ``route`` gives every message published with ``routing_key``, or None when
        the route depends on the message: a headers match on the way, or a local-random exchange
        (its pick is by message id).  For callers that remember routes (node/groups.py)."""
        if exchange.name == "":
            queue = vhost.queues.get(routing_key)
            return [queue] if queue is not None else []
        found: dict[int, Queue] = {}
        visited: dict[str, None] = {}
        try:
            self.route_into(vhost, exchange, routing_key, _headers_needed, found, visited)
        except _DependsOnMessage:
            return None
        exchanges = vhost.exchanges
        if any(exchanges[name].type == LOCAL_RANDOM for name in visited if name in exchanges):
            return None
        return list(found.values())

    def route_into(self, vhost, exchange, routing_key, headers, found, visited, message_id: int = 0) -> None:
        if exchange.name in visited:
            return
        visited[exchange.name] = None
        before = len(found)
        matched = exchange.matcher.match(routing_key, headers)
        if exchange.type == LOCAL_RANDOM:
            matched = pick_local_random(matched, message_id)  # one queue, the same on every replica
        for binding in matched:
            if binding.dest_is_queue:
                queue = vhost.queues.get(binding.destination)
                if queue is not None:
                    found.setdefault(queue.qid, queue)
            else:
                target = vhost.exchanges.get(binding.destination)
                if target is not None:
                    self.route_into(vhost, target, routing_key, headers, found, visited, message_id)
        if len(found) == before:
            alternate = exchange.alternate_exchange
            if alternate is not None and alternate in vhost.exchanges:
                self.route_into(vhost, vhost.exchanges[alternate], routing_key, headers, found, visited,
                                message_id)
