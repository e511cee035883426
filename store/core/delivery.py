"""Messages in and out of queues: publishing, consumers, assignment to consumers (dispatch), get,
acks, nacks, recover, transactions, and releasing what is settled.

A concern of the state machine: how the concerns meet is in store/core/machine.py.
"""

from __future__ import annotations

from sys import intern
from typing import TYPE_CHECKING

from . import events as EV
from . import session_rules
from .commands import (
    NOT_HERE,
    OUT_DELIVER,
    OUT_TRANSFER,
    REJECTED,
    ROUTED,
    UNROUTABLE,
    Ack,
    Cancel,
    Consume,
    Get,
    GotMessage,
    Nack,
    Op,
    Publish,
    Recover,
    TxCommit,
)
from .dedup import dedup_key
from .errors import CommandError
from .exchange_types import PLUGIN_TYPES
from .filters import FILTER_ARGUMENT, FilterError, compile_spec, view_of
from .headers import with_delivery_count
from .message import AMQP091
from .model import ChannelState, Consumer, Entry, Message, Queue

if TYPE_CHECKING:
    from .machine import StateMachine

#: Ready entries one dispatch examines for a queue's filtered consumers (dispatch_selective).
SCAN_LIMIT = 1024

#: A Consume argument the 0-9-1 front end sets (and strips from what clients send) on an auto-ack
#: consumer: the message credit it starts with.  The front end tops it up (``SessionWindowCredit``,
#: never an error) as it writes the deliveries, so that the core assigns an auto-ack consumer -- whose
#: messages leave their queue when assigned -- only as fast as its socket takes them, not a whole
#: backlog in one apply (node/amqp091/autoack.py; docs/design.md "Back-pressure towards consumers").
AUTOACK_CREDIT = "x-raftmq-autoack-credit"


class Delivery:
    def __init__(self, machine: StateMachine) -> None:
        self.m = machine
        self._publishing: tuple[int, bytes] | None = None  # (id, body) of the message being routed

    def consume(self, cmd: Consume) -> str:
        m = self.m
        (conn, number, vhost_name, queue_name, tag, no_ack, exclusive) = (
            cmd.conn, cmd.channel, cmd.vhost, cmd.queue, cmd.consumer_tag, cmd.no_ack, cmd.exclusive)
        ch = m.channel(conn, number)
        queue = m.queue(m.vhost(vhost_name), queue_name, conn)
        if queue.group != m.group:
            m.groups.check_own(queue)
        selection = None
        arguments = cmd.arguments
        if arguments and isinstance(arguments, dict) and FILTER_ARGUMENT in arguments:
            try:
                selection = compile_spec(arguments[FILTER_ARGUMENT])
            except FilterError as exc:  # the front end checked it: only a hand-made command gets here
                raise CommandError(406, f"invalid filter: {exc}") from None
        if not tag:
            ch.next_tag += 1
            tag = f"amq.ctag-{conn}-{number}-{ch.next_tag}"
            if m.group:  # unique across the groups a channel consumes from (issue 34)
                tag = f"{tag}-g{m.group}"
        if tag in ch.consumers:
            raise CommandError(530, f"attempt to reuse consumer tag '{tag}'")
        if any(c.exclusive for c in queue.consumers) or (exclusive and queue.consumers):
            raise CommandError(
                403, f"queue '{queue_name}' in vhost '{vhost_name}' in exclusive use"
            )
        consumer = Consumer(ch, tag, queue, bool(no_ack), bool(exclusive), ch.consumer_prefetch)
        if no_ack and ch.session is None and arguments and isinstance(arguments, dict):
            credit = arguments.get(AUTOACK_CREDIT)
            if type(credit) is int and credit >= 0:
                # Credit in window mode: SessionWindowCredit adds to it; deliver takes one each.
                consumer.credit_messages = credit
                consumer.window_mode = True
        ch.consumers[tag] = consumer
        queue.consumers.append(consumer)
        if selection is not None:
            consumer.filter = selection
            queue.selective.append(consumer)
        queue.had_consumers = True
        m.topology.touch(queue)
        m._dirty[queue.qid] = queue
        return tag

    def cancel(self, cmd: Cancel) -> str:
        m = self.m
        conn, number, tag = cmd.conn, cmd.channel, cmd.consumer_tag
        ch = m.channel(conn, number)
        consumer = ch.consumers.get(tag)
        if consumer is not None:
            self.remove_consumer(consumer)
        return tag

    def remove_consumer(self, consumer: Consumer) -> None:
        m = self.m
        consumer.channel.consumers.pop(consumer.tag, None)
        queue = consumer.queue
        if consumer.browse:
            if consumer in queue.browsers:
                queue.browsers.remove(consumer)
            return
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
            queue.next_consumer = 0
            if consumer.filter is not None and consumer in queue.selective:
                queue.selective.remove(consumer)
        m.topology.touch(queue)
        if queue.auto_delete and queue.had_consumers and not queue.consumers \
                and queue.exclusive_owner not in m.sessions:
            # A 0-10 session's exclusive auto-delete queue goes when the session ends (queue.declare
            # auto-delete, 0-10 L7682ff), not when its last consumer is cancelled.
            if consumer.channel.session is not None:  # a 0-10 subscription: orphans to the alternate
                session_rules.orphans_to_alternate(m, queue, consumer.channel)
            m.topology.delete_queue(queue)

    def publish(self, cmd: Publish) -> int:
        m = self.m
        # Unpacked by position (Publish's field order), not by name: 0.06 against 0.15 µs, and this
        # runs for every message on every node.
        (conn, _token, number, vhost_name, exchange_name, routing_key, mandatory, props, body, persistent,
         priority, expiration, properties_format, _op) = cmd
        # (lookups inlined: this runs for every message on every node; the helpers raise the errors)
        if conn is not None:
            channels = m.channels.get(conn)
            if channels is None or number not in channels:
                m.channel(conn, number)
        vhost = m.vhosts.get(vhost_name)
        if vhost is None:
            vhost = m.vhost(vhost_name)
        exchange = vhost.exchanges.get(exchange_name)
        if exchange is None:
            exchange = m.exchange(vhost, exchange_name)
        if exchange.internal:
            raise CommandError(403, f"cannot publish to internal exchange '{exchange_name}' in vhost "
                               f"'{vhost_name}'")
        # Share the strings, small property blocks and sizes that messages repeat: every message
        # holds them for as long as it is queued (100 B of the ~650 B a queued 256 B message took;
        # a size above 256 is an int object of 28 B).
        shared = m._shared_props
        if len(shared) >= 1024:
            shared.clear()
        if len(props) <= 64:
            props = shared.setdefault(props, props)
        size = len(body)
        if size > 256:
            size = shared.setdefault(size, size)
        # live=1: the publish's own hold while it is routed, so that a queue dropping it at once
        # (drop-head at length 0) does not release a body another queue is about to take.
        message = Message(m.next_msg_id, exchange.name, intern(routing_key), props, size, bool(persistent),
                          priority or 0, m._now, 0, properties_format, 1)
        m.next_msg_id += 1
        if exchange.type in PLUGIN_TYPES:
            outcome = m.plugin_exchanges.plugin_publish(vhost, exchange, message, conn, expiration)
            if outcome is not None:
                self.keep_body(message, body)
                return outcome
        queues = m.topology.route(vhost, exchange, routing_key, message)
        sent_on = False  # issue 34: copies sent to other groups' queues (a plugin exchange's)
        if m.group_count > 1 and queues:
            if exchange.type in PLUGIN_TYPES:
                # Issue 34: a deduplicating (or x-delay-less delayed) exchange's publishes all go to
                # the metadata group, whose cache sees every one: it sends the copies on.
                routed = len(queues)
                queues = m.groups.route_remote(message, queues, expiration)
                sent_on = len(queues) < routed
            else:
                # This group stores the copies of its own queues; the front end sent the publish to
                # every group it routes to, and one of them answers for the rest.
                own = [queue for queue in queues if queue.group == m.group]
                if not own:
                    return NOT_HERE
                queues = own
        self._publishing = message.id, body  # a reject-publish-dlx copy takes its body from here
        # Numbered alike on every node, chained once the cluster keeps a history, recorded where a
        # history is kept (issue 36); without either, only numbered (no call: the hot path).
        if not m.records_events and not m.chain_on:
            m.event_seq += 1
        else:
            m.event(EV.PUBLISHED, None, message, conn or "", vhost_name, conn)
        stats = m.stats
        stats["published"] += 1
        if not queues and not sent_on:
            stats["unroutable"] += 1
            m.event(EV.UNROUTABLE, None, message, "returned" if mandatory else "dropped", vhost_name)
            return UNROUTABLE
        outcome = ROUTED
        for queue in queues:
            if queue.no_local and self.local_to(queue, conn):
                m.event(EV.DROPPED, queue, message, "no-local")
                continue
            if not self.enqueue(queue, message, expiration):
                outcome = REJECTED
        self.keep_body(message, body)
        self._publishing = None
        return outcome

    def local_to(self, queue: Queue, conn: str | None) -> bool:
        """Whether ``conn`` (a publisher's connection) holds ``queue``: owns it exclusively (a 0-9-1
        connection, or the connection of the 0-10 session that owns it) or has an exclusive
        subscriber on it.  Qpid's no-local (store/core/queue_args.py) drops such messages at once, so
        they neither reach the holder nor stay queued behind it (Qpid's test_no_local_awkward)."""
        if conn is None:
            return False
        owner = queue.exclusive_owner
        if owner is not None:
            session = self.m.sessions.get(owner)
            if (session.channel.conn if session is not None else owner) == conn:
                return True
        return any(consumer.exclusive and consumer.channel.conn == conn for consumer in queue.consumers)

    def body_source(self, message: Message) -> bytes | int:
        """What a copy of ``message`` takes its body from: the bytes while ``message`` is the one
        being published (refused by a full queue, its body is not stored yet), else its id."""
        publishing = self._publishing
        if publishing is not None and publishing[0] == message.id:
            return publishing[1]
        return message.id

    def keep_body(self, message: Message, body: bytes | int) -> None:
        """End a new message's routing hold: if anything still holds it, the node stores its body
        (``body``: the bytes, or the id of the message whose body it shares, for a dead-letter copy)."""
        message.live -= 1
        if message.live:
            self.m._body_puts.append((message.id, body))

    def enqueue(self, queue: Queue, message: Message, expiration: int | None) -> bool:
        """Add ``message`` to ``queue``; False if the queue refused it (reject-publish).

        A duplicate for a deduplicating queue is accepted (its publisher is confirmed) and not
        added: the plugin's queue-level rule (store/core/dedup.py)."""
        m = self.m
        dedup_as = None
        if queue.dedup is not None:
            dedup_as = dedup_key(message.properties, message.format)
            if dedup_as is not None and queue.dedup.seen(dedup_as, m._now):
                m.event(EV.DEDUPLICATED, queue, message, "queue")
                # .get: the stats of a snapshot written before issue 21 lack the key
                m.stats["deduplicated"] = m.stats.get("deduplicated", 0) + 1
                return True
        if queue.max_length is not None or queue.max_length_bytes is not None:
            full = (queue.max_length is not None and len(queue.ready) >= queue.max_length) or (
                queue.max_length_bytes is not None
                and queue.ready_bytes + message.size > queue.max_length_bytes
            )
            if full and queue.overflow != "drop-head":
                if queue.overflow == "reject-publish-dlx":
                    m.expiry.dead_letter(queue, message, "maxlen")
                else:
                    m.event(EV.DROPPED, queue, message, "reject-publish")
                return False
        ttl = queue.message_ttl
        if expiration is not None and (ttl is None or expiration < ttl):
            ttl = expiration
        expires_at = m._now + ttl * 1000 if ttl is not None else None
        priority = min(message.priority, queue.max_priority) if queue.max_priority else 0
        durable = message.persistent and queue.durable and queue.exclusive_owner is None
        entry = Entry(queue.next_seq, message, expires_at, priority, durable)
        queue.next_seq += 1
        queue.ready.append(entry)
        if dedup_as is not None and queue.dedup is not None:
            queue.dedup.add(dedup_as, message.id, m._now, expires_at)
        if not m.records_events and not m.chain_on:
            m.event_seq += 1
        else:
            m.event(EV.ROUTED, queue, message)
        size = message.size
        message.live += 1
        queue.ready_bytes += size
        m.message_bytes += size
        if durable and m._persist is not None:
            if message.refs == 0:
                record = [message.exchange, message.routing_key, message.properties, None,
                          message.priority, message.published_at]
                if message.format != AMQP091:
                    record.append(message.format)  # store format 2; a 0-9-1 record is as in format 1
                m._persist.put_message(message.id, record)  # the node fills the body in (index 3)
            message.refs += 1
            m._persist.put_entry(queue.qid, entry.seq, [message.id, expires_at, priority, 0])
        if expires_at is not None:
            m.expiring[queue.qid] = queue
        if queue.max_length is not None or queue.max_length_bytes is not None:
            while (queue.max_length is not None and len(queue.ready) > queue.max_length) or (
                queue.max_length_bytes is not None and queue.ready_bytes > queue.max_length_bytes
            ):
                dropped = queue.ready.pop_oldest()
                if dropped is None:
                    break
                queue.ready_bytes -= dropped.message.size
                m.expiry.dead_letter(queue, dropped.message, "maxlen")
                self.drop(queue, dropped)
        if queue.consumers or queue.browsers or expires_at is not None or queue.qid in m.expiring:
            # Only then has _dispatch anything to do (a queue nobody consumes fills up with no
            # dispatch at all: this runs for every publish on every node).
            m._dirty[queue.qid] = queue
        return True

    def dispatch(self, queue: Queue) -> None:
        """Give ready messages to consumers with credit, round-robin, one message per turn.

        A queue's only consumer takes as many in a row as its credit allows (``Consumer.room``):
        the same order as turn by turn, without re-checking every limit before every message
        (this loop runs for every delivery on every node)."""
        m = self.m
        consumers = queue.consumers
        if queue.qid in m.expiring:
            m.expiry.expire_head(queue)
        if queue.browsers:
            m.session_commands.browse(queue)
        if queue.selective:
            self.dispatch_selective(queue)
            consumers = [c for c in consumers if c.filter is None]
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
                found: Consumer | None = None
                for i in range(n):
                    candidate = consumers[(start + i) % n]
                    if candidate.room() > 0 and candidate.fits(ready.peek()):
                        found = candidate
                        queue.next_consumer = (start + i + 1) % n
                        break
                if found is None:
                    return
                chosen, room = found, 1
            while room > 0:
                entry = ready.pop()
                if entry is None:
                    return
                queue.ready_bytes -= entry.message.size
                if entry.expires_at is not None and entry.expires_at < m._now:
                    m.expiry.dead_letter(queue, entry.message, "expired")
                    self.drop(queue, entry)
                    continue
                if limit is not None and entry.delivery_count > limit:
                    self.past_limit(queue, entry)  # came back past the limit through a restart
                    continue
                if not chosen.fits(entry):  # 0-10 byte credit smaller than the message: wait
                    ready.requeue(entry)
                    queue.ready_bytes += entry.message.size
                    return
                self.deliver(chosen, queue, entry)
                room -= 1

    def dispatch_selective(self, queue: Queue) -> None:
        """Give filtered consumers (``queue.selective``) the ready messages their filters match.

        Each takes the first matching ready message in sequence order (priorities aside: a filtered
        consumer scans by arrival), leaving the others where they are for other consumers.  They take
        turns, one message each, and one that got a message moves to the end of ``queue.selective``
        (round-robin across dispatches too, as ``next_consumer`` is for unfiltered ones).  A
        consumer's ``scan_cursor`` remembers how far it has looked: every ready entry up to it is
        known not to match, so a later dispatch starts after it (a message returned to the queue
        below it moves it back, ``return_to_ready``).  One dispatch examines at most ``SCAN_LIMIT``
        entries for all the queue's filtered consumers together; a scan cut short puts the queue in
        ``rescan`` and the next TICK goes on (a million non-matching messages cost many short applies,
        never one long one).  Filtered consumers are served before the queue's unfiltered ones."""
        budget = SCAN_LIMIT
        selective = queue.selective
        progress = True
        while progress:
            progress = False
            for consumer in list(selective):
                if consumer.room() <= 0:
                    continue
                entry, budget = self._next_match(queue, consumer, budget)
                if budget < 0:
                    self.m.rescan[queue.qid] = queue
                    return
                if entry is None:
                    continue
                if consumer in selective:  # (a dead-letter cycle cannot cancel it; checked all the same)
                    selective.remove(consumer)
                    selective.append(consumer)
                self.deliver(consumer, queue, entry)
                progress = True

    def _next_match(self, queue: Queue, consumer: Consumer, budget: int) -> tuple[Entry | None, int]:
        """Take the first ready entry after ``consumer``'s cursor that its filter matches (None: none, or
        it does not fit the consumer's byte credit); the budget left (below 0: the scan was cut)."""
        m = self.m
        ready = queue.ready
        selection = consumer.filter
        if selection is None:
            return None, budget  # not a filtered consumer: nothing to scan for
        now = m._now
        limit = queue.delivery_limit
        while True:
            entry = ready.next_after(consumer.scan_cursor)
            if entry is None:
                return None, budget
            budget -= 1
            if budget < 0:
                return None, budget
            message = entry.message
            if entry.expires_at is not None and entry.expires_at < now:
                ready.remove_seq(entry.seq)
                queue.ready_bytes -= message.size
                m.expiry.dead_letter(queue, message, "expired")
                self.drop(queue, entry)
                continue
            if not selection.matches_view(view_of(message), now // 1000):
                consumer.scan_cursor = entry.seq
                continue
            if not consumer.fits(entry):  # 0-10 byte credit smaller than the message: wait
                return None, budget
            ready.remove_seq(entry.seq)
            queue.ready_bytes -= message.size
            if limit is not None and entry.delivery_count > limit:
                self.past_limit(queue, entry)
                continue
            return entry, budget

    def rewind_scans(self, queue: Queue, seq: int) -> None:
        """An entry with sequence ``seq`` is ready again: filtered consumers that had looked past it
        look at it again."""
        for consumer in queue.selective:
            if consumer.scan_cursor >= seq:
                consumer.scan_cursor = seq - 1

    def deliver(self, consumer: Consumer, queue: Queue, entry: Entry) -> None:
        m = self.m
        message = entry.message
        redelivered = entry.delivery_count > 0
        if redelivered and queue.delivery_header:
            message = with_delivery_count(message, entry.delivery_count)
        m.event(EV.DELIVERED, queue, entry.message, EV.NO_ACK + consumer.tag if consumer.no_ack else consumer.tag, "",
                consumer.channel.conn)
        stats = m.stats
        stats["delivered"] += 1
        if redelivered:
            stats["redelivered"] += 1
        counts = m.queue_counts.get(queue.qid)
        if counts is None:
            counts = m.queue_counts[queue.qid] = [0, 0]
        counts[0] += 1
        entry.delivery_count += 1
        ch = consumer.channel
        session = ch.session
        if session is not None:
            m.session_commands.take_credit(consumer, message)
            transfer_id = session.next_transfer
            session.next_transfer += m.group_count  # issue 34: group g numbers g mod G (group_sessions.py)
            if not consumer.no_ack:
                session.transfers[transfer_id] = (queue.qid, entry.seq, consumer.tag)
        elif consumer.credit_messages is not None:  # a 0-9-1 auto-ack consumer's credit (AUTOACK_CREDIT)
            consumer.credit_messages -= 1
        if consumer.no_ack:
            self.drop(queue, entry)
        else:
            consumer.unacked += 1
            self.hold(ch, consumer, queue, entry)
        # Tuple literals, typed by commands.OutTransfer and OutDeliver (the hot path: commands.py "outputs").
        if session is not None:
            m._out.append((ch.conn, OUT_TRANSFER, ch.number, consumer.tag,
                           (transfer_id, queue.qid, entry.seq, redelivered, message)))
        else:
            m._out.append((ch.conn, OUT_DELIVER, ch.number, consumer.tag, (queue.qid, entry.seq, redelivered, message)))

    def hold(self, ch: ChannelState, holder: object, queue: Queue, entry: Entry) -> None:
        """Record an unacked delivery; a durable entry's delivery count is persisted so that a
        restart redelivers it with redelivered=true."""
        m = self.m
        entry.holder = holder
        ch.unacked[(queue.qid, entry.seq)] = (queue, entry)
        queue.unacked_count += 1
        if entry.durable and m._persist is not None:
            m._persist.put_entry(queue.qid, entry.seq, [entry.message.id, entry.expires_at, entry.priority,
                                                     entry.delivery_count], durable_promise=False)

    def get(self, cmd: Get):
        m = self.m
        conn, number, vhost_name, queue_name, no_ack = cmd.conn, cmd.channel, cmd.vhost, cmd.queue, cmd.no_ack
        ch = m.channel(conn, number)
        queue = m.queue(m.vhost(vhost_name), queue_name, conn)
        if queue.group != m.group:
            m.groups.check_own(queue)
        m.topology.touch(queue)
        if queue.qid in m.expiring:
            m.expiry.expire_head(queue)
        limit = queue.delivery_limit
        while True:
            entry = queue.ready.pop()
            if entry is None:
                return None
            queue.ready_bytes -= entry.message.size
            if limit is None or entry.delivery_count <= limit:
                break
            self.past_limit(queue, entry)
        redelivered = entry.delivery_count > 0
        message = entry.message
        if redelivered and queue.delivery_header:
            message = with_delivery_count(message, entry.delivery_count)
        entry.delivery_count += 1
        counts = m.queue_counts.get(queue.qid)
        if counts is None:
            counts = m.queue_counts[queue.qid] = [0, 0]
        counts[0] += 1
        if no_ack:
            self.drop(queue, entry)
        else:
            self.hold(ch, ch, queue, entry)
        m.event(EV.DELIVERED, queue, entry.message, EV.NO_ACK if no_ack else "", "", conn)
        return GotMessage(queue.qid, entry.seq, redelivered, message, len(queue.ready))

    def take_unacked(self, ch: ChannelState, refs: list) -> list[tuple[Queue, Entry]]:
        m = self.m
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
                    m._dirty[queue.qid] = queue
            entry.holder = None
            queue.unacked_count -= 1
            taken.append(item)
        # Channel-wide prefetch may have freed credit for any of the channel's consumers.
        if ch.prefetch_count:
            for consumer in ch.consumers.values():
                m._dirty[consumer.queue.qid] = consumer.queue
        return taken

    def ack(self, cmd: Ack) -> None:
        m = self.m
        conn, number, refs = cmd.conn, cmd.channel, cmd.refs
        ch = m.channel(conn, number)
        for queue, entry in self.take_unacked(ch, refs):
            m.stats["acked"] += 1
            m.count_ack(queue.qid)
            m.event(EV.ACKED, queue, entry.message, "", "", conn)
            self.drop(queue, entry)

    def nack(self, cmd: Nack) -> None:
        m = self.m
        conn, number, refs, requeue = cmd.conn, cmd.channel, cmd.refs, cmd.requeue
        # ``unsent``: the front end held these assignments and never sent them (a cancelled
        # consumer's read-ahead, node/amqp091/window.py): back to the queue as not delivered.
        unsent = cmd.unsent
        ch = m.channel(conn, number)
        for queue, entry in self.take_unacked(ch, refs):
            if unsent and entry.delivery_count > 0:
                entry.delivery_count -= 1
            if requeue:
                self.return_to_ready(queue, entry)
            else:
                m.expiry.dead_letter(queue, entry.message, "rejected", conn)
                self.drop(queue, entry)

    def recover(self, cmd: Recover) -> None:
        m = self.m
        conn, number = cmd.conn, cmd.channel
        # 0-9-1 basic.recover requeue=false (redeliver to the original recipient) is served as a
        # requeue, as RabbitMQ does: the message is redelivered, possibly to the same consumer.
        self.requeue_all(m.channel(conn, number))

    def requeue_all(self, ch: ChannelState) -> None:
        refs = list(ch.unacked)
        for queue, entry in self.take_unacked(ch, refs):
            self.return_to_ready(queue, entry)

    def return_to_ready(self, queue: Queue, entry: Entry) -> None:
        m = self.m
        if m.vhosts[queue.vhost].queues.get(queue.name) is not queue:
            self.release_message(entry)
            return
        if queue.delivery_limit is not None and entry.delivery_count > queue.delivery_limit:
            # A quorum queue's poison-message rule (RabbitMQ 3.13 rabbit_fifo return_one): each
            # return counts one (delivery_count: deliveries not taken back as never sent), and
            # past the limit the message is dead-lettered instead of requeued.
            self.past_limit(queue, entry)
            return
        m.event(EV.REQUEUED, queue, entry.message)
        queue.ready.requeue(entry)
        if queue.selective:
            self.rewind_scans(queue, entry.seq)
        queue.ready_bytes += entry.message.size
        if entry.expires_at is not None:
            m.expiring[queue.qid] = queue
        m._dirty[queue.qid] = queue

    def past_limit(self, queue: Queue, entry: Entry) -> None:
        """An entry returned more often than the queue's delivery limit allows: dead-lettered with
        reason delivery_limit (or dropped), not requeued or delivered.  Besides a return, a ready
        entry can be past it when a single node restarted while it was delivered (its stored count
        includes that delivery, as RabbitMQ counts a consumer that went down as a return)."""
        m = self.m
        m.expiry.dead_letter(queue, entry.message, "delivery_limit")
        self.drop(queue, entry)

    def drop(self, queue: Queue, entry: Entry) -> None:
        """Remove an entry for good (acked, rejected, expired, purged, dropped)."""
        m = self.m
        if queue.dedup is not None:
            queue.dedup.forget(entry.message.id)
        if entry.durable and m._persist is not None:
            m._persist.delete_entry(queue.qid, entry.seq)
        self.release_message(entry)

    def release_deleted(self, queue: Queue, entries: list[Entry]) -> None:
        """Forget ``entries`` taken out of ``queue`` (being deleted), recording a DELETED event each.

        Deleting a queue of 20,000 messages runs this on every node."""
        m = self.m
        if not m.records_events and not m.chain_on:
            m.event_seq += len(entries)
        else:
            for entry in entries:
                m.event(EV.DELETED, queue, entry.message)  # chained on every node (issue 36)
        release = self.release_message
        for entry in entries:
            release(entry)

    def release_message(self, entry: Entry) -> None:
        """An entry is gone: its bytes leave the count, and the body goes with the last holder."""
        m = self.m
        message = entry.message
        m.message_bytes -= message.size
        message.live -= 1
        if not message.live:
            m._body_deletes.append(message.id)
        if entry.durable and m._persist is not None:
            message.refs -= 1
            if message.refs == 0:
                m._persist.delete_message(message.id)

    def tx_commit(self, cmd: TxCommit) -> list:
        """Apply a transaction's publishes and acks atomically; return the publish outcomes."""
        m = self.m
        conn, number, operations = cmd.conn, cmd.channel, cmd.operations
        m.channel(conn, number)
        outcomes = []
        for sub in operations:
            try:
                result = m._handlers[sub.op](sub)
            except CommandError:
                # The front end validated each operation when the client sent it; one that became
                # invalid since (its exchange deleted meanwhile) is skipped, the rest still commit.
                result = UNROUTABLE
            if sub.op == Op.PUBLISH:
                outcomes.append(result)
        return outcomes
