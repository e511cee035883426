"""A cluster node whose Raft journal cannot be written (issue 17 item 5, raft/journal.py).

Before: the journal's flush raised ENOSPC in pysyncobj's thread, which logged it and retried every
tick; the failed records were already off the buffer, the leader stayed leader, and its publisher
waited for confirms that never came. Now the node stops (exit status 70); the cluster elects
another leader, the publisher's connection ends (an answer: it may republish), and after space is
freed the node restarts, catches up, and nothing confirmed is lost.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) every group's journal directory is a tmpfs;
the test's only queue is placed in queue group 1 (the group with the fewest queues, ties to the
lowest: store/core/groups.py ``place``), so the journal filled is that group's on the node leading
it, and a worker that cannot write its journal stops its node (a node is all its processes).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.integration.helpers import uniq, wait_until
from tests.integration.test_backpressure import MiB, RawPublisher, fill, stored_seqs

pytestmark = pytest.mark.cluster


@pytest.mark.timeout(240)
def test_leader_whose_journal_disk_is_full_stops_and_loses_nothing(tmp_path) -> None:
    """Each node's <data>/raft is a 256 MiB tmpfs; the leader's is filled to 8 MiB free, the disk
    alarm is off (disk_free_limit = 1), and a publisher on the leader sends 64 KiB persistent
    messages with confirms until its connection ends: the leader exits with 70 and logs why, a new
    leader is elected, every confirmed message is in the queue, and once the space is freed the
    old leader restarts and the replicas are identical."""
    if os.geteuid() != 0:
        pytest.skip("mounting small filesystems needs root")
    cluster = Cluster(3, tmp_path, extra_config="disk_free_limit = 1\n")
    mounts = []
    try:
        for node in cluster.nodes:
            for group in range(cluster.groups):
                mount = cluster.group_dir(node, group) / "raft"
                mount.mkdir(parents=True)
                done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
                mounts.append(mount)
        cluster.start()
        group = cluster.queue_group
        leader = cluster.leader(group=group)
        ballast = fill(cluster.group_dir(leader, group) / "raft", 8 * MiB)
        queue = uniq("jfull")
        pub = RawPublisher(leader, queue, durable=True, confirms=True)
        pub.run(max_messages=2000, seconds=60, window=64, until=lambda p: p.ended or p.closed is not None)
        assert pub.ended or pub.closed is not None, f"no answer after {pub.sent} messages"
        confirmed = sorted(pub.confirmed)
        print(f"{pub.sent} sent, {len(confirmed)} confirmed before the leader stopped")
        pub.close()
        wait_until(lambda: not leader.is_alive(), timeout=10, what="the leader to stop")
        assert leader.proc.returncode == 70
        assert "Raft journal: flush failed" in leader.log_tail(400)

        new_leader = cluster.leader(exclude=leader, group=group)
        got = stored_seqs(new_leader, queue)
        assert set(confirmed) <= set(got), f"confirmed but lost: {sorted(set(confirmed) - set(got))[:10]}"

        ballast.unlink()
        leader.start()
        cluster.wait_caught_up(leader)
        cluster.wait_caught_up(leader, group=group)
        cluster.wait_applied_equal(group=group)
        cluster.wait_digests_equal()  # every group's replicas identical
    finally:
        cluster.stop()
        for mount in mounts:
            subprocess.run(["umount", "-l", str(mount)], check=False)
