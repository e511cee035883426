"""A 0-9-1 auto-ack consumer is assigned only as fast as its socket takes the deliveries (issue 31 item 2,
the 0-9-1 counterpart of tests/integration/test_amqp10_credit_memory.py).

An auto-ack message leaves its queue when the core assigns it, and basic.qos prefetch does not apply
to auto-ack consumers (0-9-1 reference, basic.qos: "prefetch-count ... ignored if the no-ack option is
set"), so before this change a ``no_ack`` consumer attaching to a backlog was assigned all of it in one
apply: 100 x 1 MiB queued and a socket that is not read put +84 MB into the node's heap and emptied the
queue at once.  The channel now gives the core credit in slices as it writes (node/amqp091/autoack.py).

The consumer here is a raw 0-9-1 client (tests/integration/rawamqp.py: frames built from the spec, not
raftmq's codec) with a 64 KiB receive buffer, so that the test, not a client library, decides when the
socket is read.  A private node with a 16 MiB body cache, so that what the node holds for the consumer
is not hidden by cached bodies.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from raftmq.ops.local.node import RaftmqNode

from .rawamqp import BASIC_CONSUME_OK, FRAME_BODY, FRAME_HEADER, RawClient, basic_consume, read_shortstr
from .test_amqp10_credit_memory import body_of, fill_queue, pika_conn, probe_for, queue_depth, rss

MB = 1 << 20
BACKLOG = 100  # x 1 MiB queued
BODY_SIZE = MB
RSS_BOUND = 40 * MB  # what the node may grow by while the consumer does not read (before: +84 MB)
BASIC_DELIVER = (60, 60)


@pytest.fixture(scope="module")
def node(broker_kind: str, tmp_path_factory) -> Iterator[RaftmqNode]:
    if broker_kind == "rabbitmq":
        pytest.skip("drives a private raftmq node")
    base = tmp_path_factory.mktemp("autoack-memory")
    config = base / "raftmq.toml"
    config.write_text("disk_free_limit = 1\nbody_cache_bytes = 16777216\nautoack_slice = 2048\n"
                      '[users.guest]\npassword = "guest"\ntags = ["administrator"]\n')
    n = RaftmqNode(base / "data", config=config).start()
    yield n
    n.terminate()


def unread_consumer(port: int, rcvbuf: int) -> RawClient:
    """A raw client whose socket's receive buffer is set before it connects (the window the kernel
    advertises stays small)."""
    client = RawClient("127.0.0.1", port, timeout=15)
    client.sock.close()  # replaced before the handshake: a connection that never spoke
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(15)
    sock.connect(("127.0.0.1", port))
    client.sock = sock
    return client


def read_deliveries(client: RawClient, count: int, timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """The next ``count`` basic.deliver (delivery tag, body), content frames joined (0-9-1 4.2.6)."""
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        frame = client.read_method(timeout=max(0.1, deadline - time.monotonic()))
        assert frame.method == BASIC_DELIVER, f"expected basic.deliver, got {frame.method}"
        _tag, pos = read_shortstr(frame.payload, 4)
        (delivery_tag,) = struct.unpack_from(">Q", frame.payload, pos)
        header = client.read_frame(timeout=max(0.1, deadline - time.monotonic()))
        assert header.type == FRAME_HEADER
        (size,) = struct.unpack_from(">Q", header.payload, 4)
        parts, got = [], 0
        while got < size:
            body = client.read_frame(timeout=max(0.1, deadline - time.monotonic()))
            assert body.type == FRAME_BODY
            parts.append(body.payload)
            got += len(body.payload)
        out.append((delivery_tag, b"".join(parts)))
    return out


def test_autoack_consumer_that_never_reads_holds_no_backlog(node) -> None:
    """100 x 1 MiB queued; a raw auto-ack consumer (basic.consume no-ack) with a 64 KiB receive buffer
    that does not read for 2 s.  Checks: the node's heap (RssAnon) grows by less than 40 MB (before:
    +84 MB, every message assigned in one apply), another client's publish-and-get round trip completes
    throughout, and more than half of the backlog is still queued; then the consumer reads: all 100
    arrive, intact, in queue order, once (delivery tags 1..100, nothing more within 1 s), and the queue
    is empty."""
    queue = "autoack-unread"
    fill_queue(node, queue, BACKLOG, BODY_SIZE)
    time.sleep(0.5)
    before = rss(node.pid)
    consumer = unread_consumer(node.port, 65536)
    try:
        consumer.handshake()
        consumer.open_channel(1)
        consumer.send(basic_consume(1, queue, "unread", no_ack=True))
        consumer.expect_method(BASIC_CONSUME_OK, channel=1)
        peak, worst = probe_for(node, queue, 2.0)
        depth = queue_depth(node, queue)
        growth = peak - before
        print(f"\nunread auto-ack consumer: RssAnon {before / MB:.0f} -> {peak / MB:.0f} MB (+{growth / MB:.1f}); "
              f"other client's worst round trip {worst * 1000:.0f} ms; {depth} of {BACKLOG} still queued")
        assert growth < RSS_BOUND, f"RssAnon grew {growth / MB:.0f} MB for an auto-ack consumer that does not read"
        assert depth > BACKLOG // 2, f"only {depth} left queued: the backlog was assigned to a full socket"
        got = read_deliveries(consumer, BACKLOG)
        assert [tag for tag, _ in got] == list(range(1, BACKLOG + 1))
        for i, (_tag, body) in enumerate(got):
            assert body == body_of(i, BODY_SIZE), f"message {i} differs"
        with pytest.raises(TimeoutError):
            consumer.read_frame(timeout=1.0)  # once: nothing after the 100th
        assert queue_depth(node, queue) == 0
    finally:
        consumer.close()


def test_autoack_consumer_that_reads_gets_everything(node) -> None:
    """The fast path: a pika auto-ack consumer on 2,000 x 1 KiB queued and 500 more published while it
    consumes gets all 2,500, in order, once (the channel's credit top-ups keep up: none is stuck behind
    a slice), and the queue ends empty; a client-sent ``x-raftmq-autoack-credit`` argument is ignored
    (the node's own, store/delivery.AUTOACK_CREDIT)."""
    queue = "autoack-fast"
    fill_queue(node, queue, 2000, 1024)
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        got: list[bytes] = []

        def on_message(_ch, _method, _props, body: bytes) -> None:
            got.append(body)

        ch.basic_consume(queue, on_message, auto_ack=True, arguments={"x-raftmq-autoack-credit": 0})
        publisher = conn.channel()
        for i in range(2000, 2500):
            publisher.basic_publish("", queue, body_of(i, 1024))
        deadline = time.monotonic() + 30
        while len(got) < 2500 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        conn.process_data_events(time_limit=0.5)
        assert len(got) == 2500, f"{len(got)} of 2,500 delivered"
        assert got == [body_of(i, 1024) for i in range(2500)]
        assert queue_depth(node, queue) == 0
    finally:
        conn.close()
