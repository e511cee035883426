"""node/leader_spread.py: where the Raft groups' leaders should be (issue 34, "group leaders are
spread over the nodes and rebalanced after a node returns").  Pure: each test gives the groups'
leaders and the live members and checks the moves."""

from __future__ import annotations

import itertools

from raftmq.node.leader_spread import balanced, plan, preferred_node

MEMBERS = ["n1", "n2", "n3"]
ALL = {"n1", "n2", "n3"}


def apply(leaders: dict[int, str | None], moves: dict[int, str]) -> dict[int, str | None]:
    return {**leaders, **moves}


def test_preferred_node_is_group_mod_members():
    """Group g prefers member g mod len(members), in configured order."""
    assert [preferred_node(g, MEMBERS) for g in range(5)] == ["n1", "n2", "n3", "n1", "n2"]


def test_all_on_one_node_spread_one_per_node_to_preferred_nodes():
    """Three groups led by n1: two move, each to its preferred node (g1 -> n2, g2 -> n3), group 0 stays."""
    moves = plan(3, MEMBERS, ALL, {0: "n1", 1: "n1", 2: "n1"})
    assert moves == {1: "n2", 2: "n3"}


def test_metadata_group_moves_last():
    """All on n2: group 0 stays where it is (it carries the sessions and the forwarder, and prefers
    n1); the two queue groups go, one to n1 and one to n3."""
    leaders = {0: "n2", 1: "n2", 2: "n2"}
    moves = plan(3, MEMBERS, ALL, leaders)
    assert 0 not in moves
    assert sorted(moves) == [1, 2] and sorted(moves.values()) == ["n1", "n3"]
    assert balanced(3, ALL, apply(leaders, moves))


def test_already_balanced_moves_nothing():
    """One leader per node, whichever: nothing moves (fewest transfers, not the preferred layout)."""
    for perm in itertools.permutations(MEMBERS):
        leaders = dict(enumerate(perm))
        assert plan(3, MEMBERS, ALL, leaders) == {}
        assert balanced(3, ALL, leaders)


def test_a_returning_node_gets_one_group():
    """n3 was down: n1 led two groups, n2 one (balanced for two nodes); n3 returns and takes one of n1's."""
    leaders = {0: "n1", 1: "n2", 2: "n1"}
    assert plan(3, MEMBERS, {"n1", "n2"}, leaders) == {}
    moves = plan(3, MEMBERS, ALL, leaders)
    assert moves == {2: "n3"}
    assert balanced(3, ALL, apply(leaders, moves))


def test_dead_leaders_and_electing_groups_are_left_alone():
    """A group without a leader (electing) or led by a node not alive is not moved, and not counted."""
    moves = plan(3, MEMBERS, {"n1", "n2"}, {0: "n1", 1: None, 2: "n3"})
    assert moves == {}
    assert not balanced(3, {"n1", "n2"}, {0: "n1", 1: None, 2: "n3"})


def test_more_groups_than_nodes_differ_by_at_most_one():
    """Every layout of 8 groups over 3 nodes ends balanced (counts 3/3/2) and each move leaves a node
    that led more than its share; every move's target is live."""
    for layout in itertools.product(MEMBERS, repeat=8):
        leaders = dict(enumerate(layout))
        moves = plan(8, MEMBERS, ALL, leaders)
        after = apply(leaders, moves)
        assert balanced(8, ALL, after), (layout, moves)
        counts = sorted(sum(1 for v in after.values() if v == m) for m in MEMBERS)
        assert counts == [2, 3, 3]
        before = {m: sum(1 for v in layout if v == m) for m in MEMBERS}
        for group, node in moves.items():
            assert before[leaders[group]] > 8 // 3 and node in ALL


def test_deterministic_and_no_live_members():
    """The same inputs give the same moves; no live member or no group gives none."""
    leaders = {0: "n3", 1: "n3", 2: "n3", 3: "n3"}
    assert plan(4, MEMBERS, ALL, leaders) == plan(4, MEMBERS, ALL, leaders)
    assert plan(3, MEMBERS, set(), leaders) == {}
    assert plan(0, MEMBERS, ALL, {}) == {}
