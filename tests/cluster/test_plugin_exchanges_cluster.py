"""Issue 21's plugin exchanges on three real nodes: held delayed messages and an exchange's
deduplication cache are replicated state.  A delayed message published before the leader is killed
is released by the new leader at its time (never before); a follower that was down while the log was
compacted installs a snapshot with the held messages and the cache, and every digest is equal."""

from __future__ import annotations

import time

import pika
import pytest

from raftmq.ops.local.cluster import Cluster

pytestmark = pytest.mark.cluster

H = "x-deduplication-header"


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_delayed_messages_and_the_exchange_cache_survive_a_leader_kill_and_a_snapshot(tmp_path):
    with Cluster(3, tmp_path, extra_config="snapshot_entries = 50\nsnapshot_seconds = 1.0") as cluster:
        leader = cluster.leader()
        lagging = next(n for n in cluster.nodes if n is not leader)
        lagging.kill9()
        conn = cluster.connection(leader)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        ch.queue_declare("dq", durable=True)
        ch.queue_bind("dq", "dx", "k")
        ch.exchange_declare("ddx", "x-message-deduplication", durable=True, arguments={"x-cache-size": 1000})
        ch.queue_declare("ddq", durable=True)
        ch.queue_bind("ddq", "ddx", "")
        sent = time.monotonic()
        for i in range(5):
            ch.basic_publish("dx", "k", b"d%d" % i, pika.BasicProperties(delivery_mode=2, headers={"x-delay": 6000}))
        for i in range(100):  # > 50 entries: the leader compacts its log into a snapshot
            ch.basic_publish("ddx", "", b"m%d" % i, pika.BasicProperties(headers={H: i}))
        conn.close()
        time.sleep(2.5)
        assert cluster.fresh_status(leader)["journal_entries"] < 100
        lagging.start()
        cluster.wait_applied_equal()
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests

        leader.kill9()
        new_leader = cluster.leader(timeout=15, exclude=leader)
        conn = cluster.connection(lagging)  # the node restored from the snapshot
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(100):  # every resend dropped by the replicated exchange cache
            ch.basic_publish("ddx", "", b"again", pika.BasicProperties(headers={H: i}))
        assert count(ch, "ddq") == 100
        assert count(ch, "dq") == 0 or time.monotonic() - sent >= 6.0  # not before the delay
        deadline = time.monotonic() + 20
        while count(ch, "dq") < 5:
            assert time.monotonic() < deadline, "delayed messages not released by the new leader"
            time.sleep(0.05)
        assert time.monotonic() - sent >= 6.0
        assert new_leader is not leader
        conn.close()
        leader.start()
        cluster.wait_applied_equal(timeout=30)
        digests = cluster.digests()
        assert len(digests) == 3 and len({d for _, d in digests.values()}) == 1, digests
