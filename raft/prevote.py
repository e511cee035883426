"""Pre-Vote (Raft thesis 9.6): the decisions, free of pysyncobj so that they can be tested alone.

pysyncobj 0.3 campaigns as soon as a follower's election timer fires: it raises its term and asks
for votes, and every node that receives the request adopts the higher term -- a leader steps
down.  A follower that comes back from a restart or a partition and times out before the
leader's first heartbeat reaches it therefore deposed a healthy leader (issue 17, item 6).

With pre-vote (as etcd-io/raft does it) a node whose timer fires first asks the others whether
they *would* vote for it at term + 1, without changing its own term.  A node grants a pre-vote
only if

* the term asked for is above its own (the candidate is not behind in terms),
* it is not the leader, and has not heard from a leader within the minimum election timeout
  (the *lease*: a leader that still reaches this node is alive), and
* the candidate's log is at least as up to date as its own (Raft 5.4.1).

Only with pre-votes from a majority (its own included) does the node start a real election.
Pre-votes are not recorded anywhere: a node may grant any number of them, and granting one
changes nothing (no term, no vote, no timer).

Two kinds of election skip the pre-vote, because they must not be stopped by the lease:

* a *leadership transfer* (``TimeoutNow`` from the leader, which ``raftmq cluster remove`` uses
  to move leadership off a node before removing it): the leader asked for it, as etcd's forced
  campaign; the others still hear that leader, so a pre-vote would be refused.
* a node that has received AppendEntries from a leader with a *lower* term than its own (its
  term ran ahead, e.g. from a vote that reached it but not the leader).  pysyncobj neither
  accepts nor answers such a message, so without a real election at its higher term the node
  could never rejoin: it would ask for pre-votes forever and be refused by the lease.  etcd
  answers such a leader with its higher term (which also makes the leader step down); here the
  node's own election does the same.  This is rare and costs one election, as before.

A cluster of one elects itself at once (there is nobody to ask).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Raft messages between members (pysyncobj ignores types it does not know).
PRE_VOTE = "raftmq_pre_vote"
PRE_VOTE_REPLY = "raftmq_pre_vote_reply"


class Step(enum.Enum):
    """What a follower (or candidate) does when its election timer fires."""

    ELECT = "elect"  # pysyncobj's election: term + 1, RequestVote
    PRE_VOTE = "pre_vote"  # ask for pre-votes first


def at_election_timeout(*, enabled: bool, others: int, transfer: bool, won_pre_vote: bool,
                        term_ahead_of_leader: bool) -> Step:
    """The step to take when the election timer fires (see the module docstring for each case)."""
    if not enabled or others == 0 or transfer or won_pre_vote or term_ahead_of_leader:
        return Step.ELECT
    return Step.PRE_VOTE


def log_up_to_date(last_term: int, last_index: int, own_last_term: int, own_last_index: int) -> bool:
    """Raft 5.4.1: a log is at least as up to date if its last term is higher, or equal with an
    index at least as high."""
    return (last_term, last_index) >= (own_last_term, own_last_index)


@dataclass(frozen=True)
class Voter:
    """What a node knows when a pre-vote request reaches it."""

    term: int
    last_log_term: int
    last_log_index: int
    is_leader: bool
    leader_heard_ago: float | None  # seconds since the last AppendEntries of a current leader
    lease: float  # the minimum election timeout


def pre_vote_refusal(voter: Voter, term: int, last_log_term: int, last_log_index: int) -> str | None:
    """Why ``voter`` refuses a pre-vote for ``term`` with that last log entry; None if it grants it."""
    if term <= voter.term:
        return f"term {term} is not above ours ({voter.term})"
    if voter.is_leader:
        return "we are the leader"
    if voter.leader_heard_ago is not None and voter.leader_heard_ago < voter.lease:
        return f"heard from the leader {voter.leader_heard_ago * 1000:.0f} ms ago"
    if not log_up_to_date(last_log_term, last_log_index, voter.last_log_term, voter.last_log_index):
        return (f"log ({last_log_term}, {last_log_index}) is behind ours "
                f"({voter.last_log_term}, {voter.last_log_index})")
    return None


@dataclass
class PreVoteRound:
    """The candidate's side of one round: the term it asked for and who granted it."""

    term: int
    granted: set[str] = field(default_factory=set)

    def grant(self, node_id: str, term: int) -> None:
        if term == self.term:  # a late reply to an earlier round counts for nothing
            self.granted.add(node_id)

    def won(self, members: set[str]) -> bool:
        """A majority of the current configuration (``members``: the others), this node included.

        Counted against the members at the time of the reply, so a member removed since the
        round started does not count, and an added one raises the bar."""
        return len(self.granted & members) + 1 > (len(members) + 1) / 2
