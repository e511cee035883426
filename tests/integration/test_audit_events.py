"""The audit history (store/events.py): real traffic through a node, a snapshot of the running node,
event counts checked against what the test's clients did."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pika
import pytest

from raftmq.store import events as ev
from tests.support.raftmq_node import RaftmqNode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's audit history")
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as n:
        yield n


def test_history_of_publish_deliver_ack_reject_dlx_ttl_and_purge(node, tmp_path):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dead")
    ch.queue_declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    ch.queue_declare("short", arguments={"x-message-ttl": 50})
    for i in range(10):
        ch.basic_publish("", "work", f"w{i}".encode())
    ch.basic_publish("", "short", b"expires")
    ch.basic_publish("", "nowhere", b"unroutable")
    acked = rejected = requeued = 0
    for _ in range(10):
        method, _p, body = ch.basic_get("work")
        if body in (b"w0", b"w1"):
            ch.basic_nack(method.delivery_tag, requeue=False)  # -> dead-lettered to "dead"
            rejected += 1
        elif body == b"w2" and not method.redelivered:
            ch.basic_nack(method.delivery_tag, requeue=True)
            requeued += 1
        else:
            ch.basic_ack(method.delivery_tag)
            acked += 1
    method, _p, _b = ch.basic_get("work")  # the requeued w2 again
    ch.basic_ack(method.delivery_tag)
    acked += 1
    time.sleep(0.3)
    ch.basic_get("short")  # the expired message is gone (expiry at the head)
    purged = ch.queue_purge("dead").method.message_count
    conn.close()

    out = tmp_path / "snap"
    done = subprocess.run([sys.executable, "-m", "raftmq", "snapshot", "--data-dir", str(node.data_dir),
                           "--out", str(out)], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    records = list(ev.read_events(str(out)))
    assert [r[0] for r in records] == sorted({r[0] for r in records})  # increasing, no gaps in order
    kinds = Counter(ev.KIND_NAMES[r[2]] for r in records)
    assert kinds["published"] == 12  # client publishes (a dead-lettered copy is a dead_lettered event)
    assert kinds["acked"] == acked == 8  # ten messages, two rejected
    assert kinds["rejected"] == rejected == 2
    assert kinds["dead_lettered"] == 2
    assert kinds["requeued"] == requeued == 1
    assert kinds["expired"] == 1
    assert kinds["purged"] == purged == 2
    assert kinds["delivered"] == 11  # ten gets plus the requeued one
    unroutable = [r for r in records if ev.KIND_NAMES[r[2]] == "published" and r[7] == "nowhere"]
    assert len(unroutable) == 1 and unroutable[0][9] == ""  # routed to no queue
    assert all(r[10] is None for r in records)  # retention "metadata": no bodies
