"""No holes (issue 36, spark/union.py): a follower of a real 3-node cluster that was down while the
others compacted their Raft logs catches up by installing a state snapshot, so its own history has a
gap (``gaps``); reading its history together with another node's as one table gives every event
exactly once -- the same rows, in the same order, as the node that never missed any -- and the
catalog tables hold the queue declared during the gap.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the queues are placed in queue group 1
(``Cluster.queue_arguments``), whose replica on the lagging node installs the snapshot: the
histories compared are each node's group 1 history (``groups/g1/events``, read as group 1)."""

from __future__ import annotations

import time

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.spark import audit
from raftmq.spark.session import load
from raftmq.spark.union import holes
from raftmq.store.disk import history as EV
from tests.support.cli import raftmq
from tests.support.groups import wait_histories

pytestmark = pytest.mark.cluster

CONFIG = 'audit_retention = "metadata"\nsnapshot_entries = 50\nsnapshot_seconds = 1.0'


def publish(cluster: Cluster, node, queue: str, count: int) -> None:
    conn = cluster.connection(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True, arguments=cluster.queue_arguments())
    for i in range(count):  # one Raft entry per confirm: more than snapshot_entries
        ch.basic_publish("", queue, f"{queue} {i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


@pytest.fixture(scope="module")
def histories(tmp_path_factory):
    """(the lagging node's history, a complete node's history), both stopped."""
    base = tmp_path_factory.mktemp("holes")
    with Cluster(3, base, extra_config=CONFIG) as cluster:
        group = cluster.queue_group  # where the queues' events are (0 with one group)
        leader = cluster.leader()
        lagging = next(n for n in cluster.nodes if n is not leader)
        publish(cluster, leader, "early", 20)
        cluster.wait_applied_equal(group=group)
        wait_histories(lagging)
        lagging.kill9()
        publish(cluster, leader, "during", 150)
        time.sleep(2.5)  # the others compact their logs (snapshot_seconds = 1): no entries left to send
        lagging.start()
        cluster.wait_caught_up(lagging)
        cluster.wait_caught_up(lagging, group=group)
        publish(cluster, leader, "late", 20)
        cluster.wait_applied_equal(group=group)
        for node in cluster.nodes:
            wait_histories(node)
        complete = next(n for n in cluster.nodes if n is not lagging)
        cluster.stop()
    return (str(cluster.group_dir(lagging, group) / "events"), str(cluster.group_dir(complete, group) / "events"))


def test_the_lagging_node_has_a_gap_that_the_union_fills(histories):
    lagging, complete = histories
    info = EV.history_info(lagging)
    assert info.gaps, info  # it installed a snapshot instead of applying those batches
    assert not EV.history_info(complete).gaps
    alone = holes([lagging])
    assert alone.holes and [tuple(g) for g in info.gaps] == alone.holes
    together = holes([lagging, complete])
    assert together.holes == [] and together.last_seq == info.last_seq


def test_several_nodes_read_as_one_table_without_duplicates_or_holes(spark, histories):
    lagging, complete = histories
    full = list(EV.read_events(complete))
    own = {r[0] for r in EV.read_events(lagging)}
    assert len(own) < len(full)
    for paths in ([lagging, complete], [complete, lagging]):
        found = load(spark, paths, "events", partitions=3).orderBy("seq").collect()
        assert [r["seq"] for r in found] == [r[0] for r in full]  # each event once, none missing
        assert [(r["kind"], r["queue"], r["message_id"], r["raft_index"]) for r in found] == \
            [(EV.KIND_NAMES[r[2]], r[4], r[5], r[10]) for r in full]
    # Pushdown still narrows the merged read: the gap's own range comes from the complete node.
    low, high = EV.history_info(lagging).gaps[0]
    gap = load(spark, [lagging, complete], "events").where(f"seq >= {low} and seq <= {high}")
    assert gap.count() == sum(1 for r in full if low <= r[0] <= high) > 0
    queues = {r["name"] for r in load(spark, [lagging, complete], "queues").collect()}
    assert queues == {"early", "during", "late"}
    assert "during" not in {r["name"] for r in load(spark, lagging, "queues").collect()}
    counts = {r["kind"]: r["events"] for r in audit.summary(spark, [lagging, complete]).collect()}
    assert counts["routed"] == counts["published"] == 190


def test_audit_command_warns_of_a_hole_and_reads_several_nodes_as_one(histories, capsys):
    """``raftmq audit`` names the lagging node's gap on stderr when it is given alone (the check it
    runs before starting Spark); given both nodes (two --snapshot options) it warns of nothing and
    counts every publish once."""
    from raftmq.spark.report import _warn_holes

    lagging, complete = histories
    low, high = EV.history_info(lagging).gaps[0]
    _warn_holes([lagging])
    assert f"history lacks events {low}..{high}" in capsys.readouterr().err  # "group 1's history" with groups
    done = raftmq("audit", "summary", "--snapshot", lagging, "--snapshot", complete, "--quiet", timeout=180)
    assert done.returncode == 0, done.stderr
    assert "lacks events" not in done.stderr, done.stderr
    published = next(line.split() for line in done.stdout.splitlines() if line.startswith("published"))
    assert published[1] == "190", done.stdout
