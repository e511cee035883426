"""Content headers and the basic class's properties (0-9-1 general spec 4.2.6, reference class basic).

The broker keeps a message's properties as the raw property bytes it was published with (flags then
values) and hands them back unchanged on delivery: no decode/encode on the hot path.  It only looks
inside them for delivery-mode, priority and expiration (:func:`peek_properties`, which also checks
that the whole property list is well formed) and, when dead-lettering, for the headers
(:func:`decode_properties` / :func:`encode_properties`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from struct import Struct
from struct import error as StructError

from .errors import AMQPSyntaxError, FrameError
from .fieldtable import decode_table, encode_table

_HEADER = Struct(">HHQ")  # class-id, weight, body-size
_U16 = Struct(">H")
_U32 = Struct(">I")
_U64 = Struct(">Q")

#: (attribute, type) of the basic class's properties in flag order: bit 15 is the first.
BASIC_PROPERTIES = (
    ("content_type", "shortstr"),
    ("content_encoding", "shortstr"),
    ("headers", "table"),
    ("delivery_mode", "octet"),
    ("priority", "octet"),
    ("correlation_id", "shortstr"),
    ("reply_to", "shortstr"),
    ("expiration", "shortstr"),
    ("message_id", "shortstr"),
    ("timestamp", "timestamp"),
    ("type", "shortstr"),
    ("user_id", "shortstr"),
    ("app_id", "shortstr"),
    ("cluster_id", "shortstr"),
)
_FLAG = {name: 1 << (15 - i) for i, (name, _) in enumerate(BASIC_PROPERTIES)}
_DELIVERY_MODE, _PRIORITY, _EXPIRATION = _FLAG["delivery_mode"], _FLAG["priority"], _FLAG["expiration"]


@dataclass(slots=True)
class BasicProperties:
    """The basic class's content properties; ``None`` means absent."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


assert tuple(f.name for f in fields(BasicProperties)) == tuple(n for n, _ in BASIC_PROPERTIES)


def _flags(buf: bytes, pos: int) -> tuple[int, int]:
    """Read the property flags (a 16-bit word per 15 properties, bit 0 says another word follows).

    Returns the flags of the first word (the basic class has 14 properties) and the offset after the
    last word; bits in continuation words name properties the basic class does not have.
    """
    (first,) = _U16.unpack_from(buf, pos)
    pos += 2
    word = first
    while word & 1:
        (word,) = _U16.unpack_from(buf, pos)
        pos += 2
        if word & ~1:
            raise AMQPSyntaxError("property flags name a property the basic class does not have", 60)
    if first & 0b10:
        raise AMQPSyntaxError("property flag 1 is reserved", 60)
    return first & ~1, pos


def decode_content_header(payload: bytes) -> tuple[int, int, bytes]:
    """Split a content header payload into (class-id, body-size, property bytes)."""
    try:
        class_id, _weight, body_size = _HEADER.unpack_from(payload, 0)
    except StructError as exc:
        raise FrameError("content header shorter than 14 bytes") from exc
    if len(payload) < 14:
        raise FrameError("content header has no property flags")
    return class_id, body_size, payload[12:]


def encode_content_header(class_id: int, body_size: int, properties: bytes) -> bytes:
    return _HEADER.pack(class_id, 0, body_size) + properties


_PEEKED: dict[bytes, tuple[int | None, int | None, str | None]] = {}
_PEEK_CACHE_BYTES = 64  # property blocks up to this size are remembered (publishers repeat theirs)
_PEEK_CACHE_ENTRIES = 1024


def peek_properties(properties: bytes) -> tuple[int | None, int | None, str | None]:
    """(delivery-mode, priority, expiration) of raw property bytes, checking the list is well formed.

    Raises :class:`FrameError` (501) when a value overruns the header and :class:`AMQPSyntaxError`
    (502) for reserved flags or a string that is not UTF-8.  The headers table is skipped by its
    length here; it is decoded only when something needs it (headers exchange, dead-lettering).

    A publisher sends the same few small property blocks again and again (pika's persistent
    messages: ``10 00 02``), so the results for small well-formed blocks are remembered.
    """
    peeked = _PEEKED.get(properties)
    if peeked is not None:
        return peeked
    peeked = _peek(properties)
    if len(properties) <= _PEEK_CACHE_BYTES:
        if len(_PEEKED) >= _PEEK_CACHE_ENTRIES:
            _PEEKED.clear()
        _PEEKED[properties] = peeked
    return peeked


def _peek(properties: bytes) -> tuple[int | None, int | None, str | None]:
    if properties == b"\x00\x00":
        return None, None, None
    delivery_mode = priority = expiration = None
    try:
        flags, pos = _flags(properties, 0)
        for name, typ in BASIC_PROPERTIES:
            bit = _FLAG[name]
            if not flags & bit:
                continue
            if typ == "shortstr":
                size = properties[pos]
                if bit == _EXPIRATION:
                    expiration = str(properties[pos + 1:pos + 1 + size], "utf-8")
                pos += 1 + size
            elif typ == "octet":
                value = properties[pos]
                if bit == _DELIVERY_MODE:
                    delivery_mode = value
                elif bit == _PRIORITY:
                    priority = value
                pos += 1
            elif typ == "table":
                (size,) = _U32.unpack_from(properties, pos)
                pos += 4 + size
            else:  # timestamp
                pos += 8
    except (StructError, IndexError) as exc:
        raise FrameError("truncated content properties", 60) from exc
    except UnicodeDecodeError as exc:
        raise AMQPSyntaxError("expiration is not UTF-8", 60) from exc
    if pos > len(properties):
        raise FrameError("content properties overrun the content header", 60)
    return delivery_mode, priority, expiration


def decode_properties(properties: bytes) -> BasicProperties:
    """Decode raw property bytes into :class:`BasicProperties`."""
    props = BasicProperties()
    try:
        flags, pos = _flags(properties, 0)
        for name, typ in BASIC_PROPERTIES:
            if not flags & _FLAG[name]:
                continue
            value: object
            if typ == "shortstr":
                size = properties[pos]
                value = str(properties[pos + 1:pos + 1 + size], "utf-8")
                pos += 1 + size
            elif typ == "octet":
                value = properties[pos]
                pos += 1
            elif typ == "table":
                value, pos = decode_table(properties, pos)
            else:
                (value,) = _U64.unpack_from(properties, pos)
                pos += 8
            setattr(props, name, value)
    except (StructError, IndexError) as exc:
        raise FrameError("truncated content properties", 60) from exc
    except UnicodeDecodeError as exc:
        raise AMQPSyntaxError("a content property is not UTF-8", 60) from exc
    if pos > len(properties):
        raise FrameError("content properties overrun the content header", 60)
    return props


def encode_properties(props: BasicProperties) -> bytes:
    """Encode :class:`BasicProperties` into property bytes (flags then values)."""
    flags = 0
    parts: list[bytes] = []
    for name, typ in BASIC_PROPERTIES:
        value = getattr(props, name)
        if value is None:
            continue
        flags |= _FLAG[name]
        if typ == "shortstr":
            raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            if len(raw) > 255:
                raise ValueError(f"property {name} longer than 255 bytes")
            parts.append(bytes((len(raw),)) + raw)
        elif typ == "octet":
            parts.append(bytes((value,)))
        elif typ == "table":
            parts.append(encode_table(value))
        else:
            parts.append(_U64.pack(value))
    return _U16.pack(flags) + b"".join(parts)
