"""Back-pressure towards a consumer on a follower (issue 17 item 4, node/writeflow.py).

The pause of a connection whose client stopped reading is node-local; what the state machine
assigns must be the same on every replica. So the stop goes through the log (``Op.FLOW``): the
replicas must still be identical afterwards, and the consumer must get every message once, in
order, when it reads again.
"""

from __future__ import annotations

import time

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.integration.helpers import uniq, wait_until
from tests.integration.test_backpressure import BODY, MiB, RawConsumer, RawPublisher, queued, rss

pytestmark = pytest.mark.cluster

WATERMARK = 48 * MiB


@pytest.mark.timeout(240)
def test_auto_ack_consumer_on_a_follower_that_stops_reading(tmp_path) -> None:
    """An auto-ack consumer on a follower stops reading while a publisher on the same follower
    offers its queue twice the memory watermark: the messages stay queued (not in the follower's
    write buffer), their bodies on disk, so the publisher is not blocked (a backlog on disk holds
    no memory: until bodies went to disk, this test expected connection.blocked near the
    watermark), the replicas' state digests are equal, and the consumer then receives every
    message once, in order."""
    config = f"memory_high_watermark = {WATERMARK}\ndisk_free_limit = 1\n"
    with Cluster(3, tmp_path, extra_config=config) as cluster:
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        cluster.connection(follower).close()  # the follower accepts clients
        queue = uniq("bpc")
        consumer = RawConsumer(follower, queue, no_ack=True)
        publisher = RawPublisher(follower, queue)
        try:
            time.sleep(0.5)
            baseline = rss(follower.pid)
            offered = 2 * WATERMARK // BODY
            publisher.run(max_messages=offered, seconds=90, until=lambda p: p.blocked or p.sent >= offered)
            assert not publisher.events, f"the publisher was blocked after {publisher.sent * BODY // MiB} MiB"
            assert publisher.sent == offered, f"only {publisher.sent} of {offered} messages sent in 90 s"
            wait_until(lambda: queued(follower, queue) + 48 * MiB // BODY >= offered, timeout=30,
                       what="the messages queued")
            time.sleep(1.5)
            held = queued(follower, queue) * BODY
            grown = rss(follower.pid) - baseline
            print(f"published {publisher.sent * BODY / MiB:.0f} MiB, queued {held / MiB:.0f} MiB, "
                  f"follower RSS grew {grown / MiB:.0f} MiB")
            # What left the queue without reaching the client: the kernel's socket buffers, the
            # write buffer, and deliveries assigned before the stop committed (parked). RSS is not
            # asserted here: a cluster node also keeps recent Raft entries (up to 64 MiB) in memory.
            out_of_queue = publisher.sent * BODY - held
            assert held > WATERMARK, "the messages stayed in the queue"
            assert out_of_queue < 48 * MiB, f"{out_of_queue / MiB:.0f} MiB left the queue unread"
            cluster.wait_applied_equal()
            digests = cluster.digests()
            assert len({d for _, d in digests.values()}) == 1, digests

            published = publisher.sent
            consumer.drain(published, seconds=120)
            assert consumer.seqs[:published] == list(range(published)), "every message once, in order"
            cluster.wait_applied_equal()
            digests = cluster.digests()
            assert len({d for _, d in digests.values()}) == 1, digests
        finally:
            publisher.close()
            consumer.close()
