"""A follower's commit index moves only over entries the leader's AppendEntries matched (Raft §5.3).

pysyncobj advanced it after *every* AppendEntries, including those that carry a snapshot (or
announce one) and match nothing: a node restarted with entries the cluster never committed then
applied them.  Real pysyncobj, a real journal; the leader is this test, speaking pysyncobj's
messages to the follower's handler.
"""

from __future__ import annotations

import pytest
from pysyncobj.node import TCPNode

from raftmq.ops.local.node import free_port
from raftmq.raft.journal import AppendJournal
from raftmq.raft.replica import Replica

NO_OP = b"\x01"  # pysyncobj applies these without calling us


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def follower(tmp_path):
    """A node whose journal holds entries 1..10 of term 1, of which only 1..3 are known committed:
    4..10 were appended while it led term 1, and no one else has them."""
    leader_address = free_address()
    journal = AppendJournal(str(tmp_path / "raft" / "journal"))
    for index in range(1, 11):
        journal.add(NO_OP, index, 1)
    journal.setRaftCommitIndex(3)
    journal.setCurrentTerm(1, None)
    journal.flush()
    journal._destroy()
    replica = Replica(free_address(), [leader_address], str(tmp_path / "raft"), "secret",
                      sink=lambda _item: None, election_timeout=(5.0, 6.0))
    try:
        yield replica, TCPNode(leader_address)
    finally:
        replica.destroy_synchronous()


def receive(replica: Replica, node: TCPNode, message: dict) -> None:
    replica._SyncObj__onMessageReceived(node, message)


@pytest.mark.parametrize("serialized", [None, (b"part of a snapshot", False, False)],
                         ids=["snapshot-not-ready", "first-snapshot-chunk"])
def test_an_append_entries_that_sends_a_snapshot_does_not_commit_the_followers_own_entries(follower, serialized):
    replica, leader = follower
    assert replica._SyncObj__raftCommitIndex == 3
    # Term 2's leader has compacted past this node's log: it sends its snapshot (pysyncobj's
    # message has no prevLogIdx), with its own commit index far ahead.
    receive(replica, leader, {"type": "append_entries", "term": 2, "commit_index": 500, "serialized": serialized})
    assert replica._SyncObj__raftCommitIndex == 3, "entries 4..10 were never matched against the leader's log"
    assert replica.journal.getRaftCommitIndex() == 3


def test_a_matched_append_entries_still_commits(follower):
    """The consistency check passed at index 10 (same term): 4..10 are the leader's, commit them."""
    replica, leader = follower
    receive(replica, leader, {"type": "append_entries", "term": 2, "commit_index": 8, "entries": [],
                              "prevLogIdx": 10, "prevLogTerm": 1})
    assert replica._SyncObj__raftCommitIndex == 8


def test_a_mismatched_append_entries_commits_nothing(follower):
    replica, leader = follower
    receive(replica, leader, {"type": "append_entries", "term": 2, "commit_index": 500, "entries": [],
                              "prevLogIdx": 10, "prevLogTerm": 2})
    assert replica._SyncObj__raftCommitIndex == 3
