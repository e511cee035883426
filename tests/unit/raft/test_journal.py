"""The durable Raft journal: what was flushed survives a reopen, torn tails are cut, deletions stick."""

from __future__ import annotations

import os

from raftmq.raft.journal import AppendJournal


def entries(journal):
    return [journal[i] for i in range(len(journal))]


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
    size = os.path.getsize(tmp_path / "journal.log")
    with open(tmp_path / "journal.log", "r+b") as fh:
        fh.truncate(size - 3)  # the last record was half written when the node died
    reopened = AppendJournal(str(tmp_path))
    assert entries(reopened) == [(b"a", 1, 1)]
    reopened.add(b"c", 2, 2)
    reopened.flush()
    assert entries(AppendJournal(str(tmp_path))) == [(b"a", 1, 1), (b"c", 2, 2)]


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
