"""AMQP 1.0 links (2.6) as core commands, one core session per link.

*Outgoing* (the client attaches as receiver; :class:`OutgoingLink`): ``MESSAGE_SUBSCRIBE`` on the
source queue (a dynamic source declares an exclusive auto-delete queue first), link credit as
``MESSAGE_FLOW`` message credit, drain as ``MESSAGE_FLUSH``, outcomes as ``MESSAGE_SETTLE``:
accepted -> accept, released -> release (the delivery does not count), modified with
delivery-failed -> release counting a redelivery, rejected and modified undeliverable-here ->
reject (dead-lettered).  A pre-settled link (snd-settle-mode settled) subscribes with accept-mode
none: the core forgets a message once assigned (at-most-once).

*Read-ahead* (unsettled, non-durable outgoing links, as the 0-9-1 front end's prefetch read-ahead,
node/amqp091/window.py): each MESSAGE_FLOW is a log entry, an apply and a dispatch, and clients such
as proton top their credit up every few messages, so a link that granted the core exactly the
client's credit spent more on flow commands than on the deliveries (profiled on a 3-node cluster:
467 MESSAGE_FLOW and 329 MESSAGE_SETTLE for 10,000 consumed messages).  With a client credit of at
least ``READAHEAD_MIN_CREDIT``, the core is given up to twice it, topped up only when what it still
holds plus what waits here falls to half of that; deliveries beyond the client's credit wait here
(``held``), in order, and go out as the client grants credit.  The client never gets more than its
credit.  Held deliveries are unsettled in the core: a detached link releases them unsent (not
counted as a delivery attempt).  Small credits, pre-settled links (the core forgets a message once
assigned: a held one would be lost) and durable links (their unsettled state is the client's) keep the
exact scheme below.

*Held while blocked* (issue 31 item 2): while the client's session incoming-window is 0 (2.5.6), a
delivery of the session waits for it, or the connection's write buffer is past ``write_buffer_high``
(``Session.blocked``), every outgoing link holds what the core assigns in ``held`` too, as the core's
transfer tuples: an unsettled one carries no body (store/disk/bodies.fill_bodies), so credit alone never
reads a backlog from disk; it goes out when the session resumes the link (``resume_sending``).  A
pre-settled link's transfers carry their bodies: it gives the core no credit while blocked, counts
what it holds for the memory alarm, and stops the core (``FLOW``) past ``write_buffer_high`` of it.

*Pre-settled slices* (issue 31 item 2): a pre-settled link whose client grants credit for a large
backlog would have the core assign all of it in one apply, bodies included (the core forgets the
messages, so the link must keep them), before the write buffer could stop it.  Such a link gives the
core at most a slice of the client's credit beyond what it has written -- ``write_buffer_high`` over
the size of its recent deliveries, between ``PRESETTLED_MIN_SLICE`` and ``amqp10_presettled_slice``
-- and tops it up at half as deliveries are written (and when the session resumes it), so a backlog
leaves the queue only as fast as the socket takes it.  While the client's credit is below the slice
the link grants exactly as below.  A drain is flushed slice by slice: while a flush used up all the
core was given, another slice follows; the client's credit is used up (2.6.7) only once the core
reports the queue empty with credit to spare, or deliveries used it up.

The core's credit is additive; 1.0 credit is absolute (2.6.7: link-credit = the receiver's
delivery-count + link-credit - the sender's delivery-count).  The link keeps ``granted``, the credit
given to the core so far, and ``assigned``, the transfers the core gave us: the core still holds
``granted - assigned - (transfers in flight)``, so adding ``wanted - (granted - assigned)`` leaves it
exactly ``wanted - in flight``.  A lower limit (rare) stops the core's credit with a request and
recomputes once the reply -- which follows every transfer assigned before it -- is in.

*Incoming* (the client attaches as sender; :class:`IncomingLink`): each complete delivery (its
transfer frames joined, at most ``max_message_size``) is stored as sent (format AMQP100,
``protocol/amqp10/convert.py``) and submitted as ``PUBLISH``.  Pre-settled deliveries are submitted;
unsettled ones are requested, and the outcome is sent once the core has applied it (committed in a
cluster): accepted when routed, released when unroutable (as RabbitMQ 4), rejected when a queue
refused it (reject-publish).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING

from raftmq.protocol.amqp10 import convert
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import Amqp10Error, DecodeError
from raftmq.protocol.amqp10.stored import EMPTY
from raftmq.store.core import queries as Q
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import (
    REJECTED,
    ROUTED,
    Flow,
    MessageFlow,
    MessageFlush,
    MessageSettle,
    MessageStop,
    MessageSubscribe,
    Publish,
    QueueDeclare,
    QueueDelete,
    SessionAttach,
    SessionDetach,
)
from raftmq.store.core.message import AMQP100, properties_in
from raftmq.store.core.sessions import (
    SETTLE_ACCEPT,
    SETTLE_REJECT,
    SETTLE_RELEASE,
    SETTLE_RELEASE_REDELIVERED,
    UNLIMITED,
)
from raftmq.store.disk.bodies import READ_AHEAD, body_to_send

from ..core.access import WRITE, AccessRefused
from .address import AddressError, Target, parse_source, parse_target, queue_address
from .direct_reply import dynamic_queue_prefix
from .filters import FilterRefused, SourceFilters, from_source
from .limits import refusals
from .modified import settle_modified
from .session import SERIAL, SessionError, error
from .settling import SETTLE_BATCH
from .terminus import Refusal, plan_source, target_of
from .txn_work import post, retire

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)

SETTLED, UNSETTLED, MIXED = 1, 0, 2  # sender-settle-mode
FIRST, SECOND = 0, 1  # receiver-settle-mode
INCOMING_CREDIT = 256  # link credit we give a publishing client, topped up at half
MAX_CREDIT = 1 << 30
READAHEAD_MIN_CREDIT = 32  # client credit from which an outgoing link reads ahead (module docstring)
PRESETTLED_MIN_SLICE = 4  # a pre-settled link's smallest credit slice to the core (module docstring)
ASSEMBLY_MARGIN = 1 << 20  # unfinished deliveries per connection: max_message_size + this


def _signed(value: int) -> int:
    """A serial-number difference (RFC 1982) as a signed int."""
    value %= SERIAL
    return value - SERIAL if value >= SERIAL // 2 else value


def delivery_octets(message, body: bytes, redelivered: bool) -> bytes:
    """A stored message as a 1.0 message: its properties in format AMQP100 (converted when another
    protocol published it) and its body (the node's, store/disk/bodies.py: the model holds none)."""
    return convert.encode_delivery(properties_in(message, AMQP100, EMPTY), body, message.exchange,
                                   message.routing_key, redelivered)


def _topup_may_wait(have: int, wanted: int) -> bool:
    """Whether a credit top-up is deferrable (raft/cluster.py): while the core still holds half
    the client's credit nobody waits for it, so it may wait for company.  Issue 30: a receiver's
    top-up after every message (proton's credit window) took a Raft batch of its own."""
    return have > 0 and 2 * have >= wanted


class Link:
    sends = False

    def __init__(self, session: Session, attach) -> None:
        self.session = session
        self.conn = session.conn
        self.handle = attach.handle
        self.name = attach.name
        self.attach_frame = attach
        self.core = 0  # core channel number (a core session of its own)
        self.alive = True

    def _core_attach(self) -> None:
        conn = self.conn
        self.core = conn.core_channel(self)
        name = f"amqp10:{conn.conn_id}:{self.core}".encode()
        conn.broker.submit(SessionAttach(conn.conn_id, None, self.core, conn.vhost, conn.principal.name,
                            name, False))

    def _refuse(self, condition: str, text: str) -> None:
        """2.6.3: answer the attach with a null terminus, then detach with the error."""
        a = self.attach_frame
        reply = p.Attach(name=a.name, handle=a.handle, role=not a.role, source=None, target=None,
                         initial_delivery_count=0 if a.role else None)
        if a.role:
            reply.target = a.target
        else:
            reply.source = a.source
        self.session.send_attach(reply)
        self.session.send_detach(a.handle, error(condition, text))

    def release(self) -> None:
        """The link is gone (detach, end, refusal): its core session goes, unsettled messages return."""
        if not self.alive:
            return
        self.alive = False
        conn = self.conn
        if self.core:
            conn.links_by_core.pop(self.core, None)
            conn.broker.submit(SessionDetach(conn.conn_id, None, self.core))

    def on_detach(self, detach) -> None:
        self.release()
        self.session.send_detach(self.handle, closed=bool(detach.closed))  # 2.6.6: answered in kind

    def failed(self, result: tuple) -> None:
        """The core refused a command: the core session is destroyed, so is the link."""
        condition = {403: "amqp:unauthorized-access", 404: "amqp:not-found", 405: "amqp:resource-locked",
                     406: "amqp:precondition-failed"}.get(result[1], "amqp:internal-error")
        self.session.detach_link(self, error(condition, str(result[2])))

    def on_transfer(self, transfer, payload: bytes) -> None:
        raise SessionError("amqp:not-allowed", "transfer on a link where the client receives")

    def on_flow(self, flow) -> None:
        pass

    def on_sender_disposition(self, first: int, last: int, settled: bool) -> None:
        pass

    def on_outcome(self, transfer_ids, state, settled, first, last) -> None:
        pass


class OutgoingLink(Link):
    """We send: a subscription on a queue."""

    sends = True

    def __init__(self, session: Session, attach) -> None:
        super().__init__(session, attach)
        self.destination = ""
        self.settled = attach.snd_settle_mode == SETTLED
        self.rcv_second = attach.rcv_settle_mode == SECOND
        self.delivery_count = 0  # 1.0 delivery-count (serial)
        self.limit: int | None = None  # the client's delivery-count + link-credit (serial)
        self.granted = 0  # credit given to the core so far
        self.assigned = 0  # transfers the core gave this link
        self.subscribed = False
        self.stopping = False
        self.drain_wanted = False
        self.queue = ""
        self.settles: dict[int, list[int]] = {}  # outcome -> core transfer ids settled, not yet submitted
        self.readahead = not self.settled  # DurableOutgoingLink turns it off (module docstring)
        self.held: deque[tuple] = deque()  # core transfers beyond the client's credit or window, in order
        self.owned_bytes = 0  # bodies the held transfers carry (pre-settled: nothing else holds them)
        self.window_stop = False  # the core was stopped (Flow) because held bodies reached the high mark
        self.client_credit = 0  # the link-credit of the client's latest flow: how much it grants at a time
        # Pre-settled slices (module docstring): whether the core's credit is a slice smaller than the
        # client's, the core's credit left at which it is topped up, a recent delivery size (a decaying
        # maximum, 0 until one is seen) and the assigned count when the pending drain flush was sent.
        self.sliced = False
        self.topup_at = 0
        self.unit = 0
        self.flush_mark = 0
        self.browse = False  # distribution-mode copy (terminus.py): reads without taking, sends pre-settled
        self.subscription_queue: str | None = None  # a durable topic subscription's queue (terminus.py)
        self.filters = SourceFilters()  # the source's filters we apply (filters.py)

    def flush_settles(self) -> None:
        """One MESSAGE_SETTLE per outcome for the dispositions of one read (a disposition per message
        is what most clients send, and each command costs a log entry and an apply)."""
        settles, self.settles = self.settles, {}
        if not self.alive:
            return
        for how, transfer_ids in settles.items():
            ranges = [list(r) for r in rs.from_ids(sorted(transfer_ids))]
            self.conn.broker.submit(MessageSettle(self.conn.conn_id, None, self.core, ranges, how))

    def attach(self):
        a = self.attach_frame
        source = a.source if isinstance(a.source, p.Source) else None
        conn = self.conn
        try:
            plan = plan_source(conn, source, self.name, Q.exchange_names(conn.broker.machine, conn.vhost))
            if plan.queue is not None:  # a topic subscription: its own queue, bound (terminus.py)
                self.queue, declare = plan.queue, plan.setup
                for command in plan.setup:
                    conn.access.authorize(command)
                self.subscription_queue = plan.queue if plan.durable else None
            elif source is not None and source.dynamic:
                self.queue = f"{dynamic_queue_prefix(source)}{uuid.uuid4()}"  # direct_reply.py
                declare = QueueDeclare(conn.conn_id, None, 0, conn.vhost, self.queue, False, False, True,
                           True, {}, True)  # server-named: the amq. prefix is ours to use
                conn.access.authorize(declare)
            else:
                address = source.address if source is not None else None
                if not isinstance(address, str):
                    raise AddressError("a receiver needs a source address")
                self.queue = parse_source(address)
                if not Q.has_queue(conn.broker.machine, conn.vhost, self.queue):
                    self._refuse("amqp:not-found", f"no queue '{self.queue}' in vhost '{conn.vhost}'")
                    return None
                declare = None
            self.filters = from_source(source.filter if source is not None else None)
            subscribe = MessageSubscribe(conn.conn_id, None, 0, conn.vhost, self.queue, "", self.settled,
                         False, self.filters.arguments())
            if plan.browse:
                subscribe = subscribe._replace(browse=True)
                self.browse = self.settled = True
                self.readahead = False
            conn.access.authorize(subscribe)
        except FilterRefused as exc:
            self._refuse("amqp:invalid-field", str(exc))
            return None
        except Refusal as exc:
            self._refuse(exc.condition, exc.text)
            return None
        except AddressError as exc:
            self._refuse("amqp:invalid-field", str(exc))
            return None
        except AccessRefused as exc:
            self._refuse("amqp:unauthorized-access", exc.text)
            return None
        return self._start(declare, subscribe)

    def _start(self, declare: QueueDeclare | None, subscribe: MessageSubscribe):
        """Attach the core session and subscribe (recovery.py resumes a durable link instead)."""
        conn = self.conn
        self._core_attach()
        self.destination = f"l{self.core}"
        self._setup_refused: tuple | None = None
        for command in declare if isinstance(declare, list) else [declare] if declare is not None else []:
            # With a token: a refused declare (a vhost's max-queues, store/core/limits.py) closes the core
            # channel, and the link is refused with its reason rather than the subscribe's 504.
            conn.request(command._replace(channel=self.core), self._setup_done)
        conn.request(subscribe._replace(channel=self.core, destination=self.destination), self._subscribed)
        return self

    def _setup_done(self, result: tuple) -> None:
        if result[0] != 0 and self._setup_refused is None:
            self._setup_refused = result

    def _subscribed(self, result: tuple) -> None:
        if not self.alive:
            return
        a = self.attach_frame
        if result[0] != 0:
            result = getattr(self, "_setup_refused", None) or result
            self.session.links.pop(self.handle, None)
            self.release()
            condition = "amqp:not-found" if result[1] == 404 else "amqp:resource-locked" \
                if result[1] == 403 and "exclusive" in str(result[2]) else "amqp:unauthorized-access" \
                if result[1] == 403 else "amqp:precondition-failed" if result[1] == 406 else "amqp:internal-error"
            self._refuse(condition, str(result[2]))
            return
        self.subscribed = True
        source = a.source if isinstance(a.source, p.Source) else p.Source()
        address = queue_address(self.queue) if source.dynamic else source.address
        reply_source = p.Source(address=address, durable=source.durable,
                                expiry_policy=source.expiry_policy, timeout=source.timeout,
                                dynamic=source.dynamic, default_outcome=p.Released(),
                                distribution_mode=t.Symbol("copy") if self.browse else None,
                                filter=self.filters.echo or None,  # the filters in use (3.5.3)
                                outcomes=[t.Symbol(s) for s in ("amqp:accepted:list", "amqp:rejected:list",
                                                                 "amqp:released:list", "amqp:modified:list")])
        self.session.send_attach(p.Attach(
            name=a.name, handle=self.handle, role=False, snd_settle_mode=SETTLED if self.settled else UNSETTLED,
            rcv_settle_mode=SECOND if self.rcv_second else FIRST, source=reply_source, target=a.target,
            initial_delivery_count=self.delivery_count, max_message_size=self.conn.config.max_message_size,
            unsettled=self.unsettled_map()))
        self._unlimited_bytes()
        self._apply_credit()

    def unsettled_map(self) -> dict | None:
        return None  # a durable link's resumption lists its unsettled deliveries (recovery.py)

    # ------------------------------------------------------------------ credit

    def on_flow(self, flow) -> None:
        if flow.properties and "txn-id" in flow.properties:  # 4.4.3 transactional acquisition
            return self.session.detach_link(self, error("amqp:not-implemented", "transactional acquisition"))
        if flow.link_credit is not None:
            base = flow.delivery_count if flow.delivery_count is not None else 0
            self.limit = (base + min(flow.link_credit, MAX_CREDIT)) % SERIAL
            self.client_credit = min(flow.link_credit, MAX_CREDIT)
        self.drain_wanted = bool(flow.drain)
        if self.subscribed:
            self._send_held()
            self._apply_credit()
        if flow.echo:
            self._send_flow()

    def _credit(self) -> int:
        return max(0, _signed(self.limit - self.delivery_count)) if self.limit is not None else 0

    def _apply_credit(self) -> None:
        if self.stopping or not self.alive or self.limit is None:
            return
        conn = self.conn
        self.send_replays()
        wanted = self._credit()
        if self.readahead and (self.client_credit >= READAHEAD_MIN_CREDIT or self.held):
            return self._read_ahead(wanted)
        if self.settled and self.session.blocked():
            self.session.waiting[self] = None  # pre-settled deliveries carry their bodies: none
            return  # assigned until they can go (resume_sending)
        have = self.granted - self.assigned + len(self.held)
        delta = wanted - have
        if self.settled and delta > 0:
            target = self._presettled_slice()
            self.sliced = target < wanted
            if self.sliced:  # a slice of the client's credit, topped up at half (module docstring)
                delta = target - have if 2 * have <= target or self.drain_wanted else 0
        if delta > 0:
            self.granted += delta
            conn.broker.submit(MessageFlow(conn.conn_id, None, self.core, self.destination, 0, delta),
                               _topup_may_wait(have, wanted))
        elif delta < 0 and wanted < have:
            self.stopping = True
            conn.request(MessageStop(conn.conn_id, None, self.core, self.destination), self._stopped)
            return
        if self.drain_wanted:
            self.stopping = True
            self.flush_mark = self.assigned
            conn.request(MessageFlush(conn.conn_id, None, self.core, self.destination), self._drained)

    def _presettled_slice(self) -> int:
        """How much of the client's credit a pre-settled link lets the core hold (module docstring):
        what fits ``write_buffer_high`` at the recent delivery size, within the configured bounds."""
        if self.unit <= 0:
            target = PRESETTLED_MIN_SLICE  # sizes unknown yet: a small first slice, then what fits
        else:
            most = max(PRESETTLED_MIN_SLICE, self.conn.config.amqp10_presettled_slice)
            target = max(PRESETTLED_MIN_SLICE, min(most, self.conn._flush_at // self.unit))
        self.topup_at = target // 2
        return target

    def _read_ahead(self, wanted: int) -> None:
        """The core's credit for a reading-ahead link: up to twice the credit the client grants at a
        time, topped up when what the core holds and what waits here fall to half that (module
        docstring); ``wanted`` is the client's credit left."""
        conn = self.conn
        have = self.granted - self.assigned + len(self.held)
        target = 2 * self.client_credit if self.client_credit >= READAHEAD_MIN_CREDIT else wanted
        if self.drain_wanted:
            if have < wanted:  # 2.6.7 drain: the core must be able to send all the client may take
                self.granted += wanted - have
                conn.broker.submit(MessageFlow(conn.conn_id, None, self.core, self.destination, 0, wanted - have))
            self.stopping = True
            conn.request(MessageFlush(conn.conn_id, None, self.core, self.destination), self._drained)
        elif have < target and 2 * have <= target:  # topped up at half: one MESSAGE_FLOW per ~credit messages
            self.granted += target - have
            conn.broker.submit(MessageFlow(conn.conn_id, None, self.core, self.destination, 0, target - have),
                               _topup_may_wait(have, wanted))

    def _send_held(self) -> None:
        held = self.held

        def following() -> list[int]:  # the next held ones, read with one that missed the cache
            return [t[4].id for t in islice(held, READ_AHEAD) if len(t) == 5]

        session = self.session
        while held and self._credit() > 0 and not session.blocked():
            transfer = held.popleft()
            if len(transfer) > 5:
                self._owned(-len(transfer[5]))
            self._send(transfer, following)
        if held and session.blocked():
            session.waiting[self] = None  # the rest goes when the window opens or the buffer drains
        if self.window_stop and not held and self.alive:
            self.window_stop = False  # what was held went out: the core may assign again (once the
            if not self.conn._write_paused:  # write buffer drained: then resume_writing restarts it)
                self.conn.broker.submit(Flow(self.conn.conn_id, None, self.core, True))

    def _hold(self, transfer: tuple) -> None:
        """Keep a core transfer until credit, window and write buffer allow it: by reference (an
        unsettled one carries no body, store/disk/bodies.fill_bodies) -- or, pre-settled, with the body the
        core gave it, counted for the memory alarm; past ``write_buffer_high`` of those the core is
        stopped for this link (node/writeflow.py's rule) until they are sent."""
        self.held.append(transfer)
        if self.session.blocked():
            self.session.waiting[self] = None
        if len(transfer) > 5:
            self._owned(len(transfer[5]))
            if not self.window_stop and self.owned_bytes >= self.conn._flush_at:
                self.window_stop = True
                self.conn.broker.submit(Flow(self.conn.conn_id, None, self.core, False))

    def _owned(self, size: int) -> None:
        self.owned_bytes += size
        self.conn.delivery_bytes += size

    def resume_sending(self) -> None:
        """The session window opened or the write buffer drained (session.resume_sending)."""
        if self.subscribed and self.alive:
            self.send_replays()
            self._send_held()
            self._apply_credit()

    def send_replays(self) -> None:
        """Deliveries a resumed durable link owes the client before new ones (recovery.py)."""

    def _stopped(self, result: tuple) -> None:
        self.stopping = False
        self.granted = self.assigned  # every transfer assigned before the stop has arrived
        if result[0] != 0:
            return self.failed(result)
        self._unlimited_bytes()
        self._apply_credit()

    def _unlimited_bytes(self) -> None:
        """1.0 has no byte credit: the core's is unlimited (MESSAGE_STOP and MESSAGE_FLUSH zero it too)."""
        self.conn.broker.submit(MessageFlow(self.conn.conn_id, None, self.core, self.destination, 1,
                                 UNLIMITED))

    def _drained(self, result: tuple) -> None:
        """2.6.7 drain: everything available was sent; the rest of the credit is used up.  A sliced
        pre-settled link (module docstring) first flushes slice after slice while the core used up
        what it was given (the queue may hold more) or deliveries are held for the window."""
        self.stopping = False
        used_all = self.granted == self.assigned and self.assigned > self.flush_mark
        self.granted = self.assigned
        if result[0] != 0:
            return self.failed(result)
        if self.settled and self.drain_wanted and self._credit() > 0 and (self.held or (used_all and self.sliced)):
            self._unlimited_bytes()  # the flush zeroed the core's byte credit
            self._send_held()
            return self._apply_credit()  # the next slice and flush (or, blocked, once resumed)
        self.drain_wanted = False
        unused = self.limit is not None and _signed(self.limit - self.delivery_count) > 0
        if unused:
            self.delivery_count = self.limit
        self._unlimited_bytes()
        if unused:
            # 2.6.7: the sender advances delivery-count to use the credit up, then sends its flow state.
            # When deliveries used it all up there is nothing to tell (as Proton-J and Artemis brokers
            # do): a flow then reads as "drained, queue empty" to clients such as cli-proton-python's
            # receiver, which closes with messages still queued.
            self._send_flow(drain=True)

    def _send_flow(self, drain: bool = False) -> None:
        self.session.send_flow({"handle": self.handle, "delivery_count": self.delivery_count,
                                "link_credit": self._credit(), "available": 0, "drain": drain})

    # ------------------------------------------------------------------ deliveries

    def on_core_transfer(self, transfer: tuple) -> None:
        self.assigned += 1
        session = self.session  # session.blocked(), inlined: this runs once per message sent
        blocked = session.remote_incoming_window <= 0 or session.parked or self.conn._write_paused
        if self.readahead:
            if self.held or blocked or self._credit() <= 0:
                self._hold(transfer)  # beyond the client's credit or window: sent when it grants more
                return
            self._send(transfer)
            if (not self.stopping and self.client_credit >= READAHEAD_MIN_CREDIT
                    and self.granted - self.assigned + len(self.held) <= self.client_credit):
                self._apply_credit()  # what the core holds fell to half of its read-ahead target
            return
        if self.settled:  # the recent delivery size, for the slice (a maximum decaying by 1/8 a delivery)
            size = transfer[4].size
            unit = self.unit
            self.unit = size if size >= unit else unit - ((unit - size) >> 3)
        if self.held or blocked:
            self._hold(transfer)  # 2.5.6: the client's window (or our write buffer) is full
            return
        self._send(transfer)
        if self.sliced and not self.stopping and self.granted - self.assigned <= self.topup_at:
            self._apply_credit()  # a written delivery makes room for the next slice

    def _send(self, transfer: tuple, following: Callable[[], list[int]] | None = None) -> None:
        """One core transfer to the client.  An unsettled one carries no body
        (store/disk/bodies.fill_bodies): it is read now, with ``following`` when it is only on disk."""
        transfer_id, redelivered, message = transfer[0], transfer[3], transfer[4]
        body = body_to_send(self.conn.broker.bodies, message, transfer, 5, following, transfer[1])
        if body is None:
            return  # its message is gone: nothing to send
        self.delivery_count = (self.delivery_count + 1) % SERIAL
        data = delivery_octets(message, body, redelivered)
        self.session.send_delivery(self, transfer_id, self.settled, data, transfer_id.to_bytes(8, "big"))

    def on_detach(self, detach) -> None:
        if detach.closed and self.subscription_queue and self.core:  # closed ends a durable subscription
            self.conn.broker.submit(QueueDelete(self.conn.conn_id, None, self.core, self.conn.vhost,
                                                self.subscription_queue, False, False))
        super().on_detach(detach)

    def on_outcome(self, transfer_ids: list[int], state, settled: bool, first: int, last: int) -> None:
        cls = state.__class__
        if cls is p.TransactionalState:  # 4.4.2 transactional retirement (txn_work.py)
            return retire(self, transfer_ids, state, settled, first, last)
        if cls is p.Released:
            how = SETTLE_RELEASE
        elif cls is p.Rejected:
            how = SETTLE_REJECT
        elif cls is p.Modified:
            if state.undeliverable_here:
                how = SETTLE_REJECT
            else:
                how = SETTLE_RELEASE_REDELIVERED if state.delivery_failed else SETTLE_RELEASE
            if state.message_annotations:  # the core changes the messages first: modified.py
                return settle_modified(self, transfer_ids, state, how, settled, first, last)
        elif state is None and not settled:
            return  # a state-less unsettled disposition says nothing
        else:
            how = SETTLE_ACCEPT  # accepted, or settled without an outcome
        if settled:
            # Settlements read together go to the core as one command per outcome (flush_settles).
            self.settles.setdefault(how, []).extend(transfer_ids)
            self.conn.settle_due[self.core] = self
            # A durable link's settlements go at the end of the read (recovery across failover reports
            # what the core has settled): counted as a full batch.
            self.conn.settles_pending += len(transfer_ids) if self.readahead or self.settled else SETTLE_BATCH
            return
        ranges = [list(r) for r in rs.from_ids(sorted(transfer_ids))]
        command = MessageSettle(self.conn.conn_id, None, self.core, ranges, how)
        # receiver-settle-mode second (2.6.12): settle once the outcome is applied, then tell the client.
        session = self.session
        for delivery_id in list(session.unsettled):
            if session.unsettled[delivery_id][0] is self and session.unsettled[delivery_id][1] in transfer_ids:
                del session.unsettled[delivery_id]

        def done(result: tuple) -> None:
            session.conn.send(session.channel, p.Disposition(role=False, first=first, last=None if last == first else last,
                                                             settled=True,
                                                             state=state))
        self.conn.request(command, done)

    def release(self) -> None:
        self.flush_settles()  # what the client settled before it left is settled, not requeued
        if self.owned_bytes:
            self._owned(-self.owned_bytes)
        if self.held and self.alive and not self.settled:  # never sent: back to the queue, not counted
            ranges = [list(r) for r in rs.from_ids(sorted(t[0] for t in self.held))]
            self.conn.broker.submit(MessageSettle(self.conn.conn_id, None, self.core, ranges, SETTLE_RELEASE))
        self.held.clear()  # (pre-settled ones left the queue when assigned: at most once, 2.6.12)
        session = self.session
        for delivery_id in [d for d, (link, _) in session.unsettled.items() if link is self]:
            del session.unsettled[delivery_id]
        super().release()


class IncomingLink(Link):
    """We receive: each delivery is a PUBLISH."""


    def __init__(self, session: Session, attach) -> None:
        super().__init__(session, attach)
        self.target: Target | None = None
        self.rcv_second = attach.rcv_settle_mode == SECOND
        self.delivery_count = attach.initial_delivery_count or 0
        self.credit = 0
        self.parts: list[bytes] = []
        self.part_bytes = 0
        self.current: p.Transfer | None = None
        self.awaiting_settle: set[int] = set()  # mode second: dispositions sent, client not settled yet

    def attach(self):
        a = self.attach_frame
        conn = self.conn
        try:
            self.target = target_of(a.target)
            if self.target is not None:
                self._check(self.target)
        except Refusal as exc:
            self._refuse(exc.condition, exc.text)
            return None
        except AddressError as exc:
            self._refuse("amqp:invalid-field", str(exc))
            return None
        except AccessRefused as exc:
            self._refuse("amqp:unauthorized-access", exc.text)
            return None
        except _NotFound as exc:
            self._refuse("amqp:not-found", str(exc))
            return None
        self._core_attach()
        conn.is_publisher = True
        self.session.send_attach(p.Attach(
            name=a.name, handle=self.handle, role=True, snd_settle_mode=a.snd_settle_mode,
            rcv_settle_mode=SECOND if self.rcv_second else FIRST, source=a.source, target=a.target,
            max_message_size=conn.config.max_message_size))
        self._grant()
        return self

    def _check(self, target: Target) -> None:
        """The exchange (or queue) exists and we may write to it; raises AccessRefused / _NotFound."""
        conn = self.conn
        conn.access.require(WRITE, "exchange", target.exchange)
        vhost = conn.broker.machine.vhosts.get(conn.vhost)
        if vhost is None or target.exchange not in vhost.exchanges:
            raise _NotFound(f"no exchange '{target.exchange}' in vhost '{conn.vhost}'")
        if not target.exchange and target.routing_key is not None and target.routing_key not in vhost.queues:
            raise _NotFound(f"no queue '{target.routing_key}' in vhost '{conn.vhost}'")

    def _grant(self) -> None:
        self.credit = INCOMING_CREDIT
        self.session.send_flow({"handle": self.handle, "delivery_count": self.delivery_count,
                                "link_credit": self.credit})

    def release(self) -> None:
        self._reset()
        super().release()

    def on_transfer(self, transfer, payload: bytes) -> None:
        if self.current is None:
            if transfer.delivery_id is None:
                raise SessionError("amqp:invalid-field", "the first transfer of a delivery needs a delivery-id")
            self.current = transfer
            if self.credit <= 0:
                self.session.detach_link(self, error("amqp:link:transfer-limit-exceeded", "no link credit"))
                return
        if transfer.aborted:
            self._reset()
            return
        self.part_bytes += len(payload)
        self.conn.assembling += len(payload)
        limit = self.conn.config.max_message_size
        if self.part_bytes > limit:
            self._reset()
            self.session.detach_link(self, error("amqp:link:message-size-exceeded", f"message larger than {limit}"))
            return
        if self.conn.assembling > limit + ASSEMBLY_MARGIN:
            # Unfinished deliveries of all links together: the bound is per connection, not per link.
            raise _ConnectionLimit("unfinished deliveries of this connection exceed max_message_size")
        self.parts.append(payload)
        if transfer.more:
            return
        first = self.current
        data = b"".join(self.parts)
        self._reset()
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % SERIAL
        settled = bool(first.settled)
        txn_state = first.state if first.state.__class__ is p.TransactionalState else None
        self._deliver(first.delivery_id, settled, data, txn_state)
        if self.credit < INCOMING_CREDIT // 2 and self.alive:
            self._grant()

    def _reset(self) -> None:
        self.conn.assembling -= self.part_bytes
        self.current = None
        self.parts = []
        self.part_bytes = 0

    def _deliver(self, delivery_id: int, settled: bool, data: bytes, txn_state=None) -> None:
        session = self.session
        try:
            message = convert.publish_of(data, self.conn.config.amqp10_max_message_elements)
        except DecodeError as exc:
            # Counted, and logged at most once per LOG_INTERVAL per node (many links could each log one)
            refusals(self.conn.broker).refused("undecodable delivery", self.conn.peer,
                                               f"link {self.name!r}: {exc.condition}: {exc.text}")
            self._outcome(delivery_id, settled, p.Rejected(error=error(exc.condition, exc.text)))
            return
        target = self.target
        try:
            if target is None:
                if not message.to:
                    raise AddressError("the target is null and the message has no 'to'")
                target = parse_target(message.to)
                self._check(target)
            routing_key = target.routing_key
            if routing_key is None:
                routing_key = message.subject or ""
        except AddressError as exc:
            return self._outcome(delivery_id, settled, p.Rejected(error=error("amqp:invalid-field", str(exc))))
        except AccessRefused as exc:
            return self._outcome(delivery_id, settled,
                                 p.Rejected(error=error("amqp:unauthorized-access", exc.text)))
        except _NotFound as exc:
            return self._outcome(delivery_id, settled, p.Rejected(error=error("amqp:not-found", str(exc))))
        self.conn.counts[0] += 1
        command = Publish(self.conn.conn_id, None, self.core, self.conn.vhost, target.exchange, routing_key,
                   False, message.properties, message.body, message.persistent, message.priority or 0,
                   message.ttl, AMQP100)
        if txn_state is not None:  # 4.4.1 transactional posting: held until the commit
            return post(self, delivery_id, settled, txn_state, command)
        if settled:
            self.conn.broker.submit(command, False, len(message.body))
            return

        def published(result: tuple) -> None:
            if result[0] != 0:
                self._outcome(delivery_id, settled, p.Rejected(error=error("amqp:internal-error", str(result[2]))))
                return self.failed(result)
            outcome = result[1]
            state = p.Accepted() if outcome == ROUTED else p.Rejected(
                error=error("amqp:resource-limit-exceeded", "a queue refused the message")) \
                if outcome == REJECTED else p.Released()
            self._outcome(delivery_id, settled, state)
        session.conn.request(command, published)

    def _outcome(self, delivery_id: int, settled: bool, state) -> None:
        if settled or not self.alive:
            return
        if self.rcv_second:
            self.awaiting_settle.add(delivery_id)
            self.session.disposition(delivery_id, False, state)
        else:
            self.session.disposition(delivery_id, True, state)

    def on_sender_disposition(self, first: int, last: int, settled: bool) -> None:
        if settled:
            span = (last - first) % SERIAL
            for delivery_id in [d for d in self.awaiting_settle if (d - first) % SERIAL <= span]:
                self.awaiting_settle.discard(delivery_id)


class _NotFound(Exception):
    pass


class _ConnectionLimit(Amqp10Error):
    """Closes the connection with amqp:resource-limit-exceeded."""

    condition = "amqp:resource-limit-exceeded"
