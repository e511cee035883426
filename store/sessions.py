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

Command layouts (``[op, conn, token, channel, *args]``):

  SESSION_ATTACH(vhost, principal, name, force) -> ("busy",) | ("attached", resumed, completed, replay, tx)
  SESSION_DETACH()                              SESSION_TIMEOUT(seconds) -> granted seconds
  SESSION_COMMAND(command_id, inner)            -> inner's result, or ("duplicate",)
  SESSION_KNOWN_COMPLETED(ranges)               SESSION_TX_SELECT()
  MESSAGE_SUBSCRIBE(vhost, queue, destination, accept_none, exclusive, args[, browse])
  MESSAGE_ACQUIRE(ranges) -> ("result", id, acquired ranges)    MESSAGE_RESUME() -> ("result", id, 0)
  MESSAGE_FLOW(destination, unit, value)        MESSAGE_FLOW_MODE(destination, window)
  MESSAGE_STOP(destination)                     MESSAGE_FLUSH(destination)
  MESSAGE_SETTLE(ranges, how)                   how: 0 accept, 1 release, 2 release+redelivered, 3 reject
  SESSION_WINDOW_CREDIT(destination, messages, bytes)  (submitted bare by the front end, never fails)
"""

from __future__ import annotations

from . import events as EV
from . import ranges as rs
from . import session_rules
from .commands import OUT_SESSION_DETACHED, OUT_TRANSFER, Op
from .headers import with_delivery_count
from .model import ChannelState, Consumer, Session

MAX_SESSION_TIMEOUT = 3600  # seconds: a detached session's state is kept at most this long
UNLIMITED = 0xFFFFFFFF
SETTLE_ACCEPT, SETTLE_RELEASE, SETTLE_RELEASE_REDELIVERED, SETTLE_REJECT = range(4)


RESULT_OPS = frozenset((Op.QUEUE_QUERY, Op.EXCHANGE_QUERY, Op.EXCHANGE_BOUND, Op.MESSAGE_ACQUIRE,
                        Op.MESSAGE_RESUME))
MAX_BROWSED = 10_000  # not-acquired transfers remembered per session for a later message.acquire


def session_key(vhost: str, principal: str, name: bytes) -> str:
    return f"{vhost}\x00{principal}\x00{bytes(name).hex()}"


class SessionMixin:
    """The session handlers of ``StateMachine`` (kept apart: one module, one job)."""

    sessions: dict[str, Session]

    def _session_handlers(self) -> dict:
        return {
            Op.SESSION_ATTACH: self._session_attach,
            Op.SESSION_DETACH: self._session_detach,
            Op.SESSION_TIMEOUT: self._session_timeout,
            Op.SESSION_COMMAND: self._session_command,
            Op.SESSION_KNOWN_COMPLETED: self._session_known_completed,
            Op.MESSAGE_SUBSCRIBE: self._message_subscribe,
            Op.MESSAGE_FLOW: self._message_flow,
            Op.SESSION_WINDOW_CREDIT: self._session_window_credit,
            Op.MESSAGE_FLOW_MODE: self._message_flow_mode,
            Op.MESSAGE_STOP: self._message_stop,
            Op.MESSAGE_FLUSH: self._message_flush,
            Op.MESSAGE_SETTLE: self._message_settle,
            Op.SESSION_TX_SELECT: self._session_tx_select,
            Op.MESSAGE_ACQUIRE: self._message_acquire,
            Op.MESSAGE_RESUME: lambda cmd: 0,  # no partial transfers are kept: resume from offset 0
            Op.QUEUE_QUERY: self._queue_query,
            Op.EXCHANGE_QUERY: self._exchange_query,
            Op.EXCHANGE_BOUND: self._exchange_bound,
        }

    # ------------------------------------------------------------------ attachment

    def _session_attach(self, cmd: list):
        _, conn, _, number, vhost_name, principal, name, force = cmd
        self._vhost(vhost_name)
        key = session_key(vhost_name, principal, name)
        session = self.sessions.get(key)
        if session is not None and session.channel.conn is not None:
            if session.channel.conn == conn and session.channel.number == number:
                pass  # a repeated attach on the same channel: idempotent
            elif not force:
                return ("busy",)
            else:
                old_conn, old_number = session.channel.conn, session.channel.number
                self._unregister_channel(session.channel)
                self._out.append((old_conn, OUT_SESSION_DETACHED, old_number, bytes(name)))
                if session.timeout <= 0:
                    # Taking over detaches the old attachment, and state with a zero timeout does
                    # not outlive a detach (session.request-timeout L4587ff, 3.6.4): a new session.
                    # (qpid.messaging re-attaches this way after failover and numbers from 0 again.)
                    self._destroy_session(session)
                    session = None
        existing = self.channels.get(conn, {}).get(number)
        if existing is not None and existing is not (session.channel if session else None):
            raise self._error(530, f"channel {number} is already attached to another session")
        resumed = session is not None
        if session is None:
            session = Session(key, vhost_name, principal, bytes(name), ChannelState(conn, number))
            session.channel.session = session
            self.sessions[key] = session
        ch = session.channel
        ch.conn, ch.number = conn, number
        self.channels.setdefault(conn, {})[number] = ch
        session.detached_at = None
        self.detached_sessions.pop(key, None)
        replay = []
        for transfer_id, (qid, seq, destination) in sorted(session.transfers.items()):
            item = ch.unacked.get((qid, seq))
            if item is not None:
                queue, entry = item
                message = entry.message
                if queue.delivery_header and entry.delivery_count > 1:  # as first sent (issue 21)
                    message = with_delivery_count(message, entry.delivery_count - 1)
                replay.append((transfer_id, destination, qid, seq, message))
        for consumer in ch.consumers.values():
            self._dirty[consumer.queue.qid] = consumer.queue  # deliveries resume
        return ("attached", resumed, [list(r) for r in session.completed], replay, session.transactional)

    def _unregister_channel(self, ch: ChannelState) -> None:
        channels = self.channels.get(ch.conn)
        if channels is not None and channels.get(ch.number) is ch:
            del channels[ch.number]
            if not channels:
                del self.channels[ch.conn]
        ch.conn = None

    def _session_detach(self, cmd: list) -> None:
        ch = self._channel(cmd[1], cmd[3])
        if ch.session is not None:
            self._detach(ch.session)

    def _detach(self, session: Session) -> None:
        """The client went away (detach, connection closed, node down): keep the state for its timeout."""
        self._unregister_channel(session.channel)
        if session.timeout <= 0:
            self._destroy_session(session)
            return
        session.detached_at = self._now
        self.detached_sessions[session.key] = session

    def _destroy_session(self, session: Session) -> None:
        if self.sessions.pop(session.key, None) is None:
            return
        self.detached_sessions.pop(session.key, None)
        ch = session.channel
        self._unregister_channel(ch)
        for consumer in list(ch.consumers.values()):
            self._remove_consumer(consumer)
        self._requeue_all(ch)
        session.transfers.clear()
        for queue in list(self.exclusive_queues.pop(session.key, {}).values()):
            self._delete_queue(queue)

    def _session_timeout(self, cmd: list) -> int:
        ch = self._channel(cmd[1], cmd[3])
        granted = max(0, min(int(cmd[4]), MAX_SESSION_TIMEOUT))
        if ch.session is not None:
            ch.session.timeout = granted
        return granted

    def _expire_sessions(self) -> None:
        for session in list(self.detached_sessions.values()):
            if session.detached_at is not None and self._now - session.detached_at >= session.timeout * 1_000_000:
                self._destroy_session(session)

    # ------------------------------------------------------------------ commands

    def _session_command(self, cmd: list):
        """Execute ``inner`` once per (session, command id): the incoming idempotence barrier."""
        _, conn, _, number, command_id, inner = cmd
        ch = self._channel(conn, number)
        session = ch.session
        if session is None:
            raise self._error(503, "session command on a channel without a session")
        if rs.contains(session.completed, command_id):
            return ("duplicate",)
        rs.add(session.completed, command_id, command_id)
        self._caller_owner = session.key
        try:
            session_rules.check(self, conn, number, inner)
            value = self._handlers[inner[0]]([inner[0], conn, None, number, *inner[4:]])
        finally:
            self._caller_owner = None
        if inner[0] in RESULT_OPS:
            # The result travels in an execution.result command: give it an id of ours.
            result_id = session.next_transfer
            session.next_transfer += 1
            return ("result", result_id, value)
        return value

    def _session_tx_select(self, cmd: list) -> None:
        ch = self._channel(cmd[1], cmd[3])
        if ch.session is None:
            raise self._error(503, "tx.select on a channel without a session")
        ch.session.transactional = True

    def _session_known_completed(self, cmd: list) -> None:
        ch = self._channel(cmd[1], cmd[3])
        if ch.session is not None:
            for lo, hi in cmd[4]:
                rs.remove(ch.session.completed, lo, hi)

    # ------------------------------------------------------------------ subscriptions

    def _message_subscribe(self, cmd: list) -> str:
        _, conn, _, number, vhost_name, queue_name, destination, accept_none, exclusive, args = cmd[:10]
        browse = len(cmd) > 10 and bool(cmd[10])
        tag = self._consume([Op.CONSUME, conn, None, number, vhost_name, queue_name, destination,
                             bool(accept_none) or browse, bool(exclusive), args])
        consumer = self._channel(conn, number).consumers[tag]
        consumer.credit_messages = 0  # 0-10: a subscription starts without credit (message.flow)
        consumer.credit_bytes = 0
        consumer.window_mode = True  # message.set-flow-mode rule default-flow-mode (L6137ff): window
        if browse:  # acquire-mode not-acquired: see messages, leave them for others until acquired
            queue = consumer.queue
            queue.consumers.remove(consumer)
            queue.browsers.append(consumer)
            consumer.browse = True
        return tag

    def _browse(self, queue) -> None:
        """Send not-acquired transfers of messages each browser has not seen yet (in queue order)."""
        for consumer in queue.browsers:
            session = consumer.channel.session
            while consumer.has_credit():
                entry = queue.ready.next_after(consumer.cursor)
                if entry is None or not consumer.fits(entry):
                    break
                consumer.cursor = entry.seq
                self._take_credit(consumer, len(entry.message.body))
                transfer_id = session.next_transfer
                session.next_transfer += 1
                session.browsed[transfer_id] = (queue.qid, entry.seq, consumer.tag)
                if len(session.browsed) > MAX_BROWSED:
                    del session.browsed[next(iter(session.browsed))]
                ch = consumer.channel
                message = entry.message
                if queue.delivery_header and entry.delivery_count > 0:
                    message = with_delivery_count(message, entry.delivery_count)
                self._out.append((ch.conn, OUT_TRANSFER, ch.number, consumer.tag,
                                  (transfer_id, queue.qid, entry.seq, entry.delivery_count > 0, message)))

    def _message_acquire(self, cmd: list) -> list:
        """message.acquire (L5854): take browsed messages that are still available; the ranges acquired."""
        _, conn, _, number, id_ranges = cmd
        ch = self._channel(conn, number)
        session = ch.session
        acquired = []
        for transfer_id in rs.ids(id_ranges):
            item = session.browsed.pop(transfer_id, None) if session else None
            if item is None:
                continue
            qid, seq, destination = item
            queue = self.queues_by_id.get(qid)
            entry = queue.ready.remove_seq(seq) if queue is not None else None
            if entry is None:
                continue  # consumed, expired or acquired by someone else meanwhile
            queue.ready_bytes -= len(entry.message.body)
            entry.delivery_count += 1
            self._hold(ch, ch, queue, entry)
            session.transfers[transfer_id] = (qid, seq, destination)
            acquired.append(transfer_id)
        return rs.from_ids(acquired)

    def _subscription(self, cmd: list) -> Consumer:
        ch = self._channel(cmd[1], cmd[3])
        consumer = ch.consumers.get(cmd[4])
        if consumer is None:
            raise self._error(404, f"no subscription '{cmd[4]}'")
        return consumer

    def _message_flow(self, cmd: list) -> None:
        consumer = self._subscription(cmd)
        unit, value = cmd[5], cmd[6]
        attr = "credit_messages" if unit == 0 else "credit_bytes"
        current = getattr(consumer, attr)
        if value == UNLIMITED or current is None or current >= UNLIMITED:
            setattr(consumer, attr, UNLIMITED)
        else:
            setattr(consumer, attr, current + value)
        self._dirty[consumer.queue.qid] = consumer.queue

    def _session_window_credit(self, cmd: list) -> None:
        """Window mode: the client completed transfers (session.completed), which "implicitly grants a
        single unit of message credit, and the size of the message in byte credits" each (L6097ff).
        Never an error: a subscription gone or switched to credit mode meanwhile just gets none."""
        _, conn, _, number, destination, messages, size = cmd
        ch = self.channels.get(conn, {}).get(number)
        consumer = ch.consumers.get(destination) if ch is not None else None
        if consumer is None or not consumer.window_mode:
            return
        for attr, value in (("credit_messages", messages), ("credit_bytes", size)):
            current = getattr(consumer, attr)
            if current is not None and current < UNLIMITED:
                setattr(consumer, attr, min(UNLIMITED - 1, current + value))
        self._dirty[consumer.queue.qid] = consumer.queue

    def _message_flow_mode(self, cmd: list) -> None:
        consumer = self._subscription(cmd)
        consumer.window_mode = bool(cmd[5])
        consumer.credit_messages = consumer.credit_bytes = 0

    def _message_stop(self, cmd: list) -> None:
        consumer = self._subscription(cmd)
        consumer.credit_messages = consumer.credit_bytes = 0

    def _message_flush(self, cmd: list) -> None:
        consumer = self._subscription(cmd)
        self._dispatch(consumer.queue)
        consumer.credit_messages = consumer.credit_bytes = 0

    def _take_credit(self, consumer: Consumer, size: int) -> None:
        if consumer.credit_messages is not None and consumer.credit_messages < UNLIMITED:
            consumer.credit_messages -= 1
        if consumer.credit_bytes is not None and consumer.credit_bytes < UNLIMITED:
            consumer.credit_bytes = max(0, consumer.credit_bytes - size)

    def _message_settle(self, cmd: list) -> None:
        _, conn, _, number, id_ranges, how = cmd
        ch = self._channel(conn, number)
        session = ch.session
        if session is None:
            raise self._error(503, "message settlement on a channel without a session")
        refs = []
        for transfer_id in rs.ids(id_ranges):
            item = session.transfers.pop(transfer_id, None)
            if item is None:
                continue  # settled already (a replayed accept) or never sent
            qid, seq, _destination = item
            refs.append((qid, seq))
        for queue, entry in self._take_unacked(ch, refs):
            if how == SETTLE_ACCEPT:
                self.stats["acked"] += 1
                self._event(EV.ACKED, queue, entry.message)
                self._drop(queue, entry)
            elif how == SETTLE_REJECT:
                self._dead_letter(queue, entry.message, "rejected")
                self._drop(queue, entry)
            else:
                if how == SETTLE_RELEASE and entry.delivery_count > 0:
                    entry.delivery_count -= 1  # release without set-redelivered
                self._return_to_ready(queue, entry)
        # Window mode credit is not restored here: message.set-flow-mode (L6097ff) "message.accept,
        # message.release, message.reject, tx.commit and tx.rollback have no effect on the outstanding
        # credit balances"; the front end grants it when session.completed covers the transfer.

    # ------------------------------------------------------------------ queries (0-10 results)

    def _queue_query(self, cmd: list):
        """(name, durable, exclusive, auto_delete, arguments, messages, consumers) or None."""
        vhost = self._vhost(cmd[4])
        queue = vhost.queues.get(cmd[5])
        if queue is None:
            return None
        return (queue.name, queue.durable, queue.exclusive_owner is not None, queue.auto_delete,
                dict(queue.arguments), len(queue.ready), len(queue.consumers))

    def _exchange_query(self, cmd: list):
        """(type, durable, arguments) or None."""
        exchange = self._vhost(cmd[4]).exchanges.get(cmd[5])
        if exchange is None:
            return None
        return (exchange.type, exchange.durable, dict(exchange.arguments))

    def _exchange_bound(self, cmd: list):
        """0-10 exchange.bound: (exchange-not-found, queue-not-found, queue-not-matched,
        key-not-matched, args-not-matched)."""
        vhost = self._vhost(cmd[4])
        exchange_name, queue_name, key, args = cmd[5], cmd[6], cmd[7], cmd[8]
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
