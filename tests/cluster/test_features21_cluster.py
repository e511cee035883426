"""Issue 21 on three real nodes: the deduplication cache and delivery counts are replicated state.

Every replica applies the same deduplication and delivery-limit decisions (the digest covers the
caches and the counts), and the cache outlives its leader: a resend to the new leader after a
leader kill -9 is still dropped -- the failover case issue 21 starts from (a confirm lost with the
leader, the publisher resends).
"""

from __future__ import annotations

import time

import pika
import pytest

from raftmq.ops.local.cluster import Cluster

pytestmark = pytest.mark.cluster

H = "x-deduplication-header"


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_dedup_and_delivery_limit_replicate_and_the_cache_survives_a_leader_kill(tmp_path):
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        conn = cluster.connection(leader)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("f21-present", durable=True, arguments={"x-message-deduplication": True})
        ch.queue_declare("f21-window", durable=True, arguments={"x-message-deduplication": True,
                                                                "x-cache-ttl": 600_000})
        ch.queue_declare("f21-dlq", durable=True)
        ch.queue_declare("f21-limited", durable=True, arguments={
            "x-delivery-limit": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "f21-dlq"})
        for i in range(20):
            props = pika.BasicProperties(delivery_mode=2, headers={H: f"k{i % 10}"})
            ch.basic_publish("", "f21-present", b"p%d" % i, props, mandatory=True)
            ch.basic_publish("", "f21-window", b"w%d" % i, props, mandatory=True)
        assert count(ch, "f21-present") == 10 and count(ch, "f21-window") == 10
        # The window queue's first copies are consumed: only its cache remembers their keys now.
        for _ in range(10):
            method, _props, _body = ch.basic_get("f21-window", auto_ack=True)
            assert method is not None
        # Delivery limit 1: delivered, requeued, delivered again with x-delivery-count 1, requeued:
        # dead-lettered.
        ch.basic_publish("", "f21-limited", b"poison", pika.BasicProperties(delivery_mode=2), mandatory=True)
        counts = []
        for _ in range(2):
            method, props, _body = ch.basic_get("f21-limited", auto_ack=False)
            counts.append((props.headers or {}).get("x-delivery-count"))
            ch.basic_nack(method.delivery_tag, requeue=True)
        assert counts == [None, 1]
        assert count(ch, "f21-limited") == 0 and count(ch, "f21-dlq") == 1
        conn.close()

        cluster.wait_applied_equal()
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests

        leader.kill9()
        new_leader = cluster.leader(timeout=15, exclude=leader)
        assert new_leader is not leader
        conn = cluster.connection(new_leader)
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(10):  # resends after the failover: every one confirmed, none stored
            props = pika.BasicProperties(delivery_mode=2, headers={H: f"k{i}"})
            ch.basic_publish("", "f21-present", b"resend", props, mandatory=True)
            ch.basic_publish("", "f21-window", b"resend", props, mandatory=True)
        ch.basic_publish("", "f21-present", b"new", pika.BasicProperties(headers={H: "k-new"}), mandatory=True)
        assert count(ch, "f21-present") == 11
        assert count(ch, "f21-window") == 0
        conn.close()

        leader.start()  # the killed node rejoins: it catches up to the same caches
        cluster.wait_applied_equal(timeout=30)
        digests = cluster.digests()
        assert len(digests) == 3 and len({d for _, d in digests.values()}) == 1, digests


def test_a_follower_restored_from_a_snapshot_has_the_same_cache(tmp_path):
    """The cache travels in the Raft snapshot: a follower down while the log was compacted installs
    one, then drops the same resends as the others."""
    with Cluster(3, tmp_path, extra_config="snapshot_entries = 50\nsnapshot_seconds = 1.0") as cluster:
        leader = cluster.leader()
        lagging = next(n for n in cluster.nodes if n is not leader)
        lagging.kill9()
        conn = cluster.connection(leader)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("f21-snap", durable=True, arguments={"x-message-deduplication": True,
                                                              "x-cache-size": 100})
        for i in range(300):  # one Raft entry per confirm round trip: > 50 entries
            ch.basic_publish("", "f21-snap", b"m", pika.BasicProperties(headers={H: i}))
        assert count(ch, "f21-snap") == 300
        for _ in range(150):  # consumed: their keys leave the cache (the plugin's rule)
            assert ch.basic_get("f21-snap", auto_ack=True)[0] is not None
        time.sleep(2.5)  # the leader compacts (snapshot_seconds = 1)
        assert cluster.fresh_status(leader)["journal_entries"] < 300
        lagging.start()
        cluster.wait_applied_equal()
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests
        lconn = cluster.connection(lagging)
        lch = lconn.channel()
        lch.confirm_delivery()
        for i in range(200, 300):  # the last 100 keys inserted are cached (x-cache-size 100)
            lch.basic_publish("", "f21-snap", b"again", pika.BasicProperties(headers={H: i}))
        assert count(lch, "f21-snap") == 150
        # Key 0 was consumed (the plugin's rule: not cached), key 150 evicted by the bound.
        for i in (0, 150):
            lch.basic_publish("", "f21-snap", b"again", pika.BasicProperties(headers={H: i}))
        assert count(lch, "f21-snap") == 152
        lconn.close()
        conn.close()
        cluster.wait_applied_equal()
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests
