"""The audit history's format: event kinds, the LMDB layout, reading it, and consistent snapshots.

The state machine numbers events deterministically (``machine.event_seq`` is replicated state, so
the same event has the same sequence number on every node) and hands each applied batch's events
to an ``EventStore`` (``event_writer.py``), which appends them to its own LMDB environment,
``<data>/events``.  Events are derived data: they never feed back into the state.

The environment holds six tables (keys big-endian so that LMDB order is numeric order):

``events``     u64 seq -> ``[seq, time_us, kind, vhost, queue, message_id, exchange, routing_key,
               size, detail, raft_index]``.  ``detail`` is kind-specific text: the publisher's
               connection, the consumer tag, a dead-letter reason and target, an exclusive
               queue's owner, a binding's destination.  ``time_us`` never decreases with ``seq``
               (the machine keeps the largest leader-stamped time), so a time range is a
               sequence range.
``messages``   u64 message id -> ``[message_id, time_us, vhost, exchange, routing_key, size,
               publisher, properties, body, seq]``; ``properties`` are the AMQP 0-9-1 encoded
               basic properties, ``body`` is None unless retention keeps bodies.
``queues``     ``vhost NUL name`` -> ``[vhost, name, durable, exclusive, auto_delete, arguments,
               retention, declared_us, deleted_us]`` (arguments as JSON text).
``exchanges``  ``vhost NUL name`` -> ``[vhost, name, type, durable, auto_delete, internal,
               arguments, declared_us, deleted_us]``.
``bindings``   ``vhost NUL source NUL q|e NUL destination NUL key NUL arguments`` ->
               ``[vhost, source, destination, destination_type, routing_key, arguments,
               bound_us, unbound_us]``.
``meta``       ``raft_index`` (the last applied batch whose events are all written), ``first_seq``
               and ``last_seq`` (the retained range), ``gaps`` (ranges this node never saw: it
               installed a state snapshot instead of applying them).

A snapshot (:func:`snapshot`) is ``env.copy(compact=True)`` inside one read transaction: it holds
every event of every batch up to its ``raft_index`` and none after, even while the node writes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import lmdb
import msgpack

# Message events
PUBLISHED, DELIVERED, ACKED, REQUEUED, REJECTED, EXPIRED, DEAD_LETTERED, DROPPED, PURGED, DELETED = range(1, 11)
ROUTED, UNROUTABLE = 11, 12
# Definition events (the catalog: queues, exchanges, bindings)
QUEUE_DECLARED, QUEUE_DELETED, EXCHANGE_DECLARED, EXCHANGE_DELETED, BOUND, UNBOUND = range(13, 19)
# Issue 21: a message held by a delayed exchange (detail: the delay in ms), released from it (detail:
# microseconds after its due time), and a duplicate not enqueued / not routed (detail: "queue" for a
# deduplicating queue, "exchange" for an x-message-deduplication exchange)
DELAYED, DELAY_RELEASED, DEDUPLICATED = 19, 20, 21

KIND_NAMES = {PUBLISHED: "published", DELIVERED: "delivered", ACKED: "acked", REQUEUED: "requeued",
              REJECTED: "rejected", EXPIRED: "expired", DEAD_LETTERED: "dead_lettered", DROPPED: "dropped",
              PURGED: "purged", DELETED: "deleted", ROUTED: "routed", UNROUTABLE: "unroutable",
              QUEUE_DECLARED: "queue_declared", QUEUE_DELETED: "queue_deleted",
              EXCHANGE_DECLARED: "exchange_declared", EXCHANGE_DELETED: "exchange_deleted",
              BOUND: "bound", UNBOUND: "unbound", DELAYED: "delayed", DELAY_RELEASED: "delay_released",
              DEDUPLICATED: "deduplicated"}
DEFINITION_KINDS = frozenset(range(QUEUE_DECLARED, UNBOUND + 1))

RETENTIONS = ("none", "metadata", "body")
RETENTION_ARGUMENT = "x-audit-retention"  # a queue argument overriding the node's retention

EVENT_FIELDS = ("seq", "time_us", "kind", "vhost", "queue", "message_id", "exchange", "routing_key", "size",
                "detail", "raft_index")
MESSAGE_FIELDS = ("message_id", "time_us", "vhost", "exchange", "routing_key", "size", "publisher",
                  "properties", "body", "seq")
QUEUE_FIELDS = ("vhost", "name", "durable", "exclusive", "auto_delete", "arguments", "retention",
                "declared_us", "deleted_us")
EXCHANGE_FIELDS = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments",
                   "declared_us", "deleted_us")
BINDING_FIELDS = ("vhost", "source", "destination", "destination_type", "routing_key", "arguments",
                  "bound_us", "unbound_us")
TABLES = ("events", "messages", "queues", "exchanges", "bindings", "meta")

U64 = struct.Struct(">Q")


def name_key(*parts: str) -> bytes:
    return "\0".join(parts).encode()


def open_tables(env: lmdb.Environment, create: bool, txn: lmdb.Transaction | None = None) -> dict:
    """The environment's named tables (``create=False``: only those that exist)."""
    tables = {}
    for name in TABLES:
        try:
            tables[name] = env.open_db(name.encode(), txn=txn, create=create)
        except lmdb.NotFoundError:
            pass
    return tables


@dataclass(frozen=True)
class HistoryInfo:
    """What a history (live or snapshot) holds."""

    raft_index: int
    first_seq: int
    last_seq: int
    events: int
    messages: int
    gaps: list


def _meta(txn: lmdb.Transaction, db, key: bytes, default):
    value = txn.get(key, db=db) if db is not None else None
    return msgpack.unpackb(value) if value is not None else default


def info(txn: lmdb.Transaction, tables: dict) -> HistoryInfo:
    meta = tables.get("meta")

    def count(name: str) -> int:
        db = tables.get(name)
        return txn.stat(db)["entries"] if db is not None else 0

    return HistoryInfo(raft_index=_meta(txn, meta, b"raft_index", 0), first_seq=_meta(txn, meta, b"first_seq", 0),
                       last_seq=_meta(txn, meta, b"last_seq", 0), events=count("events"),
                       messages=count("messages"), gaps=_meta(txn, meta, b"gaps", []))


def open_history(path: str) -> lmdb.Environment:
    """Open a history read-only: a live one (it has a lock file) with LMDB's reader lock, a frozen
    snapshot copy (no lock file) without, so that reading a snapshot never writes to it."""
    live = os.path.exists(os.path.join(path, "lock.mdb"))
    return lmdb.open(path, readonly=True, lock=live, max_dbs=len(TABLES) + 1, map_size=0)


def history_info(path: str) -> HistoryInfo:
    env = open_history(path)
    try:
        with env.begin() as txn:
            return info(txn, open_tables(env, create=False, txn=txn))
    finally:
        env.close()


def read_events(path: str, start: int = 0, stop: int | None = None) -> Iterator[list]:
    """Yield event records (see the module docstring) with start <= seq < stop, in order."""
    yield from read_table(path, "events", start, stop)


def read_table(path: str, table: str, start: int = 0, stop: int | None = None) -> Iterator[list]:
    """Yield a table's records in key order; ``start``/``stop`` bound the key of the u64-keyed
    tables (``events``, ``messages``) and must be left out for the catalog tables."""
    env = open_history(path)
    try:
        yield from records(env, table, start, stop)
    finally:
        env.close()


def records(env: lmdb.Environment, table: str, start: int = 0, stop: int | None = None) -> Iterator[list]:
    """``read_table`` on an environment already open (LMDB allows one handle per process)."""
    with env.begin() as txn:
        db = open_tables(env, create=False, txn=txn).get(table)
        if db is None:
            return
        cursor = txn.cursor(db=db)
        if not (cursor.set_range(U64.pack(start)) if start else cursor.first()):
            return
        for key, value in cursor:
            if stop is not None and U64.unpack(key)[0] >= stop:
                return
            yield msgpack.unpackb(value, raw=False)


def snapshot(path: str, destination: str) -> HistoryInfo:
    """Write a compact, consistent copy of a (possibly running) node's history to an empty directory."""
    env = open_history(path)
    try:
        return copy_snapshot(env, destination)
    finally:
        env.close()


def copy_snapshot(env: lmdb.Environment, destination: str) -> HistoryInfo:
    """``snapshot`` from an environment already open (the node's own, for the admin API)."""
    os.makedirs(destination, exist_ok=True)
    if os.listdir(destination):
        raise ValueError(f"snapshot destination {destination} must be empty")
    with env.begin() as txn:
        tables = open_tables(env, create=False, txn=txn)
        env.copy(destination, compact=True, txn=txn)
        return info(txn, tables)
