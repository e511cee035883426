"""Which histories make each group's table (spark/groups.py, issue 34): a node's data directory,
its ``raftmq snapshot``, a lone queue group's history and several nodes' -- on directories laid out
as a node and ``raftmq snapshot`` lay them out (ops/group_dirs.py), no Spark needed."""

from __future__ import annotations

from pathlib import Path

from raftmq.spark.groups import ORDER, histories, layout, lone_group, meta_histories


def history(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "data.mdb").write_bytes(b"")
    return path


def test_a_data_directory_and_a_snapshot_give_every_group(tmp_path):
    """A data directory's group 0 is ``events``, its queue groups ``groups/g<N>/events``; a
    snapshot's group 0 is itself, its queue groups ``groups/g<N>``; groups in order (g10 after g2),
    a queue group's directory without a history left out."""
    data = tmp_path / "data"
    for where in ("events", "groups/g1/events", "groups/g2/events", "groups/g10/events"):
        history(data / where)
    (data / "groups" / "g3").mkdir()  # a worker that keeps no history
    assert histories(str(data)) == [(0, str(data / "events")), (1, str(data / "groups/g1/events")),
                                    (2, str(data / "groups/g2/events")), (10, str(data / "groups/g10/events"))]
    snap = tmp_path / "snap"
    for where in ("", "groups/g1", "groups/g2"):
        history(snap / where)
    assert histories(str(snap)) == [(0, str(snap)), (1, str(snap / "groups/g1")), (2, str(snap / "groups/g2"))]


def test_one_group_and_a_lone_queue_groups_history(tmp_path):
    """A history without ``groups/`` is group 0 alone; a queue group's own history, named by its
    place, is that group (its rows read as group N), and then also the catalog's source."""
    one = history(tmp_path / "one")
    assert layout([str(one)]) == {0: [str(one)]}
    g2 = history(tmp_path / "snap" / "groups" / "g2")
    assert lone_group(str(g2)) == 2 and lone_group(str(tmp_path / "node/groups/g7/events/")) == 7
    assert lone_group(str(tmp_path / "groups-g1")) == 0
    found = layout([str(g2)])
    assert found == {2: [str(g2)]} and meta_histories(found) == [str(g2)]


def test_several_nodes_are_unioned_group_by_group(tmp_path):
    """Two nodes' snapshots: each group's histories in the order the nodes were given; a group only
    one node has comes from that node alone."""
    a, b = tmp_path / "a", tmp_path / "b"
    for where in ("", "groups/g1", "groups/g2"):
        history(a / where)
    for where in ("", "groups/g1"):
        history(b / where)
    assert layout([str(b), str(a)]) == {0: [str(b), str(a)], 1: [str(b / "groups/g1"), str(a / "groups/g1")],
                                        2: [str(a / "groups/g2")]}
    assert ORDER == ("time", "group", "seq")
