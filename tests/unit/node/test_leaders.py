"""node/leaders.py: the bounded ring of the last leaders a node saw (issue 35's Cluster page)."""

from raftmq.node.leaders import LeaderHistory


def test_records_changes_newest_first_with_the_previous_leader():
    """The first leader has no previous one; each later one names the leader before it."""
    history = LeaderHistory()
    history.saw(10.0, 1, "n1")
    history.saw(20.0, 3, "n2")
    assert [(c.at, c.term, c.leader, c.previous) for c in history.recent()] == [
        (20.0, 3, "n2", "n1"), (10.0, 1, "n1", None)]


def test_the_same_leader_again_is_not_a_change():
    history = LeaderHistory()
    history.saw(1.0, 1, "n1")
    history.saw(2.0, 1, "n1")
    assert len(history.recent()) == 1


def test_bounded_the_oldest_falls_off():
    """Only ``size`` entries are kept, so a flapping leader cannot grow the node's memory."""
    history = LeaderHistory(size=3)
    for i in range(10):
        history.saw(float(i), i, f"n{i % 2}")
    assert [c.term for c in history.recent()] == [9, 8, 7]
