"""Every Raft group's history of a node read as one table (issue 34): which histories make it.

With ``raft_groups = N`` a node keeps one audit history per group: the metadata group's (group 0)
in ``<data>/events`` and each queue group's, written by its worker, in ``<data>/groups/g<N>/events``;
``raftmq snapshot`` writes them to ``<out>`` and ``<out>/groups/g<N>`` (ops/group_dirs.py).  Each
group numbers its events with its own sequence (``event_seq`` is each group's replicated state) and
keeps its own hash chain, so a group's history is read -- and its records checked -- on its own, and
the data source adds a ``group`` column (0 for the metadata group, and so everywhere for a node with
one group).

**The order** of the merged table is ``time``, then ``group``, then ``seq`` (:data:`ORDER`), the order
the node-side merges use (tests/integration/test_audit_who.py): the time is the leader-stamped time
of the batch that applied the event, non-decreasing along one group's sequence, so within a group
this is the sequence order, and across groups the order in which their leaders stamped them (two
groups' events stamped in the same microsecond go by group).  With one group it is ``seq`` order.

**Several nodes** (spark/union.py): each group is read as the union of that group's histories on
every node given (a node's gaps filled from the others, two nodes disagreeing on an event fail the
read), and a node's groups are never mixed with one another: group g of one node is compared only
with group g of another.
"""

from __future__ import annotations

from collections.abc import Sequence

from raftmq.ops.group_dirs import history_dir, lone_group, queue_group_histories

META_GROUP = 0  # the metadata group: the topology, the connections, sessions
__all__ = ["META_GROUP", "ORDER", "histories", "layout", "lone_group", "meta_histories"]
ORDER = ("time", "group", "seq")  # the documented order of the merged events (module docstring)


def layout(paths: Sequence[str]) -> dict[int, list[str]]:
    """group -> its histories, one per path given that holds that group (in the order given), in
    group order.  Each path is a node's data directory or a ``raftmq snapshot`` of one, with every
    group's history; a path with no ``groups/`` (one group, or a lone history directory) gives one
    group: 0, or N for a queue group's own history (``groups/g<N>``, :func:`lone_group`)."""
    found: dict[int, list[str]] = {}
    for path in paths:
        # (a data directory's ``events``, else the path itself: a snapshot or a history directory)
        found.setdefault(lone_group(str(path)), []).append(history_dir(str(path)) or str(path))
        for group, history in queue_group_histories(str(path)):
            found.setdefault(group, []).append(history)
    return dict(sorted(found.items()))


def meta_histories(found: dict[int, list[str]]) -> list[str]:
    """The histories the catalog tables and the connections' principals are read from: the
    metadata group's, or (a lone queue group's history given) the first group's."""
    return found.get(META_GROUP) or next(iter(found.values()))


def histories(path: str) -> list[tuple[int, str]]:
    """(group, history) of one node's data directory or snapshot, in group order."""
    return [(group, paths[0]) for group, paths in layout([path]).items()]
