"""The one-step publish path (``Channel.publish_whole``) answers exactly as the frame-by-frame path.

A publisher's read usually holds whole publishes (method, header, one body frame), which the front
end takes in one step; frames that arrive one per read always go through the general path.  Fed the
same bytes both ways, a real single-node broker (LMDB store, local log) must write the same bytes
back and end with the same queue contents, whatever the mix of good and bad publishes.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.node.amqp091.connection import Amqp091Connection
from raftmq.node.broker import Broker
from raftmq.node.config import Config
from tests.integration import rawamqp as raw
from tests.support.transport import RecordingTransport

QUEUE = "q"


def handshake(confirms: bool) -> list[bytes]:
    return raw.opening_frames(QUEUE, product="test", confirms=confirms)


async def settle(broker: Broker) -> None:
    """Until every command submitted so far is applied and its outputs released (fsyncs included)."""
    for _ in range(2000):
        await asyncio.sleep(0.001)
        if broker.log.idle:
            return
    raise TimeoutError("the broker did not settle in 2 s")


async def run_broker(steps: list[bytes], chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    """Feed the handshake, then ``chunks`` one ``data_received`` each, all in one loop iteration (so
    that the commands they make share one batch however the bytes were cut); return what was written
    after the handshake and the bodies left in the queue."""
    data_dir = tempfile.mkdtemp(prefix="raftmq-publish-path-")
    broker = Broker(Config(data_dir=data_dir, port=0))
    await broker.start()
    await settle(broker)
    transport = RecordingTransport()
    conn = Amqp091Connection(broker, transport)
    conn.start(b"")
    for step in steps:
        conn.data_received(step)
        for _ in range(2000):  # start-ok's password is checked in the login pool (node/logins.py)
            if not conn.checking_login:
                break
            await asyncio.sleep(0.001)
        await settle(broker)
    transport.data.clear()
    for chunk in chunks:
        conn.data_received(chunk)
    await settle(broker)
    written = bytes(transport.data)
    queue = broker.machine.vhosts["/"].queues.get(QUEUE)
    bodies = []
    while queue is not None and len(queue.ready):
        bodies.append(broker.bodies.get(queue.ready.pop().message.id))
    conn.connection_lost(None)
    await broker.stop()
    shutil.rmtree(data_dir, ignore_errors=True)  # one per hypothesis example
    return written, bodies


def frames_of(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size = struct.unpack_from(">I", data, pos + 3)[0]
        out.append(data[pos:pos + 8 + size])
        pos += 8 + size
    return out


def answers(written: bytes) -> tuple[list[bytes], list[int]]:
    """The frames written other than acks, in order, and the publishes acked (how acks are grouped
    into basic.ack multiple=true is the confirm path's business, not the parser's)."""
    frames: list[bytes] = []
    acked: list[int] = []
    for frame in frames_of(written):
        if frame[7:11] == b"\x00\x3c\x00\x50":  # basic.ack
            tag, multiple = struct.unpack_from(">QB", frame, 11)
            first = (acked[-1] if acked else 0) + 1 if multiple else tag
            acked += range(first, tag + 1)
        else:
            frames.append(frame)
    return frames, acked


body = st.binary(min_size=0, max_size=40)
publish = st.one_of(
    # good publishes: default exchange or amq.direct, to the queue or nowhere, maybe mandatory
    st.tuples(st.just("good"), st.sampled_from(["", "amq.direct"]), st.sampled_from([QUEUE, "nowhere"]),
              st.booleans(), body),
    # a body split over two frames, an empty body (with an empty body frame after it), immediate, a missing exchange, a bad header class,
    # a body longer or shorter than announced, a routing key that is not UTF-8
    st.tuples(st.sampled_from(["split", "empty", "empty-body-frame", "immediate", "no-exchange", "bad-class", "long-body",
                               "short-body", "bad-utf8"]), st.just(""), st.just(QUEUE), st.booleans(), body),
)


def encode(item: tuple) -> bytes:
    kind, exchange, key, mandatory, data = item
    data = data or b"x"
    if kind == "no-exchange":
        exchange = "missing"
    routing_key: str | bytes = b"\xff" if kind == "bad-utf8" else key
    method = raw.basic_publish(1, exchange, routing_key, mandatory=mandatory, immediate=kind == "immediate")
    if kind == "empty":
        return method + raw.content_header_frame(1, 0)
    if kind == "empty-body-frame":
        return method + raw.content_header_frame(1, 0) + raw.body_frame(1, b"")
    if kind == "split":
        return method + raw.content_header_frame(1, len(data) + 1) + raw.body_frame(1, data) + raw.body_frame(1, b"!")
    size = {"long-body": len(data) - 1, "short-body": len(data) + 1}.get(kind, len(data))
    header = raw.content_header_frame(1, size, class_id=50 if kind == "bad-class" else 60)
    return method + header + raw.body_frame(1, data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(publish, min_size=1, max_size=12), confirms=st.booleans())
def test_whole_reads_and_frame_by_frame_reads_answer_alike(items, confirms):
    data = b"".join(encode(item) for item in items)
    steps = handshake(confirms)
    whole, whole_queued = asyncio.run(run_broker(steps, [data]))
    by_frame, by_frame_queued = asyncio.run(run_broker(steps, frames_of(data)))
    assert answers(whole) == answers(by_frame)
    assert whole_queued == by_frame_queued


def test_a_read_of_publishes_is_queued_and_confirmed():
    """The plain case, spelled out: 50 publishes in one read are queued in order and confirmed by one
    basic.ack with multiple=true for tag 50 (the log applied them as one batch)."""
    bodies = [f"m{i}".encode() for i in range(50)]
    data = b"".join(encode(("good", "", QUEUE, False, b)) for b in bodies)
    written, queued = asyncio.run(run_broker(handshake(confirms=True), [data]))
    assert queued == bodies
    ack = raw.method_frame(1, raw.BASIC_ACK, struct.pack(">QB", 50, 1))
    assert written == ack
