"""raftmq's own Cluster page (issue 35): GET /api/raftmq/cluster, the Raft state as this node sees it.

RabbitMQ has no such page, so the path is under /api/raftmq/ (no RabbitMQ tool asks for it).  Readable
by monitoring users, as /api/nodes is.  Everything comes from the log's RaftStatus (one read), the
member list the broker keeps from the replicated state, and the node's own leader history
(node/leaders.py): nothing reads the machine's model.  Each node knows its own commit and applied
index, its own connected partners and counters; followers' lag is the leader's knowledge only, so
a follower's answer leaves it null -- the page says whose view it shows.

Each member's own numbers (its commit and applied index, term and role as it sees them, the last
snapshots it wrote or loaded) are asked from it over the Raft port (ops/http/members.py) and given
per member as ``reported`` with the answer's age in seconds; a member that did not answer is listed
in ``members_missing``.  GET /api/raftmq/digests asks every member for its state digest (the model
and bodies, as ``digest.json``: node/status.py) made now, each with the applied index it was made at:
replicas at the same index must have the same digest (``digests_agree``: true, false, or null when
no two were made at the same index).
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


def leader_name(broker: Broker, seen: str) -> str:
    """A leader in the history, as RabbitMQ names nodes.  A change seen before this node had applied
    the member list names the leader by its Raft address (node/leaders.py): it is named by its node
    id once the members are known (the Cluster page showed raftmq@127.0.0.1:<port> for a change a
    loaded follower saw early)."""
    return node_name(broker, broker.node_of_raft(seen) or seen)


def cluster_view(broker: Broker) -> dict:
    """The body of /api/raftmq/cluster: members (as /api/nodes), this node's counters and its leader history."""
    raft = broker.log.raft_status()
    members = [{"name": n["name"], "running": n["running"], "raft": n["raft"]} for n in node_members(broker)]
    leader = next((m["name"] for m in members if m["raft"].get("leader")), None)
    changes = [{"time": int(c.at * 1000), "term": c.term, "leader": leader_name(broker, c.leader),
                "previous": leader_name(broker, c.previous) if c.previous else None}
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


def _reported(view: dict) -> dict:
    return {**view.get("raft", {}), "age": view.get("age")}


async def get_cluster(request: web.Request) -> web.Response:
    require(request, MONITORING)
    view = cluster_view(context(request).broker)
    gathered = await context(request).members.gather()
    for member in view["members"]:
        own = gathered.views.get(member["name"])
        member["reported"] = _reported(own) if own is not None else None
    view["members_missing"] = gathered.missing
    return reply(view)


async def get_digests(request: web.Request) -> web.Response:
    """Every member's state digest, made now (ops/http/members.py; a walk of the whole model on each
    member's loop, so only on request, and at most once per DIGEST_EVERY seconds per member)."""
    require(request, MONITORING)
    gathered = await context(request).members.digests()
    rows = []
    for name, view in sorted(gathered.views.items()):
        made = view.get("digest") or {}
        rows.append({"name": name, "applied_index": made.get("applied_index"), "digest": made.get("digest"),
                     "model_digest": made.get("model_digest"), "bodies_digest": made.get("bodies_digest"),
                     "age": round((made.get("age") or 0.0) + (view.get("age") or 0.0), 3)})
    by_index: dict[int, set[str]] = {}
    for row in rows:
        if row["digest"] is not None:
            by_index.setdefault(row["applied_index"], set()).add(row["digest"])
    compared = [digests for index, digests in by_index.items()
                if sum(1 for r in rows if r["applied_index"] == index) > 1]
    agree = None if not compared else all(len(d) == 1 for d in compared)
    return reply({"members": rows, "members_missing": gathered.missing, "digests_agree": agree})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/raftmq/cluster", get_cluster)
    app.router.add_get("/api/raftmq/digests", get_digests)
