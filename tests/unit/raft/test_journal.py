"""The durable Raft journal: what was flushed survives a reopen, torn tails are cut, deletions stick."""

from __future__ import annotations

import pytest

from raftmq.raft.journal import KEEP_RESIDENT, AppendJournal


def entries(journal):
    return [journal[i] for i in range(len(journal))]


def segments(path) -> list:
    return sorted(path.glob("seg-*.log"))


def test_flushed_entries_and_term_survive_reopen(tmp_path):
    j = AppendJournal(str(tmp_path))
    for i in range(1, 6):
        j.add(b"cmd%d" % i, i, 1)
    j.setCurrentTerm(3, "127.0.0.1:1")
    j.flush()
    j.add(b"unflushed", 6, 1)  # never flushed: a crash now loses it, and it was never acknowledged
    reopened = AppendJournal(str(tmp_path))
    assert entries(reopened) == [(b"cmd%d" % i, i, 1) for i in range(1, 6)]
    assert reopened.getCurrentTerm() == 3 and reopened.getVotedForNodeId() == "127.0.0.1:1"


def test_torn_tail_is_cut_at_load(tmp_path):
    j = AppendJournal(str(tmp_path))
    j.add(b"a", 1, 1)
    j.add(b"b", 2, 1)
    j.flush()
    j.add(b"c", 3, 1)
    record = b"".join(j._buffer)
    segment = segments(tmp_path)[-1]
    with open(segment, "ab") as fh:
        fh.write(record[:-3])  # the last record was half written when the node died, never fsynced
    reopened = AppendJournal(str(tmp_path))
    assert entries(reopened) == [(b"a", 1, 1), (b"b", 2, 1)]
    assert reopened.damage is None and reopened.repair is None  # a torn tail is not damage
    reopened.add(b"c", 3, 2)
    reopened.flush()
    assert entries(AppendJournal(str(tmp_path))) == [(b"a", 1, 1), (b"b", 2, 1), (b"c", 3, 2)]


def test_delete_from_and_to(tmp_path):
    j = AppendJournal(str(tmp_path))
    for i in range(1, 11):
        j.add(b"x%d" % i, i, 1)
    j.flush()
    j.deleteEntriesFrom(7)  # a conflicting suffix (list positions 7.. = indexes 8..10)
    j.add(b"new8", 8, 2)
    j.deleteEntriesTo(3)  # compacted into a snapshot
    j.flush()
    expected = [(b"x%d" % i, i, 1) for i in range(4, 8)] + [(b"new8", 8, 2)]
    assert entries(j) == expected
    assert entries(AppendJournal(str(tmp_path))) == expected


def test_commit_index_is_a_lazy_hint(tmp_path):
    j = AppendJournal(str(tmp_path))
    j.setRaftCommitIndex(42)
    assert AppendJournal(str(tmp_path)).getRaftCommitIndex() == 1  # not written yet
    j.onOneSecondTimer()
    assert AppendJournal(str(tmp_path)).getRaftCommitIndex() == 42


def test_overlapping_rewrite_costs_one_flush_and_keeps_order(tmp_path):
    """pysyncobj deletes and re-adds an overlapping suffix on every repeated AppendEntries."""
    j = AppendJournal(str(tmp_path))
    for i in range(1, 6):
        j.add(b"e%d" % i, i, 1)
    j.flush()
    flushes = j.flushes
    j.deleteEntriesFrom(2)  # positions 2.. = indexes 3..5, all flushed
    j.add(b"e3", 3, 1)
    j.add(b"e4'", 4, 2)  # a different entry from a new leader
    assert entries(AppendJournal(str(tmp_path)))[-1] == (b"e5", 5, 1)  # old suffix still on disk
    j.flush()
    assert j.flushes == flushes + 1
    expected = [(b"e1", 1, 1), (b"e2", 2, 1), (b"e3", 3, 1), (b"e4'", 4, 2)]
    assert entries(j) == expected
    assert entries(AppendJournal(str(tmp_path))) == expected


def test_dropping_only_unflushed_records(tmp_path):
    j = AppendJournal(str(tmp_path))
    j.add(b"a", 1, 1)
    j.flush()
    j.add(b"b", 2, 1)
    j.add(b"c", 3, 1)
    j.deleteEntriesFrom(2)  # drops "c" before it ever reached the disk
    j.flush()
    assert entries(AppendJournal(str(tmp_path))) == [(b"a", 1, 1), (b"b", 2, 1)]


def test_a_suffix_of_the_current_term_is_never_cut_by_a_shorter_resend(tmp_path):
    """Raft §5.3: delete existing entries only on a conflict.  pysyncobj asks to cut everything
    after prevLogIdx and re-adds what the message carries; a resend carrying fewer entries than
    the follower acknowledged must not make it lose the rest."""
    j = AppendJournal(str(tmp_path))
    j.setCurrentTerm(2, None)
    for i in range(1, 11):
        j.add(b"e%d" % i, i, 2)
    j.flush()
    flushes = j.flushes
    j.deleteEntriesFrom(3)  # prevLogIdx 3, the message carries indexes 4..6 only
    for i in range(4, 7):
        j.add(b"e%d" % i, i, 2)
    j.flush()
    expected = [(b"e%d" % i, i, 2) for i in range(1, 11)]
    assert entries(j) == expected
    assert j.flushes == flushes  # nothing was rewritten
    j.add(b"e11", 11, 2)  # the log grows on as usual
    j.flush()
    assert entries(AppendJournal(str(tmp_path))) == [*expected, (b"e11", 11, 2)]


def test_a_kept_suffix_is_still_cut_at_a_real_conflict(tmp_path):
    j = AppendJournal(str(tmp_path))
    j.setCurrentTerm(3, None)
    for i in range(1, 6):
        j.add(b"e%d" % i, i, 1 if i < 3 else 3)
    j.flush()
    j.deleteEntriesFrom(1)
    j.add(b"e2", 2, 1)
    j.add(b"other3", 3, 2)  # cannot happen under Raft's rules; if it does, the leader wins
    j.flush()
    expected = [(b"e1", 1, 1), (b"e2", 2, 1), (b"other3", 3, 2)]
    assert entries(j) == expected
    assert entries(AppendJournal(str(tmp_path))) == expected


def test_a_suffix_of_an_older_term_or_with_a_membership_change_is_cut(tmp_path):
    j = AppendJournal(str(tmp_path))
    j.setCurrentTerm(4, None)
    for i in range(1, 6):
        j.add(b"\x00e%d" % i, i, 3)  # last entry of term 3, the current term is 4
    j.deleteEntriesFrom(2)
    assert [e[1] for e in entries(j)] == [1, 2]
    j.add(b"\x00e3", 3, 4)
    j.add(b"\x02membership", 4, 4)  # pysyncobj rolled this change back before asking to cut
    j.add(b"\x00e5", 5, 4)
    j.deleteEntriesFrom(3)
    assert [e[1] for e in entries(j)] == [1, 2, 3]


def test_compaction_deletes_whole_segments_and_rewrites_nothing_it_keeps(tmp_path):
    j = AppendJournal(str(tmp_path), segment_bytes=200)
    for i in range(1, 31):
        j.add(b"e" * 50 + b"%d" % i, i, 1)
        j.flush()  # a segment rolls over at the first flush after it holds 200 bytes
    files = segments(tmp_path)
    assert len(files) > 5
    first_segment = files[0].read_bytes()
    kept = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in files[-3:]}
    first_kept_index = j[len(j) - 6][1]
    j.deleteEntriesTo(len(j) - 6)  # a snapshot covers all but the last six entries
    j.reaper.join(5)  # compacted segments are deleted off the tick thread
    remaining = segments(tmp_path)
    assert len(remaining) < len(files)
    for path in remaining:  # kept segments are the very same files, untouched
        if path.name in kept:
            assert (path.stat().st_ino, path.stat().st_mtime_ns) == kept[path.name]
    assert [e[1] for e in entries(j)] == list(range(first_kept_index, 31))
    assert entries(AppendJournal(str(tmp_path), segment_bytes=200)) == entries(j)
    # A compacted segment whose deletion did not reach the disk before a crash: skipped, deleted.
    files[0].write_bytes(first_segment)
    assert entries(AppendJournal(str(tmp_path), segment_bytes=200)) == entries(j)
    assert not files[0].exists()
    assert j.size_bytes == sum(8 + 16 + 50 + len(b"%d" % i) for i in range(first_kept_index, 31))


def test_a_cut_across_segments_deletes_the_later_ones(tmp_path):
    j = AppendJournal(str(tmp_path), segment_bytes=100)
    for i in range(1, 21):
        j.add(b"c" * 40, i, 1)
        j.flush()
    j._cut(4)  # a conflict: list positions 4.. (indexes 5..20) go
    j.add(b"new", 5, 2)
    j.flush()
    expected = [(b"c" * 40, i, 1) for i in range(1, 5)] + [(b"new", 5, 2)]
    assert entries(j) == expected
    assert entries(AppendJournal(str(tmp_path), segment_bytes=100)) == expected


def test_a_segment_left_behind_by_an_interrupted_cut_is_ignored(tmp_path):
    j = AppendJournal(str(tmp_path), segment_bytes=100)
    for i in range(1, 11):
        j.add(b"d" * 40, i, 1)
        j.flush()
    files = segments(tmp_path)
    saved = files[-1].read_bytes()
    j._cut(2)
    j.add(b"new", 3, 2)
    j.flush()
    files[-1].write_bytes(saved)  # as if its deletion had not reached the disk before a crash
    reopened = entries(AppendJournal(str(tmp_path), segment_bytes=100))
    assert reopened == [(b"d" * 40, 1, 1), (b"d" * 40, 2, 1), (b"new", 3, 2)]
    assert not files[-1].exists()  # removed at load: its indexes do not follow on


def test_a_single_file_journal_of_an_earlier_version_is_taken_over(tmp_path):
    j = AppendJournal(str(tmp_path))
    for i in range(1, 4):
        j.add(b"old%d" % i, i, 1)
    j.flush()
    j._destroy()
    segments(tmp_path)[0].rename(tmp_path / "journal.log")
    assert entries(AppendJournal(str(tmp_path))) == [(b"old%d" % i, i, 1) for i in range(1, 4)]
    assert not (tmp_path / "journal.log").exists()


def test_entries_after_a_clear_may_start_below_the_old_first_index(tmp_path):
    j = AppendJournal(str(tmp_path))
    for i in range(1, 11):
        j.add(b"x", i, 1)
    j.flush()
    j.deleteEntriesTo(8)  # first index 9 now
    j.clear()  # installing a snapshot
    j.add(b"s1", 5, 2)
    j.add(b"s2", 6, 2)
    j.flush()
    assert entries(AppendJournal(str(tmp_path))) == [(b"s1", 5, 2), (b"s2", 6, 2)]


def test_committed_entries_leave_memory_and_are_read_back_from_disk(tmp_path):
    j = AppendJournal(str(tmp_path), segment_bytes=4096)
    for i in range(1, 301):
        j.add(b"body-%d" % i, i, 1)
        if i % 10 == 0:
            j.flush()  # several segments
    j.add(b"unflushed", 301, 1)
    expected = [(b"body-%d" % i, i, 1) for i in range(1, 301)] + [(b"unflushed", 301, 1)]
    j.setRaftCommitIndex(301)  # everything committed; the last one not flushed yet
    resident = [command is not None for command, _idx, _term in j._entries]
    # The first two stay too: pysyncobj looks at log[0] and log[1] all the time.
    assert resident == [True] * 2 + [False] * (301 - KEEP_RESIDENT - 2) + [True] * KEEP_RESIDENT
    assert entries(j) == expected  # by index, negative ones included
    assert j[-1] == expected[-1] and j[-2] == expected[-2] and j[0] == expected[0]
    assert j[10:20] == expected[10:20]  # a short slice: a list
    run = j[5:]  # to the end, as pysyncobj asks for: read lazily
    assert len(run) == len(expected) - 5 and list(run) == expected[5:]
    assert run[0] == expected[5] and run[-1] == expected[-1] and run[:3] == expected[5:8]
    assert j.reads > 0
    # A conflict inside the evicted part, then a compaction: both still read correctly.
    j._cut(250)
    j.add(b"new-251", 251, 2)
    j.flush()
    j.deleteEntriesTo(100)
    assert entries(j) == expected[100:250] + [(b"new-251", 251, 2)]
    assert j._entries[0][0] is not None and j._entries[1][0] is not None  # the new head, back in memory
    assert entries(AppendJournal(str(tmp_path), segment_bytes=4096)) == entries(j)


def test_a_damaged_record_is_not_served(tmp_path):
    j = AppendJournal(str(tmp_path))
    for i in range(1, 200):
        j.add(b"x" * 20, i, 1)
    j.flush()
    j.setRaftCommitIndex(199)
    segment = segments(tmp_path)[0]
    with open(segment, "r+b") as fh:
        fh.seek(5 * 44 + 30)
        fh.write(b"\xff")  # inside the sixth record's command (records of 44 bytes)
    with pytest.raises(RuntimeError, match="damaged"):
        j[5]


def test_entries_not_yet_on_disk_stay_in_memory(tmp_path):
    j = AppendJournal(str(tmp_path))
    for i in range(1, 201):
        j.add(b"y", i, 1)
    j.setRaftCommitIndex(200)  # (a follower may learn a commit index before its own flush)
    assert all(command is not None for command, _idx, _term in j._entries)
    j.flush()
    j.setRaftCommitIndex(200)
    assert sum(command is None for command, _idx, _term in j._entries) == 200 - KEEP_RESIDENT - 2
    assert entries(j) == [(b"y", i, 1) for i in range(1, 201)]


def test_a_reopened_journal_keeps_only_its_head_and_newest_entries_in_memory(tmp_path):
    """A restart does not read the whole journal into memory (up to 1 GiB with a large backlog):
    as after a commit, only the first two and the newest KEEP_RESIDENT commands stay; the others are
    read back from disk, and a conflict or a compaction still works on them."""
    j = AppendJournal(str(tmp_path), segment_bytes=4096)
    for i in range(1, 201):
        j.add(b"body-%d" % i, i, 1)
    j.flush()
    expected = [(b"body-%d" % i, i, 1) for i in range(1, 201)]
    again = AppendJournal(str(tmp_path), segment_bytes=4096)
    resident = [command is not None for command, _idx, _term in again._entries]
    assert resident == [True] * 2 + [False] * (200 - KEEP_RESIDENT - 2) + [True] * KEEP_RESIDENT
    assert entries(again) == expected and list(again[3:]) == expected[3:]
    again._cut(150)  # a conflict inside the part left on disk
    again.add(b"new-151", 151, 2)
    again.flush()
    again.deleteEntriesTo(50)
    assert entries(again) == expected[50:150] + [(b"new-151", 151, 2)]
    assert entries(AppendJournal(str(tmp_path), segment_bytes=4096)) == entries(again)
