"""Checksums of the audit history (store/disk/history.py "Checksums", store/disk/event_writer.py, issue 29).

Every value the writer puts is sealed; readers (``read_table``, the writer at open, ``scan_history``)
check each record and never return a damaged one: ``HistoryDamaged`` names it.  A history written
before checksums (the fixture, written by the code of history format 1 through a real node) stays
readable, is marked ``legacy`` when a new writer continues it, and what is written after is checked.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import msgpack
import pytest

from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import EventStore
from raftmq.store.disk.sealed import SEALED, unseal
from raftmq.versions import HISTORY_FORMAT
from tests.unit.store.test_event_writer import Driver

FIXTURE_1 = Path(__file__).parent / "fixtures" / "history-format-1.lmdb"


def _history(path: Path, messages: int = 3) -> None:
    """A closed history with a queue, ``messages`` publishes (bodies kept) and their events."""
    s = EventStore(str(path), "body")
    d = Driver(s)
    d.declare("audit-queue-one")
    for i in range(messages):
        d.publish("audit-queue-one", b"audited-body-%d-" % i + bytes(range(64)))
    assert s.flush()
    s.close()


def _raw(path: Path, table: str) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=len(EV.TABLES) + 1)
    try:
        with env.begin() as txn:
            db = EV.open_tables(env, create=False, txn=txn).get(table)  # no chain table before issue 36
            return [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)] if db is not None else []
    finally:
        env.close()


def _rewrite(path: Path, table: str, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=len(EV.TABLES) + 1)
    try:
        db = env.open_db(table.encode())
        with env.begin(write=True, db=db) as txn:
            txn.put(key, value)
    finally:
        env.close()


def _flip(path: Path, pattern: bytes, at: int = 0) -> None:
    data_file = path / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    offset = raw.find(pattern)
    assert offset >= 0 and raw.find(pattern, offset + 1) < 0, "the pattern must occur exactly once"
    raw[offset + at] ^= 0x01
    data_file.write_bytes(bytes(raw))


def test_every_value_the_writer_puts_is_sealed_and_reads_back(tmp_path):
    """Events, messages, catalog and meta records all carry the seal; the stamp says format 2."""
    path = tmp_path / "events"
    _history(path)
    for table in EV.TABLES:
        rows = _raw(path, table)
        assert rows or table in ("exchanges", "bindings", "connections"), table  # (no exchange, no AuditNote)
        for key, value in rows:
            if (table, key) == ("meta", EV.FORMAT_KEY):
                assert msgpack.unpackb(value) == HISTORY_FORMAT
            else:
                assert value[0] == SEALED, (table, key)
                unseal(key, value)
    assert [m[8][:14] for m in EV.read_table(str(path), "messages")] == [b"audited-body-%d" % i for i in range(3)]
    assert EV.scan_history(str(path)) == ([], 0)


def test_a_flipped_byte_in_a_message_record_is_never_returned(tmp_path):
    """A bit flip inside a kept body: reading the table stops with HistoryDamaged naming the message;
    scan_history (raftmq verify) lists it; the events table is still read intact."""
    path = tmp_path / "events"
    _history(path)
    _flip(path, b"audited-body-1-", at=8)
    with pytest.raises(EV.HistoryDamaged) as info:
        list(EV.read_table(str(path), "messages"))
    (damage,) = info.value.damages
    assert damage.store == "events" and damage.what == "checksum mismatch"
    message_id = int(damage.where.split()[-1])
    assert damage.where == f"messages/message {message_id}" and f"messages/message {message_id}" in str(info.value)
    assert EV.scan_history(str(path))[0] == [damage]
    assert EV.verify_history(str(path)) == [damage]
    assert len(list(EV.read_events(str(path)))) > 3  # the other tables are unaffected


def test_a_flipped_byte_in_an_event_record_stops_reading_at_it(tmp_path):
    """An event record's queue name damaged: read_events raises at that seq, never yields it."""
    path = tmp_path / "events"
    _history(path, messages=1)
    events = _raw(path, "events")
    seq, value = next((k, v) for k, v in events if b"audit-queue-one" in v
                      and msgpack.unpackb(unseal(k, v))[2] == EV.ROUTED)
    _rewrite(path, "events", seq, value.replace(b"audit-queue-one", b"audit-queue-onf"))
    with pytest.raises(EV.HistoryDamaged, match=f"events/seq {EV.U64.unpack(seq)[0]}: checksum mismatch"):
        list(EV.read_events(str(path)))
    assert [d.where for d in EV.verify_history(str(path))] == [f"events/seq {EV.U64.unpack(seq)[0]}"]


def test_a_damaged_meta_record_stops_the_writer_at_open(tmp_path):
    """The writer numbers the history from meta: a damaged last_seq is refused at open
    (HistoryDamaged: the node does not start) with the way out in the message."""
    path = tmp_path / "events"
    _history(path)
    key, value = next((k, v) for k, v in _raw(path, "meta") if k == b"last_seq")
    _rewrite(path, "meta", key, value[:-1] + bytes([value[-1] ^ 4]))
    with pytest.raises(EV.HistoryDamaged, match="meta/'last_seq': checksum mismatch.*move .* aside"):
        EventStore(str(path))
    assert [d.where for d in EV.verify_history(str(path))] == ["meta/'last_seq'"]


def test_an_unsealed_record_in_a_checked_history_is_damage(tmp_path):
    """A history written with checksums from the start has no legacy mark: a plain msgpack value
    there is damage, not an old record."""
    path = tmp_path / "events"
    _history(path)
    key, value = _raw(path, "events")[0]
    _rewrite(path, "events", key, bytes(unseal(key, value)))
    assert [d.what for d in EV.verify_history(str(path))] == [
        "no checksum header (every record of this store format has one)"]


def test_a_history_written_before_checksums_is_read_and_continued(tmp_path):
    """The format-1 fixture reads unchecked (msgpack that decodes); a writer continuing it marks it
    legacy, seals its meta, and writes checked records after; an unsealed record past the legacy
    bound is damage."""
    path = tmp_path / "events"
    shutil.copytree(FIXTURE_1, path)
    old_events = list(EV.read_events(str(path)))
    assert len(old_events) == 30 and EV.history_info(str(path)).last_seq == 30
    damages, unchecked = EV.scan_history(str(path))
    assert damages == [] and unchecked == sum(len(_raw(path, t)) for t in EV.TABLES)
    s = EventStore(str(path), "body")
    assert s.last_seq == 30 and s.checker.legacy == {"events": 31, "messages": 7}
    d = Driver(s)
    s.append(d.index, [])
    d.machine.event_seq = 30  # a single node continues the history's numbering (node/broker.py)
    d.declare("after-upgrade")
    d.publish("after-upgrade", b"new-body")
    assert s.flush()
    s.close()
    events = list(EV.read_events(str(path)))
    assert events[:30] == old_events and len(events) > 30
    new = [(k, v) for k, v in _raw(path, "events") if EV.U64.unpack(k)[0] > 30]
    assert new and all(v[0] == SEALED for _, v in new)
    assert all(v[0] == SEALED for k, v in _raw(path, "meta") if k != EV.FORMAT_KEY)
    damages, unchecked = EV.scan_history(str(path))
    assert damages == [] and 0 < unchecked < sum(len(_raw(path, t)) for t in EV.TABLES)
    key, value = new[-1]
    _rewrite(path, "events", key, bytes(unseal(key, value)))
    assert [d.where for d in EV.verify_history(str(path))] == [f"events/seq {EV.U64.unpack(key)[0]}"]
    # An old record can only be checked for structure: one cut in half does not decode.
    old_key, old_value = _raw(path, "messages")[2]
    _rewrite(path, "messages", old_key, old_value[: len(old_value) // 2])
    found = [(d.where, d.what.split(" (")[0]) for d in EV.verify_history(str(path))]
    assert found == [(f"events/seq {EV.U64.unpack(key)[0]}", "no checksum header"),
                     ("messages/message 3", "does not decode")]
