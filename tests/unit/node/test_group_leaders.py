"""node/group_leaders.py's pure parts: group ports and reading a survey (issue 34: `raftmq cluster
status` shows every group's leader, term and each replica's lag).  The requests themselves are
exercised against real nodes in tests/cluster/test_group_leaders.py."""

from __future__ import annotations

from raftmq.node.group_leaders import GroupReplica, Rebalanced, Survey, group_address


def test_group_address_moves_the_port_by_group_steps():
    """Group g listens on the member's Raft port + g x raft_group_port_step (Config.for_group)."""
    assert group_address("127.0.0.1:4401", 0, 100) == "127.0.0.1:4401"
    assert group_address("127.0.0.1:4401", 2, 100) == "127.0.0.1:4601"
    assert group_address("[::1]:4401", 1, 7) == "[::1]:4408"


def test_survey_names_the_replica_that_leads_at_the_highest_term_and_computes_lag():
    """The leader is a replica that says it leads (a stale leader at a lower term loses); lag is
    entries behind the highest commit index any replica reported; a member that did not answer is
    not alive and has no lag."""
    seen = Survey(2, ["n1", "n2", "n3"], {
        0: [GroupReplica("n1", "a:1", "leader", 3, 10, 10, "n1"),
            GroupReplica("n2", "a:2", "follower", 3, 10, 8, "n1"),
            GroupReplica("n3", "a:3", error="connection lost")],
        1: [GroupReplica("n1", "a:101", "leader", 2, 5, 5, "n1"),
            GroupReplica("n2", "a:102", "leader", 4, 7, 7, "n2"),
            GroupReplica("n3", "a:103", error="connection lost")],
    })
    assert seen.alive == {"n1", "n2"}
    assert seen.leaders() == {0: "n1", 1: "n2"}
    rows = seen.rows()
    assert [r["leader"] for r in rows] == ["n1", "n2"] and rows[1]["term"] == 4
    lags = {r["node"]: r["lag"] for r in rows[0]["replicas"]}
    assert lags == {"n1": 0, "n2": 2, "n3": None}
    assert rows[0]["replicas"][2]["error"] == "connection lost"


def test_no_leader_while_electing_and_the_rebalance_result_as_json():
    """A group whose replicas are all followers or candidates has no leader (None); a rebalance's
    result keys groups as strings for JSON."""
    seen = Survey(1, ["n1"], {0: [GroupReplica("n1", "a:1", "candidate", 5, 3, 3, None)]})
    assert seen.leader(0) is None
    done = Rebalanced({2: "n3", 1: "n2"}, [2], {0: "n1", 1: "n2", 2: None})
    assert done.as_dict() == {"moves": {"1": "n2", "2": "n3"}, "failed": [2],
                              "leaders": {"0": "n1", "1": "n2", "2": None}}
