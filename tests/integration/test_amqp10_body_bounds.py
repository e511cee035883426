"""One AMQP 1.0 message must never take gigabytes (issue 31 item 1), against a private raftmq node.

Found on main: an amqp-value body of millions of one-byte empty lists (1.6.22 list0) was decoded whole
into Python objects on the event loop -- 8 MiB: RSS +581 MB, other clients stalled 3.4-5.3 s; 300
attach frames of 128 KiB holding 130k-element lists stalled others 8-15 s.

Spec (/work/shared/specs, AMQP 1.0): 3.2 (a message is sections; 3.2.8 amqp-value is a body section;
3.2.5 application-properties), 2.7.5 transfer (a delivery in several frames, ``more``), 2.8.15
amqp:decode-error, 2.7.9 close with an error, 3.4.3 rejected (with an error).

Checked, with hand-built frames over a real socket (the 8 MiB body would cost the test's own proton
~600 MB to build) and pika as the other client:

1. the 8 MiB body of empty lists is accepted; the node's RSS grows by less than 64 MB over the
   publish and delivery (the body's octets, not its elements), and another client's 0-9-1 round trip
   (connect, declare, publish, get) stays under 1.5 s throughout; a 1.0 consumer gets the amqp-value
   section byte for byte, a 0-9-1 consumer gets those octets as its body with type ``amqp-1.0``
   (docs/amqp10.md, "Message conversion");
2. sections the node must read (application-properties) past ``amqp10_max_message_elements`` are
   rejected with amqp:decode-error, logged once per link; the link stays usable;
3. attach frames holding a 130k-element list are closed with amqp:decode-error, one log line each,
   and the others' round trip stays bounded.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import stored
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.frames import encode_frame
from tests.integration.helpers import connect, round_trip
from tests.integration.test_amqp10_raw import Raw

MiB = 1 << 20
U32 = struct.Struct(">I")
HEADER = struct.Struct(">IBBH")
CHUNK = 120_000  # transfer payload per frame, under the node's max-frame-size of 128 KiB
RTT_BOUND = 1.5  # seconds: loose (shared 2-core machine; ~0.05 s seen); main stalled others 2.3-5.3 s at 8 MiB
RSS_BOUND = 64 * MiB


@pytest.fixture(scope="module")
def node(broker_kind: str, tmp_path_factory) -> Iterator[RaftmqNode]:
    if broker_kind == "rabbitmq":
        pytest.skip("drives a private raftmq node")
    base = tmp_path_factory.mktemp("amqp10-body")
    config = base / "raftmq.toml"
    config.write_text("disk_free_limit = 1\n")  # no disk alarm from a nearly full test disk
    n = RaftmqNode(base / "data", config=config).start()
    yield n
    n.terminate()


def rss(pid: int, field: str = "VmRSS") -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of process ``pid`` in bytes (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


class Watch:
    """Another client's round trips, and the node's peak RSS: its high-water mark is reset when the
    watch starts (``clear_refs`` 5, Linux 4.0+) -- a sample between round trips would miss a peak that
    is freed while the loop is blocked, as main's was -- and also sampled, in case the reset is refused."""

    def __init__(self, n: RaftmqNode) -> None:
        self.node, self.rtts = n, []
        try:
            Path(f"/proc/{n.pid}/clear_refs").write_text("5")
        except OSError:
            pass
        self.before = self.peak = rss(n.pid)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def growth(self) -> int:
        """How far the node's RSS rose above where it was when the watch started."""
        return max(self.peak, rss(self.node.pid, "VmHWM")) - self.before

    def _run(self) -> None:
        deadline = time.monotonic() + 60  # bounded whatever happens
        while not self.stop.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            round_trip(self.node.url)
            self.rtts.append(time.monotonic() - started)
            self.peak = max(self.peak, rss(self.node.pid))
            time.sleep(0.02)

    def __enter__(self) -> Watch:
        # The same client's round trips before the flood: on a loaded machine (the suite's two xdist
        # workers beside other processes) one took 3.2 s with nothing else sent to the node.
        self.baseline = []
        for _ in range(3):
            started = time.monotonic()
            round_trip(self.node.url)
            self.baseline.append(time.monotonic() - started)
        self.thread.start()
        return self

    def bound(self) -> float:
        """The longest round trip allowed during the flood: RTT_BOUND beyond three times the slowest
        before it (a stalled loop, as main's 2.3-5.3 s at 8 MiB, exceeds it on a quiet machine)."""
        return RTT_BOUND + 3 * max(self.baseline)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def attached_sender(n: RaftmqNode, address: str) -> Raw:
    """A raw 1.0 connection with a session and an attached sender that holds link credit."""
    raw = Raw(n.port)
    raw.login()
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=100_000, outgoing_window=100_000)))
    assert isinstance(raw.performative(), p.Begin)
    raw.send(encode_frame(p.Attach(name="s", handle=0, role=False, snd_settle_mode=0, rcv_settle_mode=0,
                                   source=p.Source(), target=p.Target(address=address), initial_delivery_count=0)))
    assert isinstance(raw.performative(), p.Attach)
    assert isinstance(raw.performative(), p.Flow)  # the node's credit
    return raw


def send_message(raw: Raw, delivery_id: int, payload: bytes) -> None:
    """One unsettled delivery in frames of CHUNK octets (2.7.5: ``more`` on all but the last)."""
    chunks = [payload[i:i + CHUNK] for i in range(0, len(payload), CHUNK)] or [b""]
    for i, chunk in enumerate(chunks):
        first = i == 0
        transfer = p.Transfer(handle=0, delivery_id=delivery_id if first else None,
                              delivery_tag=bytes((delivery_id,)) if first else None,
                              message_format=0 if first else None, settled=False, more=i < len(chunks) - 1)
        raw.send(encode_frame(transfer, payload=chunk))


def outcome(raw: Raw, timeout: float = 30.0):
    while True:
        body = raw.performative(timeout)
        if isinstance(body, p.Disposition):
            return body.state


def receive_one(n: RaftmqNode, queue: str) -> bytes:
    """The octets of one delivery from ``queue`` through a raw 1.0 receiver (credit 1, pre-settled)."""
    raw = Raw(n.port)
    raw.reader.max_frame_size = 64 * MiB  # our open sets no max-frame-size: the node may send one frame
    try:
        raw.login("receiver")
        raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=100_000, outgoing_window=100_000)))
        begun = raw.performative()
        raw.send(encode_frame(p.Attach(name="r", handle=0, role=True, snd_settle_mode=1, rcv_settle_mode=0,
                                       source=p.Source(address=f"/queues/{queue}"), target=p.Target())))
        assert isinstance(raw.performative(), p.Attach)
        raw.send(encode_frame(p.Flow(next_incoming_id=begun.next_outgoing_id, incoming_window=100_000,
                                     next_outgoing_id=0, outgoing_window=100_000, handle=0, delivery_count=0,
                                     link_credit=1)))
        parts = []
        while True:
            frame = raw.frame(30.0)
            if isinstance(frame.performative, p.Transfer):
                parts.append(frame.payload)
                if not frame.performative.more:
                    return b"".join(parts)
    finally:
        raw.close()


def empty_lists_value(count: int) -> bytes:
    """An amqp-value section holding a list32 of ``count`` empty lists (one octet each)."""
    return b"\x00\x53\x77\xd0" + U32.pack(count + 4) + U32.pack(count) + b"\x45" * count


def test_8_mib_body_of_empty_lists_is_stored_and_delivered_as_octets(node):
    """Issue 31 item 1: the body is kept as octets -- RSS and others' round trip bounded; 1.0 gets the
    section byte for byte, 0-9-1 the section octets with type amqp-1.0 (docs/amqp10.md)."""
    conn = connect(node.url)
    ch = conn.channel()
    for q in ("body-10", "body-091"):
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, "amq.fanout")
    body = empty_lists_value(8 * MiB)
    raw = attached_sender(node, "/exchanges/amq.fanout")
    try:
        with Watch(node) as watch:
            time.sleep(0.3)
            send_message(raw, 0, body)
            state = outcome(raw)
            delivered = receive_one(node, "body-10")
            time.sleep(0.3)
            growth = watch.growth()
    finally:
        raw.close()
    assert isinstance(state, p.Accepted), state
    spans = stored.spans(delivered)
    assert spans[-1].cls is p.AmqpValue and delivered[spans[-1].start:] == body
    method, props, got = ch.basic_get("body-091", auto_ack=True)
    assert method is not None and got == body and props.type == "amqp-1.0"
    conn.close()
    print(f"8 MiB of empty lists: RSS +{growth / MiB:.1f} MB, round trips {len(watch.rtts)}, "
          f"max {max(watch.rtts):.3f} s")
    assert len(watch.rtts) >= 2
    assert growth < RSS_BOUND, f"RSS grew {growth / MiB:.0f} MB"
    assert max(watch.rtts) < watch.bound(), (watch.rtts, watch.baseline)


def test_properties_past_the_element_budget_are_rejected(node):
    """3.2.5/3.4.3: application-properties of 40,000 entries (80,000 elements > 65,536) cannot be read
    within the budget: rejected with amqp:decode-error (three times, one log line: such rejections are
    logged at most once per 10 s per node, node/amqp10/limits.py); the next message on the link is
    accepted."""
    conn = connect(node.url)
    conn.channel().queue_declare("budget", durable=True)
    conn.close()
    offset = node.log_path.stat().st_size
    raw = attached_sender(node, "/queues/budget")
    try:
        big = p.ApplicationProperties({f"k{i}": i for i in range(40_000)}).encode() + p.Data(b"x").encode()
        for delivery_id in (0, 1, 2):
            send_message(raw, delivery_id, big)
            state = outcome(raw)
            assert isinstance(state, p.Rejected) and state.error.condition == "amqp:decode-error", state
        send_message(raw, 3, p.ApplicationProperties({"k": 1}).encode() + p.Data(b"y").encode())
        assert isinstance(outcome(raw), p.Accepted)
    finally:
        raw.close()
    log = node.log_path.read_bytes()[offset:].decode(errors="replace")
    assert log.count("undecodable delivery refused") == 1, log[-2000:]


def attach_with_huge_list(count: int) -> bytes:
    """An attach whose desired-capabilities is a list32 of ``count`` empty lists (one frame)."""
    # name, handle, role, nine nulls (snd-settle-mode ... offered-capabilities), desired-capabilities
    items = b"\xa1\x01l" + b"\x43" + b"\x42" + b"\x40" * 9 + empty_lists_value(count)[3:]
    body = b"\x00\x53\x12\xd0" + U32.pack(len(items) + 4) + U32.pack(13) + items
    return HEADER.pack(8 + len(body), 2, 0, 0) + body


def test_attach_frames_of_130k_element_lists_are_decode_errors(node):
    """2.8.15: an attach past amqp10_max_frame_elements is amqp:decode-error, connection closed, one log
    line per connection; the others' round trip stays bounded meanwhile."""
    offset = node.log_path.stat().st_size
    frame = attach_with_huge_list(130_000)
    assert len(frame) < 131072
    closes = []
    with Watch(node) as watch:
        for _ in range(20):
            raw = Raw(node.port)
            try:
                raw.login("flood")
                raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)))
                raw.performative()
                raw.send(frame)
                while True:
                    body = raw.performative()
                    if isinstance(body, p.Close):
                        closes.append(body.error.condition)
                        break
            finally:
                raw.close()
    assert closes == ["amqp:decode-error"] * 20
    log = node.log_path.read_bytes()[offset:].decode(errors="replace")
    assert log.count("element budget") == 20, log[-2000:]
    print(f"20 attach frames of 130k elements: round trips {len(watch.rtts)}, max {max(watch.rtts):.3f} s")
    assert watch.rtts and max(watch.rtts) < watch.bound(), (watch.rtts, watch.baseline)


def test_a_legitimate_message_with_properties_round_trips(node):
    """The walk does not change what a 1.0 client sends and gets: properties, application-properties and
    an amqp-value body come back as sent (3.2: the bare message is immutable)."""
    conn = connect(node.url)
    conn.channel().queue_declare("plain", durable=True)
    conn.close()
    bare = (p.Properties(message_id="m1", subject="s").encode()
            + p.ApplicationProperties({"k": t.Symbol("v"), "n": 7}).encode()
            + p.AmqpValue({"a": [1, 2, None]}).encode())
    raw = attached_sender(node, "/queues/plain")
    try:
        send_message(raw, 0, bare)
        assert isinstance(outcome(raw), p.Accepted)
    finally:
        raw.close()
    delivered = receive_one(node, "plain")
    assert delivered.endswith(bare)
