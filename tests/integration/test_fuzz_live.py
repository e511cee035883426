"""Property-based fuzzing of a live broker over real sockets (hypothesis, frames built by hand).

After a valid handshake (reference 1.4: start/start-ok, tune/tune-ok with frame-max 4096, open/open-ok)
and channel.open, each example sends one input:

(a) random bytes;
(b) random frames: well-formed envelopes (general 4.2.3: type, channel, size, payload, frame-end %xCE)
    around random payloads, method frames using the real class and method ids (reference 1.3);
(c) mutations of a valid frame stream (queue.declare, basic.publish with a content header carrying
    properties and a field table, one or several body frames, basic.get; general 4.2.4-4.2.6) with
    random byte flips, insertions, deletions and a truncation -- of the raw stream, and of the frame
    payloads inside well-formed envelopes;
(d) random sequences of well-formed methods with plausible arguments (declare, bind, publish, get,
    consume, ack/nack/reject, purge, delete, qos, flow, recover, tx, confirm) on three channels over a
    small pool of names, each synchronous method awaited, a channel closed by an error answered with
    close-ok and reopened: this drives the broker's state machine rather than its decoders.

Whatever was sent, the broker must either

* close the connection with connection.close carrying a reply code of the reference's constants table
  (1.2) that fits a malformed or disallowed input: 501 frame-error, 502 syntax-error, 503
  command-invalid, 504 channel-error, 505 unexpected-frame, 530 not-allowed, 540 not-implemented, or a
  channel error 403/404/406 -- channel errors normally arrive as channel.close, where 405
  resource-locked is accepted too -- and never 541 internal-error, or
* keep working: a channel.open sent after the input (the "probe") is answered with channel.open-ok.

It must never hang: when neither happens within a short time (the input may end inside a frame, so the
broker legitimately waits for the rest), the test sends more than a whole frame of zero octets -- which
completes any partial frame and then starts a frame of the undefined type 0 -- and the broker must now
end the connection (general 4.2.3: an undefined frame type is a fatal frame error). Every read is bounded.

After every example a fresh pika connection must still do a publish/get round trip: the node stays up.

RabbitMQ deviations, accepted only when the broker under test is RabbitMQ: for some inputs (an unknown
class or method id, an undefined frame type) it ends the TCP connection without a connection.close, and
for some server-only methods sent by the client it closes with 541 internal-error.

Runs are deterministic (``derandomize=True``, no example database) and bounded (fixed example counts,
short timeouts; no shrinking, which would replay many slow live examples -- a failure prints the
falsifying example, and the same example is generated again on the next run). ``RAFTMQ_FUZZ_SCALE=N``
multiplies the example counts for a longer hunt.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
import uuid
from dataclasses import dataclass

import pika
import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from tests.integration import rawamqp as r
from tests.integration.helpers import connect, round_trip
from tests.integration.rawamqp import ConnectionEnded, RawClient

ALLOWED_CODES = {501, 502, 503, 504, 505, 530, 540, 406, 404, 403}
# RabbitMQ 3.10 answers some client-sent server methods on channel 0 (e.g. connection.start after open)
# with 541 internal-error; accepted only when the broker under test is RabbitMQ.
RABBITMQ_EXTRA_CODES = {541}
CHANNEL_CODES = {403, 404, 405, 406}  # channel.close (reference 1.2 "channel" errors)
FRAME_MAX = 4096  # negotiated: the smallest frame-max (reference 1.2 frame-min-size), so the filler is short
PROBE_CHANNEL = 7  # the mutated stream uses channel 1
ANSWER_TIMEOUT = 0.5  # seconds to wait for the probe's answer before concluding the broker waits for input
CLOSE_TIMEOUT = 5.0  # seconds the broker gets to end the connection after the filler
FILLER = b"\x00" * (FRAME_MAX + 64)

# (class-id, method-id) of every method of the reference (1.3) and RabbitMQ's extensions.
METHOD_IDS = [
    (10, 10), (10, 11), (10, 20), (10, 21), (10, 30), (10, 31), (10, 40), (10, 41), (10, 50), (10, 51),
    (10, 60), (10, 61), (20, 10), (20, 11), (20, 20), (20, 21), (20, 40), (20, 41), (40, 10), (40, 11),
    (40, 20), (40, 21), (40, 30), (40, 31), (40, 40), (40, 51), (50, 10), (50, 11), (50, 20), (50, 21),
    (50, 30), (50, 31), (50, 40), (50, 41), (50, 50), (50, 51), (60, 10), (60, 11), (60, 20), (60, 21),
    (60, 30), (60, 31), (60, 40), (60, 50), (60, 60), (60, 70), (60, 71), (60, 72), (60, 80), (60, 90),
    (60, 100), (60, 110), (60, 111), (60, 120), (85, 10), (85, 11), (90, 10), (90, 11), (90, 20),
    (90, 21), (90, 30), (90, 31),
]

# RAFTMQ_FUZZ_SCALE=10 multiplies every example count (a longer hunt; mind the per-test timeouts below).
SCALE = max(1, int(os.environ.get("RAFTMQ_FUZZ_SCALE", "1")))
TIMEOUT = 120 * SCALE

FUZZ_SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.data_too_large],
)


# -- the valid stream that (c) mutates ----------------------------------------------------------------------
def field_table(items: list[tuple[str, bytes, bytes]]) -> bytes:
    """A field table (general 4.2.5.5) from (name, type octet, encoded value)."""
    return r.longstr(b"".join(r.shortstr(name) + t + v for name, t, v in items))


HEADERS_TABLE = field_table([
    ("s", b"S", r.longstr("long string")),
    ("i", b"I", struct.pack(">i", -7)),
    ("l", b"l", struct.pack(">q", 1 << 40)),
    ("t", b"t", b"\x01"),
    ("d", b"d", struct.pack(">d", 2.5)),
    ("D", b"D", struct.pack(">Bi", 2, 314)),
    ("T", b"T", struct.pack(">Q", 1_700_000_000)),
    ("V", b"V", b""),
    ("x", b"x", r.longstr(b"\x00\xff")),
    ("A", b"A", r.longstr(b"I" + struct.pack(">i", 1) + b"S" + r.longstr("two"))),
    ("F", b"F", field_table([("nested", b"b", b"\x05")])),
])

# content header properties (reference 1.8 basic properties, general 4.2.6.1 property flags): content-type
# (bit 15), headers (13), delivery-mode (12), priority (11), correlation-id (10), message-id (7)
PROPERTY_FLAGS = 0x8000 | 0x2000 | 0x1000 | 0x0800 | 0x0400 | 0x0080
PROPERTIES = (r.shortstr("text/plain") + HEADERS_TABLE + b"\x02" + b"\x05" + r.shortstr("corr-1")
              + r.shortstr("msg-1"))

_RUN = uuid.uuid4().hex[:8]
_counter = itertools.count()


def valid_frames() -> list[tuple[int, int, bytes]]:
    """queue.declare (exclusive, auto-delete), two publishes to it through the default exchange -- one
    body in one frame, one split in two body frames -- and a basic.get, as (type, channel, payload).
    Each call uses a new queue name of the same length, so the layout (and so what a mutation hits) is
    the same every time."""
    queue = f"fz-{_RUN}-{next(_counter):07d}"
    body1 = b"first body: " + bytes(range(32))
    body2a, body2b = b"second body, part one / ", b"part two"
    frames = [
        r.queue_declare(1, queue, exclusive=True, auto_delete=True),
        r.basic_publish(1, "", queue),
        r.content_header_frame(1, len(body1), flags=PROPERTY_FLAGS, props=PROPERTIES),
        r.body_frame(1, body1),
        r.basic_publish(1, "", queue),
        r.content_header_frame(1, len(body2a) + len(body2b), flags=0x8000, props=r.shortstr("a/b")),
        r.body_frame(1, body2a),
        r.body_frame(1, body2b),
        r.basic_get(1, queue),
    ]
    out = []
    for f in frames:
        ftype, channel, size = struct.unpack_from(">BHI", f)
        out.append((ftype, channel, f[7:7 + size]))
    return out


def valid_stream() -> bytes:
    return b"".join(r.frame(*f) for f in valid_frames())


STREAM_LEN = len(valid_stream())

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, STREAM_LEN - 1), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, STREAM_LEN), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, STREAM_LEN - 1), st.integers(1, 8)),
)


def mutate(data: bytes, mutations: list[tuple], truncate_at: int | None) -> bytes:
    buf = bytearray(data)
    for kind, pos, arg in mutations:
        pos = min(pos, len(buf) - 1) if kind != "insert" else min(pos, len(buf))
        if kind == "flip" and buf:
            buf[pos] ^= arg
        elif kind == "insert":
            buf[pos:pos] = arg
        elif kind == "delete":
            del buf[pos:pos + arg]
    if truncate_at is not None:
        del buf[truncate_at:]
    return bytes(buf)


FRAME_COUNT = len(valid_frames())
payload_mutation = st.tuples(st.integers(0, FRAME_COUNT - 1), mutation)


def mutate_payloads(frames: list[tuple[int, int, bytes]], mutations: list[tuple[int, tuple]],
                    drop_after: int | None) -> bytes:
    """Apply each (frame index, mutation) to that frame's payload, keep the envelopes well-formed (size
    recomputed, frame-end in place), optionally drop every frame after ``drop_after``."""
    payloads = [bytearray(p) for _t, _c, p in frames]
    for index, m in mutations:
        payloads[index] = bytearray(mutate(bytes(payloads[index]) or b"\x00", [m], None))
    kept = frames if drop_after is None else frames[:drop_after + 1]
    return b"".join(r.frame(t, c, bytes(payloads[i])) for i, (t, c, _p) in enumerate(kept))


@st.composite
def random_frames(draw) -> bytes:
    """1-4 well-formed frame envelopes with random content, optionally after a basic.publish so that
    header and body frames have something to belong to."""
    out = [r.basic_publish(1, "", "fz-nowhere")] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 4))):
        ftype = draw(st.sampled_from([r.FRAME_METHOD, r.FRAME_HEADER, r.FRAME_BODY, r.FRAME_HEARTBEAT]))
        channel = draw(st.sampled_from([0, 1, 2, 3]))
        if ftype == r.FRAME_METHOD:
            ids = draw(st.sampled_from(METHOD_IDS))
            payload = struct.pack(">HH", *ids) + draw(st.binary(max_size=48))
        elif ftype == r.FRAME_HEADER:
            payload = (struct.pack(">HHQH", draw(st.sampled_from([60, 60, 50, 0])), 0,
                                   draw(st.integers(0, 64)), draw(st.integers(0, 0xFFFF)))
                       + draw(st.binary(max_size=32)))
        elif ftype == r.FRAME_BODY:
            payload = draw(st.binary(max_size=64))
        else:
            payload = draw(st.sampled_from([b"", b"", b"\x00"]))
        out.append(r.frame(ftype, channel, payload))
    return b"".join(out)


# -- (d) sequences of well-formed methods ------------------------------------------------------------------
def bits(*flags: bool) -> bytes:
    """Consecutive bit fields packed into one octet, low bit first (general 4.2.5.2)."""
    return bytes([sum(1 << i for i, f in enumerate(flags) if f)])


QUEUE_ARGS = [
    ("x-message-ttl", b"I", struct.pack(">i", 50)),
    ("x-max-length", b"I", struct.pack(">i", 2)),
    ("x-max-length-bytes", b"I", struct.pack(">i", 100)),
    ("x-max-priority", b"I", struct.pack(">i", 5)),
    ("x-expires", b"I", struct.pack(">i", 60_000)),
    ("x-overflow", b"S", r.longstr("reject-publish")),
    ("x-overflow", b"S", r.longstr("drop-head")),
    ("x-dead-letter-exchange", b"S", r.longstr("")),
    ("x-dead-letter-routing-key", b"S", r.longstr("dlq")),
    ("x-queue-mode", b"S", r.longstr("lazy")),
]


@dataclass
class Op:
    """One step of a method sequence: frames for ``channel`` and the reply a synchronous method awaits."""

    name: str
    channel: int
    frames: bytes
    reply: tuple[tuple[int, int], ...] = ()  # acceptable replies; () for an asynchronous method


SYNC_REPLIES = {
    "queue.declare": ((50, 11),), "exchange.declare": ((40, 11),), "exchange.delete": ((40, 21),),
    "exchange.bind": ((40, 31),), "queue.bind": ((50, 21),), "queue.unbind": ((50, 51),),
    "get": ((60, 71), (60, 72)), "consume": ((60, 21),), "cancel": ((60, 31),), "recover": ((60, 111),),
    "purge": ((50, 31),), "queue.delete": ((50, 41),), "qos": ((60, 11),), "flow": ((20, 21),),
    "flow-off": ((20, 21),), "tx.select": ((90, 11),), "tx.commit": ((90, 21),),
    "tx.rollback": ((90, 31),), "confirm.select": ((85, 11),),
}
SEQ_CHANNELS = (1, 2, 3)


@st.composite
def method_sequences(draw) -> list[Op]:
    """A prelude declaring a small pool of entities (three queues, two exchanges, unique to the example,
    with random exclusive / auto-delete attributes), then 5-30 random well-formed methods on channels 1-3
    over that pool, the server-named queue ("") and the predeclared exchanges, with plausible flags,
    arguments, properties and delivery tags."""
    prefix = f"fm-{_RUN}-{next(_counter):07d}"
    b = st.booleans()
    pool_q = [f"{prefix}-q{i}" for i in range(3)]
    q_attrs = {q: dict(exclusive=draw(b), auto_delete=draw(b)) for q in pool_q}
    pool_x = [(f"{prefix}-x0", "direct"), (f"{prefix}-x1", "topic")]
    x_attrs = {x: dict(auto_delete=draw(b)) for x, _t in pool_x}
    queues = [*pool_q, ""]
    exchanges = [x for x, _t in pool_x] + ["", "amq.direct", "amq.fanout", "amq.topic"]

    def m(ch: int, ids: tuple[int, int], args: bytes = b"") -> bytes:
        return r.method_frame(ch, ids, args)

    def queue_declare(ch: int, q: str, passive=False, durable=False, exclusive=False, auto_delete=False,
                      args=()) -> Op:
        return Op("queue.declare", ch, m(ch, (50, 10), struct.pack(">H", 0) + r.shortstr(q) + bits(
            passive, durable, exclusive, auto_delete, False) + field_table(list(args))),
            SYNC_REPLIES["queue.declare"])

    def exchange_declare(ch: int, x: str, xtype: str, passive=False, durable=False, auto_delete=False,
                         internal=False) -> Op:
        return Op("exchange.declare", ch, m(ch, (40, 10), struct.pack(">H", 0) + r.shortstr(x) + r.shortstr(
            xtype) + bits(passive, durable, auto_delete, internal, False) + field_table([])),
            SYNC_REPLIES["exchange.declare"])

    def queue_bind(ch: int, q: str, x: str, key: str) -> Op:
        return Op("queue.bind", ch, m(ch, (50, 20), struct.pack(">H", 0) + r.shortstr(q) + r.shortstr(x)
                                      + r.shortstr(key) + bits(False) + field_table([])),
                  SYNC_REPLIES["queue.bind"])

    ops = [Op("channel.open", ch, r.channel_open(ch), ((20, 11),)) for ch in SEQ_CHANNELS[1:]]
    ops += [queue_declare(1, q, **q_attrs[q]) for q in pool_q]
    ops += [exchange_declare(1, x, t, **x_attrs[x]) for x, t in pool_x]
    ops += [queue_bind(1, pool_q[0], pool_x[0][0], "k"), queue_bind(1, pool_q[1], pool_x[1][0], "#")]

    for _ in range(draw(st.integers(5, 30))):
        ch = draw(st.sampled_from(SEQ_CHANNELS))
        q, x = draw(st.sampled_from(queues)), draw(st.sampled_from(exchanges))
        key = draw(st.sampled_from(["", "k", "a.b", "#", "*.b"]))
        kind = draw(st.sampled_from([
            "queue.declare", "exchange.declare", "queue.bind", "publish", "publish", "publish", "publish",
            "get", "get", "consume", "cancel", "ack", "ack", "nack", "reject", "recover", "purge",
            "queue.delete", "exchange.delete", "exchange.bind", "queue.unbind", "qos", "flow", "tx.select",
            "tx.commit", "tx.rollback", "confirm.select"]))
        if kind == "queue.declare":
            if draw(b):  # half the time the pool's own attributes (a redeclare), else anything
                op = queue_declare(ch, q, passive=draw(b), **q_attrs.get(q, {}))
            else:
                args = draw(st.lists(st.sampled_from(QUEUE_ARGS), max_size=3, unique_by=lambda a: a[0]))
                op = queue_declare(ch, q, draw(b), draw(b), draw(b), draw(b), args)
        elif kind == "exchange.declare":
            name, xtype = draw(st.sampled_from(pool_x + [("amq.direct", "direct"), ("", "direct")]))
            if draw(b):  # a redeclare
                op = exchange_declare(ch, name, xtype, passive=draw(b), **x_attrs.get(name, {}))
            else:
                xtype = draw(st.sampled_from(["direct", "fanout", "topic", "headers"]))
                op = exchange_declare(ch, name, xtype, draw(b), draw(b), draw(b), draw(b))
        elif kind == "exchange.delete":
            op = Op(kind, ch, m(ch, (40, 20), struct.pack(">H", 0) + r.shortstr(x) + bits(draw(b), False)),
                    SYNC_REPLIES[kind])
        elif kind == "exchange.bind":
            y = draw(st.sampled_from(exchanges))
            op = Op(kind, ch, m(ch, (40, 30), struct.pack(">H", 0) + r.shortstr(x) + r.shortstr(y)
                                + r.shortstr(key) + bits(False) + field_table([])), SYNC_REPLIES[kind])
        elif kind == "queue.bind":
            op = queue_bind(ch, q, x, key)
        elif kind == "queue.unbind":
            op = Op(kind, ch, m(ch, (50, 50), struct.pack(">H", 0) + r.shortstr(q) + r.shortstr(x)
                                + r.shortstr(key) + field_table([])), SYNC_REPLIES[kind])
        elif kind == "publish":
            body = draw(st.binary(max_size=40))
            flags, props = 0, b""
            if draw(b):  # delivery-mode (bit 12), priority (bit 11), expiration (bit 8)
                flags = 0x1000 | 0x0800 | 0x0100
                props = (bytes([draw(st.sampled_from([1, 2]))]) + bytes([draw(st.integers(0, 9))])
                         + r.shortstr(draw(st.sampled_from(["0", "20", "60000"]))))
            exchange, rkey = draw(st.sampled_from([("", q), (x, key)]))
            frames = (m(ch, r.BASIC_PUBLISH, struct.pack(">H", 0) + r.shortstr(exchange) + r.shortstr(rkey)
                        + bits(draw(b), False))
                      + r.content_header_frame(ch, len(body), flags=flags, props=props)
                      + (r.body_frame(ch, body) if body else b""))
            op = Op(kind, ch, frames)
        elif kind == "get":
            op = Op(kind, ch, r.basic_get(ch, q, no_ack=draw(b)), SYNC_REPLIES[kind])
        elif kind == "consume":
            tag = draw(st.sampled_from(["", "c1", "c2"]))
            op = Op(kind, ch, m(ch, r.BASIC_CONSUME, struct.pack(">H", 0) + r.shortstr(q) + r.shortstr(tag)
                                + bits(False, draw(b), draw(b), False) + field_table([])), SYNC_REPLIES[kind])
        elif kind == "cancel":
            op = Op(kind, ch, m(ch, (60, 30), r.shortstr(draw(st.sampled_from(["c1", "c2", "none"])))
                                + bits(False)), SYNC_REPLIES[kind])
        elif kind in ("ack", "nack", "reject"):
            everything = draw(b)  # delivery-tag 0 with multiple: all outstanding (always valid)
            tag, multiple = (0, True) if everything else (draw(st.integers(1, 4)), draw(b))
            if kind == "ack":
                op = Op(kind, ch, m(ch, (60, 80), struct.pack(">Q", tag) + bits(multiple)))
            elif kind == "nack":
                op = Op(kind, ch, m(ch, (60, 120), struct.pack(">Q", tag) + bits(multiple, draw(b))))
            else:
                op = Op(kind, ch, m(ch, (60, 90), struct.pack(">Q", max(tag, 1)) + bits(draw(b))))
        elif kind == "recover":
            op = Op(kind, ch, m(ch, (60, 110), bits(True)), SYNC_REPLIES[kind])
        elif kind == "purge":
            op = Op(kind, ch, m(ch, (50, 30), struct.pack(">H", 0) + r.shortstr(q) + bits(False)),
                    SYNC_REPLIES[kind])
        elif kind == "queue.delete":
            op = Op(kind, ch, m(ch, (50, 40), struct.pack(">H", 0) + r.shortstr(q) + bits(draw(b), draw(b), False)),
                    SYNC_REPLIES[kind])
        elif kind == "qos":
            op = Op(kind, ch, m(ch, (60, 10), struct.pack(">IH", 0, draw(st.integers(0, 3))) + bits(draw(b))),
                    SYNC_REPLIES[kind])
        elif kind == "flow":
            active = draw(b)
            op = Op("flow" if active else "flow-off", ch, m(ch, (20, 20), bits(active)), SYNC_REPLIES[kind])
        elif kind.startswith("tx."):
            op = Op(kind, ch, m(ch, (90, {"tx.select": 10, "tx.commit": 20, "tx.rollback": 30}[kind])),
                    SYNC_REPLIES[kind])
        else:
            op = Op(kind, ch, m(ch, (85, 10), bits(False)), SYNC_REPLIES[kind])
        ops.append(op)
    return ops


class SequenceDriver:
    """Runs a method sequence on a raw connection: waits for each synchronous reply; after a channel.close
    from the server answers close-ok and reopens the channel (reference 1.5.2.5/1.5.2.6), so that one
    channel error does not silence the rest of the sequence."""

    REPLY_TIMEOUT = 3.0

    def __init__(self, broker, client: RawClient) -> None:
        self.broker = broker
        self.client = client
        self.log: list[str] = []

    def _reopen(self, channel: int) -> None:
        self.client.send(r.method_frame(channel, r.CHANNEL_CLOSE_OK) + r.channel_open(channel))
        self._await(channel, ((20, 11),), "channel.open (reopen)")

    def _await(self, channel: int, replies: tuple, what: str) -> bool:
        """True when a reply arrived; False when that channel was closed by the server (and reopened)."""
        deadline = time.monotonic() + self.REPLY_TIMEOUT
        pending_reopen: list[int] = []
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no reply to {what} on channel {channel} within {self.REPLY_TIMEOUT}s (hang)"
            try:
                f = self.client.read_frame(timeout=remaining)
            except TimeoutError:
                raise AssertionError(f"no reply to {what} on channel {channel} within "
                                     f"{self.REPLY_TIMEOUT}s (hang)") from None
            if f.method == r.CONNECTION_CLOSE and f.channel == 0:
                close = r.Close.decode(f.payload)
                check_close_code(self.broker, close.reply_code, f"connection.close after {what}")
                raise SequenceEnded(f"connection.close {close.reply_code}")
            if f.method == r.CHANNEL_CLOSE:
                close = r.Close.decode(f.payload)
                if close.reply_code not in CHANNEL_CODES:
                    check_close_code(self.broker, close.reply_code, f"channel.close after {what}")
                self.log.append(f"ch{f.channel}:{close.reply_code}")
                if f.channel == channel:
                    for other in pending_reopen:
                        self._reopen(other)
                    self._reopen(channel)
                    return False
                pending_reopen.append(f.channel)
                continue
            if f.channel == channel and f.method in replies:
                for other in pending_reopen:
                    self._reopen(other)
                return True

    def run(self, ops: list[Op]) -> str:
        try:
            for op in ops:
                if op.name == "flow-off" and self.broker.kind == "rabbitmq":
                    continue  # RabbitMQ refuses channel.flow active=false with 540 (see test_limits_auth)
                self.client.send(op.frames)
                if op.reply:
                    self._await(op.channel, op.reply, op.name)
            # errors of asynchronous methods (publish, ack...) may still be on their way: finish with one
            # synchronous method per channel (basic.qos 0: harmless), then the probe channel
            for ch in SEQ_CHANNELS:
                for _attempt in range(5):
                    self.client.send(r.method_frame(ch, (60, 10), struct.pack(">IH", 0, 0) + bits(False)))
                    if self._await(ch, ((60, 11),), "the final basic.qos"):
                        break
            self.client.send(r.channel_open(PROBE_CHANNEL))
            self._await(PROBE_CHANNEL, ((20, 11),), "the probe channel.open")
        except SequenceEnded as end:
            return str(end)
        except (ConnectionEnded, ConnectionError):  # EOF while reading, or a reset while sending
            return ended_without_close(self.broker, "during a method sequence")
        return "working"


class SequenceEnded(Exception):
    pass


def run_sequence(broker, ops: list[Op]) -> str:
    client = RawClient(broker.host, broker.port, timeout=5.0)
    driver = SequenceDriver(broker, client)
    try:
        client.handshake(frame_max=FRAME_MAX, heartbeat=0)
        client.open_channel(1)
        outcome = driver.run(ops)
        _note(f"ops: {[(o.name, o.channel) for o in ops]}\nchannel errors: {driver.log}\noutcome: {outcome}",
              f"{outcome}, {len(driver.log)} channel errors" if driver.log else outcome)
    finally:
        client.close()
    assert broker.is_alive(), "the broker process died or stopped answering the protocol header"
    round_trip(broker.url)
    return outcome


def cleanup(broker, queues: list[str], exchanges: list[str]) -> None:
    """Delete what a sequence may have left behind (durable, non-exclusive entities outlive it)."""
    conn = connect(broker.url)
    try:
        for kind, name in [("q", q) for q in queues] + [("x", x) for x in exchanges]:
            ch = conn.channel()
            try:
                if kind == "q":
                    ch.queue_delete(name)
                else:
                    ch.exchange_delete(name)
                ch.close()
            except pika.exceptions.ChannelClosedByBroker:
                pass  # e.g. 405: an exclusive queue whose connection's cleanup is still under way
    finally:
        conn.close()


def pool_names(ops: list[Op]) -> tuple[list[str], list[str]]:
    """The pool names a sequence declared in its prelude (for the cleanup)."""
    marker = f"fm-{_RUN}-".encode()
    data = b"".join(o.frames for o in ops[:8])
    i = data.find(marker)
    prefix = data[i:i + len(marker) + 7].decode()
    return [f"{prefix}-q{i}" for i in range(3)], [f"{prefix}-x{i}" for i in range(2)]


# -- one live example ----------------------------------------------------------------------------------
def _note(message: str, outcome: str | None = None) -> None:
    """hypothesis.note/event inside a property; nothing outside one."""
    try:
        note(message)
        if outcome is not None:
            event(outcome.split(" (")[0])  # e.g. "connection.close 501", "working, after channel.close 404"
    except InvalidArgument:
        pass


def check_close_code(broker, code: int, what: str) -> None:
    allowed = ALLOWED_CODES | (RABBITMQ_EXTRA_CODES if broker.kind == "rabbitmq" else set())
    assert code in allowed, f"{what} with reply code {code}, not one of {sorted(allowed)}"


def ended_without_close(broker, stage: str) -> str:
    assert broker.kind == "rabbitmq", f"raftmq ended the socket without connection.close ({stage})"
    return "eof"


def await_outcome(client: RawClient, broker, timeout: float) -> str | None:
    """Read until the connection ends or the probe is answered; None if neither within ``timeout``."""
    deadline = time.monotonic() + timeout
    channel_closes: list[int] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            f = client.read_frame(timeout=remaining)
        except TimeoutError:
            return None
        except ConnectionEnded:
            return ended_without_close(broker, "before answering the probe")
        method = f.method
        if method == r.CONNECTION_CLOSE and f.channel == 0:
            close = r.Close.decode(f.payload)
            check_close_code(broker, close.reply_code, "connection.close")
            try:
                client.send(r.method_frame(0, r.CONNECTION_CLOSE_OK))
            except OSError:
                pass
            return f"connection.close {close.reply_code}"
        if method == r.CONNECTION_CLOSE_OK and f.channel == 0:
            return "close-ok (the input closed the connection)"
        if method == r.CHANNEL_CLOSE:
            close = r.Close.decode(f.payload)
            if close.reply_code not in CHANNEL_CODES:
                check_close_code(broker, close.reply_code, f"channel.close on channel {f.channel}")
            if f.channel == PROBE_CHANNEL:
                return f"probe channel closed {close.reply_code}"
            channel_closes.append(close.reply_code)
            continue
        if method == r.CHANNEL_OPEN_OK and f.channel == PROBE_CHANNEL:
            return "working" + "".join(f", after channel.close {c}" for c in channel_closes)
        # anything else (declare-ok, get-ok and its content, returns, deliveries...) is skipped


def live_example(broker, data: bytes) -> str:
    """Handshake, send ``data`` then the probe, judge the outcome; then a round trip on a new connection."""
    _note(f"input ({len(data)} octets): {data.hex()}")
    client = RawClient(broker.host, broker.port, timeout=5.0)
    try:
        client.handshake(frame_max=FRAME_MAX, heartbeat=0)
        client.open_channel(1)
        try:
            client.send(data + r.channel_open(PROBE_CHANNEL))
        except OSError:
            pass  # the broker may already have hung up; the outcome below says how
        outcome = await_outcome(client, broker, ANSWER_TIMEOUT)
        if outcome is None:
            # the broker waits for the rest of a frame: give it more than a frame of zeros
            try:
                client.send(FILLER)
            except OSError:
                pass
            outcome = await_outcome(client, broker, CLOSE_TIMEOUT)
            assert outcome is not None, (
                f"broker neither answered nor closed within {CLOSE_TIMEOUT}s after a frame of filler (hang)")
        _note(f"outcome: {outcome}", outcome)
    finally:
        client.close()
    assert broker.is_alive(), "the broker process died or stopped answering the protocol header"
    round_trip(broker.url)
    return outcome


# -- the properties -------------------------------------------------------------------------------------------
@pytest.mark.timeout(TIMEOUT)
@settings(max_examples=50 * SCALE, **FUZZ_SETTINGS)
@given(data=st.binary(min_size=1, max_size=200))
def test_random_bytes_after_handshake(broker, data):
    """(a) random octets where a frame should start."""
    live_example(broker, data)


@pytest.mark.timeout(TIMEOUT)
@settings(max_examples=150 * SCALE, **FUZZ_SETTINGS)
@given(data=random_frames())
def test_random_frames_after_handshake(broker, data):
    """(b) well-formed frame envelopes around random method arguments, content headers and bodies."""
    live_example(broker, data)


@pytest.mark.timeout(TIMEOUT)
@settings(max_examples=100 * SCALE, **FUZZ_SETTINGS)
@given(mutations=st.lists(mutation, min_size=1, max_size=4),
       truncate_at=st.one_of(st.none(), st.none(), st.integers(0, STREAM_LEN - 1)))
def test_mutated_valid_streams(broker, mutations, truncate_at):
    """(c) a valid declare/publish/get stream with random flips, insertions, deletions and truncation."""
    live_example(broker, mutate(valid_stream(), mutations, truncate_at))


@pytest.mark.timeout(TIMEOUT)
@settings(max_examples=200 * SCALE, **FUZZ_SETTINGS)
@given(mutations=st.lists(payload_mutation, min_size=1, max_size=3),
       drop_after=st.one_of(st.none(), st.none(), st.integers(0, FRAME_COUNT - 1)))
def test_mutated_payloads_in_well_formed_frames(broker, mutations, drop_after):
    """(c') the same stream with the mutations inside frame payloads and the envelopes kept well-formed,
    so that the method, content-header, property and field-table decoders and the broker's semantics get
    the mutated octets instead of the frame layer (which catches most of (c) with 501)."""
    live_example(broker, mutate_payloads(valid_frames(), mutations, drop_after))


@pytest.mark.timeout(TIMEOUT)
@settings(max_examples=150 * SCALE, **FUZZ_SETTINGS)
@given(ops=method_sequences())
def test_random_method_sequences(broker, ops):
    """(d) well-formed methods in random order with plausible arguments, each synchronous one awaited
    (bounded): whatever the order, each ends in a reply, a channel error with a fitting code (the channel
    is then reopened and the sequence goes on) or a connection error with a fitting code -- never 541
    internal-error, never silence -- and afterwards the node serves a new connection.

    (This found a re-entrant auto-delete bug in exchange.delete within its first 20 examples: an
    auto-delete exchange deleted while still bound -- fixed in 8fad103; the dedicated regression test is
    test_limits_auth.py::test_deleting_an_auto_delete_exchange_that_still_has_bindings.)"""
    try:
        run_sequence(broker, ops)
    finally:
        cleanup(broker, *pool_names(ops))


def test_the_unmutated_stream_is_valid(broker):
    """The stream (c) mutates is itself valid: no error, the probe is answered."""
    assert live_example(broker, valid_stream()) == "working"


# -- (e) before authentication: start-ok with crafted sizes and depths, bounded in time and memory -------------
PRE_LOGIN_ANSWER = 1.0  # seconds: decoding a frame of at most 4 KiB (frame-min-size) is microseconds
PRE_LOGIN_RSS_GROWTH = 50 << 20  # bytes the node may grow over the whole run
_pre_login_rss: dict[int, int] = {}


def node_rss(broker) -> int | None:
    """The raftmq node's resident set size (Linux /proc); None for RabbitMQ."""
    if broker.kind != "raftmq":
        return None
    with open(f"/proc/{broker.process.pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


@st.composite
def crafted_client_properties(draw) -> bytes:
    """A client-properties field table holding one S/x/A/F value whose declared size is anything
    (up to 2^32-1) followed by random octets, wrapped in 0-300 nested tables; the outer size is
    right, or anything."""
    code = draw(st.sampled_from([b"S", b"x", b"A", b"F"]))
    size = draw(st.one_of(st.integers(0, 64), st.integers(0, 0xFFFFFFFF), st.just(0xFFFFFFFF)))
    items = r.shortstr("v") + code + struct.pack(">I", size) + draw(st.binary(max_size=64))
    for _ in range(draw(st.integers(0, 300))):
        items = r.shortstr("k") + b"F" + r.longstr(items)
    outer = len(items) if draw(st.booleans()) else draw(st.integers(0, 0xFFFFFFFF))
    return struct.pack(">I", outer) + items


@pytest.mark.timeout(TIMEOUT)
@settings(max_examples=80 * SCALE, **FUZZ_SETTINGS)
@given(properties=crafted_client_properties())
def test_start_ok_with_crafted_sizes_before_login_is_answered_fast(broker, properties):
    """(e) connection.start-ok (reference 1.4.2.2) with a wrong password and crafted client-properties:
    before login a frame is at most frame-min-size (4096, general 4.2.3), and no declared size or depth
    is trusted, so the broker answers within 1 s -- connection.close 403 (the properties decoded, the
    login failed), or a malformed-input code -- and the node's RSS grows by less than 50 MB over the run."""
    baseline = _pre_login_rss.setdefault(0, node_rss(broker) or 0)
    client = RawClient(broker.host, broker.port, timeout=5.0)
    try:
        client.send(r.PROTOCOL_HEADER)
        client.expect_method(r.CONNECTION_START, channel=0)
        started = time.monotonic()
        try:
            client.send(r.method_frame(0, r.CONNECTION_START_OK, properties + r.shortstr("PLAIN")
                                       + r.longstr(b"\x00guest\x00not-the-password") + r.shortstr("en_US")))
        except OSError:
            pass
        try:
            close = client.expect_connection_close(timeout=PRE_LOGIN_ANSWER + 4.0)
            outcome = f"connection.close {close.reply_code}"
            check_close_code(broker, close.reply_code, "connection.close before login")
        except ConnectionEnded:
            outcome = ended_without_close(broker, "before login")
        elapsed = time.monotonic() - started
        _note(f"outcome: {outcome} after {elapsed:.3f} s", outcome)
    finally:
        client.close()
    assert elapsed < PRE_LOGIN_ANSWER, f"{elapsed:.2f} s to answer a start-ok before login"
    rss = node_rss(broker)
    if rss is not None:
        assert rss - baseline < PRE_LOGIN_RSS_GROWTH, f"the node grew by {(rss - baseline) >> 20} MB"
    assert broker.is_alive(), "the broker process died or stopped answering the protocol header"
