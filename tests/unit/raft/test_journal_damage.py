"""Issue 29: the journal tells a torn tail from damage, keeps what it can verify, and records a
pending repair when entries it may have acknowledged are gone (docs/design.md "Storage faults").

A crash can only tear what was never fsynced (and so never acknowledged: raft/replica.py sends an
acknowledgement only after the flush).  Everything before the synced mark was fsynced: a bad
record there, a segment shorter than the mark, a missing segment, or a journal ending before the
mark's index is damage, and the node must not vote until it has the lost entries again (Raft §5.4's
Leader Completeness depends on voters that keep what they acknowledged; Alagappan et al.,
"Protocol-Aware Recovery for Consensus-Based Storage", FAST 2018).
"""

from __future__ import annotations

import json
import os
import random

import pytest

from raftmq.raft.journal import AppendJournal, verify_journal
from raftmq.raft.journal_files import MARK_NAME, META_COPY_NAME, META_NAME


def entries(journal):
    return [journal[i] for i in range(len(journal))]


def segments(path) -> list:
    return sorted(path.glob("seg-*.log"))


def written(path, count: int = 40, segment_bytes: int = 1 << 20) -> AppendJournal:
    j = AppendJournal(str(path), segment_bytes=segment_bytes)
    for i in range(1, count + 1):
        j.add(b"command %d " % i * 8, i, 1)
        if i % 5 == 0:
            j.flush()  # several flushes, as a running node makes
    j.setRaftCommitIndex(count)
    j.setCurrentTerm(4, "127.0.0.1:7")
    j._destroy()
    return j


def flip(path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x10]))


def test_an_intact_journal_reopens_without_damage(tmp_path):
    written(tmp_path)
    reopened = AppendJournal(str(tmp_path))
    assert len(reopened) == 40 and reopened.damage is None and reopened.repair is None
    assert verify_journal(str(tmp_path)) == []


@pytest.mark.parametrize("seed", range(6))
def test_a_bit_flip_inside_what_was_fsynced_is_damage(tmp_path, seed):
    written(tmp_path)
    segment = segments(tmp_path)[-1]
    size = os.path.getsize(segment)
    offset = random.Random(seed).randrange(size // 4, size * 3 // 4)  # the middle, not the tail
    flip(segment, offset)
    found = verify_journal(str(tmp_path))
    assert found and any("inside what was fsynced" in d.what for d in found)
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None
    kept = entries(reopened)
    assert kept == [(b"command %d " % i * 8, i, 1) for i in range(1, len(kept) + 1)]  # a verified prefix
    assert len(kept) < 40
    assert reopened.repair["until"] >= 40  # every entry it may have acknowledged
    assert (tmp_path / "damaged-1" / segment.name).exists()  # kept for a person to look at
    assert reopened.getCurrentTerm() == 4 and reopened.getVotedForNodeId() == "127.0.0.1:7"
    reopened._destroy()
    again = AppendJournal(str(tmp_path))  # restarted before the repair: still pending
    assert again.repair is not None and again.repair["until"] >= 40


def test_a_truncated_segment_is_damage(tmp_path):
    written(tmp_path)
    segment = segments(tmp_path)[-1]
    os.truncate(segment, os.path.getsize(segment) // 2)
    assert verify_journal(str(tmp_path))
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None and reopened.repair["until"] >= 40


def test_a_truncation_at_a_record_boundary_is_damage_too(tmp_path):
    j = written(tmp_path)
    offset = j._offsets[30]  # exactly where entry 31 starts: every remaining record is intact
    segment = segments(tmp_path)[-1]
    os.truncate(segment, offset)
    reopened = AppendJournal(str(tmp_path))
    assert len(reopened) == 30 and reopened.damage is not None and reopened.repair["until"] == 40


def test_a_deleted_newest_segment_is_damage(tmp_path):
    written(tmp_path, count=60, segment_bytes=2048)  # several segments
    files = segments(tmp_path)
    assert len(files) >= 3
    os.unlink(files[-1])
    assert verify_journal(str(tmp_path))
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None and "missing" in reopened.damage
    assert reopened.repair["until"] >= 60


def test_a_deleted_middle_segment_is_damage_and_later_ones_are_set_aside(tmp_path):
    written(tmp_path, count=60, segment_bytes=2048)
    files = segments(tmp_path)
    os.unlink(files[1])
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None and reopened.repair["until"] >= 60
    assert (tmp_path / "damaged-1" / files[-1].name).exists()


def test_a_deleted_head_segment_after_compaction_is_damage(tmp_path):
    j = AppendJournal(str(tmp_path), segment_bytes=2048)
    for i in range(1, 61):
        j.add(b"x%d" % i * 20, i, 1)
        j.flush()
    j.deleteEntriesTo(40)  # first index 41: the segments before it are deleted
    j.reaper.join()
    j._destroy()
    files = segments(tmp_path)
    os.unlink(files[0])  # the segment holding the first index
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None and "head" in reopened.damage


def test_an_unflushed_tail_is_a_torn_tail_not_damage(tmp_path):
    j = written(tmp_path)
    j2 = AppendJournal(str(tmp_path))
    j2.add(b"never flushed", 41, 1)
    segment = segments(tmp_path)[-1]
    with open(segment, "ab") as fh:
        fh.write(j2._buffer[0][:7])  # the write was cut by the crash
    reopened = AppendJournal(str(tmp_path))
    assert len(reopened) == 40 and reopened.damage is None and reopened.repair is None
    assert j is not None


def test_a_cut_then_a_crash_is_not_damage(tmp_path):
    """A conflict's cut shortens the journal on purpose: the mark goes down first."""
    j = AppendJournal(str(tmp_path))
    for i in range(1, 11):
        j.add(b"x%d" % i, i, 1)
    j.flush()
    j.setCurrentTerm(2, None)
    j.add(b"new6", 6, 2)  # conflicts with entry 6 of term 1: 6..10 are dropped
    j.flush()
    j._destroy()
    reopened = AppendJournal(str(tmp_path))
    assert entries(reopened)[-1] == (b"new6", 6, 2) and reopened.damage is None


def test_a_clear_then_a_crash_is_not_damage(tmp_path):
    written(tmp_path)
    j = AppendJournal(str(tmp_path))
    j.clear()
    j.add(b"snapshot entry", 500, 3)
    j.add(b"snapshot entry 2", 501, 3)
    j.flush()
    j._destroy()
    reopened = AppendJournal(str(tmp_path))
    assert [e[1] for e in entries(reopened)] == [500, 501] and reopened.damage is None


def test_one_damaged_meta_copy_is_mended_from_the_other(tmp_path):
    written(tmp_path)
    flip(tmp_path / META_NAME, 10)
    found = verify_journal(str(tmp_path))
    assert [d.store for d in found] == ["journal-meta"]
    reopened = AppendJournal(str(tmp_path))
    assert reopened.getCurrentTerm() == 4 and reopened.getVotedForNodeId() == "127.0.0.1:7"
    assert reopened.damage is None
    assert verify_journal(str(tmp_path)) == []  # both copies written again


def test_both_meta_copies_damaged_is_damage(tmp_path):
    written(tmp_path)
    flip(tmp_path / META_NAME, 10)
    flip(tmp_path / META_COPY_NAME, 12)
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None and "term and vote" in reopened.damage
    assert reopened.repair is not None  # the vote is unknown: it must not vote until repaired


def test_a_damaged_synced_mark_is_damage(tmp_path):
    written(tmp_path)
    with open(tmp_path / MARK_NAME, "r+b") as fh:
        fh.write(os.urandom(96))
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is not None and "synced mark" in reopened.damage


def test_a_journal_of_an_earlier_version_opens_as_it_is(tmp_path):
    """Written before issue 29: a bare JSON meta, no synced mark.  Read as it is, then checked."""
    written(tmp_path)
    os.unlink(tmp_path / MARK_NAME)
    os.unlink(tmp_path / META_COPY_NAME)
    (tmp_path / META_NAME).write_text(json.dumps({"term": 4, "vote": "127.0.0.1:7", "commit": 40}))
    reopened = AppendJournal(str(tmp_path))
    assert len(reopened) == 40 and reopened.damage is None and reopened.getCurrentTerm() == 4
    reopened._destroy()
    assert verify_journal(str(tmp_path)) == []


def test_repaired_clears_the_pending_repair_durably(tmp_path):
    written(tmp_path)
    os.truncate(segments(tmp_path)[-1], 100)
    j = AppendJournal(str(tmp_path))
    assert j.repair is not None
    j.repaired()
    j._destroy()
    assert AppendJournal(str(tmp_path)).repair is None


def test_commit_hint_never_points_past_the_journal(tmp_path):
    w = written(tmp_path)
    os.truncate(segments(tmp_path)[-1], w._offsets[10])
    j = AppendJournal(str(tmp_path))
    assert j.getRaftCommitIndex() <= j[-1][1]


def test_an_evicted_entry_read_back_damaged_is_reported_not_returned(tmp_path):
    """A running node: an entry no longer in memory is read from its segment for a follower far
    behind; damaged, it raises and is reported (Replica then takes a snapshot past it)."""
    from raftmq.raft.journal import KEEP_RESIDENT, EntryDamaged

    j = AppendJournal(str(tmp_path))
    count = KEEP_RESIDENT + 20
    for i in range(1, count + 1):
        j.add(b"entry %d " % i * 10, i, 1)
    j.flush()
    j.setRaftCommitIndex(count)  # committed: the oldest are evicted from memory
    flip(segments(tmp_path)[-1], j._offsets[5] + 30)
    reported: list = []
    j.on_read_damage = reported.append
    with pytest.raises(EntryDamaged):
        j[5]
    assert reported and reported[0].store == "journal" and "entry 6" in reported[0].what
    assert j[6] == (b"entry 7 " * 10, 7, 1)  # the others still read


def test_a_cut_at_a_segment_boundary_then_a_crash_is_not_damage(tmp_path):
    """The cut removes a whole segment: the lowered mark points at the one before it."""
    j = AppendJournal(str(tmp_path), segment_bytes=600)
    i = 0
    while len(segments(tmp_path)) < 3:
        i += 1
        j.add(b"y%d" % i * 40, i, 1)
        j.flush()
    first_of_last = next(pos for pos, off in enumerate(j._offsets) if off >= j._segments[-1].base)
    j.setCurrentTerm(2, None)
    j.add(b"conflict", j._entries[first_of_last][1], 2)  # cuts exactly at the newest segment's start
    j.flush()
    j._destroy()
    reopened = AppendJournal(str(tmp_path))
    assert reopened.damage is None, reopened.damage
    assert reopened[-1] == (b"conflict", j._entries[-1][1], 2)


def test_the_pending_repair_remembers_the_term_of_the_newest_entry_held(tmp_path):
    """What a learner compares candidates with (raft/repair.py may_vote_for)."""
    j = AppendJournal(str(tmp_path))
    for i in range(1, 21):
        j.add(b"t%d" % i * 10, i, 1 if i <= 10 else 2)
        j.flush()
    j._destroy()
    os.truncate(segments(tmp_path)[-1], j._offsets[12])
    reopened = AppendJournal(str(tmp_path))
    assert reopened.repair["until"] == 20 and reopened.repair["until_term"] == 2
