"""Several histories read as one (spark/union.py) on real LMDB histories written by the node's own
writer (EventStore), without Spark: each key once in key order, a gap filled from another history,
two histories disagreeing on an event fail the read naming it, and ``holes`` computes what none holds."""

from __future__ import annotations

import pytest

from raftmq.spark.datasource import RaftmqReader, _Histories
from raftmq.spark.union import HistoriesDisagree, coverage, held_ranges, holes
from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import EventStore


def event(seq: int, detail: str = "") -> list:
    return [seq, 1_000_000 + seq, EV.DELIVERED, "/", "q", seq, "", "q", 10, detail or f"ctag-{seq}", None]


def write(path, *ranges: range, edit: dict[int, str] | None = None) -> str:
    """A history of the given seq ranges; batch = Raft index = one per ten seqs, as on every node."""
    store = EventStore(str(path), "metadata")
    batches: dict[int, list] = {}
    for seqs in ranges:
        for s in seqs:
            batches.setdefault((s - 1) // 10 + 1, []).append(event(s, (edit or {}).get(s, "")))
    for index, events in sorted(batches.items()):
        store.append(index, events)
    store.close()
    return str(path)


def read(paths: list[str], start: int = 0, stop: int = 1 << 62) -> list[list]:
    reader = RaftmqReader(paths, "events", None, None, 100)
    with _Histories(paths, "events") as opened:
        reader.check = opened.check
        return list(reader._event_rows(opened.cursor, start, stop))


def test_each_event_once_and_the_gap_filled(tmp_path):
    gapped = write(tmp_path / "a", range(1, 11), range(21, 31))
    full = write(tmp_path / "b", range(1, 31))
    assert EV.history_info(gapped).gaps == [[11, 20]]
    for paths in ([gapped, full], [full, gapped]):
        rows = read(paths)
        assert [r[0] for r in rows] == list(range(1, 31))
        assert rows == read([full])  # the same records
    assert [r[0] for r in read([gapped, full], 8, 23)] == list(range(8, 23))


def test_histories_that_disagree_on_an_event_fail_the_read_naming_it(tmp_path):
    one = write(tmp_path / "a", range(1, 11))
    other = write(tmp_path / "b", range(1, 11), edit={5: "someone-else"})
    with pytest.raises(HistoriesDisagree, match="events/seq 5"):
        read([one, other])
    assert [r[0] for r in read([one, other], 6, 11)] == list(range(6, 11))  # the rest agrees


def test_holes_are_the_ranges_no_history_holds(tmp_path):
    a = write(tmp_path / "a", range(1, 11), range(21, 31))
    b = write(tmp_path / "b", range(1, 16))
    assert held_ranges(EV.history_info(a)) == [(1, 10), (21, 30)]
    assert holes([a]).holes == [(11, 20)]
    assert holes([a, b]).holes == [(16, 20)]
    both = coverage([EV.history_info(a), EV.history_info(b)])
    assert both.held == [(1, 15), (21, 30)] and both.last_seq == 30
