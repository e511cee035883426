"""The audit history's vocabulary: event kinds and record fields (no I/O).

The state machine numbers and records events (``machine.event``) with these kinds; the node writes
them to its history (``store/disk/event_writer.py``, format in ``store/disk/history.py``) and the
Spark data source reads them back by these field names.
"""

from __future__ import annotations

import hashlib

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
TABLES = ("events", "messages", "queues", "exchanges", "bindings", "meta", "chain")  # chain: issue 36
CATALOG_TABLES = ("queues", "exchanges", "bindings")

# Issue 36: the tamper-evidence chain (docs/design.md "Tamper evidence: the event chain").  Every
# applied batch with events moves the replicated ``StateMachine.chain_head`` on:
#     head = SHA-256(previous head || msgpack(chained fields of each event of the batch, in seq order))
# over every event the machine numbers, kept by this node's retention or not.  The chained fields
# are an event record (EVENT_FIELDS) without its ``raft_index`` (slot 10: the machine's message or
# definition there, which is not chained); fields added after slot 10 are chained too.  One hash
# per batch over the packed events costs the apply path about half what a hash per event did
# (docs/benchmarks.md); the history writer keeps each kept event's seal CRC beside (a hint, not a
# proof: store/disk/history.py "chain"), so that a verifier can name the event that was changed.
CHAIN_ZERO = bytes(32)  # the head before the first event
CHAIN_TABLE = "chain"  # the history's table of per-batch chain records (store/disk/history.py)
_sha256 = hashlib.sha256
_packb = msgpack.packb  # deterministic for the ints, str, bytes and None of events (the machine packs
# with its own Packer, the same encoding: a Packer is not shared between threads)


def chained_fields(record: list) -> list:
    """The fields of a stored event record that the chain covers: all but ``raft_index``."""
    return record[:10] + record[11:]


def chain_packed(fields: list | tuple) -> bytes:
    """One event's part of its batch's chained stream."""
    return _packb(fields)


def chain_next(previous: bytes, stream: bytes) -> bytes:
    """The head after a batch whose events packed one after the other are ``stream``."""
    return _sha256(previous + stream).digest()
