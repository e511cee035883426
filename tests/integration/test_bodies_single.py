"""Message bodies on disk on a single node (issue 18): a durable queue's backlog larger than the
body cache spills to ``<data>/bodies`` and is read back for consumers; transient messages stay
transient across a restart (as RabbitMQ's classic queues v2 page them out), persistent ones stay.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the queue is placed in queue group 1, whose
worker's body store and status.json are read; the metrics sum every group's (each has a cache of
``body_cache_bytes``)."""

from __future__ import annotations

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import consume_acked
from tests.integration.test_metrics import scrape, value
from tests.support.groups import GROUPS, group_status, queue_arguments

CACHE = 64 << 10
WRITE_BEHIND = 16 << 10
BODY = 2048
COUNT = 200  # 400 KB: 6x the cache


def body(kind: str, i: int) -> bytes:
    return (f"{kind}-{i:06d}-".encode() * (BODY // 10 + 1))[:BODY]




@pytest.fixture
def node(broker_kind, tmp_path):
    if broker_kind == "rabbitmq":
        pytest.skip("drives a raftmq node's body store and restarts it")
    metrics_port = free_port()
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_BODY_CACHE_BYTES": str(CACHE),
                                          "RAFTMQ_BODY_WRITE_BEHIND_BYTES": str(WRITE_BEHIND)},
                    extra_args=["--metrics-port", str(metrics_port)]) as n:
        n.metrics_port = metrics_port
        yield n


def test_a_backlog_spills_to_disk_and_transient_messages_do_not_survive_a_restart(node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("spill", durable=True, arguments=queue_arguments())
    ch.confirm_delivery()
    for i in range(COUNT):
        ch.basic_publish("", "spill", body("p", i), pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "spill", body("t", i), pika.BasicProperties(delivery_mode=1))
    st = group_status(node)
    # The transient ones spilled past the write-behind bound; the persistent ones are in the
    # durable store's message records and are not written twice.
    assert COUNT * 0.5 < st["bodies_written"] <= COUNT, st
    assert st["body_held_bytes"] <= CACHE + WRITE_BEHIND, st  # not the 800 KB queued
    samples = scrape(node.metrics_port)
    assert value(samples, "raftmq_bodies_written_total") > 0
    assert 0 < value(samples, "raftmq_body_memory_bytes") <= GROUPS * (CACHE + WRITE_BEHIND)
    assert value(samples, "raftmq_body_cache_limit_bytes") == GROUPS * CACHE
    # Read back from disk, in order, both kinds.
    expected = [b for i in range(COUNT) for b in (body("p", i), body("t", i))]
    assert consume_acked(ch, "spill", 40) == expected[:40]
    assert value(scrape(node.metrics_port), "raftmq_bodies_read_total") > 0  # some came from disk
    conn.close()

    node.restart(hard=True)  # kill -9: what was confirmed and persistent is what comes back
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    st = group_status(node)
    assert st["bodies_lost"] == 0
    got = consume_acked(ch, "spill", COUNT, inactivity=3)
    # The 20 persistent ones delivered before the restart were acked; transient ones are gone.
    assert got == [body("p", i) for i in range(20, COUNT)]
    conn.close()
