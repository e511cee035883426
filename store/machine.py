"""The broker state machine: the protocol-independent core every front end drives.

``StateMachine.apply(now, commands)`` applies a batch of commands (see ``commands.py``) in order and
returns its *effects* (``effects.py``): the outputs for the connections involved, in order (replies
to requests, deliveries to consumers, server-side consumer cancels), the operations that keep the
single-node LMDB mirror in step, and audit events. Same commands in, same state and effects out on
every node: apply never reads a clock (``now`` comes with the batch, stamped by the proposer), never
draws random numbers, never iterates a ``set`` (hash order varies per process), and does no I/O:
the node carries the effects out.

Routing, queueing, delivery assignment to consumers (round-robin among consumers with credit),
acknowledgements, TTL, dead-lettering, length limits, priorities, delivery limits and publisher
deduplication all happen here, so every node agrees where each message went and who holds it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from sys import intern

from . import events as EV
from .commands import (
    ERR,
    OK,
    OUT_CANCEL,
    OUT_CLOSE,
    OUT_DELIVER,
    OUT_REPLY,
    OUT_TRANSFER,
    REJECTED,
    ROUTED,
    UNROUTABLE,
    Op,
    ok,
)
from .dedup import DedupCache, dedup_key
from .durable import DurableStore, PersistenceRecorder, binding_key
from .effects import Effects
from .errors import HARD_ERRORS, CommandError
from .headers import add_x_death, message_headers, with_delivery_count
from .model import ChannelState, Consumer, Entry, Exchange, Message, Queue, ReadyList, Session, VHost
from .queue_args import EQUIVALENCE_ARGS, QueueSettings, parse_queue_arguments, parse_stored_queue_arguments
from .routing import Binding
from .sessions import SessionMixin
from .users import UserMixin, UserRecord
from .values import as_int

log = logging.getLogger(__name__)

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


class BatchWindow:
    """The sequence numbers of one origin's recent batches (a bounded window, deterministic).

    An origin re-proposes only batches still in flight (at most ``ClusterLog.max_in_flight`` of
    them, within seconds), so a window of the last 4096 sequence numbers is ample.
    """

    __slots__ = ("seen", "order")
    LIMIT = 4096

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.order: deque[int] = deque()

    def add(self, seq: int) -> bool:
        if seq in self.seen:
            return False
        self.seen.add(seq)
        self.order.append(seq)
        if len(self.order) > self.LIMIT:
            self.seen.discard(self.order.popleft())
        return True


class StateMachine(SessionMixin, UserMixin):
    def __init__(self, store: DurableStore | None = None) -> None:
        self.store = store
        self.vhosts: dict[str, VHost] = {}
        self.channels: dict[str, dict[int, ChannelState]] = {}
        self.exclusive_queues: dict[str, dict[int, Queue]] = {}
        self.queues_by_id: dict[int, Queue] = {}
        # Reverse binding index: (vhost, dest_is_queue, destination) -> bindings pointing at it.
        self.inbound: dict[tuple[str, bool, str], list[Binding]] = {}
        self.expiring: dict[int, Queue] = {}  # queues whose ready head may carry an expiry
        self.idle_expiring: dict[int, Queue] = {}  # queues with x-expires
        self.queue_last_used: dict[int, int] = {}
        self.next_qid = 1
        self.next_msg_id = 1
        self.applied_index = 0
        self.message_bytes = 0  # bodies held in queues: the memory alarm watches it
        # Batches already applied, per origin: a batch retried after an ambiguous Raft error
        # (pysyncobj may report failure for an entry that did commit) is applied once.
        self.applied_batches: dict[str, BatchWindow] = {}
        # Cluster members as announced through the log: node_id -> (raft address, amqp address).
        # Every node derives known-hosts and "which node is down" from this, not from its config.
        self.members: dict[str, tuple[str, str]] = {}
        # Counters for metrics (ops/metrics.py): deterministic like the rest, not part of the digest.
        self.event_seq = 0  # audit events are numbered here, identically on every node (events.py)
        self.event_sink: Callable[[int | None, list], None] | None = None
        self._events: list[list] = []
        self.stats = {"published": 0, "unroutable": 0, "delivered": 0, "redelivered": 0, "acked": 0,
                      "rejected": 0, "dead_lettered": 0, "expired": 0, "deduplicated": 0, "delivery_limited": 0}
        self.sessions: dict[str, Session] = {}  # AMQP 0-10 sessions by key (sessions.py)
        self.users: dict[str, UserRecord] = {}  # managed through the admin API (users.py)
        self.detached_sessions: dict[str, Session] = {}  # the ones waiting out their timeout
        self._now = 0
        self._out: list = []
        self._replies = True  # apply_batch(replies=...)
        self._dirty: dict[int, Queue] = {}
        self._shared_props: dict[bytes, bytes] = {}  # see _publish
        # The owner identity of the command being applied when it is not its connection: an AMQP
        # 0-10 session (exclusive queues belong to the session and survive its failover).
        self._caller_owner: str | None = None
        self.internal_errors = 0  # commands that raised something other than CommandError (a bug)
        self._persist: PersistenceRecorder | None = None
        self._handlers: dict[int, Callable[[list], object]] = {
            Op.CHANNEL_OPEN: self._channel_open,
            Op.CHANNEL_CLOSE: self._channel_close,
            Op.CONNECTION_CLOSE: self._connection_close,
            Op.QOS: self._qos,
            Op.FLOW: self._flow,
            Op.EXCHANGE_DECLARE: self._exchange_declare,
            Op.EXCHANGE_DELETE: self._exchange_delete,
            Op.EXCHANGE_BIND: self._exchange_bind,
            Op.EXCHANGE_UNBIND: self._exchange_unbind,
            Op.QUEUE_DECLARE: self._queue_declare,
            Op.QUEUE_BIND: self._queue_bind,
            Op.QUEUE_UNBIND: self._queue_unbind,
            Op.QUEUE_PURGE: self._queue_purge,
            Op.QUEUE_DELETE: self._queue_delete,
            Op.CONSUME: self._consume,
            Op.CANCEL: self._cancel,
            Op.PUBLISH: self._publish,
            Op.GET: self._get,
            Op.ACK: self._ack,
            Op.NACK: self._nack,
            Op.RECOVER: self._recover,
            Op.TX_COMMIT: self._tx_commit,
            Op.TICK: self._tick,
            Op.NODE_RESET: self._node_reset,
            Op.MEMBER_SET: self._member_set,
            Op.MEMBER_REMOVE: self._member_remove,
            Op.VHOST_ADD: self._vhost_add,
            **self._session_handlers(),
            **self._user_handlers(),
        }
        if store is not None:
            self._load(store)

    # ------------------------------------------------------------------ applying

    def apply(self, now: int, commands: list, index: int | None = None,
              batch_id: tuple[str, int] | None = None, replies: bool = True) -> Effects:
        """Apply ``commands`` at time ``now`` (microseconds): the model changes, and the returned
        ``Effects`` say what the node must do about it (store/effects.py).  No I/O happens here.

        ``replies`` False leaves out the replies (``OUT_REPLY``): they go to the connections that
        issued the commands, all on the node that proposed the batch, so the other nodes of a
        cluster need none (one per publish, built and thrown away).  Outputs are not state:
        the model is the same either way.

        Time never goes backwards inside the state machine: batches proposed by different nodes
        carry their proposer's clock, so the machine keeps the largest time seen (itself part of
        the replicated state, hence deterministic). ``batch_id`` (origin, sequence) makes a
        retried batch a no-op.
        """
        effects = Effects(index=index)
        if batch_id is not None:
            origin, seq = batch_id
            window = self.applied_batches.get(origin)
            if window is None:
                window = self.applied_batches[origin] = BatchWindow()
            if not window.add(seq):
                if index is not None:
                    self.applied_index = index
                return effects
        if now > self._now:
            self._now = now
        self._out = effects.outputs
        self._replies = replies
        # The LMDB mirror is kept in step only for a machine loaded from one (single node): apply
        # records persistence operations (effects) for it instead of writing.
        self._persist = PersistenceRecorder() if self.store is not None else None
        for command in commands:
            self._apply_one(command)
        if index is not None:
            self.applied_index = index
        if self._persist is not None:
            effects.persistence, effects.sync_needed = self._persist.ops, self._persist.sync_needed
            self._persist = None
        if self._events:
            effects.events, self._events = self._events, []
        return effects

    def apply_batch(self, now: int, commands: list, index: int | None = None,
                    batch_id: tuple[str, int] | None = None, replies: bool = True) -> list:
        """``apply``, then carry out its persistence and events here; the outputs.  For callers
        that own the machine's store and history themselves (tests, tools); the logs carry the
        effects out on their own (raft/local.py, raft/cluster.py)."""
        effects = self.apply(now, commands, index, batch_id, replies)
        self.carry_out(effects)
        return effects.outputs

    def carry_out(self, effects: Effects) -> None:
        """Commit the persistence to the LMDB store this machine was loaded from, if any, and hand
        the events to ``event_sink``."""
        if self.store is not None and (effects.persistence or effects.index is not None):
            self.store.commit(effects.persistence, (self.next_qid, self.next_msg_id), effects.index)
        if effects.events and self.event_sink is not None:
            self.event_sink(effects.index, effects.events)

    def _event(self, kind: int, queue: Queue | None, message: Message, detail: str = "",
               vhost: str = "") -> None:
        """Record a message's audit event (numbered even when this node keeps no history, so that
        every node numbers every event alike).  The record carries the message itself: the event
        writer takes properties and body from it only when its retention asks for them."""
        self.event_seq += 1
        if self.event_sink is not None:
            self._events.append([self.event_seq, self._now, kind, queue.vhost if queue else vhost,
                                 queue.name if queue else "", message.id, message.exchange, message.routing_key,
                                 len(message.body), detail, message])

    def _definition_event(self, kind: int, vhost: str, queue: str = "", exchange: str = "",
                          routing_key: str = "", detail: str = "", definition: tuple = ()) -> None:
        """Record a queue, exchange or binding change (the catalog tables of the audit history)."""
        self.event_seq += 1
        if self.event_sink is not None:
            self._events.append([self.event_seq, self._now, kind, vhost, queue, None, exchange, routing_key,
                                 0, detail, definition])

    def _apply_one(self, command: list) -> None:
        op = command[0]
        try:
            result = self._handlers[op](command)
            if result is None or result.__class__ is not tuple or result[0] not in (OK, ERR):
                result = (OK, result)
        except CommandError as exc:
            result = (ERR, exc.code, exc.text)
            if exc.code not in HARD_ERRORS and len(command) > 3 and command[1] is not None:
                # A channel exception closes the channel: later commands from it are refused
                # (an 0-10 execution exception destroys the session the same way).
                self._close_channel(command[1], command[3], error=True)
        except Exception:
            # A bug, not a refusal (refusals raise CommandError before changing anything).  Every
            # replica applies the same command with the same code, so they all fail alike and stay
            # identical; stopping instead would stop every node on the same log entry, and again
            # at each restart.  So: 541 to the client, the traceback in the log, and a count that
            # status.json and the metrics show (docs/design.md, "A bug inside apply").
            self.internal_errors += 1
            log.exception("apply failed for op %s (internal error %d)", op, self.internal_errors)
            result = (ERR, 541, "INTERNAL_ERROR - internal error applying command")
        token = command[2] if len(command) > 2 else None
        if self._replies and (token is not None or (result[0] == ERR and command[1] is not None)):
            # Token-less commands (plain publishes) answer only with errors, so that the front end
            # can close the channel they came from.
            self._out.append((command[1], OUT_REPLY, token, result, command[3] if len(command) > 3 else None))
        # Until none is left: dispatching one queue can dirty another (a message expired or past
        # its delivery limit, dead-lettered into a queue with consumers).  Left for the next
        # command, it would be dispatched there on this node but never on a follower that installs
        # a snapshot in between (``_dirty`` is not replicated state): their outputs and states
        # would part (tests/unit/store/test_determinism.py found it).  Each round needs a message
        # already expired or past its limit, and a dead-lettered copy is neither, so this ends.
        while self._dirty:
            dirty, self._dirty = self._dirty, {}
            for queue in dirty.values():
                self._dispatch(queue)

    # ------------------------------------------------------------------ lookups

    def _vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise CommandError(530, f"vhost '{name}' not found")
        return vhost

    def _channel(self, conn: str, number: int) -> ChannelState:
        ch = self.channels.get(conn, {}).get(number)
        if ch is None:
            raise CommandError(504, f"channel {number} is not open")
        return ch

    def _queue(self, vhost: VHost, name: str, conn: str | None = None) -> Queue:
        queue = vhost.queues.get(name)
        if queue is None:
            raise CommandError(404, f"no queue '{name}' in vhost '{vhost.name}'")
        if conn is not None and queue.exclusive_owner not in (None, conn, self._caller_owner):
            raise CommandError(
                405,
                f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost.name}'. "
                "It could be originally declared on another connection or the exclusive property "
                "value does not match that of the original declaration.",
            )
        return queue

    def _exchange(self, vhost: VHost, name: str) -> Exchange:
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            raise CommandError(404, f"no exchange '{name}' in vhost '{vhost.name}'")
        return exchange

    # ------------------------------------------------------------------ vhosts, channels, connections

    def _vhost_add(self, cmd: list) -> None:
        name = cmd[3]
        if name in self.vhosts:
            return None
        vhost = self.vhosts[name] = VHost(name)
        for ex_name, ex_type in DEFAULT_EXCHANGES:
            vhost.exchanges[ex_name] = Exchange(name, ex_name, ex_type, True, False, False, {})
            self._definition_event(EV.EXCHANGE_DECLARED, name, exchange=ex_name, detail=ex_type,
                                   definition=(True, False, False, {}))
        if self._persist is not None:
            self._persist.put_vhost(name)
        return None

    def _channel_open(self, cmd: list) -> None:
        conn, number = cmd[1], cmd[3]
        channels = self.channels.setdefault(conn, {})
        if number in channels:
            raise CommandError(504, f"channel {number} already open")
        channels[number] = ChannelState(conn, number)

    def _channel_close(self, cmd: list) -> None:
        self._close_channel(cmd[1], cmd[3])

    def _close_channel(self, conn: str, number: int, error: bool = False) -> None:
        channels = self.channels.get(conn)
        ch = channels.get(number) if channels else None
        if ch is None:
            return
        if ch.session is not None:
            if error:
                self._destroy_session(ch.session)
            else:
                self._detach(ch.session)
            return
        del channels[number]
        for consumer in list(ch.consumers.values()):
            self._remove_consumer(consumer)
        self._requeue_all(ch)

    def _connection_close(self, cmd: list) -> None:
        conn = cmd[1]
        for number in list(self.channels.get(conn, {})):
            self._close_channel(conn, number)
        self.channels.pop(conn, None)
        for queue in list(self.exclusive_queues.pop(conn, {}).values()):
            self._delete_queue(queue)

    def _node_reset(self, cmd: list) -> None:
        """Close every connection of node ``node_id`` not of its boot ``keep_boot``.

        Issued when a node is declared down (``keep_boot`` None) and when a node restarts: its
        consumers' unacknowledged messages go back to their queues (redelivered) and its exclusive
        queues are deleted, as if each client connection had closed.
        """
        node_id, keep_boot = cmd[3], cmd[4]
        prefix = f"{node_id}."
        keep = f"{keep_boot}." if keep_boot else None
        conns = [c for c in dict.fromkeys([*self.channels, *self.exclusive_queues])
                 if c.startswith(prefix) and not (keep and c.startswith(keep))]
        if keep:
            # The node restarted: its earlier incarnations are dead and will never retry a batch.
            for origin in [o for o in self.applied_batches if o.startswith(prefix) and o != keep_boot]:
                del self.applied_batches[origin]
        for conn in conns:
            self._connection_close([Op.CONNECTION_CLOSE, conn, None])
            self._out.append((conn, OUT_CLOSE, 320, f"CONNECTION_FORCED - node {node_id} left the cluster"))
        return len(conns)

    def _member_set(self, cmd: list) -> None:
        node_id, raft, amqp = cmd[3], cmd[4], cmd[5]
        if self.members.get(node_id) != (raft, amqp):
            self.members[node_id] = (raft, amqp)
            self._failover_update()  # failover_exchange_behavior 2: the candidates changed

    def _member_remove(self, cmd: list) -> None:
        node_id = cmd[3]
        if self.members.pop(node_id, None) is not None:
            self._node_reset([Op.NODE_RESET, None, None, node_id, None])
            self._failover_update()

    def _qos(self, cmd: list) -> None:
        _, conn, _, number, prefetch_count, global_ = cmd
        ch = self._channel(conn, number)
        if global_:
            ch.prefetch_count = prefetch_count
        else:
            ch.consumer_prefetch = prefetch_count
        for consumer in ch.consumers.values():
            self._dirty[consumer.queue.qid] = consumer.queue

    def _flow(self, cmd: list) -> bool:
        _, conn, _, number, active = cmd
        ch = self._channel(conn, number)
        ch.active = bool(active)
        if active:
            for consumer in ch.consumers.values():
                self._dirty[consumer.queue.qid] = consumer.queue
        return ch.active

    # ------------------------------------------------------------------ exchanges

    def _exchange_declare(self, cmd: list) -> None:
        _, conn, _, number, vhost_name, name, type_, passive, durable, auto_delete, internal, args = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
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
        if type_ not in EXCHANGE_TYPES:
            raise CommandError(503, f"unknown exchange type '{type_}'")
        vhost.exchanges[name] = Exchange(vhost_name, name, type_, durable, auto_delete, internal, args)
        self._definition_event(EV.EXCHANGE_DECLARED, vhost_name, exchange=name, detail=type_,
                               definition=(bool(durable), bool(auto_delete), bool(internal), args))
        if durable and self._persist is not None:
            self._persist.put_exchange(vhost_name, name, type_, auto_delete, internal, args)
        return None

    def _exchange_delete(self, cmd: list) -> None:
        _, conn, _, number, vhost_name, name, if_unused = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        if name == "":
            raise CommandError(403, "operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise CommandError(403, f"exchange '{name}' in vhost '{vhost_name}' is reserved")
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            return None  # RabbitMQ answers delete-ok for a missing exchange
        if if_unused and exchange.bindings:
            raise CommandError(406, f"exchange '{name}' in vhost '{vhost_name}' in use")
        self._delete_exchange(exchange)
        return None

    def _delete_exchange(self, exchange: Exchange) -> None:
        vhost = self.vhosts[exchange.vhost]
        if vhost.exchanges.get(exchange.name) is not exchange:
            return
        # Gone first: removing its last binding below would otherwise auto-delete it again.
        del vhost.exchanges[exchange.name]
        for binding in list(exchange.bindings):
            self._remove_binding(vhost, exchange, binding)
        for binding in list(self.inbound.get((vhost.name, False, exchange.name), ())):
            source = vhost.exchanges.get(binding.source)
            if source is not None:
                self._remove_binding(vhost, source, binding)
        self._definition_event(EV.EXCHANGE_DELETED, vhost.name, exchange=exchange.name, detail=exchange.type)
        if exchange.durable and self._persist is not None:
            self._persist.delete_exchange(vhost.name, exchange.name)

    def _binding_endpoints(self, vhost: VHost, source: str, dest_is_queue: bool, dest: str, conn: str):
        if source == "" or (not dest_is_queue and dest == ""):
            raise CommandError(403, "operation not permitted on the default exchange")
        exchange = self._exchange(vhost, source)
        if dest_is_queue:
            target = self._queue(vhost, dest, conn)
        else:
            target = self._exchange(vhost, dest)
        return exchange, target

    def _exchange_bind(self, cmd: list) -> None:
        _, conn, _, number, vhost_name, destination, source, routing_key, args = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        exchange, target = self._binding_endpoints(vhost, source, False, destination, conn)
        self._add_binding(vhost, exchange, Binding(source, False, destination, routing_key, args),
                          target.durable)

    def _exchange_unbind(self, cmd: list) -> None:
        _, conn, _, number, vhost_name, destination, source, routing_key, args = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        exchange, _ = self._binding_endpoints(vhost, source, False, destination, conn)
        self._unbind(vhost, exchange, Binding(source, False, destination, routing_key, args))

    def _add_binding(self, vhost: VHost, exchange: Exchange, binding: Binding, dest_durable: bool) -> None:
        if exchange.find_binding(binding) >= 0:
            return
        exchange.bindings.append(binding)
        exchange.rebuild()
        self.inbound.setdefault((vhost.name, binding.dest_is_queue, binding.destination), []).append(binding)
        self._binding_event(EV.BOUND, vhost, binding)
        if exchange.durable and dest_durable and self._persist is not None:
            self._persist.put_binding(self._binding_key(vhost, binding))

    @staticmethod
    def _binding_key(vhost: VHost, b: Binding) -> bytes:
        return binding_key(vhost.name, b.source, b.dest_is_queue, b.destination,
                                         b.routing_key, b.arguments)

    def _unbind(self, vhost: VHost, exchange: Exchange, wanted: Binding) -> None:
        i = exchange.find_binding(wanted)
        if i >= 0:
            self._remove_binding(vhost, exchange, exchange.bindings[i])

    def _binding_event(self, kind: int, vhost: VHost, b: Binding) -> None:
        self._definition_event(kind, vhost.name, queue=b.destination if b.dest_is_queue else "",
                               exchange=b.source, routing_key=b.routing_key, detail=b.destination,
                               definition=(b.dest_is_queue, b.arguments))

    def _remove_binding(self, vhost: VHost, exchange: Exchange, binding: Binding) -> None:
        exchange.bindings.remove(binding)
        exchange.rebuild()
        self._binding_event(EV.UNBOUND, vhost, binding)
        inbound = self.inbound.get((vhost.name, binding.dest_is_queue, binding.destination))
        if inbound is not None:
            inbound.remove(binding)
            if not inbound:
                del self.inbound[(vhost.name, binding.dest_is_queue, binding.destination)]
        if exchange.durable and self._persist is not None:
            self._persist.delete_binding(self._binding_key(vhost, binding))
        if exchange.auto_delete and not exchange.bindings:
            self._delete_exchange(exchange)

    # ------------------------------------------------------------------ queues

    def _queue_declare(self, cmd: list) -> tuple:
        (_, conn, _, number, vhost_name, name, passive, durable, exclusive, auto_delete, args) = cmd[:11]
        server_named = len(cmd) > 11 and bool(cmd[11])  # the front end generated the name
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        existing = vhost.queues.get(name)
        if passive:
            queue = self._queue(vhost, name, conn)
            return ok((name, len(queue.ready), len(queue.consumers)))
        if existing is not None:
            self._queue(vhost, name, conn)  # exclusive-lock check
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
            self._touch(existing)
            return ok((name, len(existing.ready), len(existing.consumers)))
        if name.startswith("amq.") and not server_named:
            raise CommandError(403, f"queue name '{name}' contains reserved prefix 'amq.*'")
        settings = parse_queue_arguments(args, name, vhost_name)  # refused before anything changes
        owner = (self._caller_owner or conn) if exclusive else None  # 0-10: the session owns it
        queue = Queue(self.next_qid, vhost_name, name, durable, owner, auto_delete, args)
        self._configure_queue(queue, settings)
        self.next_qid += 1
        self._register_queue(vhost, queue)
        self._definition_event(EV.QUEUE_DECLARED, vhost_name, queue=name, detail=owner or "",
                               definition=(bool(durable), bool(exclusive), bool(auto_delete), args))
        if durable and not exclusive and self._persist is not None:
            self._persist.put_queue(vhost_name, name, queue.qid, auto_delete, args)
        return ok((name, 0, 0))

    def _configure_queue(self, queue: Queue, settings: QueueSettings) -> None:
        """Give a new queue its x-argument settings (validated already: parse_queue_arguments)."""
        queue.message_ttl = settings.message_ttl
        queue.max_length = settings.max_length
        queue.max_length_bytes = settings.max_length_bytes
        queue.max_priority = settings.max_priority
        queue.dead_letter_exchange = settings.dead_letter_exchange
        queue.dead_letter_routing_key = settings.dead_letter_routing_key
        queue.overflow = settings.overflow
        queue.delivery_limit = settings.delivery_limit
        queue.delivery_header = settings.delivery_header
        if settings.deduplicate:
            ttl = settings.cache_ttl * 1000 if settings.cache_ttl is not None else None
            queue.dedup = DedupCache(settings.cache_size, ttl)
        queue.ready = ReadyList(queue.max_priority)
        if settings.expires is not None:
            self.idle_expiring[queue.qid] = queue
            self.queue_last_used[queue.qid] = self._now

    def _register_queue(self, vhost: VHost, queue: Queue) -> None:
        vhost.queues[queue.name] = queue
        self.queues_by_id[queue.qid] = queue
        if queue.exclusive_owner is not None:
            self.exclusive_queues.setdefault(queue.exclusive_owner, {})[queue.qid] = queue

    def _touch(self, queue: Queue) -> None:
        if queue.qid in self.idle_expiring:
            self.queue_last_used[queue.qid] = self._now

    def _queue_bind(self, cmd: list) -> None:
        _, conn, _, number, vhost_name, queue_name, exchange_name, routing_key, args = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        exchange, queue = self._binding_endpoints(vhost, exchange_name, True, queue_name, conn)
        if exchange.type == "failover" and queue.exclusive_owner is None:
            # 0-10 11.1.2.3 failover_exchange_disallow_shared_queues
            raise CommandError(530, f"only exclusive queues may be bound to '{exchange_name}'")
        self._add_binding(vhost, exchange, Binding(exchange_name, True, queue_name, routing_key, args),
                          queue.durable and queue.exclusive_owner is None)
        if exchange.type == "failover":
            self._failover_update([queue])  # failover_exchange_behavior 1: an update at once

    def _failover_update(self, queues: list[Queue] | None = None) -> None:
        """Write a failover update (empty body, header amq.failover = member URLs) into queues bound
        to amq.failover: the given ones, or all of them when the member set changed."""
        from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties

        if queues is None:
            queues = []
            for vhost in self.vhosts.values():
                failover = vhost.exchanges.get("amq.failover")
                for binding in failover.bindings if failover else ():
                    queue = vhost.queues.get(binding.destination)
                    if queue is not None and queue not in queues:
                        queues.append(queue)
        if not queues:
            return
        urls = [f"amqp:tcp:{amqp}" for _raft, amqp in self.members.values()]
        props = encode_properties(BasicProperties(headers={"amq.failover": urls}))
        for queue in queues:
            message = Message(self.next_msg_id, "amq.failover", "", props, b"", False, 0, self._now)
            self.next_msg_id += 1
            self._enqueue(queue, message, None)

    def _queue_unbind(self, cmd: list) -> None:
        _, conn, _, number, vhost_name, queue_name, exchange_name, routing_key, args = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        exchange, _ = self._binding_endpoints(vhost, exchange_name, True, queue_name, conn)
        self._unbind(vhost, exchange, Binding(exchange_name, True, queue_name, routing_key, args))

    def _queue_purge(self, cmd: list) -> int:
        _, conn, _, number, vhost_name, name = cmd
        self._channel(conn, number)
        queue = self._queue(self._vhost(vhost_name), name, conn)
        count = 0
        for entry in queue.ready.drain():
            self._event(EV.PURGED, queue, entry.message)
            self._drop(queue, entry)
            count += 1
        queue.ready_bytes = 0
        return count

    def _queue_delete(self, cmd: list) -> int:
        _, conn, _, number, vhost_name, name, if_unused, if_empty = cmd
        self._channel(conn, number)
        vhost = self._vhost(vhost_name)
        queue = vhost.queues.get(name)
        if queue is None:
            return 0  # RabbitMQ: deleting a missing queue succeeds with a count of 0
        self._queue(vhost, name, conn)
        if if_unused and queue.consumers:
            raise CommandError(406, f"queue '{name}' in vhost '{vhost_name}' in use")
        if if_empty and len(queue.ready):
            raise CommandError(406, f"queue '{name}' in vhost '{vhost_name}' is not empty")
        count = len(queue.ready)
        self._delete_queue(queue)
        return count

    def _delete_queue(self, queue: Queue) -> None:
        vhost = self.vhosts[queue.vhost]
        if vhost.queues.get(queue.name) is not queue:
            return
        del vhost.queues[queue.name]
        del self.queues_by_id[queue.qid]
        self.expiring.pop(queue.qid, None)
        self.idle_expiring.pop(queue.qid, None)
        self.queue_last_used.pop(queue.qid, None)
        if queue.exclusive_owner is not None:
            self.exclusive_queues.get(queue.exclusive_owner, {}).pop(queue.qid, None)
        for consumer in [*queue.consumers, *queue.browsers]:
            self._out.append((consumer.channel.conn, OUT_CANCEL, consumer.channel.number, consumer.tag))
            consumer.channel.consumers.pop(consumer.tag, None)
        queue.consumers.clear()
        queue.browsers.clear()
        # Unacked entries are discarded with the queue; their holders forget them.
        if queue.unacked_count:
            for ch_map in self.channels.values():
                for ch in ch_map.values():
                    for key in [k for k in ch.unacked if k[0] == queue.qid]:
                        entry = ch.unacked.pop(key)[1]
                        self._event(EV.DELETED, queue, entry.message, "unacked")
                        self._release_message(entry)
        self._release_deleted(queue, queue.ready.take_all())
        for binding in list(self.inbound.get((vhost.name, True, queue.name), ())):
            source = vhost.exchanges.get(binding.source)
            if source is not None:
                self._remove_binding(vhost, source, binding)
        self._dirty.pop(queue.qid, None)
        self._definition_event(EV.QUEUE_DELETED, vhost.name, queue=queue.name)
        if queue.durable and queue.exclusive_owner is None and self._persist is not None:
            self._persist.delete_queue(vhost.name, queue.name, queue.qid)

    # ------------------------------------------------------------------ consumers

    def _consume(self, cmd: list) -> str:
        _, conn, _, number, vhost_name, queue_name, tag, no_ack, exclusive, _args = cmd
        ch = self._channel(conn, number)
        queue = self._queue(self._vhost(vhost_name), queue_name, conn)
        if not tag:
            ch.next_tag += 1
            tag = f"amq.ctag-{conn}-{number}-{ch.next_tag}"
        if tag in ch.consumers:
            raise CommandError(530, f"attempt to reuse consumer tag '{tag}'")
        if any(c.exclusive for c in queue.consumers) or (exclusive and queue.consumers):
            raise CommandError(
                403, f"queue '{queue_name}' in vhost '{vhost_name}' in exclusive use"
            )
        consumer = Consumer(ch, tag, queue, bool(no_ack), bool(exclusive), ch.consumer_prefetch)
        ch.consumers[tag] = consumer
        queue.consumers.append(consumer)
        queue.had_consumers = True
        self._touch(queue)
        self._dirty[queue.qid] = queue
        return tag

    def _cancel(self, cmd: list) -> str:
        _, conn, _, number, tag = cmd
        ch = self._channel(conn, number)
        consumer = ch.consumers.get(tag)
        if consumer is not None:
            self._remove_consumer(consumer)
        return tag

    def _remove_consumer(self, consumer: Consumer) -> None:
        consumer.channel.consumers.pop(consumer.tag, None)
        queue = consumer.queue
        if consumer.browse:
            if consumer in queue.browsers:
                queue.browsers.remove(consumer)
            return
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
            queue.next_consumer = 0
        self._touch(queue)
        if queue.auto_delete and queue.had_consumers and not queue.consumers \
                and queue.exclusive_owner not in self.sessions:
            # A 0-10 session's exclusive auto-delete queue goes when the session ends (queue.declare
            # auto-delete, 0-10 L7682ff), not when its last consumer is cancelled.
            self._delete_queue(queue)

    # ------------------------------------------------------------------ publishing

    def _publish(self, cmd: list) -> int:
        (_, conn, _, number, vhost_name, exchange_name, routing_key, mandatory, props, body,
         persistent, priority, expiration) = cmd
        # (lookups inlined: this runs for every message on every node; the helpers raise the errors)
        if conn is not None:
            channels = self.channels.get(conn)
            if channels is None or number not in channels:
                self._channel(conn, number)
        vhost = self.vhosts.get(vhost_name)
        if vhost is None:
            vhost = self._vhost(vhost_name)
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            exchange = self._exchange(vhost, exchange_name)
        if exchange.internal:
            raise CommandError(403, f"cannot publish to internal exchange '{exchange_name}' in vhost "
                               f"'{vhost_name}'")
        # Share the strings and small property blocks that messages repeat: every message holds
        # them for as long as it is queued (100 B of the ~650 B a queued 256 B message took).
        if len(props) <= 64:
            shared = self._shared_props.get(props)
            if shared is None:
                if len(self._shared_props) >= 1024:
                    self._shared_props.clear()
                self._shared_props[props] = props
            else:
                props = shared
        message = Message(self.next_msg_id, exchange.name, intern(routing_key), props, body, bool(persistent),
                          priority or 0, self._now)
        self.next_msg_id += 1
        queues = self._route(vhost, exchange, routing_key, props)
        if self.event_sink is None:
            self.event_seq += 1  # numbered alike on every node, recorded where history is kept
        else:
            self._event(EV.PUBLISHED, None, message, conn or "", vhost_name)
        stats = self.stats
        stats["published"] += 1
        if not queues:
            stats["unroutable"] += 1
            self._event(EV.UNROUTABLE, None, message, "returned" if mandatory else "dropped", vhost_name)
            return UNROUTABLE
        outcome = ROUTED
        for queue in queues:
            if not self._enqueue(queue, message, expiration):
                outcome = REJECTED
        return outcome

    def _route(self, vhost: VHost, exchange: Exchange, routing_key: str, props: bytes) -> list[Queue]:
        if exchange.name == "":
            queue = vhost.queues.get(routing_key)
            return [queue] if queue is not None else []
        headers_cache: list[dict] = []

        def headers() -> dict:
            if not headers_cache:
                headers_cache.append(message_headers(props))
            return headers_cache[0]

        found: dict[int, Queue] = {}
        visited: dict[str, None] = {}
        self._route_into(vhost, exchange, routing_key, headers, found, visited)
        return list(found.values())

    def _route_into(self, vhost, exchange, routing_key, headers, found, visited) -> None:
        if exchange.name in visited:
            return
        visited[exchange.name] = None
        before = len(found)
        for binding in exchange.matcher.match(routing_key, headers):
            if binding.dest_is_queue:
                queue = vhost.queues.get(binding.destination)
                if queue is not None:
                    found.setdefault(queue.qid, queue)
            else:
                target = vhost.exchanges.get(binding.destination)
                if target is not None:
                    self._route_into(vhost, target, routing_key, headers, found, visited)
        if len(found) == before:
            alternate = exchange.alternate_exchange
            if alternate is not None and alternate in vhost.exchanges:
                self._route_into(vhost, vhost.exchanges[alternate], routing_key, headers, found, visited)

    def _enqueue(self, queue: Queue, message: Message, expiration: int | None) -> bool:
        """Add ``message`` to ``queue``; False if the queue refused it (reject-publish).

        A duplicate for a deduplicating queue is accepted (its publisher is confirmed) and not
        added: the plugin's queue-level rule (store/dedup.py)."""
        dedup_as = None
        if queue.dedup is not None:
            dedup_as = dedup_key(message.properties)
            if dedup_as is not None and queue.dedup.seen(dedup_as, self._now):
                self._event(EV.DROPPED, queue, message, "duplicate")
                # .get: the stats of a snapshot written before issue 21 lack the key
                self.stats["deduplicated"] = self.stats.get("deduplicated", 0) + 1
                return True
        if queue.max_length is not None or queue.max_length_bytes is not None:
            full = (queue.max_length is not None and len(queue.ready) >= queue.max_length) or (
                queue.max_length_bytes is not None
                and queue.ready_bytes + len(message.body) > queue.max_length_bytes
            )
            if full and queue.overflow != "drop-head":
                if queue.overflow == "reject-publish-dlx":
                    self._dead_letter(queue, message, "maxlen")
                else:
                    self._event(EV.DROPPED, queue, message, "reject-publish")
                return False
        ttl = queue.message_ttl
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        expires_at = self._now + ttl * 1000 if ttl is not None else None
        priority = min(message.priority, queue.max_priority) if queue.max_priority else 0
        durable = message.persistent and queue.durable and queue.exclusive_owner is None
        entry = Entry(queue.next_seq, message, expires_at, priority, durable)
        queue.next_seq += 1
        queue.ready.append(entry)
        if dedup_as is not None:
            queue.dedup.add(dedup_as, message.id, self._now, expires_at)
        if self.event_sink is None:
            self.event_seq += 1
        else:
            self._event(EV.ROUTED, queue, message)
        size = len(message.body)
        queue.ready_bytes += size
        self.message_bytes += size
        if durable and self._persist is not None:
            if message.refs == 0:
                self._persist.put_message(message.id, [message.exchange, message.routing_key, message.properties,
                                                 message.body, message.priority, message.published_at])
            message.refs += 1
            self._persist.put_entry(queue.qid, entry.seq, [message.id, expires_at, priority, 0])
        if expires_at is not None:
            self.expiring[queue.qid] = queue
        if queue.max_length is not None or queue.max_length_bytes is not None:
            while (queue.max_length is not None and len(queue.ready) > queue.max_length) or (
                queue.max_length_bytes is not None and queue.ready_bytes > queue.max_length_bytes
            ):
                dropped = queue.ready.pop_oldest()
                if dropped is None:
                    break
                queue.ready_bytes -= len(dropped.message.body)
                self._dead_letter(queue, dropped.message, "maxlen")
                self._drop(queue, dropped)
        if queue.consumers or queue.browsers or expires_at is not None or queue.qid in self.expiring:
            # Only then has _dispatch anything to do (a queue nobody consumes fills up with no
            # dispatch at all: this runs for every publish on every node).
            self._dirty[queue.qid] = queue
        return True

    # ------------------------------------------------------------------ delivery

    def _dispatch(self, queue: Queue) -> None:
        """Give ready messages to consumers with credit, round-robin, one message per turn.

        A queue's only consumer takes as many in a row as its credit allows (``Consumer.room``):
        the same order as turn by turn, without re-checking every limit before every message
        (this loop runs for every delivery on every node)."""
        consumers = queue.consumers
        if queue.qid in self.expiring:
            self._expire_head(queue)
        if queue.browsers:
            self._browse(queue)
        ready = queue.ready
        limit = queue.delivery_limit
        while consumers and len(ready):
            n = len(consumers)
            if n == 1:
                chosen = consumers[0]
                room = chosen.room()
                if room <= 0:
                    return
            else:
                start = queue.next_consumer % n
                chosen = None
                for i in range(n):
                    candidate = consumers[(start + i) % n]
                    if candidate.room() > 0 and candidate.fits(ready.peek()):
                        chosen = candidate
                        queue.next_consumer = (start + i + 1) % n
                        break
                if chosen is None:
                    return
                room = 1
            while room > 0:
                entry = ready.pop()
                if entry is None:
                    return
                queue.ready_bytes -= len(entry.message.body)
                if entry.expires_at is not None and entry.expires_at < self._now:
                    self._dead_letter(queue, entry.message, "expired")
                    self._drop(queue, entry)
                    continue
                if limit is not None and entry.delivery_count > limit:
                    self._past_limit(queue, entry)  # came back past the limit through a restart
                    continue
                if not chosen.fits(entry):  # 0-10 byte credit smaller than the message: wait
                    ready.requeue(entry)
                    queue.ready_bytes += len(entry.message.body)
                    return
                self._deliver(chosen, queue, entry)
                room -= 1

    def _deliver(self, consumer: Consumer, queue: Queue, entry: Entry) -> None:
        message = entry.message
        redelivered = entry.delivery_count > 0
        if redelivered and queue.delivery_header:
            message = with_delivery_count(message, entry.delivery_count)
        self._event(EV.DELIVERED, queue, entry.message, consumer.tag)
        stats = self.stats
        stats["delivered"] += 1
        if redelivered:
            stats["redelivered"] += 1
        entry.delivery_count += 1
        ch = consumer.channel
        session = ch.session
        if session is not None:
            self._take_credit(consumer, len(message.body))
            transfer_id = session.next_transfer
            session.next_transfer += 1
            if not consumer.no_ack:
                session.transfers[transfer_id] = (queue.qid, entry.seq, consumer.tag)
        if consumer.no_ack:
            self._drop(queue, entry)
        else:
            consumer.unacked += 1
            self._hold(ch, consumer, queue, entry)
        if session is not None:
            self._out.append((ch.conn, OUT_TRANSFER, ch.number, consumer.tag,
                              (transfer_id, queue.qid, entry.seq, redelivered, message)))
        else:
            self._out.append((ch.conn, OUT_DELIVER, ch.number, consumer.tag,
                              (queue.qid, entry.seq, redelivered, message)))

    def _hold(self, ch: ChannelState, holder: object, queue: Queue, entry: Entry) -> None:
        """Record an unacked delivery; a durable entry's delivery count is persisted so that a
        restart redelivers it with redelivered=true."""
        entry.holder = holder
        ch.unacked[(queue.qid, entry.seq)] = (queue, entry)
        queue.unacked_count += 1
        if entry.durable and self._persist is not None:
            self._persist.put_entry(queue.qid, entry.seq, [entry.message.id, entry.expires_at, entry.priority,
                                                     entry.delivery_count], durable_promise=False)

    def _get(self, cmd: list):
        _, conn, _, number, vhost_name, queue_name, no_ack = cmd
        ch = self._channel(conn, number)
        queue = self._queue(self._vhost(vhost_name), queue_name, conn)
        self._touch(queue)
        if queue.qid in self.expiring:
            self._expire_head(queue)
        limit = queue.delivery_limit
        while True:
            entry = queue.ready.pop()
            if entry is None:
                return ok(None)
            queue.ready_bytes -= len(entry.message.body)
            if limit is None or entry.delivery_count <= limit:
                break
            self._past_limit(queue, entry)
        redelivered = entry.delivery_count > 0
        message = entry.message
        if redelivered and queue.delivery_header:
            message = with_delivery_count(message, entry.delivery_count)
        entry.delivery_count += 1
        if no_ack:
            self._drop(queue, entry)
        else:
            self._hold(ch, ch, queue, entry)
        self._event(EV.DELIVERED, queue, entry.message, "")
        return ok((queue.qid, entry.seq, redelivered, message, len(queue.ready)))

    def _take_unacked(self, ch: ChannelState, refs: list) -> list[tuple[Queue, Entry]]:
        taken = []
        for qid, seq in refs:
            item = ch.unacked.pop((qid, seq), None)
            if item is None:
                continue  # the queue was deleted meanwhile: its entries went with it
            queue, entry = item
            holder = entry.holder
            if holder.__class__ is Consumer:
                holder.unacked -= 1
                if holder.queue is queue and holder in queue.consumers:
                    self._dirty[queue.qid] = queue
            entry.holder = None
            queue.unacked_count -= 1
            taken.append(item)
        # Channel-wide prefetch may have freed credit for any of the channel's consumers.
        if ch.prefetch_count:
            for consumer in ch.consumers.values():
                self._dirty[consumer.queue.qid] = consumer.queue
        return taken

    def _ack(self, cmd: list) -> None:
        _, conn, _, number, refs = cmd
        ch = self._channel(conn, number)
        for queue, entry in self._take_unacked(ch, refs):
            self.stats["acked"] += 1
            self._event(EV.ACKED, queue, entry.message)
            self._drop(queue, entry)

    def _nack(self, cmd: list) -> None:
        _, conn, _, number, refs, requeue = cmd[:6]
        # ``unsent``: the front end held these assignments and never sent them (a cancelled
        # consumer's read-ahead, node/amqp091/window.py): back to the queue as not delivered.
        unsent = len(cmd) > 6 and cmd[6]
        ch = self._channel(conn, number)
        for queue, entry in self._take_unacked(ch, refs):
            if unsent and entry.delivery_count > 0:
                entry.delivery_count -= 1
            if requeue:
                self._return_to_ready(queue, entry)
            else:
                self._dead_letter(queue, entry.message, "rejected")
                self._drop(queue, entry)

    def _recover(self, cmd: list) -> None:
        _, conn, _, number, _requeue = cmd
        # 0-9-1 basic.recover requeue=false (redeliver to the original recipient) is served as a
        # requeue, as RabbitMQ does: the message is redelivered, possibly to the same consumer.
        self._requeue_all(self._channel(conn, number))

    def _requeue_all(self, ch: ChannelState) -> None:
        refs = list(ch.unacked)
        for queue, entry in self._take_unacked(ch, refs):
            self._return_to_ready(queue, entry)

    def _return_to_ready(self, queue: Queue, entry: Entry) -> None:
        if self.vhosts[queue.vhost].queues.get(queue.name) is not queue:
            self._release_message(entry)
            return
        if queue.delivery_limit is not None and entry.delivery_count > queue.delivery_limit:
            # A quorum queue's poison-message rule (RabbitMQ 3.13 rabbit_fifo return_one): each
            # return counts one (delivery_count: deliveries not taken back as never sent), and
            # past the limit the message is dead-lettered instead of requeued.
            self._past_limit(queue, entry)
            return
        self._event(EV.REQUEUED, queue, entry.message)
        queue.ready.requeue(entry)
        queue.ready_bytes += len(entry.message.body)
        if entry.expires_at is not None:
            self.expiring[queue.qid] = queue
        self._dirty[queue.qid] = queue

    def _past_limit(self, queue: Queue, entry: Entry) -> None:
        """An entry returned more often than the queue's delivery limit allows: dead-lettered with
        reason delivery_limit (or dropped), not requeued or delivered.  Besides a return, a ready
        entry can be past it when a single node restarted while it was delivered (its stored count
        includes that delivery, as RabbitMQ counts a consumer that went down as a return)."""
        self._dead_letter(queue, entry.message, "delivery_limit")
        self._drop(queue, entry)

    def _drop(self, queue: Queue, entry: Entry) -> None:
        """Remove an entry for good (acked, rejected, expired, purged, dropped)."""
        if queue.dedup is not None:
            queue.dedup.forget(entry.message.id)
        if entry.durable and self._persist is not None:
            self._persist.delete_entry(queue.qid, entry.seq)
        self._release_message(entry)

    def _release_deleted(self, queue: Queue, entries: list[Entry]) -> None:
        """Forget ``entries`` taken out of ``queue`` (being deleted), recording a DELETED event each.

        Deleting a queue of 20,000 messages runs this on every node; without history or an LMDB
        mirror (a cluster's nodes keep the model in memory) only the byte count has to follow."""
        if self.event_sink is None:
            self.event_seq += len(entries)
        else:
            for entry in entries:
                self._event(EV.DELETED, queue, entry.message)
        if self._persist is None:
            self.message_bytes -= sum([len(entry.message.body) for entry in entries])
        else:
            for entry in entries:
                self._release_message(entry)

    def _release_message(self, entry: Entry) -> None:
        message = entry.message
        self.message_bytes -= len(message.body)
        if entry.durable and self._persist is not None:
            message.refs -= 1
            if message.refs == 0:
                self._persist.delete_message(message.id)

    # ------------------------------------------------------------------ tx

    def _tx_commit(self, cmd: list) -> list:
        """Apply a transaction's publishes and acks atomically; return the publish outcomes."""
        _, conn, _, number, operations = cmd
        self._channel(conn, number)
        outcomes = []
        for sub in operations:
            try:
                result = self._handlers[sub[0]](sub)
            except CommandError:
                # The front end validated each operation when the client sent it; one that became
                # invalid since (its exchange deleted meanwhile) is skipped, the rest still commit.
                result = UNROUTABLE
            if sub[0] == Op.PUBLISH:
                outcomes.append(result)
        return outcomes

    # ------------------------------------------------------------------ time

    def _tick(self, cmd: list) -> None:
        """Expire message heads, idle queues and detached sessions as of the batch time."""
        if self.detached_sessions:
            self._expire_sessions()
        for queue in list(self.expiring.values()):
            self._expire_head(queue)
        for qid, queue in list(self.idle_expiring.items()):
            expires = as_int(queue.arguments.get("x-expires"))
            idle_for = self._now - self.queue_last_used.get(qid, self._now)
            if not queue.consumers and expires is not None and idle_for >= expires * 1000:
                self._delete_queue(queue)

    def next_expiry_due(self) -> bool:
        return bool(self.expiring) or bool(self.idle_expiring) or bool(self.detached_sessions)

    def next_deadline(self) -> int | None:
        """The earliest time (microseconds) at which a TICK would change something, or None.

        The node proposes a TICK only once its clock passes this: an idle cluster with detached
        sessions or TTLs far in the future does not fill the log with ticks.
        """
        best = None
        for queue in self.expiring.values():
            head = queue.ready.peek()
            if head is not None and head.expires_at is not None:
                candidate = head.expires_at + 1  # expiry is strictly after expires_at
                best = candidate if best is None or candidate < best else best
        for qid, queue in self.idle_expiring.items():
            expires = as_int(queue.arguments.get("x-expires"))
            if expires is not None and not queue.consumers:
                candidate = self.queue_last_used.get(qid, self._now) + expires * 1000
                best = candidate if best is None or candidate < best else best
        for session in self.detached_sessions.values():
            if session.detached_at is not None:
                candidate = session.detached_at + session.timeout * 1_000_000
                best = candidate if best is None or candidate < best else best
        return best

    @staticmethod
    def _error(code: int, text: str) -> CommandError:
        return CommandError(code, text)

    def _expire_head(self, queue: Queue) -> None:
        ready = queue.ready
        while True:
            entry = ready.peek()
            if entry is None:
                self.expiring.pop(queue.qid, None)
                return
            # Strictly past: a TTL of 0 still lets a consumer that is ready right now take it.
            if entry.expires_at is None or entry.expires_at >= self._now:
                return
            ready.pop()
            queue.ready_bytes -= len(entry.message.body)
            self._dead_letter(queue, entry.message, "expired")
            self._drop(queue, entry)

    # ------------------------------------------------------------------ dead-lettering

    def _dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        if reason == "expired":
            self.stats["expired"] += 1
        elif reason == "rejected":
            self.stats["rejected"] += 1
        elif reason == "delivery_limit":
            self.stats["delivery_limited"] = self.stats.get("delivery_limited", 0) + 1
        kind = {"expired": EV.EXPIRED, "rejected": EV.REJECTED}.get(reason, EV.DROPPED)
        self._event(kind, queue, message, reason)
        dlx_name = queue.dead_letter_exchange
        if dlx_name is None:
            return
        self.stats["dead_lettered"] += 1
        self._event(EV.DEAD_LETTERED, queue, message, f"{reason}->{dlx_name}")
        vhost = self.vhosts[queue.vhost]
        dlx = vhost.exchanges.get(dlx_name)
        if dlx is None:
            return
        routing_key = queue.dead_letter_routing_key
        if routing_key is None:
            routing_key = message.routing_key
        props = add_x_death(message, queue, reason, self._now)
        dead = Message(self.next_msg_id, dlx_name, routing_key, props, message.body, message.persistent,
                       message.priority, self._now)
        self.next_msg_id += 1
        # The copy is a new message: its history links back to the original through the detail.
        self._event(EV.PUBLISHED, None, dead, f"dead-letter:{message.id}:{queue.name}", queue.vhost)
        for target in self._route(vhost, dlx, routing_key, props):
            if target is queue and reason != "rejected":
                continue  # RabbitMQ drops a dead-letter cycle back to the same queue (not on reject)
            self._enqueue(target, dead, None)

    # ------------------------------------------------------------------ loading

    def _load(self, store: DurableStore) -> None:
        state = store.load()
        self.next_qid, self.next_msg_id = state.counters
        self.applied_index = state.applied_index
        for name in state.vhosts:
            self._vhost_add([Op.VHOST_ADD, None, None, name])
        for name, (password_hash, tags, loopback_only, permissions) in state.users:
            self.users[name] = UserRecord(name, password_hash, list(tags), loopback_only,
                                          {vh: tuple(p) for vh, p in permissions.items()})
        for vhost_name, name, type_, auto_delete, internal, args in state.exchanges:
            vhost = self.vhosts.setdefault(vhost_name, VHost(vhost_name))
            vhost.exchanges[name] = Exchange(vhost_name, name, type_, True, auto_delete, internal, args)
        for vhost_name, name, qid, auto_delete, args in state.queues:
            vhost = self.vhosts.setdefault(vhost_name, VHost(vhost_name))
            queue = Queue(qid, vhost_name, name, True, None, auto_delete, args)
            self._configure_queue(queue, parse_stored_queue_arguments(args, queue.name, queue.vhost))
            self._register_queue(vhost, queue)
        for vhost_name, source, dest_is_queue, dest, rk, args in state.bindings:
            vhost = self.vhosts.get(vhost_name)
            exchange = vhost.exchanges.get(source) if vhost else None
            if exchange is None:
                continue
            binding = Binding(source, dest_is_queue, dest, rk, args)
            exchange.bindings.append(binding)
            self.inbound.setdefault((vhost_name, dest_is_queue, dest), []).append(binding)
        for vhost in self.vhosts.values():
            for exchange in vhost.exchanges.values():
                exchange.rebuild()
        messages: dict[int, Message] = {}
        for msg_id, (exchange, rk, props, body, priority, published_at) in state.messages.items():
            messages[msg_id] = Message(msg_id, exchange, rk, props, body, True, priority, published_at)
        for qid, seq, (msg_id, expires_at, priority, delivery_count) in state.entries:
            queue = self.queues_by_id.get(qid)
            message = messages.get(msg_id)
            if queue is None or message is None:
                continue
            entry = Entry(seq, message, expires_at, min(priority, queue.max_priority), True, delivery_count)
            message.refs += 1
            queue.ready.append(entry)
            queue.ready_bytes += len(message.body)
            self.message_bytes += len(message.body)
            queue.next_seq = max(queue.next_seq, seq + 1)
            if expires_at is not None:
                self.expiring[qid] = queue
            if queue.dedup is not None:
                # The single-node store keeps no cache: it is rebuilt from the messages still
                # queued (what the plugin's rule remembers; x-cache-ttl entries of messages
                # consumed before the restart are not kept).
                key = dedup_key(message.properties)
                if key is not None:
                    queue.dedup.add(key, msg_id, message.published_at, expires_at)
