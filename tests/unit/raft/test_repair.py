"""raft/repair.py: when a learner (a node whose storage lost entries) votes again, and for whom
it may vote meanwhile (Raft §5.4.1's up-to-date rule, applied to the log it held before)."""

from __future__ import annotations

from raftmq.raft.repair import Repair


def test_a_learner_votes_only_for_a_candidate_as_up_to_date_as_its_log_before_the_damage():
    repair = Repair(until=100, reason="truncated", until_term=3)
    own_now = (3, 40)  # what is left of its log
    assert repair.may_vote_for(3, 100, own_now)  # holds everything it may have acknowledged
    assert repair.may_vote_for(4, 60, own_now)  # a later term: Raft's rule, as an intact node
    assert not repair.may_vote_for(3, 99, own_now)  # would lack entry 100
    assert not repair.may_vote_for(2, 500, own_now)  # an older last term
    assert not repair.may_vote_for(3, 50, own_now)


def test_entries_a_learner_got_since_count_too():
    repair = Repair(until=100, reason="truncated", until_term=3)
    assert not repair.may_vote_for(4, 10, (5, 120))  # it now holds a term-5 entry from a leader


def test_done_needs_the_leaders_term_and_both_commit_targets():
    repair = Repair(until=100, reason="x", until_term=3)
    repair.heard_leader(term=5, commit_index=150)
    assert not repair.done(following=True, current_term=5, commit_index=120, last_log_term=5)
    assert not repair.done(following=True, current_term=5, commit_index=150, last_log_term=4)
    assert not repair.done(following=False, current_term=5, commit_index=150, last_log_term=5)
    assert repair.done(following=True, current_term=5, commit_index=150, last_log_term=5)
