"""Commands: the only way broker state changes.

A command is a plain list ``[op, conn, token, *args]`` so that it packs with msgpack and can travel
through a Raft log unchanged. ``conn`` is the connection id that issued it (None for internal
commands), ``token`` the issuer's request id to answer (None when no reply is wanted). The state
machine applies a *batch* of commands with one timestamp stamped by the proposer (the leader), so
apply never reads a clock.

Results are ``(OK, value)`` or ``(ERR, reply_code, reply_text)``; the reply codes are AMQP 0-9-1's,
which every front end translates for its own protocol.
"""

from __future__ import annotations

from enum import IntEnum

import msgpack

from .versions import COMMAND_FORMAT, check


class Op(IntEnum):
    CHANNEL_OPEN = 1
    CHANNEL_CLOSE = 2
    CONNECTION_CLOSE = 3
    QOS = 4
    FLOW = 5
    EXCHANGE_DECLARE = 10
    EXCHANGE_DELETE = 11
    EXCHANGE_BIND = 12
    EXCHANGE_UNBIND = 13
    QUEUE_DECLARE = 20
    QUEUE_BIND = 21
    QUEUE_UNBIND = 22
    QUEUE_PURGE = 23
    QUEUE_DELETE = 24
    CONSUME = 30
    CANCEL = 31
    PUBLISH = 32
    GET = 33
    ACK = 34
    NACK = 35
    RECOVER = 36
    TX_COMMIT = 40
    TICK = 50
    MEMBER_SET = 52  # (node_id, raft_address, amqp_address): a cluster member announces itself
    MEMBER_REMOVE = 53  # (node_id,): a member left the Raft configuration
    SESSION_ATTACH = 70  # AMQP 0-10 sessions and subscriptions: see store/sessions.py
    SESSION_DETACH = 71
    SESSION_TIMEOUT = 72
    SESSION_COMMAND = 73
    SESSION_KNOWN_COMPLETED = 74
    MESSAGE_SUBSCRIBE = 75
    MESSAGE_FLOW = 76
    MESSAGE_FLOW_MODE = 77
    MESSAGE_STOP = 78
    MESSAGE_FLUSH = 79
    MESSAGE_SETTLE = 80
    SESSION_TX_SELECT = 84
    MESSAGE_ACQUIRE = 85
    MESSAGE_RESUME = 86
    QUEUE_QUERY = 81  # read-only, through the log (linearizable): 0-10 queue.query
    EXCHANGE_QUERY = 82
    EXCHANGE_BOUND = 83
    NODE_RESET = 51  # (node_id, keep_boot): a node's old connections are gone (it died or restarted)
    VHOST_ADD = 60
    USER_PUT = 61  # users and permissions managed through the admin API: see store/users.py
    USER_DELETE = 62
    PERMISSION_SET = 63
    PERMISSION_CLEAR = 64
    SESSION_WINDOW_CREDIT = 87  # (destination, messages, bytes): 0-10 window credit for completed transfers


OK = 0
ERR = 1

# Publish outcomes (the value of an OK publish result).
ROUTED = 0
UNROUTABLE = 1
REJECTED = 2  # a queue with x-overflow=reject-publish refused it: nack the publisher

# Output kinds, the second item of every output tuple ``(conn, kind, ...)``.
OUT_REPLY = 0  # (conn, OUT_REPLY, token, result, channel)
OUT_DELIVER = 1  # (conn, OUT_DELIVER, channel, consumer_tag, delivery)
OUT_CANCEL = 2  # (conn, OUT_CANCEL, channel, consumer_tag): server-side consumer cancel
OUT_CLOSE = 3  # (conn, OUT_CLOSE, reply_code, reply_text): the cluster closed this connection
OUT_TRANSFER = 4  # (conn, OUT_TRANSFER, channel, destination, (transfer_id, qid, seq, redelivered, Message))
OUT_SESSION_DETACHED = 5  # (conn, OUT_SESSION_DETACHED, channel, name): the session moved elsewhere


def ok(value: object = None) -> tuple:
    return (OK, value)


def err(code: int, text: str) -> tuple:
    return (ERR, code, text)


# -- a batch of commands as it travels through the Raft log -------------------------------------------
# One byte of format version, then the msgpack array of commands.  A batch written before formats
# were numbered starts with msgpack's array header (0x90-0x9f, 0xdc, 0xdd), never with a byte
# below 0x80, so both read unambiguously.
_MSGPACK_ARRAY_MIN = 0x90


def encode_batch(commands: list[list]) -> bytes:
    return bytes((COMMAND_FORMAT,)) + msgpack.packb(commands, use_bin_type=True)


def decode_batch(blob: bytes | memoryview) -> list[list]:
    """The commands of a batch; FormatTooNew for a batch from a newer raftmq."""
    version = blob[0]
    if version >= _MSGPACK_ARRAY_MIN:
        return msgpack.unpackb(blob, raw=False, strict_map_key=False)  # unnumbered: version 1
    check("a batch in the log", version, COMMAND_FORMAT)
    return msgpack.unpackb(memoryview(blob)[1:], raw=False, strict_map_key=False)
