"""Where each Raft group's leader should be (issue 34): the pure part of leader spreading.

With several groups a node that leads them all does all their leaders' work (proposing, sending
every follower its entries, the forwarder for the metadata group) while the other nodes' cores
follow; spreading the leaders one per node (or as evenly as the groups divide) spreads that work,
as RabbitMQ's ``balanced`` leader locator and ``rabbitmq-queues rebalance`` do.  Elections place
leaders at random, and a node that returns after a failure leads nothing, so someone has to move
them: node/group_leaders.py asks each group's leader to transfer (Raft TimeoutNow) to the node
named here.

``plan`` decides from what is known now (each group's leader, which members are alive) and moves
as few groups as it can: a node leading more than its share gives groups to the node leading the
fewest until no two live nodes differ by more than one.  It prefers to move a group to its
*preferred* node (group g's is member g mod members, so a fresh cluster gets the same layout every
time) and, among the rest, queue groups before the metadata group (group 0 carries the sessions
and the forwarder; moving it costs an election's worth of stall for every client of the node).
A group without a leader now (an election in progress), or led by a node not alive, is left
alone: it is counted once it has a leader.  Deterministic: the same inputs give the same moves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def preferred_node(group: int, members: Sequence[str]) -> str:
    """Group ``group``'s preferred leader: member ``group mod len(members)`` in configured order."""
    return members[group % len(members)]


def plan(groups: int, members: Sequence[str], alive: set[str] | frozenset[str],
         leaders: Mapping[int, str | None]) -> dict[int, str]:
    """The moves (group -> node to lead it) that spread ``groups`` leaders over the live members.

    ``members``: every member's node id in configured order; ``alive``: those reachable now;
    ``leaders``: each group's current leader's node id (None or absent: unknown or electing)."""
    live = [m for m in members if m in alive]
    if not live or groups <= 0:
        return {}
    led: dict[str, list[int]] = {m: [] for m in live}
    for group in range(groups):
        leader = leaders.get(group)
        if leader in led:
            led[leader].append(group)  # type: ignore[index]  # checked: leader is a live member
    moves: dict[int, str] = {}
    order = {m: i for i, m in enumerate(live)}
    while True:
        # The most loaded node gives (ties: the later member), the least loaded takes (ties: the earlier).
        donor = max(live, key=lambda m: (len(led[m]), order[m]))
        taker = min(live, key=lambda m: (len(led[m]), order[m]))
        if len(led[donor]) - len(led[taker]) <= 1:
            return moves
        group = _pick(led[donor], taker, members)
        led[donor].remove(group)
        led[taker].append(group)
        moves[group] = taker


def _pick(candidates: list[int], taker: str, members: Sequence[str]) -> int:
    """Which of the donor's groups goes to ``taker``: a queue group that prefers ``taker``, else the
    highest queue group; the metadata group (0) only when the donor leads nothing else."""
    queue_groups = sorted(g for g in candidates if g != 0)
    for group in queue_groups:
        if preferred_node(group, members) == taker:
            return group
    return queue_groups[-1] if queue_groups else 0


def balanced(groups: int, alive: Sequence[str] | set[str], leaders: Mapping[int, str | None]) -> bool:
    """Whether every group has a live leader and no two live nodes lead counts differing by more than one."""
    counts = {m: 0 for m in alive}
    for group in range(groups):
        leader = leaders.get(group)
        if leader not in counts:
            return False
        counts[leader] += 1  # type: ignore[index]  # checked: a live member
    return not counts or max(counts.values()) - min(counts.values()) <= 1
