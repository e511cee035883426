"""Issue 29: the scrubber reads back every fsynced journal record and the snapshot, and reports
what fails its checksum (raft/scrub.py)."""

from __future__ import annotations

import os

from raftmq.raft.journal import AppendJournal
from raftmq.raft.scrub import StorageScrubber, scrub_segment
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.snapshot import verify_snapshot, write_snapshot


def journal_with_records(path, count: int = 200) -> AppendJournal:
    j = AppendJournal(str(path))
    for i in range(1, count + 1):
        j.add(b"record %d " % i * 30, i, 1)
        if i % 10 == 0:
            j.flush()
    return j


def scrubber(j: AppendJournal, snapshot: str, found: list) -> StorageScrubber:
    return StorageScrubber(j.scrub_targets, snapshot, verify_snapshot, found.append, bytes_per_second=0)


def test_an_intact_journal_and_snapshot_pass(tmp_path):
    j = journal_with_records(tmp_path / "journal")
    snapshot = str(tmp_path / "snapshot.lmdb")
    write_snapshot(snapshot, StateMachine(), b"meta")
    found: list = []
    s = scrubber(j, snapshot, found)
    assert s.one_pass() == [] and found == [] and s.passes == 1
    assert s.bytes >= sum(size for _path, size in j.scrub_targets())


def test_a_flipped_byte_in_a_flushed_record_is_reported_once(tmp_path):
    j = journal_with_records(tmp_path / "journal")
    path, size = j.scrub_targets()[-1]
    with open(path, "r+b") as fh:
        fh.seek(size // 2)
        byte = fh.read(1)
        fh.seek(size // 2)
        fh.write(bytes([byte[0] ^ 1]))
    found: list = []
    s = scrubber(j, str(tmp_path / "none.lmdb"), found)
    s.one_pass()
    s.one_pass()
    assert len(found) == 1 and found[0].store == "journal" and "checksum" in found[0].what
    assert s.found == 1


def test_a_truncated_segment_is_reported(tmp_path):
    j = journal_with_records(tmp_path / "journal")
    path, size = j.scrub_targets()[-1]
    os.truncate(path, size - 10)
    assert scrub_segment(path, size) is not None


def test_unflushed_records_are_not_read(tmp_path):
    j = journal_with_records(tmp_path / "journal", count=10)
    (path, flushed), = j.scrub_targets()
    j.add(b"buffered", 11, 1)
    assert j.scrub_targets() == [(path, flushed)]
    with open(path, "ab") as fh:
        fh.write(b"\xff" * 7)  # bytes past the mark: a write in progress, not damage
    assert scrub_segment(path, flushed) is None


def test_a_damaged_snapshot_is_reported(tmp_path):
    j = journal_with_records(tmp_path / "journal", count=10)
    snapshot = tmp_path / "snapshot.lmdb"
    machine = StateMachine()
    write_snapshot(str(snapshot), machine, b"meta" * 1000)
    data = bytearray(snapshot.read_bytes())
    at = data.find(b"metameta")
    data[at + 100] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    found: list = []
    scrubber(j, str(snapshot), found).one_pass()
    assert [d.store for d in found] == ["snapshot"]
