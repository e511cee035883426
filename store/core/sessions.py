"""AMQP 0-10 sessions in the state machine: attach/resume anywhere, exactly-once commands, replay.

A session's state is replicated (``model.Session``), so a client whose node died re-attaches on any
other node and finds it intact:

* **Incoming exactly-once.** Each command the client sends is wrapped by the front end in
  ``SESSION_COMMAND(command_id, inner)``. Apply executes ``inner`` only if ``command_id`` is not in
  the session's idempotence barrier (``completed``), and records it there. A client replaying the
  commands it never saw completed after a failover therefore has each applied once.
* **Outgoing replay.** Deliveries to a session's subscriptions are numbered here, in apply
  (``next_transfer``), and remembered until the client settles them (accept / release / reject).
  On re-attach the front end replays every unsettled transfer with its original id; the client's
  own idempotence barrier drops the ones it had already received.
* **Lifetime.** A session's channel state is registered under the (connection, channel) it is
  attached to; consumers (subscriptions) belong to the session and survive a detach. A detached
  session lives ``timeout`` seconds (session.request-timeout), then TICK destroys it: unsettled
  deliveries return to their queues, redelivered. An execution exception destroys it at once.

The commands (SessionAttach, SessionCommand, MessageSubscribe, MessageSettle...) and their values
(SessionBusy, SessionAttached, Duplicate, CommandResult...) are typed in store/core/commands.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import delivery as _delivery
from . import events as EV
from . import group_sessions, session_rules
from . import model as _model
from . import ranges as rs
from .commands import (  # (SETTLE_*: MessageSettle's ``how``, defined with it; re-exported from here)
    OUT_SESSION_DETACHED,
    OUT_TRANSFER,
    SETTLE_ACCEPT,
    SETTLE_REJECT,
    SETTLE_RELEASE,
    CommandResult,
    Consume,
    Duplicate,
    ExchangeBound,
    ExchangeQuery,
    GroupPending,
    MessageAcquire,
    MessageFlow,
    MessageFlowMode,
    MessageFlush,
    MessageSettle,
    MessageStop,
    MessageSubscribe,
    Op,
    OutSessionDetached,
    QueueDeclare,
    QueueQuery,
    SessionAttach,
    SessionAttached,
    SessionBusy,
    SessionCommand,
    SessionDetach,
    SessionKnownCompleted,
    SessionTimeout,
    SessionTxSelect,
    SessionWindowCredit,
)
from .commands import (
    SETTLE_RELEASE_REDELIVERED as SETTLE_RELEASE_REDELIVERED,
)
from .groups import META_GROUP, META_OPS
from .headers import with_delivery_count
from .model import ChannelState, Consumer, Message, Session

if TYPE_CHECKING:
    from .machine import StateMachine

MAX_SESSION_TIMEOUT = 3600  # seconds: a detached session's state is kept at most this long
# The AMQP 1.0 front end's durable links are sessions named with this prefix (node/amqp10/recovery.py);
# a user may hold StateMachine.durable_links_limit of them (config amqp10_durable_links_per_user: every
# cluster member needs the same value), checked when a new one is attached.
DURABLE_LINK_PREFIX = b"amqp10-link\x00"
DEFAULT_DURABLE_LINKS = 256
UNLIMITED = 0xFFFFFFFF


RESULT_OPS = frozenset((Op.QUEUE_QUERY, Op.EXCHANGE_QUERY, Op.EXCHANGE_BOUND, Op.MESSAGE_ACQUIRE,
                        Op.MESSAGE_RESUME))
MAX_BROWSED = 10_000  # not-acquired transfers remembered per session for a later message.acquire


def session_key(vhost: str, principal: str, name: bytes) -> str:
    return f"{vhost}\x00{principal}\x00{bytes(name).hex()}"


def durable_links_of(sessions, principal: str) -> int:
    """The 1.0 durable links of ``principal`` among ``sessions`` (all vhosts, attached or detached)."""
    return sum(1 for s in sessions.values() if s.principal == principal and s.name.startswith(DURABLE_LINK_PREFIX))


class SessionCommands:
    """AMQP 0-10 sessions: attach, detach, exactly-once commands, subscriptions, credit, settlement, queries."""

    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def session_handlers(self) -> dict:
        return {
            Op.SESSION_ATTACH: self.session_attach,
            Op.SESSION_DETACH: self.session_detach,
            Op.SESSION_TIMEOUT: self.session_timeout,
            Op.SESSION_COMMAND: self.session_command,
            Op.SESSION_KNOWN_COMPLETED: self.session_known_completed,
            Op.MESSAGE_SUBSCRIBE: self.message_subscribe,
            Op.MESSAGE_FLOW: self.message_flow,
            Op.SESSION_WINDOW_CREDIT: self.session_window_credit,
            Op.MESSAGE_FLOW_MODE: self.message_flow_mode,
            Op.MESSAGE_STOP: self.message_stop,
            Op.MESSAGE_FLUSH: self.message_flush,
            Op.MESSAGE_SETTLE: self.message_settle,
            Op.SESSION_TX_SELECT: self.session_tx_select,
            Op.MESSAGE_ACQUIRE: self.message_acquire,
            Op.MESSAGE_RESUME: lambda cmd: 0,  # no partial transfers are kept: resume from offset 0
            Op.QUEUE_QUERY: self.queue_query,
            Op.EXCHANGE_QUERY: self.exchange_query,
            Op.EXCHANGE_BOUND: self.exchange_bound,
        }

    def session_attach(self, cmd: SessionAttach):
        m = self.m
        (conn, number, vhost_name, principal, name, force) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.principal, cmd.name, cmd.force)
        if m.group == META_GROUP:  # (a queue group may not have the vhost yet: the metadata group decides)
            m.vhost(vhost_name)
        key = session_key(vhost_name, principal, name)
        session = m.sessions.get(key)
        if session is None and bytes(name).startswith(DURABLE_LINK_PREFIX) \
                and durable_links_of(m.sessions, principal) >= m.durable_links_limit:
            # a new 1.0 durable link beyond the user's bound (a re-attach is no new one); before any change
            raise m.error(530, f"NOT_ALLOWED - user '{principal}' has {m.durable_links_limit} durable links "
                               "(amqp10_durable_links_per_user)")
        if session is not None and session.channel.conn is not None:
            if session.channel.conn == conn and session.channel.number == number:
                pass  # a repeated attach on the same channel: idempotent
            elif not force:
                return SessionBusy()
            else:
                old_conn, old_number = session.channel.conn, session.channel.number
                self.unregister_channel(session.channel)
                if m.group == META_GROUP:  # (every group applies the attach: one tells the old connection)
                    m._out.append(OutSessionDetached(old_conn, OUT_SESSION_DETACHED, old_number, bytes(name)))
                if session.timeout <= 0:
                    # Taking over detaches the old attachment, and state with a zero timeout does
                    # not outlive a detach (session.request-timeout L4587ff, 3.6.4): a new session.
                    # (qpid.messaging re-attaches this way after failover and numbers from 0 again.)
                    self.destroy_session(session)
                    session = None
        existing = m.channels.get(conn, {}).get(number)
        if existing is not None and existing is not (session.channel if session else None):
            raise m.error(530, f"channel {number} is already attached to another session")
        resumed = session is not None
        if session is None:
            session = Session(key, vhost_name, principal, bytes(name), ChannelState(conn, number))
            if m.group_count > 1:  # issue 34: this group's transfer ids (store/core/group_sessions.py)
                session.next_transfer = group_sessions.first_transfer(m)
            session.channel.session = session
            m.sessions[key] = session
        ch = session.channel
        ch.conn, ch.number = conn, number
        m.channels.setdefault(conn, {})[number] = ch
        session.detached_at = None
        m.detached_sessions.pop(key, None)
        value = self.attached(session, resumed)
        for consumer in ch.consumers.values():
            m._dirty[consumer.queue.qid] = consumer.queue  # deliveries resume
        if resumed and m.tx_coord and cmd.token is not None and m.tx_groups.attach_waits(session, cmd):
            # Issue 34: a 0-10 transaction of this session across groups is deciding; the resume is
            # answered when it ended (store/core/tx_groups.py), so that the completed set the client
            # gets says whether its commit happened: a commit the coordinator began is never
            # replayed as a lost one, nor reported done before it is.
            return GroupPending(None, 1)
        return value

    def attached(self, session: Session, resumed: bool) -> SessionAttached:
        """The attach's answer: the barrier, the unsettled transfers to replay in id order."""
        ch = session.channel
        replay = []
        for transfer_id, (qid, seq, destination) in sorted(session.transfers.items()):
            item = ch.unacked.get((qid, seq))
            if item is not None:
                queue, entry = item
                message = entry.message
                if queue.delivery_header and entry.delivery_count > 1:  # as first sent (issue 21)
                    message = with_delivery_count(message, entry.delivery_count - 1)
                replay.append((transfer_id, destination, qid, seq, message))
        decided = self.m.tx_decided.get(session.key, ()) if self.m.tx_decided else ()
        return SessionAttached(resumed, [list(r) for r in session.completed], replay, session.transactional,
                               [list(r) for r in decided])

    def unregister_channel(self, ch: ChannelState) -> None:
        m = self.m
        conn = ch.conn
        channels = m.channels.get(conn) if conn is not None else None
        if conn is not None and channels is not None and channels.get(ch.number) is ch:
            del channels[ch.number]
            if not channels:
                del m.channels[conn]
        ch.conn = None

    def session_detach(self, cmd: SessionDetach) -> None:
        m = self.m
        ch = m.channel(cmd.conn, cmd.channel)
        if ch.session is not None:
            self.detach(ch.session)

    def detach(self, session: Session) -> None:
        """The client went away (detach, connection closed, node down): keep the state for its timeout."""
        m = self.m
        self.unregister_channel(session.channel)
        if session.timeout <= 0:
            self.destroy_session(session)
            return
        session.detached_at = m._now
        m.detached_sessions[session.key] = session

    def destroy_session(self, session: Session) -> None:
        m = self.m
        if m.sessions.pop(session.key, None) is None:
            return
        m.detached_sessions.pop(session.key, None)
        if m.tx_decided:
            m.tx_decided.pop(session.key, None)
        ch = session.channel
        self.unregister_channel(ch)
        for consumer in list(ch.consumers.values()):
            m.delivery.remove_consumer(consumer)
        m.delivery.requeue_all(ch)
        session.transfers.clear()
        for queue in list(m.exclusive_queues.pop(session.key, {}).values()):
            session_rules.orphans_to_alternate(m, queue)
            m.topology.delete_queue(queue)

    def session_timeout(self, cmd: SessionTimeout) -> int:
        m = self.m
        ch = m.channel(cmd.conn, cmd.channel)
        granted = max(0, min(int(cmd.seconds), MAX_SESSION_TIMEOUT))
        if ch.session is not None:
            ch.session.timeout = granted
        return granted

    def expire_sessions(self) -> None:
        m = self.m
        for session in list(m.detached_sessions.values()):
            if session.detached_at is not None and m._now - session.detached_at >= session.timeout * 1_000_000:
                self.destroy_session(session)

    def session_command(self, cmd: SessionCommand):
        """Execute ``inner`` once per (session, command id): the incoming idempotence barrier."""
        m = self.m
        conn, number, command_id, inner = cmd.conn, cmd.channel, cmd.command_id, cmd.inner
        ch = m.channel(conn, number)
        session = ch.session
        if session is None:
            raise m.error(503, "session command on a channel without a session")
        if rs.contains(session.completed, command_id):
            return Duplicate()
        rs.add(session.completed, command_id, command_id)
        if m.group_count > 1:
            if not group_sessions.session_part(m, conn, number, inner):
                return None  # issue 34: another group executes it; this one keeps the barrier alike
            if inner.op == Op.TX_BEGIN:  # issue 34: tx.commit across groups, the coordinator's record
                return m.tx_groups.begin_session(session, cmd)
        m._caller_owner = session.key
        # Issue 34: a metadata command (forwarded to the queue groups) and a queue.delete (forgotten
        # by every group) keep the session command's token, so that the other groups answer it too
        # and it completes once they have, as a 0-9-1 declare-ok or delete-ok (store/core/groups.py).
        token = cmd.token if m.group_count > 1 and (inner.op in META_OPS or inner.op == Op.QUEUE_DELETE) else None
        try:
            inner = session_rules.check(m, conn, number, inner._replace(conn=conn, token=token, channel=number))
            value: object
            if isinstance(inner, QueueDeclare) and inner.passive:
                value = session_rules.passive_declare(m, inner)
            else:
                value = m._handlers[inner.op](inner)
        finally:
            m._caller_owner = None
        if inner.op in RESULT_OPS:
            # The result travels in an execution.result command: give it an id of ours.
            return CommandResult(group_sessions.next_id(session, m.group_count), value)
        return value

    def session_tx_select(self, cmd: SessionTxSelect) -> None:
        m = self.m
        ch = m.channel(cmd.conn, cmd.channel)
        if ch.session is None:
            raise m.error(503, "tx.select on a channel without a session")
        ch.session.transactional = True

    def session_known_completed(self, cmd: SessionKnownCompleted) -> None:
        m = self.m
        ch = m.channel(cmd.conn, cmd.channel)
        if ch.session is not None:
            for lo, hi in cmd.ranges:
                rs.remove(ch.session.completed, lo, hi)
            decided = m.tx_decided.get(ch.session.key) if m.tx_decided else None
            if decided is not None:  # issue 34: the client knows these commits completed
                for lo, hi in cmd.ranges:
                    rs.remove(decided, lo, hi)
                if not decided:
                    del m.tx_decided[ch.session.key]

    def message_subscribe(self, cmd: MessageSubscribe) -> str:
        m = self.m
        (conn, number, vhost_name, queue_name, destination, accept_none, exclusive, args) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.queue, cmd.destination, cmd.accept_none, cmd.exclusive,
            cmd.arguments)
        browse = bool(cmd.browse)
        tag = m.delivery.consume(Consume(conn, None, number, vhost_name, queue_name, destination,
                             bool(accept_none) or browse, bool(exclusive), args))
        consumer = m.channel(conn, number).consumers[tag]
        consumer.credit_messages = 0  # 0-10: a subscription starts without credit (message.flow)
        consumer.credit_bytes = 0
        consumer.window_mode = True  # message.set-flow-mode rule default-flow-mode (L6137ff): window
        if browse:  # acquire-mode not-acquired: see messages, leave them for others until acquired
            queue = consumer.queue
            queue.consumers.remove(consumer)
            if consumer.filter is not None:
                queue.selective.remove(consumer)  # a filtered browser: browse() applies its filter
            queue.browsers.append(consumer)
            consumer.browse = True
        return tag

    def browse(self, queue) -> None:
        """Send not-acquired transfers of messages each browser has not seen yet (in queue order)."""
        m = self.m
        scanned = 0
        for consumer in queue.browsers:
            session = consumer.channel.session
            while consumer.has_credit():
                entry = queue.ready.next_after(consumer.cursor)
                if entry is None or not consumer.fits(entry):
                    break
                if consumer.filter is not None and not consumer.filter.matches(entry.message, m._now):
                    # Not for this browser (issue 37); a scan bounded as Delivery.dispatch_selective's.
                    scanned += 1
                    if scanned > _delivery.SCAN_LIMIT:
                        m.rescan[queue.qid] = queue
                        break
                    consumer.cursor = entry.seq
                    continue
                consumer.cursor = entry.seq
                self.take_credit(consumer, entry.message)
                transfer_id = group_sessions.next_id(session, m.group_count)
                session.browsed[transfer_id] = (queue.qid, entry.seq, consumer.tag)
                if len(session.browsed) > MAX_BROWSED:
                    del session.browsed[next(iter(session.browsed))]
                ch = consumer.channel
                message = entry.message
                if queue.delivery_header and entry.delivery_count > 0:
                    message = with_delivery_count(message, entry.delivery_count)
                m._out.append((ch.conn, OUT_TRANSFER, ch.number, consumer.tag,
                               (transfer_id, queue.qid, entry.seq, entry.delivery_count > 0, message)))

    def message_acquire(self, cmd: MessageAcquire) -> list:
        """message.acquire (L5854): take browsed messages that are still available; the ranges acquired."""
        m = self.m
        conn, number, id_ranges = cmd.conn, cmd.channel, cmd.ranges
        ch = m.channel(conn, number)
        session = ch.session
        acquired = []
        for transfer_id in rs.ids(id_ranges):
            item = session.browsed.pop(transfer_id, None) if session else None
            if session is None or item is None:
                continue
            qid, seq, destination = item
            queue = m.queues_by_id.get(qid)
            entry = queue.ready.remove_seq(seq) if queue is not None else None
            if queue is None or entry is None:
                continue  # consumed, expired or acquired by someone else meanwhile
            queue.ready_bytes -= entry.message.size
            entry.delivery_count += 1
            m.delivery.hold(ch, ch, queue, entry)
            session.transfers[transfer_id] = (qid, seq, destination)
            acquired.append(transfer_id)
        return rs.from_ids(acquired)

    def subscription(self, cmd: MessageFlow | MessageFlowMode | MessageStop | MessageFlush) -> Consumer:
        m = self.m
        ch = m.channel(cmd.conn, cmd.channel)
        consumer = ch.consumers.get(cmd.destination)
        if consumer is None:
            raise m.error(404, f"no subscription '{cmd.destination}'")
        return consumer

    def local_subscription(self, cmd: MessageFlow | MessageFlowMode | MessageStop | MessageFlush) -> Consumer | None:
        """``subscription``, except that with several groups a subscription of another group is no
        error: the front end sends a link's credit to every group when it does not know the
        subscription's (a 1.0 durable link resumed on another node; node/groups.py)."""
        m = self.m
        if m.group_count > 1:
            ch = m.channels.get(cmd.conn, {}).get(cmd.channel)
            return ch.consumers.get(cmd.destination) if ch is not None else None
        return self.subscription(cmd)

    def message_flow(self, cmd: MessageFlow) -> None:
        m = self.m
        consumer = self.local_subscription(cmd)
        if consumer is None:
            return
        unit, value = cmd.unit, cmd.value
        attr = "credit_messages" if unit == 0 else "credit_bytes"
        current = getattr(consumer, attr)
        if value == UNLIMITED or current is None or current >= UNLIMITED:
            setattr(consumer, attr, UNLIMITED)
        else:
            setattr(consumer, attr, current + value)
        m._dirty[consumer.queue.qid] = consumer.queue

    def session_window_credit(self, cmd: SessionWindowCredit) -> None:
        """Window mode: the client completed transfers (session.completed), which "implicitly grants a
        single unit of message credit, and the size of the message in byte credits" each (L6097ff).
        Never an error: a subscription gone or switched to credit mode meanwhile just gets none."""
        m = self.m
        ch = m.channels.get(cmd.conn, {}).get(cmd.channel)
        consumer = ch.consumers.get(cmd.destination) if ch is not None else None
        if consumer is None or not consumer.window_mode:
            return
        for attr, value in (("credit_messages", cmd.messages), ("credit_bytes", cmd.bytes)):
            current = getattr(consumer, attr)
            if current is not None and current < UNLIMITED:
                setattr(consumer, attr, min(UNLIMITED - 1, current + value))
        m._dirty[consumer.queue.qid] = consumer.queue

    def message_flow_mode(self, cmd: MessageFlowMode) -> None:
        consumer = self.local_subscription(cmd)
        if consumer is None:
            return
        consumer.window_mode = bool(cmd.window)
        consumer.credit_messages = consumer.credit_bytes = 0

    def message_stop(self, cmd: MessageStop) -> None:
        consumer = self.local_subscription(cmd)
        if consumer is None:
            return
        consumer.credit_messages = consumer.credit_bytes = 0

    def message_flush(self, cmd: MessageFlush) -> None:
        m = self.m
        consumer = self.local_subscription(cmd)
        if consumer is None:
            return
        m.delivery.dispatch(consumer.queue)
        consumer.credit_messages = consumer.credit_bytes = 0

    def take_credit(self, consumer: Consumer, message: Message) -> None:
        """One message and its transfer's bytes (store/model.transfer_credit) off finite credit."""
        if consumer.credit_messages is not None and consumer.credit_messages < UNLIMITED:
            consumer.credit_messages -= 1
        if consumer.credit_bytes is not None and consumer.credit_bytes < UNLIMITED:
            consumer.credit_bytes = max(0, consumer.credit_bytes - _model.transfer_credit(message))

    def message_settle(self, cmd: MessageSettle) -> None:
        m = self.m
        conn, number, id_ranges, how = cmd.conn, cmd.channel, cmd.ranges, cmd.how
        ch = m.channel(conn, number)
        session = ch.session
        if session is None:
            raise m.error(503, "message settlement on a channel without a session")
        refs = []
        for transfer_id in rs.ids(id_ranges):
            item = session.transfers.pop(transfer_id, None)
            if item is None:
                continue  # settled already (a replayed accept) or never sent
            qid, seq, _destination = item
            refs.append((qid, seq))
        for queue, entry in m.delivery.take_unacked(ch, refs):
            if how == SETTLE_ACCEPT:
                m.stats["acked"] += 1
                m.count_ack(queue.qid)
                m.event(EV.ACKED, queue, entry.message, "", "", conn)
                m.delivery.drop(queue, entry)
            elif how == SETTLE_REJECT:
                m.expiry.dead_letter(queue, entry.message, "rejected", conn)
                m.delivery.drop(queue, entry)
            else:
                if how == SETTLE_RELEASE and entry.delivery_count > 0:
                    entry.delivery_count -= 1  # release without set-redelivered
                m.delivery.return_to_ready(queue, entry)
        # Window mode credit is not restored here: message.set-flow-mode (L6097ff) "message.accept,
        # message.release, message.reject, tx.commit and tx.rollback have no effect on the outstanding
        # credit balances"; the front end grants it when session.completed covers the transfer.

    def queue_query(self, cmd: QueueQuery):
        """(name, durable, exclusive, auto_delete, arguments, messages, consumers) or None."""
        m = self.m
        vhost = m.vhost(cmd.vhost)
        queue = vhost.queues.get(cmd.name)
        if queue is None:
            return None
        return (queue.name, queue.durable, queue.exclusive_owner is not None, queue.auto_delete,
                dict(queue.arguments), len(queue.ready), len(queue.consumers))

    def exchange_query(self, cmd: ExchangeQuery):
        """(type, durable, arguments) or None."""
        m = self.m
        exchange = m.vhost(cmd.vhost).exchanges.get(cmd.name)
        if exchange is None:
            return None
        return (exchange.type, exchange.durable, dict(exchange.arguments))

    def exchange_bound(self, cmd: ExchangeBound):
        """0-10 exchange.bound: (exchange-not-found, queue-not-found, queue-not-matched,
        key-not-matched, args-not-matched)."""
        m = self.m
        vhost = m.vhost(cmd.vhost)
        exchange_name, queue_name, key, args = cmd.exchange, cmd.queue, cmd.routing_key, cmd.arguments
        exchange = vhost.exchanges.get(exchange_name)
        queue_missing = bool(queue_name) and queue_name not in vhost.queues  # no queue given: not asked
        if exchange is None:
            return (True, queue_missing, False, False, False)
        to_queue = [b for b in exchange.bindings if b.dest_is_queue and b.destination == queue_name]
        # key-not-matched (L7565ff): "no binding was found from the specified exchange with the
        # specified binding-key" -- to any queue: each flag answers its own question.
        key_match = [b for b in exchange.bindings if key is None or b.routing_key == key]
        args_match = [b for b in key_match if args is None or b.arguments == args]
        return (False, queue_missing, bool(queue_name) and not to_queue,
                key is not None and not key_match, args is not None and not args_match)
