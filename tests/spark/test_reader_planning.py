"""The raftmq reader's planning and reading called directly (pushed filters become key ranges);
the shared session is only there to parse the schema."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, IsNotNull, LessThan  # noqa: E402

from raftmq.spark.datasource import RaftmqDataSource  # noqa: E402
from raftmq.store.core.model import Message  # noqa: E402
from raftmq.store.disk import history as EV  # noqa: E402
from raftmq.store.disk.event_writer import EventStore  # noqa: E402

T0 = 1_790_000_000_000_000


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    base = tmp_path_factory.mktemp("history")
    store = EventStore(str(base / "live"), "metadata")
    batch = []
    for i in range(1, 1001):  # event i at T0 + 1000 * i microseconds
        message = Message(i, "", "q", b"\x00\x00", b"", False, 0, T0)
        batch.append([i, T0 + 1000 * i, EV.ROUTED if i % 2 else EV.ACKED, "/", "q", i, "", "q", 0, "", message])
    store.append(1, batch)
    store.close()
    info = EV.snapshot(str(base / "live"), str(base / "snap"))
    assert info.events == 1000
    return str(base / "snap")


@pytest.fixture
def reader(spark):
    from pyspark.sql.types import _parse_datatype_string

    def make(path: str, **options):
        source = RaftmqDataSource({"path": path, "table": "events", **options})
        return source.reader(_parse_datatype_string(source.schema()))

    return make


def ranges(r) -> list[tuple[int, int]]:
    return [p.value[:2] for p in r.partitions()]


def test_time_comparisons_become_a_sequence_range(snapshot, reader):
    r = reader(snapshot, partitions="4")
    since = dt.datetime.fromtimestamp((T0 + 1000 * 250) / 1e6, dt.UTC).replace(tzinfo=None)  # naive = UTC
    left = list(r.pushFilters([IsNotNull(("time",)), GreaterThanOrEqual(("time",), since),
                               LessThan(("seq",), 700)]))
    assert left == [left[0]] and isinstance(left[0], IsNotNull)  # both comparisons taken
    parts = ranges(r)
    assert parts[0][0] == 250 and parts[-1][1] == 700 and len(parts) == 4
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))  # contiguous


def test_kind_filters_travel_with_the_partitions(snapshot, reader):
    r = reader(snapshot)
    assert list(r.pushFilters([In(("kind",), ("acked", "expired")), EqualTo(("queue",), "q")])) == []
    (partition,) = r.partitions()
    rows = [row for batch in r.read(partition) for row in batch.to_pylist()]
    assert len(rows) == 500 and {row["kind"] for row in rows} == {"acked"}


def test_pushdown_off_returns_every_filter(snapshot, reader):
    r = reader(snapshot, pushdown="false")
    filters = [EqualTo(("seq",), 5)]
    assert list(r.pushFilters(filters)) == filters
    assert ranges(r) == [(1, 1001)]


def test_an_empty_range_reads_nothing(snapshot, reader):
    r = reader(snapshot)
    list(r.pushFilters([GreaterThanOrEqual(("seq",), 5000)]))
    assert [row for p in r.partitions() for batch in r.read(p) for row in batch.to_pylist()] == []


def test_a_one_group_history_reads_as_before_with_group_0(snapshot, reader):
    """Issue 34: a history without queue groups is group 0 in every row, and every other column is
    the record as the node's reader gives it (kind named; no principal in these records)."""
    r = reader(snapshot, partitions="3")
    assert list(r.pushFilters([])) == []
    assert {p.value[-1] for p in r.partitions()} == {0}
    rows = [row for p in r.partitions() for batch in r.read(p) for row in batch.to_pylist()]
    assert {row.pop("group") for row in rows} == {0}
    records = list(EV.read_events(snapshot))
    assert [(row["seq"], row["kind"], row["queue"], row["message_id"]) for row in rows] == [
        (e[0], EV.KIND_NAMES[e[2]], e[4], e[5]) for e in records]


def test_a_group_filter_plans_only_that_group(snapshot, reader):
    """``group = n`` / ``group IN (...)`` are taken by the reader: a group the history does not
    hold plans no key range (nothing is read), group 0 plans the whole history."""
    r = reader(snapshot)
    assert list(r.pushFilters([EqualTo(("group",), 2)])) == []
    assert [row for p in r.partitions() for batch in r.read(p) for row in batch.to_pylist()] == []
    assert list(r.pushFilters([In(("group",), (0, 1))])) == []
    assert ranges(r) == [(1, 1001)]
