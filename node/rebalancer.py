"""Spreading the groups' leaders on its own (issue 34): "group leaders are spread over the nodes and
rebalanced after a node returns".

One node decides, the metadata group's leader (one at a time, so two nodes never move the same
group two ways).  It rebalances ``leader_rebalance_seconds`` after it starts leading and after the
set of live members (its Raft partners and itself) changes: a node that returned leads nothing
until then, and a node lost leaves the survivors with uneven loads.  Only on those events, never
continuously: a leader placed by hand (``raftmq cluster rebalance --to``) stays where it was put
until the next change of members.  A rebalance that leaves the groups uneven (a transfer refused
while a follower catches up, a group still electing) is tried again after the same delay, up to
ATTEMPTS times per event.  The work (admin requests over the Raft ports, node/group_leaders.py)
runs in a thread: it blocks on sockets for up to a few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .group_leaders import rebalance
from .leader_spread import balanced

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

CHECK_SECONDS = 0.5
ATTEMPTS = 5


def live_members(broker: Broker) -> frozenset[str]:
    """This node and the members its metadata group's replica is connected to, by node id."""
    raft = broker.log.raft_status()
    partners = raft.connected_partners if raft is not None else ()
    names = {broker.config.node_id}
    for address in partners:
        node = broker.node_of_raft(address)
        if node is not None:
            names.add(node)
    return frozenset(names)


async def rebalance_loop(broker: Broker) -> None:
    config = broker.config
    delay = config.leader_rebalance_seconds
    if delay <= 0 or config.raft_groups < 2 or not config.clustered:
        return
    alive: frozenset[str] | None = None
    due: float | None = None  # monotonic time of the next rebalance, None: nothing to do
    attempts = 0
    while True:
        await asyncio.sleep(CHECK_SECONDS)
        if not broker.log.is_leader:
            alive, due = None, None
            continue
        now_alive = live_members(broker)
        if now_alive != alive:  # leading anew, or a member came or went
            alive, due, attempts = now_alive, time.monotonic() + delay, 0
        if due is None or time.monotonic() < due:
            continue
        attempts += 1
        try:
            done = await asyncio.to_thread(rebalance, config, None, None, 4 * delay)
        except Exception:  # an admin request's failure must not end the loop
            log.exception("leader rebalance failed")
            done = None
        if done is not None and done.moves:
            log.info("group leaders moved %s (failed: %s); now %s", done.moves, done.failed, done.leaders)
        settled = done is not None and not done.failed and balanced(config.raft_groups, sorted(alive), done.leaders)
        due = None if settled or attempts >= ATTEMPTS else time.monotonic() + delay
