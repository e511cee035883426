"""Audit history in a cluster: a snapshot taken on a follower while publishing continues holds
every event of every batch up to its Raft index and none after; all nodes number events alike, the
connection notes of issue 36 included."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika

from raftmq.ops.local.cluster import Cluster
from raftmq.store.disk import history as EV

REPO = Path(__file__).resolve().parents[2]


def publish_until(cluster: Cluster, node, stop: threading.Event, sent: list, limit: int = 20_000,
                  seconds: float = 30.0) -> None:
    conn = cluster.connection(node)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("audited", durable=True)
    deadline = time.monotonic() + seconds
    while not stop.is_set() and len(sent) < limit and time.monotonic() < deadline:
        ch.basic_publish("", "audited", b"m", pika.BasicProperties(delivery_mode=2))
        sent.append(1)
    conn.close()


def test_snapshot_during_publishing_is_consistent_at_its_raft_index(tmp_path):
    with Cluster(3, tmp_path, extra_config='audit_retention = "metadata"') as cluster:
        leader = cluster.leader()
        follower = cluster.followers()[0]
        stop, sent = threading.Event(), []
        publisher = threading.Thread(target=publish_until, args=(cluster, leader, stop, sent))
        publisher.start()
        try:
            deadline = time.monotonic() + 20
            while len(sent) < 300 and time.monotonic() < deadline:
                time.sleep(0.05)
            out = tmp_path / "snap"
            done = subprocess.run([sys.executable, "-m", "raftmq", "snapshot", "--data-dir",
                                   str(follower.data_dir), "--out", str(out)],
                                  capture_output=True, text=True, timeout=60, cwd=REPO)
            assert done.returncode == 0, done.stderr
            info = json.loads(done.stdout)
            time.sleep(0.3)  # publishing goes on after the snapshot
        finally:
            stop.set()
            publisher.join()
        assert len(sent) > 300
        cluster.wait_applied_equal()
        for node in cluster.nodes:
            node.wait_history()
        snap = list(EV.read_events(str(out)))
        assert info["events"] == len(snap) > 0 and not info["gaps"]
        assert [r[0] for r in snap] == list(range(snap[0][0], snap[-1][0] + 1))  # dense
        assert max(r[10] for r in snap) <= info["raft_index"]
        cluster.stop()  # read the live histories without the nodes holding them open
        finals = [list(EV.read_events(str(n.data_dir / "events"))) for n in cluster.nodes]
        # Every node numbered and recorded the same history.
        assert finals[0] == finals[1] == finals[2]
        # Issue 36: the publisher's connection, noted by the node it used (an AuditNote through the
        # log), is in every node's history alike, principal included, and in each connections table.
        opened = [r for r in finals[0] if r[2] == EV.CONNECTION_OPENED and r[12][0] == "guest"]
        assert opened and opened[0][12][1] == "AMQP 0-9-1"
        tables = [list(EV.read_table(str(n.data_dir / "events"), "connections")) for n in cluster.nodes]
        assert tables[0] == tables[1] == tables[2] and any(c[0] == opened[0][11] for c in tables[0])
        # The snapshot is exactly the prefix of the history up to its Raft index.
        assert snap == [r for r in finals[0] if r[10] <= info["raft_index"]]
        assert len(finals[0]) > len(snap)  # and publishing did go on after it
