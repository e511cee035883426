"""raftmq's own management pages (issue 35): what RabbitMQ has no page for.

- ``GET /api/raftmq/sessions``: the sessions a client can resume on any node -- AMQP 0-10 sessions
  and AMQP 1.0 durable links (store/core/sessions.py keeps both in the replicated state), attached
  or detached, with how long a detached one is kept and the transfers it would replay.  Listed as
  RabbitMQ's lists (``page``, ``name``...); a user sees its own, monitoring users every one.
- ``GET /api/raftmq/held``: the delayed-message and deduplication figures -- messages held by
  x-delayed-message exchanges and the counters since this node started applying, each plugin
  exchange's held messages or cache, each queue's deduplication cache (vhosts the user may see).
- ``GET /api/raftmq/queues/{vhost}/{name}/events``: a queue's latest audit events from this node's
  history (store/disk/history.py; the history is on with ``audit_retention``/``x-audit-retention``).
  The events table is ordered by sequence, not by queue, so the newest ``SCAN`` events are read
  backwards (in a worker thread: LMDB reads, each record verified by the history's checker) and the
  queue's among them answered, at most ``limit``; ``scanned_to`` says how far back it looked.  For
  the whole history: ``raftmq snapshot`` and ``raftmq audit`` (docs/design.md).  404 ``history_off``
  without a history.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from aiohttp import web

from raftmq.node.group_figures import held_totals
from raftmq.store.core import queries as Q
from raftmq.store.disk import history as EV

from ..group_dirs import open_group_history
from ..operator import MONITORING
from .common import HttpError, bad_request, columns, context, forbidden, operator, reply, require_vhost
from .views import exchange_view

if TYPE_CHECKING:
    from raftmq.store.disk.event_writer import EventStore

SCAN = 20_000  # events read back at most per request
LIMIT = 100  # events answered by default (at most 1,000)


async def list_sessions(request: web.Request) -> web.Response:
    op = operator(request)
    rows = []
    for s in Q.sessions(context(request).broker.machine):
        if not (op.has(MONITORING) or (s.principal == op.name and op.may_see_vhost(s.vhost))):
            continue
        expires = None if s.detached_at is None else s.detached_at // 1000 + s.timeout * 1000
        rows.append({"name": s.name, "kind": s.kind, "vhost": s.vhost, "user": s.principal,
                     "state": "attached" if s.detached_at is None else "detached",
                     "detached_at": None if s.detached_at is None else s.detached_at // 1000,  # ms
                     "timeout": s.timeout, "expires_at": expires,  # ms: resumable until then
                     "unsettled": s.unsettled, "subscriptions": s.subscriptions})
    return columns(request, rows)


async def held(request: web.Request) -> web.Response:
    broker, op = context(request).broker, operator(request)
    machine = broker.machine
    # Issue 34: counters of every group's process, dedup caches of queues in queue groups.
    stats, dedup = await held_totals(broker, Q.message_stats(machine), Q.dedup_queues(machine))
    exchanges = []
    for vhost in Q.vhost_names(machine):
        if not op.may_see_vhost(vhost):
            continue
        for exchange in Q.exchanges(machine, vhost):
            if exchange.type in ("x-delayed-message", "x-message-deduplication"):
                exchanges.append(exchange_view(exchange, plugins=True))
    queues = [{"vhost": v, "name": n, "cache_entries": entries} for v, n, entries in dedup
              if op.may_see_vhost(v)]
    return reply({
        # Held now (every vhost: the machine's count, as /api/overview's queue_totals.messages_delayed).
        "messages_delayed": Q.counters(machine).delayed_messages,
        # Since this node started applying (the machine's counters; equal on every node).
        "delayed": stats.get("delayed", 0), "delay_released": stats.get("delay_released", 0),
        "delay_refused": stats.get("delay_refused", 0), "deduplicated": stats.get("deduplicated", 0),
        "exchanges": exchanges, "queues": queues,
    })


def _latest_events(store: EventStore, vhost: str, queue: str, limit: int) -> tuple[list[list], int | None]:
    """In a worker thread: the queue's events among the newest SCAN, newest first, verified."""
    return _latest_in(store.env, store.path, vhost, queue, limit)


def _group_latest_events(path: str, vhost: str, queue: str, limit: int) -> tuple[list[list], int | None, int, int]:
    """In a worker thread: ``_latest_events`` in a queue group's history (issue 34: a queue's
    events are in its group's, ``<data>/groups/g<N>/events``, written by that group's worker and
    read here through LMDB's reader lock), with its first and last sequence numbers."""
    with open_group_history(path) as env:  # one opener at a time (the audit chain's page reads it too)
        found, oldest = _latest_in(env, path, vhost, queue, limit)
        with env.begin() as txn:
            tables = EV.open_tables(env, create=False, txn=txn)
            info = EV.info(txn, tables, EV.checker(txn, tables, path))
        return found, oldest, info.first_seq, info.last_seq


def _latest_in(env, path: str, vhost: str, queue: str, limit: int) -> tuple[list[list], int | None]:
    found: list[list] = []
    oldest = None
    with env.begin() as txn:
        tables = EV.open_tables(env, create=False, txn=txn)
        db = tables.get("events")
        if db is None:
            return [], None
        check = EV.checker(txn, tables, path)
        cursor = txn.cursor(db=db)
        if not cursor.last():
            return [], None
        for scanned, (key, value) in enumerate(cursor.iterprev()):
            if scanned >= SCAN:
                break
            record = check.decode("events", key, value)
            oldest = record[0]
            if record[3] == vhost and record[4] == queue:
                found.append(record)
                if len(found) >= limit:
                    break
    return found, oldest


async def queue_events(request: web.Request) -> web.Response:
    vhost, name = request.match_info["vhost"], request.match_info["name"]
    require_vhost(request, vhost)
    op = operator(request)
    if not (op.has(MONITORING) or op.may_use_vhost(vhost)):
        raise forbidden("User not authorised to access virtual host")
    try:
        limit = int(request.query.get("limit", LIMIT))
    except ValueError:
        raise bad_request("limit must be an integer") from None
    if not 1 <= limit <= 1000:
        raise bad_request("limit must be between 1 and 1000")
    store = context(request).broker.events
    if store is None:
        raise HttpError(404, "history_off", "this node keeps no audit history (audit_retention is none)")
    loop = asyncio.get_running_loop()
    broker = context(request).broker
    group = _queue_group(broker, vhost, name)
    history = os.path.join(broker.config.resolved_data_dir(), "groups", f"g{group}", "events") if group else None
    if history is not None and os.path.exists(os.path.join(history, "data.mdb")):
        found, oldest, first_seq, last_seq = await loop.run_in_executor(
            None, _group_latest_events, history, vhost, name, limit)
    else:
        found, oldest = await loop.run_in_executor(None, _latest_events, store, vhost, name, limit)
        first_seq, last_seq = store.first_seq, store.last_seq
    fields = EV.EVENT_FIELDS
    events = [dict(zip(fields, record, strict=False)) | {"kind": EV.KIND_NAMES.get(record[2], str(record[2]))}
              for record in found]
    return reply({"vhost": vhost, "queue": name, "events": events, "scanned_to": oldest,
                  "first_seq": first_seq, "last_seq": last_seq})


def _queue_group(broker, vhost: str, name: str) -> int:
    """The queue group holding the queue's messages (and events), 0 for the metadata group's or
    an unknown queue, or with one group."""
    if broker.group_host is None:
        return 0
    v = broker.machine.vhosts.get(vhost)
    q = v.queues.get(name) if v is not None else None
    return q.group if q is not None else 0


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/raftmq/sessions", list_sessions)
    app.router.add_get("/api/raftmq/held", held)
    app.router.add_get("/api/raftmq/queues/{vhost}/{name}/events", queue_events)
