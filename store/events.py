"""The audit history: an append-only event log of what happened to every message.

The state machine numbers events deterministically (``machine.event_seq`` is replicated state, so
the same event has the same sequence number on every node) and hands each batch's events to an
``EventStore``, which appends them to its own LMDB environment (``<data>/events``). Events are
derived data: they never feed back into the state, so a node may keep them or not
(``audit_retention``), and keeping them costs one LMDB put per event in the batch's write.

Record (msgpack list, key = u64 sequence, big-endian):
``[seq, time_us, kind, vhost, queue, message_id, exchange, routing_key, size, detail, body]``
where ``detail`` is kind-specific text (the consumer tag, the dead-letter reason and target, the
queues a publish was routed to) and ``body`` is the message body when retention is ``body``.

Snapshots for Spark are compact copies of this environment taken while the node runs
(``raftmq snapshot``): LMDB copies through a read transaction, so a copy holds exactly the events
up to some sequence and none after.
"""

from __future__ import annotations

import os
import struct

import lmdb
import msgpack

PUBLISHED, DELIVERED, ACKED, REQUEUED, REJECTED, EXPIRED, DEAD_LETTERED, DROPPED, PURGED, DELETED = range(1, 11)
KIND_NAMES = {PUBLISHED: "published", DELIVERED: "delivered", ACKED: "acked", REQUEUED: "requeued",
              REJECTED: "rejected", EXPIRED: "expired", DEAD_LETTERED: "dead_lettered", DROPPED: "dropped",
              PURGED: "purged", DELETED: "deleted"}
RETENTIONS = ("none", "metadata", "body")
FIELDS = ("seq", "time_us", "kind", "vhost", "queue", "message_id", "exchange", "routing_key", "size",
          "detail", "body")

_KEY = struct.Struct(">Q")


class EventStore:
    """Appends event batches to ``<path>`` (an LMDB environment with one table, ``events``)."""

    def __init__(self, path: str, retention: str = "metadata", map_size: int = 1 << 40) -> None:
        if retention not in RETENTIONS:
            raise ValueError(f"audit retention must be one of {RETENTIONS}, not {retention!r}")
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.retention = retention
        self.env = lmdb.open(path, map_size=map_size, max_dbs=2, sync=False, metasync=False)
        self.db = self.env.open_db(b"events")
        self.written = 0
        with self.env.begin(db=self.db) as txn:
            cursor = txn.cursor()
            self.last_seq = _KEY.unpack(cursor.key())[0] if cursor.last() else 0

    def append(self, events: list[list]) -> None:
        """Append a batch; events at or below the last stored sequence are a replay (the journal after
        a restart) and are skipped."""
        keep_body = self.retention == "body"
        with self.env.begin(write=True, db=self.db) as txn:
            for event in events:
                if event[0] <= self.last_seq:
                    continue
                if not keep_body:
                    event[10] = None
                txn.put(_KEY.pack(event[0]), msgpack.packb(event, use_bin_type=True), append=True)
                self.last_seq = event[0]
                self.written += 1

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()


def read_events(path: str, start: int = 0, stop: int | None = None):
    """Yield event records (lists, see the module docstring) with start <= seq < stop, in order."""
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=2, map_size=0)
    try:
        db = env.open_db(b"events", create=False)
        with env.begin(db=db) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(_KEY.pack(start)):
                return
            for key, value in cursor:
                if stop is not None and _KEY.unpack(key)[0] >= stop:
                    return
                yield msgpack.unpackb(value, raw=False)
    finally:
        env.close()


def snapshot(path: str, destination: str) -> int:
    """Write a compact, consistent copy of a (possibly running) node's event store; its last sequence."""
    os.makedirs(destination, exist_ok=True)
    if os.listdir(destination):
        raise ValueError(f"snapshot destination {destination} must be empty")
    env = lmdb.open(path, readonly=True, max_dbs=2, map_size=0)
    try:
        with env.begin() as txn:
            env.copy(destination, compact=True, txn=txn)
            db = env.open_db(b"events", txn=txn, create=False)
            cursor = txn.cursor(db=db)
            last = _KEY.unpack(cursor.key())[0] if cursor.last() else 0
    finally:
        env.close()
    return last
