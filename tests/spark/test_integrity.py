"""The Spark data source and damaged or old history records (spark/datasource.py, issue 29).

A damaged record fails the Spark read with the damage named (never a damaged row, never a silently
shorter answer); a snapshot written before checksums (history format 1: the fixture, written through
a real node by that code) is still read, all of it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import msgpack
import pytest

from raftmq.spark.session import load
from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import EventStore
from raftmq.store.disk.sealed import seal
from tests.unit.store.test_event_writer import Driver

FIXTURE_1 = Path(__file__).parents[1] / "unit" / "store" / "fixtures" / "history-format-1.lmdb"


def test_a_snapshot_written_before_checksums_is_read_whole(spark, tmp_path):
    """Old records are read unchecked, as before: every event and message of the fixture."""
    path = tmp_path / "old"
    shutil.copytree(FIXTURE_1, path)
    assert load(spark, str(path), "events").count() == 30 == len(list(EV.read_events(str(path))))
    bodies = sorted(r["body"] for r in load(spark, str(path), "messages").collect())
    assert bodies == [b"history-body-%d" % i for i in range(6)]


def test_a_damaged_event_fails_the_read_and_names_the_record(spark, tmp_path):
    """A bit flip in one event of a snapshot: the events scan fails with HistoryDamaged naming the
    snapshot and the seq; a time-filtered scan (binary search over the records) fails too; the
    messages table, undamaged, still reads."""
    live = EventStore(str(tmp_path / "events"), "body")
    d = Driver(live)
    d.declare("spark-q")
    for i in range(20):
        d.publish("spark-q", b"spark-body-%02d" % i)
    assert live.flush()
    snap = tmp_path / "snap"
    live.snapshot(str(snap))
    live.close()
    events = list(EV.read_events(str(snap)))
    target = events[len(events) // 2]
    data = bytearray((snap / "data.mdb").read_bytes())
    # Find the middle event's stored record in the file and flip one bit near its end.
    key = EV.U64.pack(target[0])
    packed = seal(key, msgpack.packb(target, use_bin_type=True))
    at = data.find(packed)
    assert at >= 0 and data.find(packed, at + 1) < 0
    data[at + len(packed) - 3] ^= 0x10
    (snap / "data.mdb").write_bytes(bytes(data))
    with pytest.raises(Exception, match=f"HistoryDamaged.*events/seq {target[0]}: checksum mismatch"):
        load(spark, str(snap), "events").collect()
    with pytest.raises(Exception, match="checksum mismatch"):
        load(spark, str(snap), "events").where(f"time >= timestamp_micros({target[1]})").count()
    assert load(spark, str(snap), "messages").count() == 20
