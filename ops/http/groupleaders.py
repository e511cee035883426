"""The Raft groups' leaders over HTTP (issue 34): "`raftmq cluster rebalance` and the HTTP API show
and move them".

GET /api/raftmq/groups (monitoring): every group's leader and each member's replica of it (role,
term, commit and applied index, lag), asked over the members' group Raft ports at the moment
(node/group_leaders.py ``survey``, as ``raftmq cluster status`` shows them).

POST /api/raftmq/rebalance (administrator; JSON body, same-origin and the session's CSRF token as
every change: ops/http/crosssite.py, common.py): ``{}`` spreads the leaders over the live members
(node/leader_spread.py); ``{"node": "n2"}`` moves every group's leader to n2, ``{"node": "n2",
"groups": [1, 2]}`` only those.  Answers what moved, what did not in time (``failed``) and each
group's leader afterwards.  The requests block on sockets (up to ``timeout`` seconds, default 15,
at most 60), so they run in a thread; one rebalance at a time per node (409 while one runs).
A node with one group answers 400: there is nothing to move.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from raftmq.node.group_leaders import rebalance, survey

from ..operator import ADMINISTRATOR, MONITORING
from .common import HttpError, bad_request, body, context, reply, require

MAX_TIMEOUT = 60.0
_running: set[int] = set()  # id(app) of a rebalance in progress


def _groups_config(request: web.Request):
    config = context(request).broker.config
    if config.raft_groups < 2 or not config.clustered:
        raise bad_request("this node runs one Raft group, or no cluster: there are no group leaders to move")
    return config


async def get_groups(request: web.Request) -> web.Response:
    require(request, MONITORING)
    config = _groups_config(request)
    seen = await asyncio.to_thread(survey, config)
    return reply({"groups": seen.rows(), "alive": sorted(seen.alive)})


async def post_rebalance(request: web.Request) -> web.Response:
    require(request, ADMINISTRATOR)
    config = _groups_config(request)
    data = await body(request)
    node = data.get("node")
    groups = data.get("groups")
    timeout = data.get("timeout", 15.0)
    if node is not None and (not isinstance(node, str) or node not in {m.node_id for m in config.cluster}):
        raise bad_request(f"node must be a member's node id, not {node!r}")
    if groups is not None and (node is None or not isinstance(groups, list)
                               or not all(isinstance(g, int) and 0 <= g < config.raft_groups for g in groups)):
        raise bad_request(f"groups: a list of group numbers 0..{config.raft_groups - 1}, with node")
    if not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT:
        raise bad_request(f"timeout: seconds, more than 0 and at most {MAX_TIMEOUT:g}")
    key = id(request.app)
    if key in _running:
        raise HttpError(409, "conflict", "a rebalance is already running on this node")
    _running.add(key)
    try:
        done = await asyncio.to_thread(rebalance, config, node, groups, float(timeout))
    finally:
        _running.discard(key)
    return reply(done.as_dict())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/raftmq/groups", get_groups)
    app.router.add_post("/api/raftmq/rebalance", post_rebalance)
