"""The stage tracer on a real 3-node cluster (issue 30): bench/latency_stages.py's collection and join.

Real node processes, real pika, the nodes' rings collected over SIGUSR2 and joined per batch
(raftmq/trace_report.py).  Checked: with ``trace_stages`` on, (almost) every lone round trip --
a persistent publish with confirms (0-9-1 publisher confirms, RabbitMQ's extension to basic.publish /
basic.ack) delivered to a consumer on the same channel -- is followed through every stage of the
chain, on a follower (forward to the leader, commit index back) and on the leader; the client's
stamps and the nodes' share one clock (the chain is in order); and a node writes its ring at stop.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the round trips' queue is placed in the
metadata group (``x-queue-group: 0``), whose log is the main process's: the tracer does not follow
a message through a queue group's worker (its ring and the hop to it are not traced yet).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from bench.latency_stages import measure
from raftmq.ops.local.cluster import Cluster
from raftmq.trace import read_dump
from raftmq.trace_report import POINT_NAMES, chain

pytestmark = pytest.mark.cluster

TRIPS = 20


def test_every_stage_is_observed_for_round_trips_on_a_follower_and_on_the_leader():
    base = Path(tempfile.mkdtemp(prefix="raftmq-trace-"))
    cluster = Cluster(3, base, extra_config="trace_stages = true").start()
    try:
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        for node, skipped in ((follower, set()), (leader, {"o_forward", "l_cmd_recv", "l_ae_commit", "o_ae_commit"})):
            result, joined = measure(cluster, node, TRIPS,
                                     arguments={"x-queue-group": 0} if cluster.groups > 1 else None)
            assert result.trips == TRIPS
            assert result.joined >= TRIPS - 2, (node.node_id, [sorted(set(chain(p)) - set(p)) for p in joined])
            for points in joined:
                assert set(POINT_NAMES) - set(chain(points)) == skipped
            # The stage times add up to the client's round trip (one clock for all processes).
            assert sum(row.mean for row in result.stages) == pytest.approx(result.total_joined.mean, rel=1e-6)
            assert all(row.n == result.joined for row in result.stages)
        assert cluster.leader() is leader  # (the placements above were what they claim)
        cluster.stop()
        for node in cluster.nodes:
            trace = read_dump(str(node.data_dir / "trace.msgpack"))  # written at stop
            assert trace["node"] == node.node_id and trace["events"]
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
