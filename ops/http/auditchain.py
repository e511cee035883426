"""GET /api/raftmq/audit/chain (issue 36): this node's audit chain records, for ``raftmq audit verify --peer``.

``?from=SEQ&to=SEQ`` bounds the batches' first seq (to exclusive), ``limit`` (at most 10,000) the
batches returned, ``events=1`` adds the event records of those batches, so that a verifier can
name the fields of an event that differs.  Readable by monitoring users; read in a worker thread
(one LMDB read transaction) so that a large page never holds the event loop.  404 when the node
keeps no history.

**Groups** (issue 34): ``group=N`` reads queue group N's chain (``<data>/groups/g<N>/events``,
written by that group's worker and read here through LMDB's reader lock, one read transaction as
for the metadata group's); without it, the metadata group's (group 0), as before.  The answer names
its ``group`` and the ``groups`` whose histories this node keeps, so a verifier walks each; a node
with one group answers ``"group": 0, "groups": [0]`` beside the fields it always had.  404 for a
group this node keeps no history of.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..audit_verify import PAGE_LIMIT, chain_page
from ..group_dirs import open_group_history, queue_group_histories
from ..operator import MONITORING
from .common import HttpError, context, reply, require


def _group_page(path: str, low: int, high: int, limit: int, with_events: bool) -> dict:
    """In a worker thread: ``chain_page`` of a queue group's history, opened for this read."""
    with open_group_history(path) as env:
        return chain_page(env, low, high, limit, with_events)


async def get_chain(request: web.Request) -> web.Response:
    require(request, MONITORING)
    broker = context(request).broker
    store = broker.events
    if store is None:
        raise HttpError(404, "Object Not Found", "this node keeps no message history (audit_retention is none)")
    try:
        low = int(request.query.get("from", "0"))
        high = int(request.query.get("to", str(1 << 63)))
        limit = min(int(request.query.get("limit", str(PAGE_LIMIT))), PAGE_LIMIT)
        group = int(request.query.get("group", "0"))
    except ValueError as exc:
        raise HttpError(400, "bad_request", f"from, to, limit and group are integers: {exc}") from exc
    with_events = request.query.get("events") == "1"
    histories = dict(queue_group_histories(broker.config.resolved_data_dir())) if broker.group_host else {}
    if group == 0:
        page = await asyncio.to_thread(chain_page, store.env, low, high, limit, with_events)
    elif group in histories:
        page = await asyncio.to_thread(_group_page, histories[group], low, high, limit, with_events)
    else:
        raise HttpError(404, "Object Not Found", f"this node keeps no history of group {group}")
    return reply({**page, "group": group, "groups": [0, *sorted(histories)]})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/raftmq/audit/chain", get_chain)
