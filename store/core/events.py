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
# Issue 36: who.  Noted by a node's front end and proposed through the log as an ``AuditNote``
# command (store/core/audit.py), so that every node records them in the same place of its history:
# a client connection opened and closed (the principal once per connection: user, protocol,
# address, connection name; per-message events carry the connection id in ``conn``), a login
# refused (detail: mechanism and reason), an operation refused for lack of a permission (queue or
# exchange: the resource; detail: the operation and the permission), and an administrative change
# (detail: what changed).
CONNECTION_OPENED, CONNECTION_CLOSED, LOGIN_REFUSED, ACCESS_REFUSED, ADMIN_CHANGE = range(22, 27)

KIND_NAMES = {PUBLISHED: "published", DELIVERED: "delivered", ACKED: "acked", REQUEUED: "requeued",
              REJECTED: "rejected", EXPIRED: "expired", DEAD_LETTERED: "dead_lettered", DROPPED: "dropped",
              PURGED: "purged", DELETED: "deleted", ROUTED: "routed", UNROUTABLE: "unroutable",
              QUEUE_DECLARED: "queue_declared", QUEUE_DELETED: "queue_deleted",
              EXCHANGE_DECLARED: "exchange_declared", EXCHANGE_DELETED: "exchange_deleted",
              BOUND: "bound", UNBOUND: "unbound", DELAYED: "delayed", DELAY_RELEASED: "delay_released",
              DEDUPLICATED: "deduplicated", CONNECTION_OPENED: "connection_opened",
              CONNECTION_CLOSED: "connection_closed", LOGIN_REFUSED: "login_refused",
              ACCESS_REFUSED: "access_refused", ADMIN_CHANGE: "admin_change"}
DEFINITION_KINDS = frozenset(range(QUEUE_DECLARED, UNBOUND + 1))
NOTE_KINDS = frozenset(range(CONNECTION_OPENED, ADMIN_CHANGE + 1))  # the kinds an AuditNote may carry

RETENTIONS = ("none", "metadata", "body")
RETENTION_ARGUMENT = "x-audit-retention"  # a queue argument overriding the node's retention
#: A ``delivered`` event's detail is the consumer tag ("" for basic.get); a delivery that needs no
#: acknowledgement (no-ack consumer or get, 1.0 pre-settled) is prefixed with this: it also ends the
#: message's life in the queue (no ``acked`` follows), which ``audit contents`` must know (issue 36).
NO_ACK = "no-ack:"

# ``conn``: the connection that acted (publish, deliver, get, ack, reject; the connection events),
# None where none did.  ``principal``: ``[user, protocol, address, connection name]`` on the
# AuditNote kinds, None on the others (their principal is their connection's: the ``connections``
# table).  Records written before issue 36 end at ``raft_index``.
EVENT_FIELDS = ("seq", "time_us", "kind", "vhost", "queue", "message_id", "exchange", "routing_key", "size",
                "detail", "raft_index", "conn", "principal")
PRINCIPAL_FIELDS = ("user", "protocol", "address", "connection_name")
CONNECTION_FIELDS = ("conn", "user", "vhost", "protocol", "address", "connection_name", "opened_us", "closed_us")
MESSAGE_FIELDS = ("message_id", "time_us", "vhost", "exchange", "routing_key", "size", "publisher",
                  "properties", "body", "seq")
QUEUE_FIELDS = ("vhost", "name", "durable", "exclusive", "auto_delete", "arguments", "retention",
                "declared_us", "deleted_us")
EXCHANGE_FIELDS = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments",
                   "declared_us", "deleted_us")
BINDING_FIELDS = ("vhost", "source", "destination", "destination_type", "routing_key", "arguments",
                  "bound_us", "unbound_us")
TABLES = ("events", "messages", "queues", "exchanges", "bindings", "meta", "connections", "chain")  # issue 36
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
