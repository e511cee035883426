"""raftmq's own Cluster page (issue 35): GET /api/raftmq/cluster, the Raft state as this node sees it.

RabbitMQ has no such page, so the path is under /api/raftmq/ (no RabbitMQ tool asks for it).  Readable
by monitoring users, as /api/nodes is.  Everything comes from the log's RaftStatus (one read), the
member list the broker keeps from the replicated state, and the node's own leader history
(node/leaders.py): nothing reads the machine's model.  Each node knows its own commit and applied
index, its own connected partners and counters; followers' lag is the leader's knowledge only, so
a follower's answer leaves it null -- the page says whose view it shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ..operator import MONITORING
from .common import context, reply, require
from .system import node_members
from .views import node_name

if TYPE_CHECKING:
    from raftmq.node.broker import Broker


def cluster_view(broker: Broker) -> dict:
    """The body of /api/raftmq/cluster: members (as /api/nodes), this node's counters and its leader history."""
    raft = broker.log.raft_status()
    members = [{"name": n["name"], "running": n["running"], "raft": n["raft"]} for n in node_members(broker)]
    leader = next((m["name"] for m in members if m["raft"].get("leader")), None)
    changes = [{"time": int(c.at * 1000), "term": c.term, "leader": node_name(broker, c.leader),
                "previous": node_name(broker, c.previous) if c.previous else None}
               for c in broker.leader_history.recent()]
    view: dict = {
        "node": node_name(broker),
        "clustered": raft is not None,
        "leader": leader,
        "members": members,
        "leader_changes": broker.leader_changes,
        "recent_leader_changes": changes,
    }
    if raft is None:  # one node: no Raft, it leads itself
        view.update(term=0, connected_partners=[], majority_lost=0, snapshots_damaged=0,
                    prevote={"rounds": 0, "won": 0, "granted": 0, "refused": 0})
        return view
    rounds, won, granted, refused = raft.prevote
    view.update(
        term=raft.term,
        connected_partners=sorted(node_name(broker, broker.node_of_raft(a) or a) for a in raft.connected_partners),
        majority_lost=raft.majority_lost,
        snapshots_damaged=raft.snapshots_damaged,
        prevote={"rounds": rounds, "won": won, "granted": granted, "refused": refused},
    )
    return view


async def get_cluster(request: web.Request) -> web.Response:
    require(request, MONITORING)
    return reply(cluster_view(context(request).broker))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/raftmq/cluster", get_cluster)
