"""The stored form of an AMQP 1.0 message's properties (format ``AMQP100``, store/core/message.py).

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

:func:`spans` decodes only the sections the node reads (header, message-annotations, properties,
application-properties), within an element budget (:func:`.types.new_budget`); the body sections
(data, amqp-value, amqp-sequence), delivery-annotations and the footer are walked over
(protocol/amqp10/skip.py: their constructor and size are checked, in O(1) per section, and no Python
object is built for what they hold).  The node never decodes a body: it stores and forwards its octets.
"""

from __future__ import annotations

from dataclasses import dataclass
from struct import Struct
from typing import Any, NamedTuple

from . import performatives as p
from . import types as t
from .described import DescribedClass
from .errors import DecodeError
from .skip import skip_value

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


class Span(NamedTuple):
    """One section of a message: its class, the section decoded (None when walked over), where its
    octets start and end, and where its value's constructor is (after the descriptor)."""

    cls: DescribedClass
    section: Any
    start: int
    end: int
    value_at: int


#: Sections walked over, not decoded: the node stores or drops them, never reads them.
WALKED = frozenset((p.Data, p.AmqpValue, p.AmqpSequence, p.DeliveryAnnotations, p.Footer))
#: Every section: walk a whole message (a body that another protocol says holds 1.0 sections).
ALL_SECTIONS = frozenset(p.BY_CODE[c] for c in p.BY_CODE if "section" in p.BY_CODE[c].PROVIDES)
#: The format codes a walked section's value may have (3.2.5-3.2.11): data a binary, amqp-sequence a
#: list, annotations and footer a map; amqp-value any value (None: not checked here).
_VALUE_CODES: dict[DescribedClass, frozenset[int] | None] = {
    p.Data: frozenset((0xA0, 0xB0)),
    p.AmqpSequence: frozenset((0x45, 0xC0, 0xD0)),
    p.AmqpValue: None,
    p.DeliveryAnnotations: frozenset((0xC1, 0xD1)),
    p.Footer: frozenset((0xC1, 0xD1)),
    p.Header: frozenset((0x45, 0xC0, 0xD0)),
    p.Properties: frozenset((0x45, 0xC0, 0xD0)),
    p.MessageAnnotations: frozenset((0xC1, 0xD1)),
    p.ApplicationProperties: frozenset((0xC1, 0xD1)),
}
_DESCRIPTOR_CODES = frozenset((0x44, 0x53, 0x80, 0xA3, 0xB3))  # ulong0, smallulong, ulong, sym8, sym32


def _section_class(buf, pos: int, end: int) -> tuple[DescribedClass, int]:
    """The section class whose descriptor is at ``pos`` (after the 0x00), and where its value starts."""
    if pos >= end or buf[pos] not in _DESCRIPTOR_CODES:
        raise DecodeError(f"a section's descriptor (a ulong or symbol) was expected at {pos}")
    if buf[pos] == 0x53 and pos + 1 < end:  # smallulong: what every client sends
        cls = p.BY_CODE.get(buf[pos + 1])
        if cls is not None and "section" in cls.PROVIDES:
            return cls, pos + 2
    after = skip_value(buf, pos, end, 1)
    descriptor, _ = t.decode_value(buf, pos, after, 1)
    if isinstance(descriptor, str):
        cls = p.BY_SYMBOL.get(descriptor)
    elif isinstance(descriptor, int):
        cls = p.BY_CODE.get(descriptor)
    else:  # a descriptor is a ulong or a symbol (1.5)
        cls = None
    if cls is None or "section" not in cls.PROVIDES:
        raise DecodeError(f"expected a section, got the descriptor {descriptor!r}")
    return cls, after


def spans(buf: bytes, elements: int | None = None, walked: frozenset = WALKED) -> list[Span]:
    """Each section of ``buf`` (:class:`Span`); raises DecodeError.

    Sections of a class in ``walked`` are walked over (:func:`.skip.skip_value`), the others decoded
    with one element budget for all of them (``elements``; None: unlimited, for stored octets, which
    passed the budget when published)."""
    out = []
    pos, end = 0, len(buf)
    budget = t.new_budget(elements)
    while pos < end:
        if buf[pos] != 0x00:
            raise DecodeError(f"a section (a described value) was expected at {pos}")
        cls, value_at = _section_class(buf, pos + 1, end)
        if cls in walked:
            codes = _VALUE_CODES.get(cls)
            if value_at >= end:
                raise DecodeError(f"the {cls.NAME} section at {pos} has no value")
            if codes is not None and buf[value_at] not in codes:
                raise DecodeError(f"the {cls.NAME} section's value has the format code {buf[value_at]:#04x}")
            after = skip_value(buf, value_at, end, 1)
            out.append(Span(cls, None, pos, after, value_at))
        else:
            section, after = p.decode_described(buf, pos, end, "section", budget)
            out.append(Span(cls, section, pos, after, value_at))
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


def encode_map(section: DescribedClass, items: dict[Any, tuple[Any, bytes]]) -> bytes:
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
            for cls, section, start, end, _at in spans(buf):
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
