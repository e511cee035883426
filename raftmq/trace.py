"""A stage tracer for the publish->delivery round trip (issue 30): off unless ``trace_stages`` is set.

When on, hooks (``raft/tracing.py`` for the Raft path, ``node/server.py`` for the client socket)
stamp each stage a batch passes with ``CLOCK_MONOTONIC`` into a bounded ring per node (the newest
``trace_stages_events``).  When off nothing is installed: the hot path is the code without hooks
(the broker tests one attribute per *connection*, never per message).

Why CLOCK_MONOTONIC: it is the one clock that every process on a host shares and that never jumps
(``perf_counter_ns`` is not comparable across processes; pysyncobj's own clock is
CLOCK_MONOTONIC_RAW, which runs at a slightly different rate), so a client's stamps and every
node's line up.

An event is ``(ns, stage, who, a, b, c)``: ``who`` is a batch's origin (``a`` its sequence, ``b``
its Raft index when known) or, for Raft messages, the peer's Raft address (see ``raft/tracing.py``
for what ``a``, ``b`` and ``c`` mean per stage).  ``raftmq/trace_report.py`` joins the rings of
all nodes per batch.

The ring is written to ``<data_dir>/trace.msgpack`` when the node gets SIGUSR2 and when it stops
(:meth:`Tracer.dump`): a magic, the CRC-32 and length of the payload, then the msgpack payload.
The reader checks all three (:func:`read_dump`) before trusting a byte.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from functools import partial

import msgpack

# Stages, in the order a batch meets them (client on a follower).
RX = "rx"  # bytes read from a client socket (the first command of the batch came in them)
SUBMIT = "submit"  # the batch's first command handed to the log (frame parsed, command built)
PROPOSE = "propose"  # the batch encoded and given to pysyncobj's command queue
FORWARD = "forward"  # a follower's tick thread sent it to the leader (apply_command)
CMD_RECV = "cmd_recv"  # the leader received it
APPEND = "append"  # appended to this node's journal buffer (b: Raft index)
AE_SEND = "ae_send"  # AppendEntries sent to peer ``who``: entries a..b (0..0: none), commit index c
AE_RECV = "ae_recv"  # AppendEntries received from ``who``: same fields
FLUSHED = "flushed"  # journal written and fdatasync'ed up to index a, which took b ns
ACK_SEND = "ack_send"  # a follower's next_node_idx to ``who`` (the leader): it holds up to a
ACK_RECV = "ack_recv"  # the leader received that acknowledgement from ``who``
COMMIT = "commit"  # this node's commit index rose to a
HANDOFF = "handoff"  # the tick thread handed the committed entry to the loop (b: index)
APPLY = "apply"  # the loop decoded it and starts applying it
APPLIED = "applied"  # the state machine returned its effects
OUTPUTS = "outputs"  # bodies stored and filled: outputs go to the connections
WRITTEN = "written"  # the first client connection write of the batch's outputs starts

MAGIC = b"RMQTRACE"
_HEAD = struct.Struct("<8sIQ")  # magic, crc32 of the payload, payload length
FORMAT_VERSION = 1
DEFAULT_EVENTS = 20_000

monotonic_ns: Callable[[], int] = partial(time.clock_gettime_ns, time.CLOCK_MONOTONIC)


class TraceDamaged(ValueError):
    """A trace file that is not one, or whose payload fails its length or checksum."""


class Tracer:
    """The ring of one node.  ``add`` is called from the event loop and from pysyncobj's tick
    thread: ``deque.append`` is atomic under the GIL, and so is the copy taken by :meth:`dump`."""

    def __init__(self, node_id: str, capacity: int = DEFAULT_EVENTS,
                 clock: Callable[[], int] = monotonic_ns) -> None:
        self.node_id = node_id
        self.address = ""  # this node's Raft address (how its peers name it), set by raft/tracing.py
        self.origin = ""  # the origin of the batches this node proposes
        self.clock = clock
        self.events: deque[tuple] = deque(maxlen=max(1, capacity))
        # The loop's hand-over from a client socket to the batch its command starts (loop only):
        # the last read, and the read and submit times of the first command of the pending batch.
        self.last_rx = 0
        self.batch_rx = 0
        self.batch_submit = 0
        self.current: tuple[str, int, int] = ("", 0, 0)  # the batch whose outputs are being written
        self.flushing = 0  # when the first connection write of those outputs started

    def add(self, stage: str, who: str = "", a: int = 0, b: int = 0, c: int = 0, ts: int = 0) -> None:
        self.events.append((ts or self.clock(), stage, who, a, b, c))

    def on_rx(self, data_received: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """``data_received`` of a client connection, stamping each read first (installed before the
        transport caches the method: uvloop does at ``set_protocol``)."""
        clock = self.clock

        def traced(data: bytes) -> None:
            self.last_rx = clock()
            data_received(data)

        return traced

    def on_flush(self, flush: Callable[[], None]) -> Callable[[], None]:
        """``flush`` of a client connection (its socket write), stamping the first of a batch's."""
        clock = self.clock

        def traced() -> None:
            if not self.flushing:
                self.flushing = clock()
            flush()

        return traced

    def snapshot(self) -> dict:
        return {"version": FORMAT_VERSION, "node": self.node_id, "address": self.address,
                "origin": self.origin, "events": [list(e) for e in self.events.copy()]}

    def dump(self, path: str) -> None:
        """Write the ring to ``path`` (a temporary file renamed into place: never half a file)."""
        payload = msgpack.packb(self.snapshot(), use_bin_type=True)
        tmp = f"{path}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(_HEAD.pack(MAGIC, zlib.crc32(payload), len(payload)))
            fh.write(payload)
        os.replace(tmp, path)


def read_dump(path: str) -> dict:
    """A trace file written by :meth:`Tracer.dump`, checked: magic, length and CRC-32."""
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < _HEAD.size:
        raise TraceDamaged(f"{path}: {len(data)} bytes, shorter than the header")
    magic, crc, length = _HEAD.unpack_from(data)
    payload = data[_HEAD.size:]
    if magic != MAGIC:
        raise TraceDamaged(f"{path}: not a raftmq trace")
    if len(payload) != length:
        raise TraceDamaged(f"{path}: payload of {len(payload)} bytes, the header says {length}")
    if zlib.crc32(payload) != crc:
        raise TraceDamaged(f"{path}: payload fails its checksum")
    trace = msgpack.unpackb(payload, raw=False)
    if trace.get("version") != FORMAT_VERSION:
        raise TraceDamaged(f"{path}: format version {trace.get('version')!r}, this reader knows {FORMAT_VERSION}")
    trace["events"] = [tuple(e) for e in trace["events"]]
    return trace
