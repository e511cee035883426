"""AMQP 1.0 message octets to and from what the core stores (format ``AMQP100``, protocol/amqp10/stored.py).

Publishing (:func:`publish_of`): the sections of a delivery are checked and stored as sent: header and
message-annotations, properties and application-properties (decoded, within the element budget
``amqp10_max_message_elements``) in the stored properties (``stored.pack``); delivery-annotations (for
this hop only, 3.2.1) and the footer are not kept.  The body is never decoded (``stored.spans`` walks
over it): it is the octets of a single data section, else the body sections as sent
(``BODY_SECTIONS``).
What the core needs besides (durable, priority, ttl) and what routing needs (``to``, ``subject``) are
read on the way.

Delivering (:func:`encode_delivery`): stored properties in format ``AMQP100`` (the publisher's own, or
another protocol's converted by ``store.core.message.properties_in``) and a body become a 1.0 message: a
header with the delivery's first-acquirer and delivery-count (the header ``x-delivery-count`` of a
quorum-style redelivery if there is one, else 1 for a redelivery), message-annotations with the
exchange and routing key the message was published with (``x-exchange``, ``x-routing-key``, as
RabbitMQ 4 sends them), then the properties and application-properties octets as stored, then the body.

Both ends cache what repeats from message to message (the sections before a data body when publishing,
everything before the body when delivering: messages published alike share one stored properties
object), so the usual message costs a dictionary lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import performatives as p
from . import stored

_BODY_SECTIONS = (p.Data, p.AmqpValue, p.AmqpSequence)
_DATA = b"\x00\x53\x75"  # the data section's descriptor (3.2.6, 0x75)
_MAX_CACHED = 1024
_MAX_PREFIX = 4096
#: Default element budget of a message's decoded sections (Config ``amqp10_max_message_elements``):
#: header, message-annotations, properties and application-properties together.  Applications put tens
#: of entries there (a message dead-lettered a hundred times carries ~1,000 in x-death); 65,536 costs at
#: 30-45 ms and a few MB to decode here (32,767 application-properties entries of ints or 40-octet
#: strings), a bound on what one publish can make the event loop do; it is as large as it is so that a
#: 0-9-1 headers table of a full 128 KiB header frame, converted to 1.0 and published again, still fits.
MESSAGE_ELEMENTS = 65536


@dataclass(slots=True)
class Published:
    """A 1.0 message as the core stores it, and what publishing reads of it."""

    properties: bytes  # format AMQP100
    body: bytes
    persistent: bool = False
    priority: int | None = None  # None: the default (4 in 1.0)
    ttl: int | None = None
    to: str | None = None
    subject: str | None = None


def _template(sections: list[stored.Span], buf: bytes, flags: int) -> Published:
    """What the non-body sections (with their spans in ``buf``) make; the body is the caller's."""
    annotated, bare = [], []
    out = Published(b"", b"")
    for cls, section, start, end, _at in sections:
        if cls is p.Header:
            annotated.append(buf[start:end])
            out.persistent = bool(section.durable)
            out.priority = None if section.priority is None or section.priority == 4 else int(section.priority)
            out.ttl = None if section.ttl is None else int(section.ttl)
        elif cls is p.MessageAnnotations:
            annotated.append(buf[start:end])
        elif cls is p.Properties:
            bare.append(buf[start:end])
            out.to, out.subject = section.to, section.subject
        elif cls is p.ApplicationProperties:
            bare.append(buf[start:end])
    out.properties = stored.pack(flags, b"".join(annotated), b"".join(bare))
    return out


def _decoded(payload: bytes, elements: int = MESSAGE_ELEMENTS) -> Published:
    sections = stored.spans(payload, elements)
    body = [s for s in sections if s.cls in _BODY_SECTIONS]
    if len(body) == 1 and body[0].cls is p.Data:
        at = body[0].value_at  # vbin8 or vbin32 (checked by the walk): the octets after its size
        flags, octets = 0, payload[at + (2 if payload[at] == 0xA0 else 5):body[0].end]
    elif not body:  # no body section (3.2 allows none): stored as "the body sections sent", i.e. none
        flags, octets = stored.BODY_SECTIONS, b""
    else:
        flags, octets = stored.BODY_SECTIONS, b"".join(payload[s.start:s.end] for s in body)
    out = _template([s for s in sections if s.cls not in _BODY_SECTIONS], payload, flags)
    out.body = octets
    return out


def _data_tail(payload: bytes) -> tuple[int, int] | None:
    """(start of a data section that ends ``payload`` exactly, start of its octets), or None.

    Candidates are searched from the end; the body may contain the same octets, so a few are tried.
    A candidate is only a guess: :func:`publish_of` decodes what precedes it and falls back to a full
    decode unless that is a clean sequence of non-body sections (then, encodings being self-delimiting,
    it is the one parse of the payload)."""
    end = len(payload)
    for _ in range(4):
        i = payload.rfind(_DATA, 0, end)
        if i < 0:
            return None
        code = payload[i + 3] if i + 3 < len(payload) else -1
        if code == 0xA0 and i + 5 <= len(payload) and i + 5 + payload[i + 4] == len(payload):
            return i, i + 5
        if code == 0xB0 and i + 8 <= len(payload) and i + 8 + int.from_bytes(payload[i + 4:i + 8], "big") == len(payload):
            return i, i + 8
        end = i + 2  # the next candidate starts before this one
    return None


_PUBLISHED: dict[bytes, Published] = {}  # sections before a trailing data section -> their template
_KEPT = (p.Header, p.MessageAnnotations, p.Properties, p.ApplicationProperties)
_SECTIONS_PUBLISHED: dict[bytes, Published] = {}  # kept sections of a body of sections -> their template
#: Payloads longer than this skip the guess of :func:`_data_tail` (an rfind through the body: ~150 ms
#: for 128 MiB here) and are walked at once (O(sections), whatever the body's size).
_MAX_GUESS = 64 * 1024


def _of_sections(payload: bytes, elements: int) -> Published:
    """:func:`_decoded`, with a cache: one walk over every section (nothing decoded), the template of
    the kept sections looked up by their octets, decoded only when new (a body of sections, as proton
    sends amqp-value by default; a large message; a data section followed by a footer)."""
    walk = stored.spans(payload, None, stored.ALL_SECTIONS)
    body = [s for s in walk if s.cls in _BODY_SECTIONS]
    if len(body) == 1 and body[0].cls is p.Data:
        flags, cache = 0, _PUBLISHED  # the same templates as the data-tail path's (kept sections, flags 0)
    else:
        flags, cache = stored.BODY_SECTIONS, _SECTIONS_PUBLISHED
    key = b"".join(payload[s.start:s.end] for s in walk if s.cls in _KEPT)
    template = cache.get(key)
    if template is None:
        template = _template(stored.spans(key, elements), key, flags)
        if len(key) <= _MAX_PREFIX:
            if len(cache) >= _MAX_CACHED:
                cache.clear()
            cache[key] = template
    if not flags:
        at = body[0].value_at  # vbin8 or vbin32 (checked by the walk): the octets after its size
        octets = payload[at + (2 if payload[at] == 0xA0 else 5):body[0].end]
    elif len(body) == 1:
        octets = payload[body[0].start:body[0].end]
    else:
        octets = b"".join(payload[s.start:s.end] for s in body)
    t = template
    return Published(t.properties, octets, t.persistent, t.priority, t.ttl, t.to, t.subject)


def publish_of(payload: bytes, elements: int = MESSAGE_ELEMENTS) -> Published:
    """The stored form of a delivery's octets; raises DecodeError (the delivery is rejected).

    ``elements``: the element budget of the sections decoded (:data:`MESSAGE_ELEMENTS`); the body is
    walked over, never decoded, so its size alone bounds its cost.  Fast for what most publishers send:
    the same sections before one data section, message after message (their template is looked up,
    not decoded)."""
    tail = _data_tail(payload) if len(payload) <= _MAX_GUESS else None
    if tail is not None:
        start, body_at = tail
        prefix = payload[:start]
        template = _PUBLISHED.get(prefix)
        if template is None and len(prefix) <= _MAX_PREFIX:
            try:
                sections = stored.spans(prefix, elements)
            except Exception:  # a guess inside the body: decode the whole payload instead
                sections = None
            if sections is not None and not any(s.cls in _BODY_SECTIONS for s in sections):
                template = _template(sections, prefix, 0)
                if len(_PUBLISHED) >= _MAX_CACHED:
                    _PUBLISHED.clear()
                _PUBLISHED[prefix] = template
        if template is not None:
            t = template
            return Published(t.properties, payload[body_at:], t.persistent, t.priority, t.ttl, t.to, t.subject)
    return _of_sections(payload, elements)


def _delivery_annotated(annotated: bytes, exchange: str, routing_key: str, redelivered: bool) -> bytes:
    """The header and message-annotations sent with a delivery, from the stored ones."""
    header = annotations = None
    for cls, section, start, end, _at in stored.spans(annotated):
        if cls is p.Header:
            header = section
        elif cls is p.MessageAnnotations:
            annotations = stored.entries(annotated, start, end)
    count = (annotations or {}).get("x-delivery-count", (None,))[0]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 1 << 32:
        count = 1 if redelivered else 0
    out = p.Header(durable=bool(header is not None and header.durable), first_acquirer=not redelivered,
                   delivery_count=count)
    if header is not None:
        out.priority, out.ttl = header.priority, header.ttl
    items = {"x-exchange": stored.entry("x-exchange", exchange, True),
             "x-routing-key": stored.entry("x-routing-key", routing_key, True)}
    for key, entry in (annotations or {}).items():
        if key not in items:
            items[key] = entry
    return out.encode() + stored.encode_map(p.MessageAnnotations, items)


_DELIVERED: dict[tuple, tuple[bytes, int]] = {}  # (stored, exchange, key, redelivered) -> (octets, flags)


def encode_delivery(properties: bytes, body: bytes, exchange: str, routing_key: str, redelivered: bool) -> bytes:
    """The octets of a 1.0 message for stored ``properties`` (format AMQP100) and ``body``."""
    key = (properties, exchange, routing_key, redelivered)
    cached = _DELIVERED.get(key)
    if cached is None:
        try:
            flags, annotated, bare = stored.unpack(properties)
        except ValueError:
            flags, annotated, bare = 0, b"", b""
        try:
            prefix = _delivery_annotated(annotated, exchange, routing_key, redelivered)
        except Exception:  # stored octets that do not decode (cannot happen for our own): none kept
            prefix = _delivery_annotated(b"", exchange, routing_key, redelivered)
        cached = (prefix + bare, flags)
        if len(_DELIVERED) >= _MAX_CACHED:
            _DELIVERED.clear()
        _DELIVERED[key] = cached
    head, flags = cached
    if flags & stored.BODY_SECTIONS:
        return head + body
    if flags & stored.BODY_UNCHECKED:  # another protocol's message that says its body is 1.0 sections
        try:
            walk = stored.spans(body, None, stored.ALL_SECTIONS)  # walked over, nothing decoded
            sections = [body[s.start:s.end] for s in walk if s.cls in _BODY_SECTIONS]
        except Exception:  # not 1.0 octets after all: sent as data
            sections = []
        if sections or not body:  # an empty body of 1.0 sections is a message without a body section
            return head + b"".join(sections)
    size = len(body)
    return head + (_DATA + b"\xa0" + bytes((size,)) if size < 256 else _DATA + b"\xb0" + size.to_bytes(4, "big")) + body


def encode(sections: list) -> bytes:
    return p.encode_sections(sections)
