"""One AMQP 1.0 session (2.5.5): windows, handles, delivery ids, transfers and dispositions.

The session keeps only what the wire needs -- the transfer-id windows of 2.5.6, the handle table, the
delivery ids of unsettled deliveries -- and hands each link's work to the core through its link
(links.py).  Errors follow 2.7.3/2.8.15: a handle beyond handle-max closes the connection with a
framing error, a handle in use or unknown ends the session (``amqp:session:handle-in-use`` /
``unattached-handle``), a transfer beyond our incoming window ends it with ``window-violation``.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import Amqp10Error
from raftmq.protocol.amqp10.frames import encode_frame_raw

from .limits import handle_max

if TYPE_CHECKING:
    from .connection import Amqp10Connection

log = logging.getLogger(__name__)

INCOMING_WINDOW = 2048  # transfer frames the client may send before we widen the window again
OUTGOING_WINDOW = 0x7FFFFFFF
SERIAL = 1 << 32


def _uint(value: int) -> bytes:
    if value == 0:
        return b"\x43"
    if value < 256:
        return b"\x52" + bytes((value,))
    return b"\x70" + value.to_bytes(4, "big")


def encode_transfer(handle: int, delivery_id: int, tag: bytes, settled: bool, resume: bool = False) -> bytes:
    """The first (and usually only) transfer of a delivery, encoded by hand: this runs once per message
    sent, and the generic Composite.encode took ~2.7 us of a consumer's ~20 us per message.  Same
    fields as ``p.Transfer(handle, delivery_id, delivery_tag, message_format=0, settled, resume)``."""
    fields = (_uint(handle) + _uint(delivery_id) + b"\xa0" + bytes((len(tag),)) + tag + b"\x43"
              + (b"\x41" if settled else b"\x42"))
    count = 5
    if resume:
        fields += b"\x42\x40\x40\x41"  # more false, rcv-settle-mode and state null, resume true
        count = 9
    return b"\x00\x53\x14\xc0" + bytes((len(fields) + 1, count)) + fields


def error(condition: str, description: str | None = None):
    return p.Error(condition=t.Symbol(condition), description=description[:2000] if description else None)


class SessionError(Amqp10Error):
    """Ends the session (not the connection) with ``condition``."""

    def __init__(self, condition: str, text: str) -> None:
        super().__init__(text)
        self.condition = condition


class Session:
    def __init__(self, conn: Amqp10Connection, channel: int, begin) -> None:
        self.conn = conn
        self.channel = channel
        self.remote_channel = channel
        self.handle_max = handle_max(conn.config, begin.handle_max)  # amqp10_link_max_per_session - 1
        self.links: dict[int, object] = {}  # the client's handle -> link
        self.detaching: set[int] = set()  # handles we detached; in use until the client's detach (2.6.5)
        # incoming (client -> us): 2.5.6
        self.next_incoming_id = begin.next_outgoing_id or 0
        self.incoming_window = INCOMING_WINDOW
        # outgoing (us -> client)
        self.next_outgoing_id = 0
        self.remote_incoming_window = begin.incoming_window or 0
        self.next_delivery_id = 0
        self.unsettled: dict[int, tuple] = {}  # delivery id we sent -> (link, core transfer id)
        # Encoded deliveries waiting for the client's incoming window (2.5.6), each with the offset of
        # its first unsent octet: a delivery cut at the window, and what links without a hold of their
        # own (management answers, durable replays) sent meanwhile.  Links holding core transfers keep
        # them as references instead (links.OutgoingLink.held) while ``blocked()``.
        self.parked: deque[tuple] = deque()
        self.parked_bytes = 0  # octets in ``parked``: counted in the memory alarm (conn.delivery_bytes)
        self.waiting: dict[object, None] = {}  # links that hold deliveries until ``blocked()`` ends, in order
        self.dispositions: list[tuple] = []  # (delivery id, settled, state) for incoming deliveries
        self.ended = False
        self.management_out = None  # the /management link answers go out on (management.py)

    # ------------------------------------------------------------------ begin / end

    def begin(self) -> None:
        self.conn.send(self.channel, p.Begin(remote_channel=self.remote_channel, next_outgoing_id=0,
                                             incoming_window=self.incoming_window,
                                             outgoing_window=OUTGOING_WINDOW, handle_max=self.handle_max))

    def on_end(self, end) -> None:
        for link in list(self.links.values()):
            link.release()
        self.links.clear()
        self.drop_parked()
        if not self.ended:
            self.conn.send(self.channel, p.End())
        self.ended = True

    def end(self, condition: str, text: str) -> None:
        """End the session with an error; the client's end completes it (the channel stays ours till then)."""
        if self.ended:
            return
        log.info("1.0 session %s/%d: ending with %s %s", self.conn.peer, self.channel, condition, text)
        for link in list(self.links.values()):
            link.release()
        self.links.clear()
        self.drop_parked()
        self.ended = True
        self.conn.discarding.add(self.channel)  # 2.5.5 DISCARDING: its frames go unread (frames.py)
        self.conn.send(self.channel, p.End(error=error(condition, text)))

    # ------------------------------------------------------------------ frames

    def on_frame(self, body, payload: bytes) -> None:
        if self.ended:
            return  # 2.5.7: frames after our end are ignored until the client's end
        try:
            self._dispatch(body, payload)
        except SessionError as exc:
            self.end(exc.condition, exc.text)

    def _dispatch(self, body, payload: bytes) -> None:
        cls = body.__class__
        if cls is p.Transfer:
            self._on_transfer(body, payload)
        elif cls is p.Flow:
            self._on_flow(body)
        elif cls is p.Disposition:
            self._on_disposition(body)
        elif cls is p.Attach:
            self._check_handle(body.handle)
            if body.handle in self.links or body.handle in self.detaching:
                raise SessionError("amqp:session:handle-in-use", f"handle {body.handle} is in use")
            link = self.conn.attach_link(self, body)  # attach.py: which kind of link
            if link is not None:
                self.links[body.handle] = link
        elif cls is p.Detach:
            if body.handle in self.detaching:
                self.detaching.discard(body.handle)  # the answer to our detach
                return
            link = self._link(body.handle)
            del self.links[body.handle]
            link.on_detach(body)
        else:
            raise SessionError("amqp:not-allowed", f"unexpected {body.NAME}")

    def _check_handle(self, handle: int) -> None:
        if handle > self.handle_max:
            exc = Amqp10Error(f"handle {handle} is beyond handle-max {self.handle_max}")
            exc.condition = "amqp:connection:framing-error"  # 2.7.3 handle-max
            raise exc

    def _link(self, handle):
        self._check_handle(handle)
        link = self.links.get(handle)
        if link is None:
            raise SessionError("amqp:session:unattached-handle", f"handle {handle} is not attached")
        return link

    def _on_transfer(self, transfer, payload: bytes) -> None:
        if self.incoming_window <= 0:
            raise SessionError("amqp:session:window-violation", "transfer beyond the incoming window")
        self.incoming_window -= 1
        self.next_incoming_id = (self.next_incoming_id + 1) % SERIAL
        link = self.links.get(transfer.handle)  # an attached link's handle was checked at attach
        if link is None:
            if transfer.handle in self.detaching:
                return  # in flight when we detached the link (2.6.6): dropped, as the link is
            link = self._link(transfer.handle)  # raises
        link.on_transfer(transfer, payload)
        if self.incoming_window < INCOMING_WINDOW // 2:
            self.incoming_window = INCOMING_WINDOW
            self.send_flow()

    def _on_flow(self, flow) -> None:
        if flow.next_incoming_id is not None:
            self.remote_incoming_window = (flow.next_incoming_id + flow.incoming_window
                                           - self.next_outgoing_id) % SERIAL
        else:
            self.remote_incoming_window = flow.incoming_window
        self.resume_sending()
        if flow.handle is not None:
            link = self.links.get(flow.handle)
            if link is None:
                if flow.handle in self.detaching:
                    return  # 2.6.6: sent before the client saw our detach (a refused attach, rhea's first flow)
                link = self._link(flow.handle)  # raises
            link.on_flow(flow)
        elif flow.echo:
            self.send_flow()

    def _on_disposition(self, d) -> None:
        first = d.first
        last = d.last if d.last is not None else first
        if not d.role:  # the client is the sender: it settles deliveries it sent (mode second)
            for link in self.links.values():
                link.on_sender_disposition(first, last, d.settled)
            return
        span = (last - first) % SERIAL
        if span < len(self.unsettled):
            ids = [(first + i) % SERIAL for i in range(span + 1)]
        else:
            ids = [i for i in self.unsettled if (i - first) % SERIAL <= span]
        by_link: dict[object, list[int]] = {}
        for delivery_id in ids:
            entry = self.unsettled.get(delivery_id)
            if entry is None:
                continue
            if d.settled:
                del self.unsettled[delivery_id]
            by_link.setdefault(entry[0], []).append(entry[1])
        for link, transfer_ids in by_link.items():
            link.on_outcome(transfer_ids, d.state, d.settled, first, last)

    # ------------------------------------------------------------------ sending

    def send_flow(self, link_state: dict | None = None) -> None:
        flow = p.Flow(next_incoming_id=self.next_incoming_id, incoming_window=self.incoming_window,
                      next_outgoing_id=self.next_outgoing_id, outgoing_window=OUTGOING_WINDOW)
        for key, value in (link_state or {}).items():
            setattr(flow, key, value)
        self.conn.send(self.channel, flow)

    def send_attach(self, attach) -> None:
        self.conn.send(self.channel, attach)

    def send_detach(self, handle: int, err=None, closed: bool = True) -> None:
        """Our detach; unless it answers the client's, the handle stays taken until the client answers."""
        if handle in self.links or err is not None:
            self.detaching.add(handle)
        self.conn.send(self.channel, p.Detach(handle=handle, closed=closed, error=err))

    def detach_link(self, link, err) -> None:
        """End a link from our side (its core session failed, its queue was deleted)."""
        if self.links.get(link.handle) is link:
            del self.links[link.handle]
            link.release()
            self.send_detach(link.handle, err)

    def blocked(self) -> bool:
        """Whether a delivery must wait: the client's incoming-window is used up (2.5.6: no transfer
        frame while it is 0), a delivery waits before it, or the connection's write buffer is full
        (node/writeflow.py).  Links then hold core transfers by reference, bodies unread."""
        return self.remote_incoming_window <= 0 or bool(self.parked) or self.conn._write_paused

    def resume_sending(self) -> None:
        """The window opened or the write buffer drained: what waits goes out, in order, while it can."""
        self._send_parked()
        if not self.waiting or self.blocked():
            return
        links, self.waiting = self.waiting, {}
        for link in links:
            if self.blocked():
                self.waiting[link] = None  # still waiting: its turn comes at the next flow or drain
            elif self.links.get(link.handle) is link:
                link.resume_sending()

    def send_delivery(self, link, transfer_id: int | None, settled: bool, sections_bytes: bytes,
                      tag: bytes | None = None, resume: bool = False) -> None:
        """One message to the client: a delivery id, split into frames of the client's max-frame-size.
        ``tag``: the delivery tag (default: the delivery id); ``resume``: 2.6.13 a resumed delivery."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id = (delivery_id + 1) % SERIAL
        if not settled:
            self.unsettled[delivery_id] = (link, transfer_id)
        tag = tag if tag is not None else delivery_id.to_bytes(4, "big")
        if self.parked or self.remote_incoming_window <= 0:
            self._park((link, delivery_id, settled, sections_bytes, tag, resume, 0))
            return
        self._write_delivery(link, delivery_id, settled, sections_bytes, tag, resume)

    def _park(self, item: tuple, first: bool = False) -> None:
        waiting = len(item[3]) - item[6]
        self.parked_bytes += waiting
        self.conn.delivery_bytes += waiting
        if first:
            self.parked.appendleft(item)
        else:
            self.parked.append(item)

    def _send_parked(self) -> None:
        while self.parked and self.remote_incoming_window > 0:
            item = self.parked.popleft()
            waiting = len(item[3]) - item[6]
            self.parked_bytes -= waiting
            self.conn.delivery_bytes -= waiting
            link = item[0]
            if self.links.get(link.handle) is link:
                self._write_delivery(*item)

    def drop_parked(self) -> None:
        """The session ended: what waits for its window is never sent."""
        self.conn.delivery_bytes -= self.parked_bytes
        self.parked_bytes = 0
        self.parked.clear()

    def _write_delivery(self, link, delivery_id: int, settled: bool, data: bytes, tag: bytes,
                        resume: bool = False, pos: int = 0) -> None:
        """Frames of one delivery from octet ``pos`` while the client's incoming-window lasts (2.5.6:
        no transfer frame while it is 0); the rest waits at the head of ``parked`` for its flow."""
        encoded = encode_transfer(link.handle, delivery_id, tag, settled, resume)
        room = max(256, self.conn.remote_max_frame - len(encoded) - 16)
        if pos == 0 and len(data) <= room:  # one frame: the performative encoded once
            self.conn.send_raw(encode_frame_raw(encoded + data, self.channel))
            self._sent_frame()
            self.conn.wrote(len(data))
            return
        start = pos
        if pos == 0:
            frame = p.Transfer(handle=link.handle, delivery_id=delivery_id, delivery_tag=tag, message_format=0,
                               settled=settled, more=False, resume=resume)
        else:
            frame = p.Transfer(handle=link.handle)
        while pos < len(data):
            if self.remote_incoming_window <= 0:
                self._park((link, delivery_id, settled, data, tag, resume, pos), first=True)
                break
            chunk = data[pos:pos + room]
            pos += len(chunk)
            frame.more = pos < len(data)
            self.conn.send(self.channel, frame, chunk)
            self._sent_frame()
            frame = p.Transfer(handle=link.handle)
        self.conn.wrote(pos - start)

    def _sent_frame(self) -> None:
        self.next_outgoing_id = (self.next_outgoing_id + 1) % SERIAL
        self.remote_incoming_window -= 1

    # ------------------------------------------------------------------ dispositions for the client's deliveries

    def disposition(self, delivery_id: int, settled: bool, state) -> None:
        self.dispositions.append((delivery_id, settled, state))

    def flush_dispositions(self) -> None:
        """Send the queued dispositions, one frame per run of consecutive ids with the same outcome."""
        if not self.dispositions or self.ended:
            self.dispositions.clear()
            return
        items, self.dispositions = self.dispositions, []
        run_first, run_settled, run_state = items[0]
        run_last = run_first
        for delivery_id, settled, state in items[1:]:
            if (delivery_id == (run_last + 1) % SERIAL and settled == run_settled
                    and state.__class__ is run_state.__class__ and state.__class__ is p.Accepted):
                run_last = delivery_id
                continue
            self._send_disposition(run_first, run_last, run_settled, run_state)
            run_first = run_last = delivery_id
            run_settled, run_state = settled, state
        self._send_disposition(run_first, run_last, run_settled, run_state)

    def _send_disposition(self, first: int, last: int, settled: bool, state) -> None:
        self.conn.send(self.channel, p.Disposition(role=True, first=first, last=None if last == first else last,
                                                   settled=settled, state=state))
