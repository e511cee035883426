"""GET /api/raftmq/audit/chain (issue 36): this node's audit chain records, for ``raftmq audit verify --peer``.

``?from=SEQ&to=SEQ`` bounds the batches' first seq (to exclusive), ``limit`` (at most 10,000) the
batches returned, ``events=1`` adds the event records of those batches, so that a verifier can
name the fields of an event that differs.  Readable by monitoring users; read in a worker thread
(one LMDB read transaction) so that a large page never holds the event loop.  404 when the node
keeps no history.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..audit_verify import PAGE_LIMIT, chain_page
from ..operator import MONITORING
from .common import HttpError, context, reply, require


async def get_chain(request: web.Request) -> web.Response:
    require(request, MONITORING)
    store = context(request).broker.events
    if store is None:
        raise HttpError(404, "Object Not Found", "this node keeps no message history (audit_retention is none)")
    try:
        low = int(request.query.get("from", "0"))
        high = int(request.query.get("to", str(1 << 63)))
        limit = min(int(request.query.get("limit", str(PAGE_LIMIT))), PAGE_LIMIT)
    except ValueError as exc:
        raise HttpError(400, "bad_request", f"from, to and limit are integers: {exc}") from exc
    page = await asyncio.to_thread(chain_page, store.env, low, high, limit, request.query.get("events") == "1")
    return reply(page)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/raftmq/audit/chain", get_chain)
