"""Back-pressure towards a client that does not read: what a connection holds while its socket is full.

asyncio calls ``pause_writing`` once a transport's write buffer passes its high-water mark
(``write_buffer_high``) and ``resume_writing`` once it drained below the low one. In between, the
connection must stop adding deliveries to that buffer, or a consumer that stopped reading grows
the node's memory by every message published to its queues (issue 17: 293 MB for 293 MB
published, and with manual acks each body held twice, once in the queue and once in the buffer).

What a connection does (docs/design.md, "Back-pressure towards consumers"):

* it flushes as soon as the deliveries written since the last flush reach the high-water mark,
  so that the transport can say "pause" in the middle of a large batch of outputs (one apply may
  assign a whole backlog) instead of after all of it was encoded into the buffer;
* while paused, deliveries the state machine assigned are *parked* here, as the references the
  outputs carry (the ``Message`` objects the queue holds): nothing is encoded, and a delivery
  whose consumer holds its message (manual ack) carries no body until it is written;
* once one channel has parked ``stop_after`` bytes (the high-water mark), the connection asks the
  state machine, through the log, to stop assigning to it (``Op.FLOW`` active=false, the command
  channel.flow uses). The pause is node-local knowledge; only a command in the log may change what
  apply does, so every replica stops assigning at the same point of the log. A 0-9-1 channel
  whose consumers are all under a basic.qos limit is assigned no more than its credit and is never
  stopped (its parked deliveries are not counted toward the threshold); an auto-ack consumer or one
  without prefetch reaches it at once, a 0-10 session when it parked that much. Messages not assigned
  stay in their queues, where other consumers can take them and the memory alarm counts them.
  An auto-ack consumer is also bounded by the credit slices its channel gives the core as it
  writes (node/amqp091/autoack.py): the stop comes one apply late, and the apply that attaches it
  to a backlog (or restarts it) would otherwise assign all of it.

On resume the parked deliveries are written in order (stopping again if the buffer refills) and
then the stopped channels' assignment is re-enabled with ``Op.FLOW`` active=true.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

# Re-send the stop for a channel after this many deliveries parked since the last one: if the
# client re-enabled it (its own channel.flow active=true), assignment would go on unbounded.
RESTOP_EVERY = 1024
DEFAULT_HIGH = 64 * 1024  # asyncio's own default high-water mark


def set_write_limits(transport, high: int) -> None:
    """High-water mark ``high`` and low-water mark high/4 on ``transport`` (0 leaves asyncio's)."""
    if high > 0:
        transport.set_write_buffer_limits(high=high, low=high // 4)


@dataclass
class Parking:
    """Deliveries held while the client's socket is full, in arrival order.

    ``owned_bytes`` counts the bodies parked deliveries carry, which nothing else holds any more:
    an auto-ack delivery left its queue when it was assigned, so the node holds its body only
    here; a manual-ack delivery is still an unacked message of its queue and is parked without its
    body, which is read when it is written (store/disk/bodies.fill_bodies).
    """

    stop_after: int = DEFAULT_HIGH  # parked bytes of one channel before its assignment is stopped
    paused: bool = False
    unflushed: int = 0  # body bytes delivered since the last flush
    items: deque = field(default_factory=deque)  # (channel number, key, payload, owned bytes)
    owned_bytes: int = 0
    stopped: dict[int, int] = field(default_factory=dict)  # channel -> parked since its stop was sent
    _parked: dict[int, int] = field(default_factory=dict)  # channel -> bytes parked, until stopped

    def park(self, channel: int, key: str, payload: tuple, owned: int, size: int) -> bool:
        """Hold one delivery of ``size`` body bytes; True when the caller should (re)send the stop
        for ``channel``."""
        self.items.append((channel, key, payload, owned))
        self.owned_bytes += owned
        count = self.stopped.get(channel)
        if count is not None:
            if count + 1 >= RESTOP_EVERY:
                self.stopped[channel] = 0
                return True
            self.stopped[channel] = count + 1
            return False
        parked = self._parked.get(channel, 0) + size
        if parked >= self.stop_after:
            self._parked.pop(channel, None)
            self.stopped[channel] = 0
            return True
        self._parked[channel] = parked
        return False

    def wrote(self, size: int) -> bool:
        """``size`` body bytes were written; True when a flush is due (a high-water mark's worth since
        the last one), so that the transport can pause the writer in the middle of a large batch."""
        self.unflushed += size
        return self.unflushed >= self.stop_after

    def pop(self) -> tuple:
        item = self.items.popleft()
        self.owned_bytes -= item[3]
        return item

    def drained(self) -> dict[int, int]:
        """Everything parked was written: forget the counts; return the channels that were stopped."""
        stopped, self.stopped = self.stopped, {}
        self._parked.clear()
        return stopped

    def release(self, connection_open: bool, write: Callable[[tuple], None], flush: Callable[[], None],
                restart: Callable[[int], None]) -> None:
        """The socket drained below its low-water mark (``resume_writing``): ``write`` each parked
        item in order (unless the socket fills again), ``flush``, and once nothing is parked any more
        ``restart`` assignment on every channel whose stop was sent.  A closing connection drops
        what is parked (its unacked deliveries return to their queues with it)."""
        self.paused = False
        if not connection_open:
            self.clear()
            return
        while self.items and not self.paused:
            write(self.pop())
        flush()
        if self.paused or self.items:
            return
        for channel in self.drained():
            restart(channel)

    def clear(self) -> None:
        self.items.clear()
        self.owned_bytes = 0
        self.stopped.clear()
        self._parked.clear()

    @property
    def holding(self) -> bool:
        """Deliveries must go through the parking (paused, or older ones still parked)."""
        return self.paused or bool(self.items)


def reader_bytes(reader) -> int:
    """Bytes a frame reader holds: its unparsed buffer plus (0-10) assemblies being reassembled."""
    held = len(getattr(reader, "_buf", b""))
    sizes = getattr(reader, "_sizes", None)
    if sizes:
        held += sum(sizes.values())
    return held


def peer_closed(transport) -> bool:
    """Whether the client of a transport that is not being read has gone (Linux TCP only).

    A connection whose reading is paused (a blocked publisher) hears nothing from its peer: without
    this look, a publisher that gave up while blocked would keep its partial publishes -- memory
    that holds the alarm up, which keeps the reading paused -- until a write to it failed (never,
    with heartbeats off). Reading is no way to know (an RST leaves the unread bytes readable, and a
    FIN waits behind them), but the kernel's TCP state says it: CLOSE after a reset, CLOSE_WAIT
    after a FIN. One getsockopt(TCP_INFO); its first octet is the state.
    """
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except (OSError, AttributeError, ValueError):  # ValueError: uvloop's socket already closed
        return False
    return bool(info) and info[0] in (_TCP_CLOSE, _TCP_CLOSE_WAIT)


_TCP_CLOSE, _TCP_CLOSE_WAIT = 7, 8  # include/net/tcp_states.h


class ReadGate:
    """Why a connection's reading is paused, and resuming it only when no reason is left.

    Two reasons, independent of each other: a resource alarm (``alarm``: set for publishers, the
    connections whose input grows memory) and the broker's proposal backlog (``flow``: the broker
    calls ``resume_flow`` when it is low again).  Shared by the 0-10 and 1.0 front ends; 0-9-1 has
    its own, which also tells the client (connection.blocked).
    """

    __slots__ = ("transport", "alarm", "flow")

    def __init__(self, transport) -> None:
        self.transport = transport
        self.alarm = False
        self.flow = False

    @property
    def paused(self) -> bool:
        return self.alarm or self.flow

    def set_alarm(self, blocked: bool) -> None:
        if blocked and not self.alarm:
            self.alarm = True
            self.transport.pause_reading()
        elif not blocked and self.alarm:
            self.alarm = False
            if not self.flow:
                self.transport.resume_reading()

    def pause_for_flow(self) -> None:
        self.flow = True
        self.transport.pause_reading()

    def resume_flow(self) -> None:
        if self.flow:
            self.flow = False
            if not self.alarm:
                self.transport.resume_reading()
