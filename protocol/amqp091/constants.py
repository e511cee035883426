"""Wire constants of AMQP 0-9-1 (reference section "Constants")."""

from __future__ import annotations

from enum import IntEnum

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))

FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
#: Bytes a frame adds around its payload: type (1), channel (2), size (4) and frame-end (1).
FRAME_OVERHEAD = 8
#: The smallest frame_max a peer may negotiate (reference: constant frame-min-size).
FRAME_MIN_SIZE = 4096

BASIC_CLASS_ID = 60


class ReplyCode(IntEnum):
    """Reply codes of the 0-9-1 reference (soft errors close a channel, hard errors the connection)."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541
