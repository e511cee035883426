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
from functools import partial
from typing import Any

import msgpack

from .audit import AuditNotes
from .commands import (
    ERR,
    OK,
    OUT_REPLY,
    AuditChainOn,
    Command,
    Ok,
    Op,
    Output,
    Refused,
    VhostAdd,
)
from .connections import Connections
from .dedup import DedupCache, dedup_key
from .delayed import DEFAULT_LIMIT as DEFAULT_DELAYED_LIMIT
from .delayed import DelayedMessages
from .delivery import Delivery
from .effects import Effects
from .errors import HARD_ERRORS, CommandError
from .events import CHAIN_ZERO, chain_next
from .expiry import Expiry
from .groups import Groups, restore_messages, restore_state
from .limits import LimitCommands
from .message import AMQP091
from .model import ChannelState, Entry, Exchange, Message, Queue, Session, VHost
from .modify import message_modify
from .persistence import LoadedState, PersistenceRecorder
from .plugin_exchanges import PluginExchanges
from .queue_args import parse_stored_queue_arguments
from .routing import Binding
from .sessions import DEFAULT_DURABLE_LINKS, SessionCommands
from .topology import Topology
from .tx_groups import TxCoord, TxGroups, TxHeld
from .tx_groups import restore_state as restore_tx
from .users import UserCommands, UserRecord

log = logging.getLogger(__name__)
_new_tuple = tuple.__new__

def _channel_of(command: Command) -> int | None:
    """The channel (or 0-10 session) a command came on; None for connection- and node-level ones."""
    return getattr(command, "channel", None)


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


class StateMachine:
    """The replicated model, the batch being applied, and the table from operation to the concern
    that applies it (connections.py, topology.py, delivery.py, expiry.py, sessions.py, users.py,
    plugin_exchanges.py).

    Each concern is a class holding code only: it reaches the model and the batch through the
    machine (``self.m``) and the other concerns by name (``m.delivery.enqueue``,
    ``m.topology.route``).  Same rules for all: no clock, no randomness, no I/O.
    """

    def __init__(self, persistent: bool = False) -> None:
        # A single node's machine keeps an LMDB mirror in step: apply records its operations
        # (Effects.persistence, store/core/persistence.py) for the applier to commit.
        self.persistent = persistent
        # The machine's concerns, a module each; they reach the model and each other through it.
        self.connections = Connections(self)
        self.topology = Topology(self)
        self.delivery = Delivery(self)
        self.expiry = Expiry(self)
        self.session_commands = SessionCommands(self)
        self.user_commands = UserCommands(self)
        self.plugin_exchanges = PluginExchanges(self)
        self.limit_commands = LimitCommands(self)
        self.groups = Groups(self)
        self.tx_groups = TxGroups(self)
        self.audit_notes = AuditNotes(self)
        self.vhosts: dict[str, VHost] = {}
        self.channels: dict[str, dict[int, ChannelState]] = {}
        self.exclusive_queues: dict[str, dict[int, Queue]] = {}
        self.queues_by_id: dict[int, Queue] = {}
        # Reverse binding index: (vhost, dest_is_queue, destination) -> bindings pointing at it.
        self.inbound: dict[tuple[str, bool, str], list[Binding]] = {}
        self.expiring: dict[int, Queue] = {}  # queues whose ready head may carry an expiry
        self.idle_expiring: dict[int, Queue] = {}  # queues with x-expires
        # Queues whose filtered consumers stopped scanning at the per-dispatch bound: a TICK goes on
        # (store/core/delivery.py dispatch_selective, docs/design.md "Filters on consumers").
        self.rescan: dict[int, Queue] = {}
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
        # Whether this node keeps an audit history: the events are then recorded into the effects
        # (they are numbered either way, so that every node numbers every event alike).
        self.records_events = False
        self._events: list[list] = []
        # The tamper-evidence chain (events.py, issue 36): replicated, so every node agrees on it;
        # each event is packed into the batch's chained stream whether or not this node records it.
        self.chain_head = CHAIN_ZERO
        # Whether events are chained at all (AuditChainOn): a cluster that keeps no audit history
        # does not pay for the chain (+0.9 µs per publish on every replica, docs/benchmarks.md).
        self.chain_on = False
        # The batch's events packed one after the other (not state: emptied at the end of each
        # apply); a Packer per machine, one thread applies.
        self._chain_stream = msgpack.Packer(use_bin_type=True, autoreset=False)
        self._chain_pack = self._chain_stream.pack
        self.stats = {"published": 0, "unroutable": 0, "delivered": 0, "redelivered": 0, "acked": 0,
                      "rejected": 0, "dead_lettered": 0, "expired": 0, "deduplicated": 0, "delivery_limited": 0,
                      "delayed": 0, "delay_released": 0, "delay_refused": 0}
        # Per queue (qid -> [delivered or got, acked]), for RabbitMQ's per-queue message_stats rates
        # (ops/http/rates.py): counted as ``stats`` is, since this node started applying; left out of
        # snapshots and the digest (statistics, not state).  Dropped with the queue.
        self.queue_counts: dict[int, list[int]] = {}
        self.sessions: dict[str, Session] = {}  # AMQP 0-10 sessions by key (sessions.py)
        self.users: dict[str, UserRecord] = {}  # managed through the admin API (users.py)
        # Permissions set through the admin API for users that are not in ``users`` (those of the
        # configuration file): name -> vhost -> (configure, write, read), or None where a permission
        # of the file was cleared (users.py, node/auth.py applies them on top of the file's).
        self.permission_overlay: dict[str, dict[str, tuple[str, str, str] | None]] = {}
        # Vhost and user limits (store/core/limits.py): name -> {limit name: value}, only those set.
        self.vhost_limits: dict[str, dict[str, int]] = {}
        self.user_limits: dict[str, dict[str, int]] = {}
        self.detached_sessions: dict[str, Session] = {}  # the ones waiting out their timeout
        self.delayed = DelayedMessages()  # held by x-delayed-message exchanges (store/core/delayed.py)
        self.delayed_limit = DEFAULT_DELAYED_LIMIT  # configuration (max_delayed_messages), not state
        self.durable_links_limit = DEFAULT_DURABLE_LINKS  # configuration (amqp10_durable_links_per_user)
        self.exchange_caches: dict[tuple[str, str], DedupCache] = {}  # x-message-deduplication exchanges
        self._now = 0
        self._out: list[Output] = []
        self._body_puts: list[tuple[int, bytes | int]] = []  # the batch's Effects.body_puts
        self._body_deletes: list[int] = []  # and body_deletes
        # Bodies of a single node's held delayed messages, read by restore, for the node to store.
        self.loaded_bodies: list[tuple[int, bytes]] = []
        self._replies = True  # apply_batch(replies=...)
        self._dirty: dict[int, Queue] = {}
        # Each key maps to itself (bytes to the same bytes, int to the same int): Delivery.publish.
        self._shared_props: dict[Any, Any] = {}
        # The owner identity of the command being applied when it is not its connection: an AMQP
        # 0-10 session (exclusive queues belong to the session and survive its failover).
        self._caller_owner: str | None = None
        # Queue groups (issue 34, store/core/groups.py).  ``group`` is which group this machine
        # applies (configuration, set by the node); the rest is replicated state.
        self.group = 0
        self.group_count = 1
        self.meta_outbox: deque[tuple[int, Any, tuple[int, int] | None]] = deque()  # metadata group
        self.meta_seq = 0
        self.meta_applied = 0  # a queue group: the last metadata outbox entry applied
        self.gone_outbox: deque[tuple[int, int, str | None, int | None]] = deque()  # a queue group: (seq, qid, conn, token)
        self.gone_seq = 0
        self.gone_applied: dict[int, int] = {}  # the metadata group: source group -> last seq taken in
        # (target, seq, qids, message, expiration): messages routed to queues of other groups
        self.msg_outbox: deque[tuple[int, int, list[int], Message, int | None]] = deque()
        self.msg_seq: dict[int, int] = {}  # target group -> the last seq given
        self.msg_applied: dict[int, int] = {}  # source group -> the last seq applied here
        # Transactions across groups (store/core/tx_groups.py): the metadata group's records as
        # coordinator, a participant's held parts; replicated state.
        self.tx_next = 0  # the coordinator: the last transaction id given
        self.tx_part_seq: dict[int, int] = {}  # the coordinator: group -> the last prepare seq given
        self.tx_coord: dict[int, TxCoord] = {}
        self.tx_prep_applied = 0  # a participant: the last prepare applied
        self.tx_held: dict[int, TxHeld] = {}
        # The coordinator: session key -> the ids ([lo, hi] ranges) of the session's 0-10 commits
        # across groups that committed, reported complete to every resume until known-completed
        # (the other groups' barriers may lack them: they executed nothing for them).
        self.tx_decided: dict[str, list[list[int]]] = {}
        self.forwarding = False  # applying a MetaApply's command (not state: set and reset inside it)
        self.forwarded_placement: tuple[int, int] | None = None
        self.internal_errors = 0  # commands that raised something other than CommandError (a bug)
        self._persist: PersistenceRecorder | None = None
        # op -> handler; each takes its own command type (the table is the hot path's dispatch, so
        # the checker sees the union only at the call: Callable[[Any], ...]).
        self._handlers: dict[int, Callable[[Any], object]] = {
            Op.CHANNEL_OPEN: self.connections.channel_open,
            Op.CHANNEL_CLOSE: self.connections.channel_close,
            Op.CONNECTION_CLOSE: self.connections.connection_close,
            Op.QOS: self.connections.qos,
            Op.FLOW: self.connections.flow,
            Op.EXCHANGE_DECLARE: self.topology.exchange_declare,
            Op.EXCHANGE_DELETE: self.topology.exchange_delete,
            Op.EXCHANGE_BIND: self.topology.exchange_bind,
            Op.EXCHANGE_UNBIND: self.topology.exchange_unbind,
            Op.QUEUE_DECLARE: self.topology.queue_declare,
            Op.QUEUE_BIND: self.topology.queue_bind,
            Op.QUEUE_UNBIND: self.topology.queue_unbind,
            Op.QUEUE_PURGE: self.topology.queue_purge,
            Op.QUEUE_DELETE: self.topology.queue_delete,
            Op.CONSUME: self.delivery.consume,
            Op.CANCEL: self.delivery.cancel,
            Op.PUBLISH: self.delivery.publish,
            Op.GET: self.delivery.get,
            Op.ACK: self.delivery.ack,
            Op.NACK: self.delivery.nack,
            Op.RECOVER: self.delivery.recover,
            Op.TX_COMMIT: self.delivery.tx_commit,
            Op.TICK: self.expiry.tick,
            Op.NODE_RESET: self.connections.node_reset,
            Op.MEMBER_SET: self.connections.member_set,
            Op.MEMBER_REMOVE: self.connections.member_remove,
            Op.VHOST_ADD: self.topology.vhost_add,
            Op.VHOST_DELETE: self.topology.vhost_delete,
            Op.MESSAGE_MODIFY: partial(message_modify, self),
            Op.AUDIT_NOTE: self.audit_notes.note,
            Op.AUDIT_CHAIN_ON: self._chain_on,
            **self.session_commands.session_handlers(),
            **self.user_commands.user_handlers(),
            **self.limit_commands.handlers(),
        }
        self._handlers.update(self.groups.handlers(self._handlers))
        self._handlers.update(self.tx_groups.handlers())

    def apply(self, now: int, commands: list, index: int | None = None,
              batch_id: tuple[str, int] | None = None, replies: bool = True) -> Effects:
        """Apply ``commands`` at time ``now`` (microseconds): the model changes, and the returned
        ``Effects`` say what the node must do about it (store/core/effects.py).  No I/O happens here.

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
        self._body_puts, self._body_deletes = effects.body_puts, effects.body_deletes
        self._replies = replies
        # The LMDB mirror is kept in step only for a machine loaded from one (single node): apply
        # records persistence operations (effects) for it instead of writing.
        self._persist = PersistenceRecorder() if self.persistent else None
        first_seq = self.event_seq
        # Only this batch's events are chained: ``restore`` (a single node's start) adds the vhosts'
        # default exchanges through the same code, outside any batch (tests/integration/
        # test_audit_chain_node.py found them prepended to the first batch's stream).
        self._chain_stream.reset()
        for command in commands:
            self._apply_one(command)
        if index is not None:
            self.applied_index = index
        if self.group_count > 1:
            self.groups.report(effects.outputs)
        if self._persist is not None:
            if self.group_count > 1:
                self.groups.persist(self._persist)
                self.tx_groups.persist(self._persist)
            effects.persistence, effects.sync_needed = self._persist.ops, self._persist.sync_needed
            self._persist = None
        if self.event_seq != first_seq:  # the batch had events: the chain moves on
            chain = None
            if self.chain_on:
                stream = self._chain_stream.bytes()
                self._chain_stream.reset()
                previous = self.chain_head
                self.chain_head = chain_next(previous, stream)
                chain = (previous, self.chain_head)
            if self._events:
                effects.events, self._events = self._events, []
                effects.chain = chain
        return effects

    def _chain_on(self, cmd: AuditChainOn) -> None:
        self.chain_on = True

    def event(self, kind: int, queue: Queue | None, message: Message, detail: str = "",
               vhost: str = "", conn: str | None = None) -> None:
        """Record a message's audit event (numbered and chained even when this node keeps no
        history, so that every node numbers and chains every event alike).  The record carries the
        message itself: the event writer takes properties and body from it only when its retention
        asks for them.  ``conn``: the connection that acted (publish, deliver, get, ack, reject),
        whose principal the history keeps once (the ``connections`` table, issue 36).  The record's
        layout is events.py's EVENT_FIELDS, with the message in place of ``raft_index`` (slot 10,
        not chained) until the writer has it."""
        seq = self.event_seq = self.event_seq + 1
        if queue is not None:
            vhost, name = queue.vhost, queue.name
        else:
            name = ""
        if self.records_events:
            fields = [seq, self._now, kind, vhost, name, message.id, message.exchange, message.routing_key,
                      message.size, detail, conn, None]
            if self.chain_on:
                self._chain_pack(fields)  # the batch's chained stream (events.chain_next)
            fields.insert(10, message)
            self._events.append(fields)
        elif self.chain_on:  # a tuple packs alike and is cheaper to build
            self._chain_pack((seq, self._now, kind, vhost, name, message.id, message.exchange, message.routing_key,
                              message.size, detail, conn, None))

    def count_ack(self, qid: int) -> None:
        """One acknowledgement of a message of queue ``qid`` (``queue_counts``)."""
        counts = self.queue_counts.get(qid)
        if counts is None:
            counts = self.queue_counts[qid] = [0, 0]
        counts[1] += 1

    def definition_event(self, kind: int, vhost: str, queue: str = "", exchange: str = "",
                         routing_key: str = "", detail: str = "", definition: tuple = ()) -> None:
        """Record a queue, exchange or binding change (the catalog tables of the audit history)."""
        seq = self.event_seq = self.event_seq + 1
        fields: list = [seq, self._now, kind, vhost, queue, None, exchange, routing_key, 0, detail, None, None]
        if self.chain_on:
            self._chain_pack(fields)
        if self.records_events:
            fields.insert(10, definition)
            self._events.append(fields)

    def _apply_one(self, command: Command) -> None:
        op = command.op
        result: Ok | Refused | None
        try:
            value = self._handlers[op](command)
            result = None  # Ok(OK, value), made only if a reply is sent (followers send none)
        except CommandError as exc:
            result = Refused(ERR, exc.code, exc.text)
            channel = _channel_of(command)
            if (exc.code not in HARD_ERRORS and command.conn is not None and channel is not None
                    and not self.forwarding):
                # A channel exception closes the channel: later commands from it are refused
                # (an 0-10 execution exception destroys the session the same way).
                self.connections.close_channel(command.conn, channel, error=True)
        except Exception:
            # A bug, not a refusal (refusals raise CommandError before changing anything).  Every
            # replica applies the same command with the same code, so they all fail alike and stay
            # identical; stopping instead would stop every node on the same log entry, and again
            # at each restart.  So: 541 to the client, the traceback in the log, and a count that
            # status.json and the metrics show (docs/design.md, "A bug inside apply").
            self.internal_errors += 1
            log.exception("apply failed for op %s (internal error %d)", op, self.internal_errors)
            result = Refused(ERR, 541, "INTERNAL_ERROR - internal error applying command")
        token = command.token
        if self._replies and (token is not None or (result is not None and command.conn is not None)):
            # Token-less commands (plain publishes) answer only with errors, so that the front end
            # can close the channel they came from.
            if result is None:
                result = _new_tuple(Ok, (OK, value))  # Ok(OK, value) without its Python-level __new__
            self._out.append((command.conn, OUT_REPLY, token, result, _channel_of(command)))  # an OutReply
        # Until none is left: dispatching one queue can dirty another (a message expired or past
        # its delivery limit, dead-lettered into a queue with consumers).  Left for the next
        # command, it would be dispatched there on this node but never on a follower that installs
        # a snapshot in between (``_dirty`` is not replicated state): their outputs and states
        # would part (tests/unit/store/test_determinism.py found it).  Each round needs a message
        # already expired or past its limit, and a dead-lettered copy is neither, so this ends.
        while self._dirty:
            dirty, self._dirty = self._dirty, {}
            for queue in dirty.values():
                self.delivery.dispatch(queue)

    def apply_forwarded(self, command: Command) -> None:
        """Apply a metadata command forwarded from the metadata group (store/core/groups.py),
        answering its issuer as the metadata group did: on every replica, since the forwarder's
        node proposed the batch and the issuer's node must answer (``replies`` is for the
        proposer's commands)."""
        replies, self._replies = self._replies, True
        try:
            self._apply_one(command)
        finally:
            self._replies = replies

    def vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise CommandError(530, f"vhost '{name}' not found")
        return vhost

    def channel(self, conn: str, number: int) -> ChannelState:
        ch = self.channels.get(conn, {}).get(number)
        if ch is None:
            if self.forwarding:  # a forwarded metadata command: its issuer may have gone since
                return ChannelState(conn, number)
            raise CommandError(504, f"channel {number} is not open")
        return ch

    def queue(self, vhost: VHost, name: str, conn: str | None = None) -> Queue:
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

    def exchange(self, vhost: VHost, name: str) -> Exchange:
        exchange = vhost.exchanges.get(name)
        if exchange is None:
            raise CommandError(404, f"no exchange '{name}' in vhost '{vhost.name}'")
        return exchange

    @staticmethod
    def error(code: int, text: str) -> CommandError:
        return CommandError(code, text)

    def restore(self, state: LoadedState) -> None:
        """Rebuild the model from a single node's LMDB mirror (read at start by
        ``store/disk/durable.py``); the bodies of held delayed messages end in ``loaded_bodies``."""
        self.next_qid, self.next_msg_id = state.counters
        self.applied_index = state.applied_index
        for name in state.vhosts:
            self.topology.vhost_add(VhostAdd(None, None, name))
        for name, (password_hash, tags, loopback_only, permissions) in state.users:
            self.users[name] = UserRecord(name, password_hash, list(tags), loopback_only,
                                          {vh: tuple(p) for vh, p in permissions.items()})
        for name, overlay in state.permission_overlay:
            self.permission_overlay[name] = {vh: tuple(p) if p is not None else None for vh, p in overlay.items()}
        for scope, name, limits in state.limits:
            self.limit_commands.table(scope)[name] = dict(limits)
        for vhost_name, name, type_, auto_delete, internal, args in state.exchanges:
            vhost = self.vhosts.setdefault(vhost_name, VHost(vhost_name))
            vhost.exchanges[name] = Exchange(vhost_name, name, type_, True, auto_delete, internal, args)
        for vhost_name, name, qid, auto_delete, args in state.queues:
            vhost = self.vhosts.setdefault(vhost_name, VHost(vhost_name))
            queue = Queue(qid, vhost_name, name, True, None, auto_delete, args)
            self.topology.configure_queue(queue, parse_stored_queue_arguments(args, queue.name, queue.vhost))
            self.topology.register_queue(vhost, queue)
        for vhost_name, source, dest_is_queue, dest, rk, args in state.bindings:
            bound_in = self.vhosts.get(vhost_name)
            exchange = bound_in.exchanges.get(source) if bound_in else None
            if exchange is None:
                continue
            binding = Binding(source, dest_is_queue, dest, rk, args)
            exchange.bindings.append(binding)
            self.inbound.setdefault((vhost_name, dest_is_queue, dest), []).append(binding)
        for vhost in self.vhosts.values():
            for exchange in vhost.exchanges.values():
                exchange.rebuild()
        # Bodies stay in the store's messages table (the node's body store reads them from there:
        # store/disk/bodies.py); the model keeps their sizes.
        messages: dict[int, Message] = {}
        for msg_id, (exchange, rk, props, body, priority, published_at, *fmt) in state.messages.items():
            messages[msg_id] = Message(msg_id, exchange, rk, props, len(body), True, priority, published_at, 0,
                                       fmt[0] if fmt else AMQP091)
        state.messages.clear()
        # Every entry is counted in its message's ``refs`` and ``live`` before any is appended: a
        # ready list freezes entries whose message nothing else holds (store/core/frozen.py), and a
        # message in several queues (entries come queue by queue) looked held by one until the
        # later queues' entries were counted -- frozen, its first queue's copy released the body
        # and the LMDB record that the other queues still held (tests/unit/store/test_frozen.py).
        # Two passes over the entries rather than a list of them: no second copy of a backlog.
        for qid, _seq, (msg_id, *_rest) in state.entries:
            message = messages.get(msg_id)
            if message is not None and qid in self.queues_by_id:
                message.refs += 1
                message.live += 1
        for qid, seq, (msg_id, expires_at, priority, delivery_count) in state.entries:
            entry_queue = self.queues_by_id.get(qid)
            message = messages.get(msg_id)
            if entry_queue is None or message is None:
                continue
            queue = entry_queue
            entry = Entry(seq, message, expires_at, min(priority, queue.max_priority), True, delivery_count)
            queue.ready.append(entry)
            queue.ready_bytes += message.size
            self.message_bytes += message.size
            queue.next_seq = max(queue.next_seq, seq + 1)
            if expires_at is not None:
                self.expiring[qid] = queue
            if queue.dedup is not None:
                # The single-node store keeps no cache: it is rebuilt from the messages still
                # queued (what the plugin's rule remembers; x-cache-ttl entries of messages
                # consumed before the restart are not kept).
                key = dedup_key(message.properties, message.format)
                if key is not None:
                    queue.dedup.add(key, msg_id, message.published_at, expires_at)
        # Held delayed messages' bodies are in their records: the node stores them at start.
        self.loaded_bodies = self.plugin_exchanges.load_delayed(state.delayed)
        if state.groups is not None:
            restore_state(self, state.groups)
            self.loaded_bodies += restore_messages(self, state.group_messages)
            self.groups.persisted = self.groups.fingerprint()
        if state.tx is not None:
            restore_tx(self, state.tx)
            self.tx_groups.persisted = self.tx_groups.fingerprint()

    def next_expiry_due(self) -> bool:
        return self.expiry.next_expiry_due()

    def next_deadline(self) -> int | None:
        return self.expiry.next_deadline()
