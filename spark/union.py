"""Several nodes' histories read as one, without duplicates and without holes (issue 36).

A node that caught up by installing a state snapshot never applied the batches the snapshot
covers, so its history lacks their events (``gaps`` in ``store/disk/history.py``).  The other
nodes applied them, and the state machine numbers events alike on every node (``event_seq`` is
replicated state), so an event has the same sequence number -- and the same record -- everywhere.
Reading the snapshots (or stopped data directories) of several nodes as one table therefore
fills every node's gaps from the others:

* ``events`` and ``messages`` (u64 keys): :class:`UnionCursor` walks one LMDB cursor per history
  in key order and returns each key once (from the first history that holds it, in the order
  given).  Events found in two histories must be byte-identical once checked: a disagreement is
  never resolved by picking one (:class:`HistoriesDisagree`, naming the key and both histories).
  Message records may differ legitimately (the body is kept by one node's retention and not by
  another's), so they are not compared.
* the catalog tables: per key, the record with the latest declare or delete time (a node that
  missed a re-declare or a delete holds an older state of it).
* :func:`holes`: the sequence ranges no given history holds (each history holds
  ``[first_seq, last_seq]`` minus its ``gaps``; events a node's retention did not keep are not
  holes: no node with the same retention keeps them).

Why a multi-node read rather than fetching the missing history from a peer at install time (as
bodies are fetched, ``store/disk/body_fetch.py``): the history is derived data, so a fetch would
add a second replication protocol for it (raft/ knows nothing of the broker), run while the node
is catching up, and still find nothing when the peer had trimmed the range or installed a
snapshot itself; reading the histories as one needs no broker change, fills a hole from whichever
node holds it, and says exactly which ranges none holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import lmdb

from raftmq.integrity import Damage
from raftmq.store.disk import history as EV


class HistoriesDisagree(EV.HistoryDamaged):
    """Two histories hold different records under one event sequence number."""

    def __init__(self, table: str, key: bytes, first: str, second: str) -> None:
        where = EV.describe_key(table, key)
        damage = Damage("events", second, where, f"differs from the record in {first}")
        super().__init__(second, [damage])
        self.args = (f"the histories {first} and {second} hold different records for {where}: one of "
                     f"them was changed (`raftmq verify --data-dir` checks each one's checksums)",)


class UnionChecker:
    """Checks and decodes a record with the checker of the history it came from (``source``)."""

    def __init__(self, checkers: Sequence[EV.Checker]) -> None:
        self.checkers = list(checkers)
        self.source = 0  # set by the UnionCursor to the history its current record came from

    def decode(self, table: str, key: bytes | memoryview, value: bytes | memoryview):
        return self.checkers[self.source].decode(table, key, value)

    def payload(self, table: str, key: bytes | memoryview, value: bytes | memoryview, source: int):
        return self.checkers[source].payload(table, key, value)


class UnionCursor:
    """The cursors of one u64-keyed table in several histories, walked as one sorted, duplicate-free
    cursor (the subset of ``lmdb.Cursor`` the data source uses: ``first``, ``last``, ``set_range``,
    ``key``, ``value``, iteration from the current record)."""

    def __init__(self, table: str, cursors: Sequence[lmdb.Cursor], check: UnionChecker, paths: Sequence[str],
                 compare: bool) -> None:
        self.table = table
        self.cursors = list(cursors)
        self.check = check
        self.paths = list(paths)
        self.compare = compare  # events: duplicates must be identical
        self.heads: list[bytes | None] = [None] * len(self.cursors)
        self._key: bytes | None = None
        self._value: bytes | None = None

    def _load(self, moved: Sequence[bool]) -> bool:
        self.heads = [bytes(c.key()) if ok else None for c, ok in zip(self.cursors, moved, strict=True)]
        return self._select()

    def _select(self) -> bool:
        best, best_key = 0, None
        for i, key in enumerate(self.heads):
            if key is not None and (best_key is None or key < best_key):
                best, best_key = i, key
        if best_key is None:
            self._key = self._value = None
            return False
        self._key, self._value = best_key, self.cursors[best].value()
        self.check.source = best
        return True

    def first(self) -> bool:
        return self._load([c.first() for c in self.cursors])

    def set_range(self, key: bytes) -> bool:
        return self._load([c.set_range(key) for c in self.cursors])

    def last(self) -> bool:
        """Position on the largest key of all (for its key only: iteration after it ends)."""
        moved = [c.last() for c in self.cursors]
        held = [(bytes(c.key()), i) for i, (c, ok) in enumerate(zip(self.cursors, moved, strict=True)) if ok]
        if not held:
            self._key = self._value = None
            return False
        key, best = max(held)
        self._key, self._value = key, self.cursors[best].value()
        self.check.source = best
        self.heads = [None] * len(self.cursors)  # nothing after the last key
        return True

    def key(self) -> bytes:
        assert self._key is not None, "the union cursor is not on a record"
        return self._key

    def value(self) -> bytes:
        assert self._value is not None, "the union cursor is not on a record"
        return self._value

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        while self._key is not None and self._value is not None:
            key, value, chosen = self._key, self._value, self.check.source
            for i, head in enumerate(self.heads):
                if head != key:
                    continue
                if self.compare and i != chosen:
                    self._same(key, chosen, i)
                self.heads[i] = bytes(self.cursors[i].key()) if self.cursors[i].next() else None
            self.check.source = chosen
            yield key, value
            self._select()

    def _same(self, key: bytes, chosen: int, other: int) -> None:
        a, b = self._value, self.cursors[other].value()
        assert a is not None
        if a == b:
            return
        # Byte-different but equal payloads (one sealed, one an unchecked old record) are the same event.
        if bytes(self.check.payload(self.table, key, a, chosen)) != bytes(
                self.check.payload(self.table, key, b, other)):
            raise HistoriesDisagree(self.table, key, self.paths[chosen], self.paths[other])


def catalog_union(tables: Sequence[tuple[lmdb.Cursor, EV.Checker]], table: str) -> list[list]:
    """A catalog table over several histories: per key, the record changed last (declared or
    deleted/unbound latest: the last two fields), in key order."""
    chosen: dict[bytes, list] = {}
    for cursor, check in tables:
        for key, value in cursor:
            record = check.decode(table, key, value)
            key = bytes(key)
            held = chosen.get(key)
            if held is None or _changed(record) > _changed(held):
                chosen[key] = record
    return [chosen[k] for k in sorted(chosen)]


def _changed(record: list) -> int:
    declared, deleted = record[-2], record[-1]
    return max(declared or 0, deleted or 0)


@dataclass(frozen=True)
class Coverage:
    """What several histories hold together."""

    last_seq: int
    held: list[tuple[int, int]]  # inclusive seq ranges some history holds, merged, in order
    holes: list[tuple[int, int]]  # inclusive seq ranges from 1 to last_seq that none holds


def held_ranges(info: EV.HistoryInfo) -> list[tuple[int, int]]:
    """The inclusive seq ranges one history holds: ``[first_seq, last_seq]`` minus its gaps."""
    if not info.last_seq or not info.first_seq:
        return []
    ranges, start = [], info.first_seq
    for low, high in sorted((int(g[0]), int(g[1])) for g in info.gaps):
        if high < start:
            continue
        if low > start:
            ranges.append((start, min(low - 1, info.last_seq)))
        start = max(start, high + 1)
    if start <= info.last_seq:
        ranges.append((start, info.last_seq))
    return ranges


def coverage(infos: Sequence[EV.HistoryInfo]) -> Coverage:
    """The ranges held by any of the histories, and the holes none fills."""
    last = max((i.last_seq for i in infos), default=0)
    merged: list[tuple[int, int]] = []
    for low, high in sorted(r for i in infos for r in held_ranges(i)):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    holes, expected = [], 1
    for low, high in merged:
        if low > expected:
            holes.append((expected, low - 1))
        expected = high + 1
    if last and expected <= last:
        holes.append((expected, last))
    return Coverage(last, merged, holes)


def holes(paths: Sequence[str]) -> Coverage:
    """:func:`coverage` of the histories at ``paths`` (snapshots or stopped data directories' events)."""
    return coverage([EV.history_info(p) for p in paths])
