"""Credit for 0-9-1 auto-ack consumers: the core assigns them only as fast as their socket takes it.

An auto-ack delivery leaves its queue when the core assigns it, and basic.qos does not apply to it
(no ack ever returns credit), so before this a consumer with ``no_ack`` attaching to a backlog was
assigned all of it in one apply: 100 x 1 MiB queued and a socket that is not read put +84 MB of
bodies into the node's heap (parked, node/writeflow.py) and emptied the queue at once.  The stop
through the log (``Op.FLOW``) came too late, and every restart assigned the rest of the backlog again.

So the channel gives the core a slice of message credit for each auto-ack consumer, as RabbitMQ's
credit flow between queue, channel and writer does (and as pre-settled 1.0 receivers do,
node/amqp10/links.py): the Consume carries the first slice (``store.delivery.AUTOACK_CREDIT``), and
each delivery *written* to the transport lets the channel top the credit up once what the core may
still assign plus what is assigned and not yet written falls to three quarters of a slice (each
top-up then has a quarter of a slice written for it).  Parked deliveries
are not written, so a consumer whose socket is full stops being assigned after at most a slice.

A slice is what fits ``write_buffer_high`` at the recent delivery size (the largest written since
the last top-up, or the earlier size halved towards it), between ``MIN_SLICE`` and
``autoack_slice`` (the config); before any size is known, it is ``MIN_SLICE``.  The credit counts
messages, so a slice granted for small messages may be taken by large ones: the bound is then
``autoack_slice`` messages, not bytes (as for pre-settled 1.0 receivers).  A fast reader's top-ups
cost one command per quarter slice (e.g. 64 deliveries of 4 KiB, 256 of 1 KiB with the defaults),
proposed without a token: ``SessionWindowCredit`` never fails, so a
top-up racing a cancel (the client's, or the server's when the queue is deleted) is simply dropped.

Rolling upgrades: the command format is unchanged, and a node older than this ignores the argument, so
in a cluster of mixed versions its replica would assign an auto-ack consumer the whole backlog where
the others assign a slice, and their states would part.  ``autoack_slice = 0`` turns the credit off
(auto-ack consumers are assigned as before): set it on the upgraded nodes until every node runs this
version.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SLICE = 4  # the smallest credit slice, and the first one (message sizes unknown yet)
# A top-up once a quarter of the slice was written: in a cluster each one waits for a commit, and
# three quarters still in flight keep a fast reader busy meanwhile (at a half, a follower's auto-ack
# backlog drained at 0.53 of the old speed; bench/autoack_ab.py --cluster).
TOP_UP_PARTS = 4


@dataclass(slots=True)
class AutoAckCredit:
    """One auto-ack consumer's credit as the channel sees it.  Per delivery written only a count and
    a maximum are kept (``wrote``: the delivery path of every auto-ack message); the slice is worked
    out every quarter slice (``_top_up``)."""

    most: int  # the largest slice (Config.autoack_slice)
    high: int  # the connection's write_buffer_high
    granted: int = MIN_SLICE  # credit given to the core so far (the Consume carried the first slice)
    written: int = 0  # deliveries written to the transport
    unit: int = 0  # recent delivery size: a maximum, decaying by half at each top-up
    peak: int = 0  # the largest delivery written since the last top-up
    due: int = MIN_SLICE // 2  # deliveries to write before the next top-up

    def slice(self) -> int:
        """Deliveries the core may be ahead of the socket: ``high`` over the recent size, bounded."""
        if self.unit <= 0:
            return MIN_SLICE
        return max(MIN_SLICE, min(max(MIN_SLICE, self.most), self.high // self.unit))

    def wrote(self, size: int) -> int:
        """A delivery of ``size`` body bytes was written: the credit to add now (0: none yet)."""
        self.written += 1
        if size > self.peak:
            self.peak = size
        self.due -= 1
        if self.due > 0:
            return 0
        return self._top_up()

    def _top_up(self) -> int:
        unit, peak = self.unit, self.peak
        self.unit = peak if peak >= unit else unit - ((unit - peak) >> 1)
        self.peak = 0
        target = self.slice()
        outstanding = self.granted - self.written
        step = max(1, target // TOP_UP_PARTS)
        if outstanding > target - step:  # the slice shrank (larger messages): wait for the writes
            self.due = outstanding - (target - step)
            return 0
        delta = target - outstanding
        self.granted += delta
        self.due = step
        return delta
