"""Pre-Vote (Raft thesis 9.6): a follower that comes back cannot depose a leader that still has its majority.

Issue 17, item 6: under load a restarted follower called an election before the leader's first
heartbeat reached it; its higher term made the leader step down (a failover-sized pause for every
client).  With pre-vote the returning node first asks whether it *could* win at term + 1; the
other follower (which hears the leader) and the leader refuse, so it never raises its term.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.raft.wire import admin_utility

pytestmark = pytest.mark.cluster

SECRET = "test-secret-not-for-production"  # ops/local/cluster.py writes this one
LOAD_SECONDS = 6.0
LOAD_MESSAGES = 20_000
# The returning node's election timer: shorter than the leader's heartbeat period (50 ms), so
# it fires before a heartbeat reaches it -- right after its first connection comes up, and again
# in any pause between AppendEntries while it catches up.  pysyncobj requires the minimum to be
# above 3 x the node's own heartbeat period, hence the 10 ms period (used only if it led).
# (4-6 ms, ticking every millisecond: its timer fires before the leader's first message reaches it
# even now that members reuse the cluster key's derivation -- session 19 made that handshake ~97 ms
# faster, and a 35-45 ms timeout no longer came first.)
IMPATIENT = ("raft_append_entries_period = 0.001\n"  # (pysyncobj: min timeout > 3 x this)
             "raft_election_timeout_min = 0.004\n"
             "raft_election_timeout_max = 0.006\n"
             "raft_tick_period = 0.001\n")


def raft_status(cluster: Cluster, node) -> dict:
    """pysyncobj's status of ``node`` (its term, state, pre-vote counters) over the Raft port."""
    return admin_utility(SECRET, 5.0).executeCommand(cluster.raft_address(node), ["status"])


def impatient_config(cluster: Cluster) -> Path:
    """The cluster's config with a tiny election timeout (top-level keys go before the tables)."""
    text = cluster.config_path.read_text()
    path = cluster.base / "impatient.toml"
    path.write_text(IMPATIENT + text)
    return path


class Load(threading.Thread):
    """Persistent publishes with confirms on the leader, bounded in count and time."""

    def __init__(self, cluster: Cluster, node, queue: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.node, self.queue = cluster, node, queue
        self.confirmed = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            conn = self.cluster.connection(self.node)
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(self.queue, durable=True)
            body = b"x" * 512
            deadline = time.monotonic() + LOAD_SECONDS
            while self.confirmed < LOAD_MESSAGES and time.monotonic() < deadline and not self.stop.is_set():
                ch.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2))
                self.confirmed += 1
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


class LeaderWatch(threading.Thread):
    """Samples every live node's status file: any node other than ``leader`` claiming leadership."""

    def __init__(self, cluster: Cluster, leader) -> None:
        super().__init__(daemon=True)
        self.cluster, self.leader = cluster, leader
        self.others: list[tuple[str, str | None]] = []  # (node claiming the role / named leader)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            for node in self.cluster.nodes:
                st = self.cluster.status(node) or {}
                if st.get("pid") != node.pid or not st.get("ready"):
                    continue  # a restarting node's status file is its previous incarnation's
                if st.get("role") == "leader" and node is not self.leader:
                    self.others.append((node.node_id, "claims leadership"))
                if st.get("leader_node") not in (None, self.leader.node_id):
                    self.others.append((node.node_id, st.get("leader_node")))


def test_a_returning_follower_whose_timer_fires_first_does_not_depose_the_leader(tmp_path):
    """A follower is killed; the leader takes confirmed publishes; the follower comes back with an
    election timeout (4-6 ms) shorter than the heartbeat period, so its timer fires before it
    hears the leader.  Raft 5.1/5.2 alone: it campaigns at term + 1 and every node that receives
    the request adopts that term -- the leader steps down.  With pre-vote (thesis 9.6) the leader
    and the other follower refuse the pre-vote (they hear a leader; and the returning log is
    behind), so the leader and its term never change, and the returning node catches up."""
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        follower.kill9()
        term = raft_status(cluster, leader)["raft_term"]

        load = Load(cluster, leader, "returning")
        watch = LeaderWatch(cluster, leader)
        load.start()
        watch.start()
        try:
            time.sleep(1.5)  # the follower falls behind under load
            follower.config = impatient_config(cluster)
            follower.start()
            cluster.wait_caught_up(follower, timeout=30)
            load.join(timeout=LOAD_SECONDS + 30)
        finally:
            load.stop.set()
            watch.stop.set()
            watch.join(timeout=5)
        assert load.error is None, load.error
        assert load.confirmed > 100, load.confirmed

        after = raft_status(cluster, leader)
        assert after["raft_term"] == term, f"the leader's term moved from {term} to {after['raft_term']}"
        assert after["leader"] is not None and after["leader"].address == cluster.raft_address(leader), after
        assert watch.others == [], watch.others[:5]
        assert cluster.leader() is leader
        returned = raft_status(cluster, follower)
        assert returned["raft_term"] == term
        # The scenario happened: the returning node's timer did fire (it asked for pre-votes) and
        # it never won one.
        assert returned["prevote_rounds"] > 0, returned
        assert returned["prevote_won"] == 0, returned


def test_removing_the_leader_moves_leadership_away_first_despite_the_lease(tmp_path):
    """``raftmq cluster remove`` of the leader asks it to transfer leadership (pysyncobj's
    TimeoutNow) and waits for another leader.  The followers still hear the old leader when the
    target campaigns, so the transfer must bypass pre-vote (as etcd's forced campaign): it does,
    in one election (term + 1), and the two remaining members carry on with confirms."""
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        term = raft_status(cluster, leader)["raft_term"]
        cluster.remove_node(leader)
        rest = [n for n in cluster.nodes if n is not leader]
        new_leader = cluster.leader(exclude=leader)
        assert new_leader in rest
        assert raft_status(cluster, new_leader)["raft_term"] == term + 1
        conn = cluster.connection(new_leader)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("after-removal", durable=True)
        for i in range(20):
            ch.basic_publish("", "after-removal", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        assert ch.queue_declare("after-removal", passive=True).method.message_count == 20
        conn.close()
