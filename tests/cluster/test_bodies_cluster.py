"""Message bodies on disk in a cluster (issue 18; store/disk/bodies.py, docs/design.md "Message bodies
on disk"): a backlog several times the body cache survives kill -9 of the leader and of the whole
cluster, and a follower that was down while it grew catches up by snapshot, fetches the bodies it
lacks from the others, and delivers the same bytes.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the queues are placed in queue group 1
(``x-queue-group``): the bodies, snapshots and figures checked are that group's (its worker's
``groups/g1``), and every group's replicas are compared."""

from __future__ import annotations

import hashlib
import json
import time

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from tests.integration.helpers import consume_acked

pytestmark = pytest.mark.cluster

CACHE = 256 << 10  # body_cache_bytes: a backlog of 6x this must not be held in memory
BODY = 4096
COUNT = 400  # 1.6 MB of bodies: 6.25x the cache
CONFIG = (f"body_cache_bytes = {CACHE}\nbody_write_behind_bytes = {64 << 10}\n"
          "snapshot_entries = 50\nsnapshot_seconds = 1.0")


def body(i: int) -> bytes:
    """Message i's body: its number, then SHA-256 of it repeated (every byte checkable)."""
    head = i.to_bytes(8, "big")
    return (head + hashlib.sha256(head).digest() * (BODY // 32 + 1))[:BODY]


def publish_backlog(cluster, node, queue: str, first: int, count: int) -> None:
    conn = cluster.connection(node)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=cluster.queue_arguments())
    ch.confirm_delivery()
    for i in range(first, first + count):
        ch.basic_publish("", queue, body(i), pika.BasicProperties(delivery_mode=2), mandatory=True)
    conn.close()


def consume_all(cluster, node, queue: str, expected: int) -> list[bytes]:
    conn = cluster.connection(node)
    got = consume_acked(conn.channel(), queue, expected)
    conn.close()
    return got


def digests(cluster, group: int) -> dict[str, dict]:
    cluster.digests(group=group)  # each live node writes digest.json (model and bodies) of every group
    out = {}
    for node in cluster.nodes:
        if node.is_alive():
            out[node.node_id] = json.loads((cluster.group_dir(node, group) / "digest.json").read_text())
    return out


def assert_same_model_and_bodies(cluster) -> None:
    """Every group's replicas hold the same model and the same bodies."""
    for group in range(cluster.groups):
        cluster.wait_applied_equal(group=group)
        found = digests(cluster, group)
        assert len({d["model_digest"] for d in found.values()}) == 1, (group, found)
        assert len({d["bodies_digest"] for d in found.values()}) == 1, (group, found)


def test_a_backlog_larger_than_the_cache_survives_leader_and_full_cluster_kills(tmp_path):
    with Cluster(3, tmp_path, extra_config=CONFIG) as cluster:
        leader = cluster.leader()
        client_node = next(n for n in cluster.nodes if n is not leader)
        publish_backlog(cluster, client_node, "backlog", 0, COUNT)
        group = cluster.queue_group
        for node in cluster.nodes:
            status = cluster.fresh_status(node, group=group)
            # The bodies are on disk: what each node holds for them is bounded by its cache and
            # write-behind, not by the 1.6 MB queued (the model keeps only their sizes).
            assert status["body_held_bytes"] <= CACHE + (64 << 10), status
            assert status["bodies_written"] > 0 and status["body_checkpoints"] > 0, status
        assert_same_model_and_bodies(cluster)

        leader.kill9()
        cluster.leader(timeout=10, exclude=leader)
        publish_backlog(cluster, client_node, "backlog", COUNT, 50)  # the cluster goes on without it
        for node in cluster.nodes:
            node.kill9() if node.is_alive() else None
        for node in cluster.nodes:
            node.start()
        cluster.wait_leader(timeout=30)
        assert_same_model_and_bodies(cluster)

        got = consume_all(cluster, client_node, "backlog", COUNT + 50)
        assert got == [body(i) for i in range(COUNT + 50)]  # none lost, none corrupt, in order
        status = cluster.fresh_status(client_node, group=group)
        assert status["body_cache_misses"] + status["body_cache_loaded"] > 0, status  # read back from disk
        assert status["bodies_lost"] == 0


def test_a_follower_down_while_the_backlog_grew_fetches_the_bodies_and_delivers_them(tmp_path):
    with Cluster(3, tmp_path, extra_config=CONFIG) as cluster:
        leader = cluster.leader()
        lagging = next(n for n in cluster.nodes if n is not leader)
        group = cluster.queue_group
        lagging.kill9()
        publish_backlog(cluster, leader, "grown", 0, COUNT)  # one entry per confirm: > 50 entries
        time.sleep(2.5)  # let the others compact their logs (snapshot_seconds = 1)
        assert cluster.fresh_status(leader, group=group)["journal_entries"] < COUNT
        snapshot = cluster.group_dir(leader, group) / "raft" / "snapshot.lmdb"
        if snapshot.exists():  # the snapshot holds the model, not the 1.6 MB of bodies
            assert snapshot.stat().st_size < COUNT * BODY / 4

        lagging.start()
        assert_same_model_and_bodies(cluster)
        status = cluster.fresh_status(lagging, group=group)
        assert status["bodies_fetched"] > 0, status  # it installed a snapshot and fetched what it lacked
        assert status["bodies_lost"] == 0

        # The lagging node delivers from its own body store: the same bytes.
        got = consume_all(cluster, lagging, "grown", COUNT)
        assert [hashlib.sha256(b).hexdigest() for b in got] == \
            [hashlib.sha256(body(i)).hexdigest() for i in range(COUNT)]
        assert_same_model_and_bodies(cluster)
