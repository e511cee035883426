"""Pre-vote decisions (raft/prevote.py): Raft thesis 9.6, as etcd-io/raft applies it."""

from __future__ import annotations

from raftmq.raft.prevote import (
    PreVoteRound,
    Step,
    Voter,
    at_election_timeout,
    log_up_to_date,
    pre_vote_refusal,
)

LEASE = 0.25


def voter(**changes) -> Voter:
    fields = dict(term=5, last_log_term=5, last_log_index=100, is_leader=False, leader_heard_ago=None, lease=LEASE)
    fields.update(changes)
    return Voter(**fields)


def test_a_follower_that_lost_its_leader_grants_a_pre_vote_for_a_log_as_up_to_date():
    assert pre_vote_refusal(voter(), term=6, last_log_term=5, last_log_index=100) is None
    assert pre_vote_refusal(voter(leader_heard_ago=LEASE + 0.01), 6, 5, 100) is None
    assert pre_vote_refusal(voter(), 6, 6, 1) is None  # a later last term wins over a longer log (5.4.1)


def test_a_node_that_heard_from_a_leader_within_the_minimum_election_timeout_refuses():
    """The lease: a leader that still reaches this node is alive, whatever the candidate's log."""
    assert "heard from the leader" in pre_vote_refusal(voter(leader_heard_ago=0.01), 6, 9, 10_000)
    assert "heard from the leader" in pre_vote_refusal(voter(leader_heard_ago=LEASE - 0.001), 6, 5, 100)


def test_the_leader_refuses():
    assert pre_vote_refusal(voter(is_leader=True), 6, 9, 10_000) == "we are the leader"


def test_a_candidate_whose_log_is_behind_is_refused():
    """A returning follower missed entries: it could not win the real election either (5.4.1)."""
    assert "behind" in pre_vote_refusal(voter(), 6, 5, 99)
    assert "behind" in pre_vote_refusal(voter(), 6, 4, 500)


def test_a_term_not_above_the_voters_is_refused():
    """The candidate is behind in terms (etcd grants a pre-vote only for m.Term > r.Term)."""
    assert "not above" in pre_vote_refusal(voter(), 5, 5, 100)
    assert "not above" in pre_vote_refusal(voter(term=7), 6, 9, 10_000)


def test_log_up_to_date_compares_last_term_then_index():
    assert log_up_to_date(3, 10, 3, 10)
    assert log_up_to_date(3, 11, 3, 10)
    assert log_up_to_date(4, 1, 3, 10)
    assert not log_up_to_date(3, 9, 3, 10)
    assert not log_up_to_date(2, 99, 3, 10)


def test_a_round_is_won_by_a_majority_of_the_current_members_self_included():
    three = {"b", "c"}
    r = PreVoteRound(term=6)
    assert not r.won(three)
    r.grant("b", 6)
    assert r.won(three)  # 2 of 3

    five = {"b", "c", "d", "e"}
    r = PreVoteRound(term=6)
    r.grant("b", 6)
    assert not r.won(five)  # 2 of 5
    r.grant("c", 6)
    assert r.won(five)  # 3 of 5

    r = PreVoteRound(term=6)
    assert not r.won({"b"})  # two members: the other one must agree
    r.grant("b", 6)
    assert r.won({"b"})


def test_late_replies_and_removed_members_do_not_count():
    r = PreVoteRound(term=7)
    r.grant("b", 6)  # a reply to the previous round
    assert not r.won({"b", "c"})
    r.grant("x", 7)  # no longer a member
    assert not r.won({"b", "c"})
    r.grant("c", 7)
    assert r.won({"b", "c"})


def test_which_elections_skip_the_pre_vote():
    normal = dict(enabled=True, others=2, transfer=False, won_pre_vote=False, term_ahead_of_leader=False)
    assert at_election_timeout(**normal) is Step.PRE_VOTE
    # A pre-vote just won, a leadership transfer the leader asked for (must bypass the lease, as
    # etcd's forced campaign), a term ahead of the leader (only an election brings the node
    # back), a cluster of one, or the feature off: pysyncobj's election at once.
    for change in (dict(won_pre_vote=True), dict(transfer=True), dict(term_ahead_of_leader=True),
                   dict(others=0), dict(enabled=False)):
        assert at_election_timeout(**{**normal, **change}) is Step.ELECT, change
