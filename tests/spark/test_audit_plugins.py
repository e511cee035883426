"""``raftmq audit delays`` and ``raftmq audit deduplicated`` (issue 21) over a real node's history:
delayed messages held and released by an x-delayed-message exchange, and duplicates dropped by a
deduplicating queue and by an x-message-deduplication exchange, checked against the client's counts."""

from __future__ import annotations

import time

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode
from raftmq.spark import audit
from tests.support.cli import raftmq

H = "x-deduplication-header"
DELAYED = 6


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    base = tmp_path_factory.mktemp("audit-plugins")
    with RaftmqNode(base / "node", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        ch.queue_declare("jobs")
        ch.queue_bind("jobs", "later", "job")
        for i in range(DELAYED):
            ch.basic_publish("later", "job", b"j%d" % i, pika.BasicProperties(headers={"x-delay": 100 + 50 * i}))
        ch.basic_publish("later", "job", b"at once")  # no x-delay: not held
        ch.exchange_declare("once", "x-message-deduplication", arguments={"x-cache-size": 100})
        ch.queue_declare("orders")
        ch.queue_bind("orders", "once", "")
        for key in ("a", "a", "b", "a"):  # 2 duplicates at the exchange
            ch.basic_publish("once", "", key.encode(), pika.BasicProperties(headers={H: key}))
        ch.queue_declare("unique", arguments={"x-message-deduplication": True})
        for key in ("x", "x", "x"):  # 2 duplicates at the queue
            ch.basic_publish("", "unique", key.encode(), pika.BasicProperties(headers={H: key}))
        deadline = time.monotonic() + 10
        while ch.queue_declare("jobs", passive=True).method.message_count < DELAYED + 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        conn.close()
        node.wait_history()
        out = base / "snapshot"
        done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out))
        assert done.returncode == 0, done.stderr
    return str(out)


def test_delays_counts_held_and_released_messages_and_their_lateness(spark, history):
    (row,) = [r.asDict() for r in audit.delays(spark, history).collect()]
    assert (row["vhost"], row["exchange"], row["delayed"], row["released"]) == ("/", "later", DELAYED, DELAYED)
    assert row["max_delay_ms"] == 100 + 50 * (DELAYED - 1)
    assert 0 <= row["late_p50_ms"] <= row["late_p99_ms"] <= row["late_max_ms"] < 1000


def test_deduplicated_counts_queue_and_exchange_drops(spark, history):
    found = {(r["level"], r["exchange"], r["queue"]): r["duplicates"]
             for r in audit.deduplicated(spark, history).collect()}
    assert found == {("exchange", "once", ""): 2, ("queue", "", "unique"): 2}


def test_the_cli_reports_both_jobs(history):
    for job, expected in (("delays", "later"), ("deduplicated", "unique")):
        done = raftmq("audit", job, "--snapshot", history, "--quiet", timeout=240)
        assert done.returncode == 0, done.stderr[-2000:]
        assert expected in done.stdout, done.stdout
