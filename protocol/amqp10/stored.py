"""The stored form of an AMQP 1.0 message's properties (format ``AMQP100``, store/message.py).

A message published with 1.0 is stored as the publisher encoded it: the sections before the body
(header, message-annotations, properties, application-properties; 1.0 3.2) in these bytes, the body
in the message body.  Layout (:func:`pack`)::

    flags (1 octet) | length of A (uint32) | A: header + message-annotations | B: properties + application-properties

A (what a broker may change, re-encoded per delivery) and B (the bare message's properties, sent
back byte for byte) are split so that a delivery needs no parsing of B.  ``flags``:
:data:`BODY_SECTIONS` when the body holds 1.0 body sections as sent (amqp-value, amqp-sequence,
several data sections; checked when published), :data:`BODY_UNCHECKED` when a message converted from
another protocol claims so (basic ``type`` ``amqp-1.0``: checked when delivered); else the body is
the octets of one data section.

Also here: sections with the spans of their octets, and maps read and written entry by entry with
each entry's octets, so that a rewrite keeps the octets (and 1.0 types) of whatever it did not touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct
from typing import Any

from . import performatives as p
from . import types as t
from .errors import DecodeError

BODY_SECTIONS = 0x01
BODY_UNCHECKED = 0x02
_LAYOUT = Struct(">BI")


def pack(flags: int, annotated: bytes, bare: bytes) -> bytes:
    return _LAYOUT.pack(flags, len(annotated)) + annotated + bare


EMPTY = pack(0, b"", b"")


def unpack(raw: bytes) -> tuple[int, bytes, bytes]:
    """(flags, header + message-annotations octets, properties + application-properties octets)."""
    if len(raw) < 5:
        raise ValueError("1.0 stored sections: shorter than their layout")
    flags, n = _LAYOUT.unpack_from(raw)
    if flags & ~(BODY_SECTIONS | BODY_UNCHECKED) or 5 + n > len(raw):
        raise ValueError("1.0 stored sections: bad layout")
    return flags, raw[5:5 + n], raw[5 + n:]


def spans(buf: bytes) -> list[tuple[Any, int, int]]:
    """Each section of ``buf`` with where its octets start and end; raises DecodeError."""
    out = []
    pos, end = 0, len(buf)
    budget = [t.MAX_ZERO_WIDTH_ELEMENTS]
    while pos < end:
        section, after = p.decode_described(buf, pos, end, "section", budget)
        out.append((section, pos, after))
        pos = after
    return out


def entries(buf: bytes, start: int, end: int) -> dict[Any, tuple[Any, bytes]]:
    """The entries of the map section at ``buf[start:end]``: key -> (value, the entry's octets)."""
    _descriptor, pos = t.decode_value(buf, start + 1, end)
    code = buf[pos]
    if code == 0xC1:
        count, pos = buf[pos + 2], pos + 3
    elif code == 0xD1:
        count, pos = int.from_bytes(buf[pos + 5:pos + 9], "big"), pos + 9
    else:
        return {}
    out: dict[Any, tuple[Any, bytes]] = {}
    for _ in range(count // 2):
        key, after_key = t.decode_value(buf, pos, end)
        value, after = t.decode_value(buf, after_key, end)
        out[key] = (p.from_described(value), buf[pos:after])
        pos = after
    return out


def encode_map(section: type, items: dict[Any, tuple[Any, bytes]]) -> bytes:
    return section._PREFIX + t.encode_compound("map8", "map32", 2 * len(items),
                                               b"".join(raw for _v, raw in items.values()))


@dataclass(slots=True)
class Sections:
    """The stored sections, parsed: what :class:`Amqp10Format` reads and rewrites."""

    flags: int
    header: Any = None
    header_raw: bytes = b""
    annotations: dict[Any, tuple[Any, bytes]] | None = None  # message-annotations entries
    annotations_raw: bytes = b""
    properties: Any = None
    properties_raw: bytes = b""
    application: dict[Any, tuple[Any, bytes]] | None = None
    application_raw: bytes = b""


def parse(raw: bytes) -> Sections:
    """The sections of stored bytes; ValueError if they do not decode."""
    flags, annotated, bare = unpack(raw)
    out = Sections(flags)
    try:
        for buf in (annotated, bare):
            for section, start, end in spans(buf):
                cls = section.__class__
                if cls is p.Header:
                    out.header, out.header_raw = section, buf[start:end]
                elif cls is p.MessageAnnotations:
                    out.annotations, out.annotations_raw = entries(buf, start, end), buf[start:end]
                elif cls is p.Properties:
                    out.properties, out.properties_raw = section, buf[start:end]
                elif cls is p.ApplicationProperties:
                    out.application, out.application_raw = entries(buf, start, end), buf[start:end]
    except (DecodeError, IndexError) as exc:
        raise ValueError(f"1.0 stored sections do not decode: {exc}") from exc
    return out


def entry(key: Any, value: Any, annotation: bool) -> tuple[Any, bytes]:
    key_raw = p._annotation_key(key) if annotation else t.encode_value(str(key))
    return value, key_raw + t.encode_value(value)
