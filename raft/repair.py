"""When a node whose storage lost entries may vote again (issue 29; docs/design.md "Storage faults").

Raft's safety rests on voters that keep what they acknowledged: a leader is elected only by a
majority whose logs it is at least as up to date as, and every committed entry is on a majority,
so the two majorities overlap in a node that has it (§5.4, Leader Completeness).  A node whose
disk lost acknowledged entries breaks that overlap: with the only other holder of those entries
down, it could elect a leader without them, which then overwrites them everywhere.  That is what
happened before this module (3,000 confirmed messages, 0 delivered).

The rule is Protocol-Aware Recovery's (Alagappan et al., FAST 2018, "CTRL"): a node that finds
its log damaged becomes a *learner* -- it appends what a leader sends and acknowledges it, never
campaigns, and votes only for candidates at least as up to date as the log it held before the
damage (``may_vote_for``) -- until it holds again everything it may have acknowledged.  It may vote again once it follows a leader and

* its commit index has reached ``until``: the highest index it may have acknowledged (the
  synced mark, or any intact record found past the damage);
* its commit index has reached the leader's commit index as of the first message it got from
  that leader: everything committed before then, whichever node acknowledged it;
* its log ends with an entry of the leader's own term (the leader's no-op at least): its log
  then matches the leader's up to that entry, and so holds every entry committed before that
  leader was elected.

If no leader can be elected without this node (the only intact copy is on a node that is down),
the cluster waits -- unavailable, never wrong -- and the node says why in its log, status.json,
``/api/nodes`` and metrics.  Nothing here has I/O or clocks: :class:`raft.replica.Replica` feeds
it and persists the outcome (``AppendJournal.repaired``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Repair:
    until: int  # the highest log index this node may have acknowledged before the damage
    reason: str  # what was found damaged (for the log, status.json, /api/nodes)
    until_term: int = 0  # the term of the entry at ``until``
    leader_term: int = -1  # the term of the leader this node now follows
    leader_commit: int = 0  # that leader's commit index in its first message to this node
    votes_withheld: int = 0  # vote and pre-vote requests this node refused meanwhile

    def heard_leader(self, term: int, commit_index: int) -> None:
        """An AppendEntries from the current leader (term >= ours) arrived."""
        if term != self.leader_term:
            self.leader_term = term
            self.leader_commit = commit_index

    def may_vote_for(self, last_log_term: int, last_log_index: int, own_last: tuple[int, int]) -> bool:
        """Grant a (pre-)vote only to a candidate at least as up to date as this node's log was
        *before* the damage (and as it is now): the comparison an intact node makes (§5.4.1), made
        with the last entry it remembers rather than the entries it lost.  Raft's proof needs no
        more of a voter than that comparison, so a learner may vote: without it two learners and
        one intact node could never elect anyone (seen in a chaos run on docker-compose)."""
        return (last_log_term, last_log_index) >= max((self.until_term, self.until), own_last)

    def done(self, *, following: bool, current_term: int, commit_index: int, last_log_term: int) -> bool:
        return (following and self.leader_term == current_term and last_log_term == current_term
                and commit_index >= max(self.until, self.leader_commit))
