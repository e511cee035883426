"""A damaged body on a single node (issue 29; store/disk/bodies.py "Damaged bodies"): with no member to
fetch an intact copy from, its delivery is refused loudly -- not sent (neither damaged nor empty),
logged at ERROR with the message id and queue, counted -- and the message stays queued: not acked,
not lost, back in its queue when the consumer goes.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the queue is placed in queue group 1: its
worker's body store is damaged and its status.json counts; the metrics sum every group's."""

from __future__ import annotations

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import message_count
from tests.integration.test_metrics import scrape, value
from tests.support.groups import group_dir, group_status, queue_arguments

BODY = 4096
COUNT = 120
DAMAGED = 60  # the message whose stored body is damaged


def body(i: int) -> bytes:
    return (f"transient-{i:06d}-".encode() * (BODY // 17 + 1))[:BODY]




@pytest.fixture
def node(broker_kind, tmp_path):
    if broker_kind == "rabbitmq":
        pytest.skip("damages a raftmq node's body store")
    metrics_port = free_port()
    # Transient bodies spill to <data>/bodies past 16 KiB of write-behind; the scrubber is off so
    # that the delivery is what meets the damage.
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_BODY_CACHE_BYTES": str(16 << 10),
                                          "RAFTMQ_BODY_WRITE_BEHIND_BYTES": str(16 << 10),
                                          "RAFTMQ_SCRUB_BYTES_PER_SECOND": "0"},
                    extra_args=["--metrics-port", str(metrics_port)]) as n:
        n.metrics_port = metrics_port
        yield n


def consume(ch, queue: str, inactivity: float) -> list[bytes]:
    got = []
    for method, _props, data in ch.consume(queue, inactivity_timeout=inactivity):
        if method is None:
            break
        got.append(data)
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    return got


def test_a_damaged_body_is_not_delivered_and_the_message_stays_queued(node):
    """Checks: every other message is delivered intact and in order; the damaged one is never sent
    (twice: to the first consumer, then after it went back to the queue, to a second one); the
    queue still holds it; bodies_damaged and bodies_refused count it (status.json and metrics);
    the log names the message and queue at ERROR."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("q", arguments=queue_arguments())  # issue 34: its group's body store is damaged
    for i in range(COUNT):
        ch.basic_publish("", "q", body(i), pika.BasicProperties(delivery_mode=1))
    message_count(ch, "q")  # a round trip: every publish before it was applied
    assert group_status(node)["bodies_written"] > DAMAGED

    # Damage the stored body while the node runs (its memory map sees the file's pages).
    path = group_dir(node) / "bodies" / "data.mdb"
    data = bytearray(path.read_bytes())
    at = data.find(body(DAMAGED))
    assert at >= 0 and data.find(body(DAMAGED), at + 1) < 0
    with open(path, "r+b") as f:
        f.seek(at + 1000)
        f.write(bytes([data[at + 1000] ^ 0x20]))

    ch.basic_qos(prefetch_count=10)
    got = consume(ch, "q", inactivity=3)
    assert got == [body(i) for i in range(COUNT) if i != DAMAGED]
    conn.close()  # the refused delivery goes back to its queue with the consumer's channel

    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    assert message_count(ch, "q") == 1  # still queued, not acked, not lost
    ch.basic_qos(prefetch_count=10)
    assert consume(ch, "q", inactivity=2) == []  # refused again: never sent damaged
    conn.close()

    st = group_status(node)
    assert st["bodies_damaged"] == 1 and st["bodies_refused"] >= 2 and st["bodies_repaired"] == 0, st
    samples = scrape(node.metrics_port)
    assert value(samples, "raftmq_bodies_damaged_total") == 1
    assert value(samples, "raftmq_bodies_refused_total") >= 2
    log = node.log_path.read_text(errors="replace")
    assert "ERROR" in log and "in queue 'q'" in log and "not delivered" in log
