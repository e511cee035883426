"""A 0-9-1 auto-ack consumer on a follower is assigned only as fast as its socket takes the deliveries
(issue 31 item 2; node/amqp091/autoack.py).  The cluster variant of
tests/integration/test_autoack_memory.py: the credit top-ups are commands the follower proposes through
the leader, and every replica must assign the same messages at the same points of the log."""

from __future__ import annotations

import time

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.integration.helpers import uniq
from tests.integration.rawamqp import BASIC_CONSUME_OK, basic_consume
from tests.integration.test_amqp10_credit_memory import body_of, fill_queue, queue_depth, rss
from tests.integration.test_autoack_memory import read_deliveries, unread_consumer

pytestmark = pytest.mark.cluster

MB = 1 << 20
BACKLOG = 100


@pytest.mark.timeout(240)
def test_auto_ack_consumer_on_a_follower_attaching_to_a_backlog_it_does_not_read(tmp_path) -> None:
    """100 x 1 MiB queued through a follower; a raw auto-ack consumer on that follower (64 KiB receive
    buffer) does not read for 2 s.  Checks: more than half of the backlog is still queued (before: the
    whole backlog assigned in the consume's apply), the replicas' state digests are equal; then the
    consumer reads all 100, intact, in order, once, the queue is empty and the digests are equal again.
    RSS is printed, not asserted: a cluster node also keeps recent Raft entries in memory."""
    with Cluster(3, tmp_path, extra_config="disk_free_limit = 1\nbody_cache_bytes = 16777216\nautoack_slice = 2048\n") as cluster:
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        cluster.connection(follower).close()  # the follower accepts clients
        queue = uniq("autoack-follower")
        fill_queue(follower, queue, BACKLOG, MB)
        time.sleep(0.5)
        before = rss(follower.pid)
        consumer = unread_consumer(follower.port, 65536)
        try:
            consumer.handshake()
            consumer.open_channel(1)
            consumer.send(basic_consume(1, queue, "unread", no_ack=True))
            consumer.expect_method(BASIC_CONSUME_OK, channel=1)
            time.sleep(2.0)
            depth = queue_depth(follower, queue)
            print(f"\nfollower: RssAnon {before / MB:.0f} -> {rss(follower.pid) / MB:.0f} MB; "
                  f"{depth} of {BACKLOG} still queued")
            assert depth > BACKLOG // 2, f"only {depth} left queued: the backlog was assigned to a full socket"
            cluster.wait_applied_equal()
            digests = cluster.digests()
            assert len({d for _, d in digests.values()}) == 1, digests
            got = read_deliveries(consumer, BACKLOG, timeout=60)
            assert [tag for tag, _ in got] == list(range(1, BACKLOG + 1))
            for i, (_tag, body) in enumerate(got):
                assert body == body_of(i, MB), f"message {i} differs"
            with pytest.raises(TimeoutError):
                consumer.read_frame(timeout=1.0)  # once: nothing after the 100th
            assert queue_depth(follower, queue) == 0
            cluster.wait_applied_equal()
            digests = cluster.digests()
            assert len({d for _, d in digests.values()}) == 1, digests
        finally:
            consumer.close()
