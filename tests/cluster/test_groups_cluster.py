"""Queue groups in a three-node cluster (issue 34): ``raft_groups = 3``, each group its own Raft
group (the metadata group in each node's main process, queue groups 1 and 2 in worker processes
on their own Raft ports).

Checked with real processes and pika: confirmed publishes through a follower to queues of both
queue groups are consumed from another node; every group's replicas are identical (each worker's
digest); after kill -9 of the node leading the metadata group, the survivors elect leaders for
every group and every confirmed message is still there.
"""

from __future__ import annotations

import json
import time

import pika
import pytest

from raftmq.ops.local.cluster import Cluster, ClusterError
from tests.integration.helpers import consume_acked

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(tmp_path):
    with Cluster(3, tmp_path, extra_config="raft_groups = 3") as c:
        yield c


def group_status(node, group: int) -> dict:
    try:
        return json.loads((node.data_dir / "groups" / f"g{group}" / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_group_digests_equal(cluster, group: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    digests: dict = {}
    while time.monotonic() < deadline:
        try:
            digests = cluster.digests(path=f"groups/g{group}/digest.json")
        except ClusterError:
            digests = {}
        if len(digests) == sum(n.is_alive() for n in cluster.nodes) and len(set(digests.values())) == 1:
            return
        time.sleep(0.5)
    raise AssertionError(f"group {group}'s replicas differ: {digests}")


def test_publish_through_a_follower_to_two_groups_consume_elsewhere_replicas_identical(cluster):
    leader = cluster.leader()
    follower, other = [n for n in cluster.nodes if n is not leader]
    conn = cluster.connection(follower)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("c-a", durable=True)
    ch.queue_declare("c-b", durable=True)
    ch.exchange_declare("c-fan", "fanout", durable=True)
    ch.queue_bind("c-a", "c-fan")
    ch.queue_bind("c-b", "c-fan")
    bodies = [b"m%d" % i for i in range(100)]
    for body in bodies:
        ch.basic_publish("c-fan", "", body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()
    conn = cluster.connection(other)
    ch = conn.channel()
    assert consume_acked(ch, "c-a", 100) == bodies
    assert consume_acked(ch, "c-b", 100) == bodies
    conn.close()
    for group in (1, 2):
        assert all(group_status(n, group).get("role") in ("leader", "follower") for n in cluster.nodes)
        wait_group_digests_equal(cluster, group)


def test_kill_9_of_the_metadata_leader_keeps_every_confirmed_message_of_every_group(cluster):
    leader = cluster.leader()
    survivor = next(n for n in cluster.nodes if n is not leader)
    conn = cluster.connection(survivor)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("k-a", durable=True)
    ch.queue_declare("k-b", durable=True)
    for i in range(50):
        for q in ("k-a", "k-b"):
            ch.basic_publish("", q, b"%s-%d" % (q.encode(), i), pika.BasicProperties(delivery_mode=2))
    conn.close()
    leader.kill9()
    cluster.leader(timeout=20, exclude=leader)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        live = [n for n in cluster.nodes if n.is_alive()]
        if all(any(group_status(n, g).get("role") == "leader" for n in live) for g in (1, 2)):
            break
        time.sleep(0.2)
    conn = cluster.connection(survivor, timeout=20)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "k-a", b"after", pika.BasicProperties(delivery_mode=2))
    assert consume_acked(ch, "k-a", 51) == [b"k-a-%d" % i for i in range(50)] + [b"after"]
    assert consume_acked(ch, "k-b", 50) == [b"k-b-%d" % i for i in range(50)]
    conn.close()
