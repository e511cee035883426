"""The last leader changes this node saw: a small bounded ring for the management UI's Cluster page
(issue 35; GET /api/raftmq/cluster, ops/http/raftview.py).

The broker's watch loop (node/broker.py ``start``) already notices each new leader every 0.25 s and
counts the changes (``leader_changes``, also a Prometheus counter); this keeps the last few with the
wall-clock time the node noticed, the Raft term then and the leader's node id, so a person can see
*when* leadership moved, not only how often.  Node-local and never replicated: it is what this node
observed, not part of the state machine (which has no clocks).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

KEPT = 16  # changes kept: enough to see a flapping leader, small enough to send on every refresh


@dataclass(frozen=True, slots=True)
class LeaderChange:
    at: float  # time.time() when this node noticed the new leader
    term: int  # the Raft term this node was in then
    leader: str  # node id of the new leader (its Raft address when not a known member)
    previous: str | None  # the leader before (None: the first leader this node saw since it started)


class LeaderHistory:
    """The last ``size`` leaders seen, oldest first (a deque with a bound: the oldest falls off)."""

    def __init__(self, size: int = KEPT) -> None:
        self._changes: deque[LeaderChange] = deque(maxlen=size)

    def saw(self, at: float, term: int, leader: str) -> None:
        """Record ``leader`` if it is not the one seen last (the loop calls this on every change)."""
        previous = self._changes[-1].leader if self._changes else None
        if leader != previous:
            self._changes.append(LeaderChange(at, term, leader, previous))

    def recent(self) -> list[LeaderChange]:
        """Newest first, as the UI lists them."""
        return list(reversed(self._changes))
