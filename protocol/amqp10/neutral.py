"""AMQP 1.0 messages as the core's neutral message (store/core/message.py, format ``AMQP100``).

A message published with 1.0 is stored as the publisher encoded it (protocol/amqp10/stored.py): a
1.0 consumer gets the properties and application-properties back byte for byte (the bare message is
immutable, 3.2) with every value's type as sent; the header and message-annotations, which a broker
may change, are re-encoded per delivery (protocol/amqp10/convert.py).

Other protocols read a 1.0 message through :class:`Amqp10Format` (RabbitMQ 4's conversion tables,
docs/amqp10.md and docs/message-mapping.md): header durable/priority/ttl; properties message-id,
correlation-id (a string of < 256 octets, uuid as ``urn:uuid:``, ulong as digits; anything else the
annotation ``x-message-id`` / ``x-correlation-id``), user-id, reply-to, content-type/-encoding,
creation-time (to the second), group-id as app_id; application-properties and message-annotations
whose key starts with ``x-`` as ``headers`` (``x-basic-type`` as ``type``).

Encoding neutral properties as 1.0 (a 0-9-1 or 0-10 message for a 1.0 consumer, and the core's header
helpers rewriting a 1.0 message: dead-lettering, x-delivery-count) starts from the stored sections
when the properties were decoded from them (their :class:`Annotations` remember the bytes) and changes
only what differs: a section nothing touched keeps its bytes, a map keeps the bytes of every entry
nothing touched.  Headers new to a message go to message-annotations when their name starts with
``x-`` (x-death, x-first-death-*, x-delivery-count), else to application-properties, whose values
1.0 restricts to simple types (3.2.5): a table or array there is dropped.
"""

from __future__ import annotations

import copy
import datetime
import uuid
from typing import Any

from raftmq.protocol.amqp091.fieldtable import Timestamp as FieldTableTimestamp
from raftmq.store.core.message import AMQP100, Properties
from raftmq.store.core.values import to_plain

from . import performatives as p
from . import types as t
from .stored import BODY_SECTIONS, BODY_UNCHECKED, Sections, encode_map, entry, pack, parse

AMQP10_TYPE = "amqp-1.0"  # neutral type of a message whose body is encoded 1.0 body sections
_URN = "urn:uuid:"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)
_ID_ANNOTATIONS = ("x-message-id", "x-correlation-id")


# ------------------------------------------------------------------------------------------ values
def _shortstr(value: str) -> bool:
    return len(value.encode("utf-8", "replace")) < 256 and "\x00" not in value


def value_to_neutral(value: Any) -> Any:
    """A 1.0 value as a header value other protocols can encode (docs/message-mapping.md)."""
    if value is None or value.__class__ in (bool, str, int, float, bytes):
        return value
    if isinstance(value, t.Timestamp):
        try:
            return _EPOCH + int(value) * _MS
        except OverflowError:
            return int(value) // 1000
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, t.Array):
        value = value.items
    if isinstance(value, list):
        return [value_to_neutral(v) for v in value]
    if isinstance(value, dict):
        return {str(k): value_to_neutral(v) for k, v in value.items()}
    return None  # described values: not carried


def value_to_amqp10(value: Any) -> Any:
    """A header value (any protocol's) as a 1.0 value: datetimes and 0-9-1 timestamps as timestamps."""
    if isinstance(value, FieldTableTimestamp):
        return t.Timestamp(int(value) * 1000)
    if value is None or isinstance(value, (bool, str, int, float, bytes, uuid.UUID)):
        return value
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return t.Timestamp((value - _EPOCH) // _MS)
    if isinstance(value, dict):
        return {str(k): value_to_amqp10(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [value_to_amqp10(v) for v in value]
    return to_plain(value)


def _simple(value: Any) -> bool:
    return not isinstance(value, (dict, list, tuple))


def _id_to_neutral(value: Any, name: str, annotations: dict) -> str | None:
    """A message-id / correlation-id as the neutral string, or in ``annotations[name]``."""
    if isinstance(value, uuid.UUID):
        return _URN + str(value)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if _shortstr(value):
            return str(value)
        annotations[name] = str(value)
        return None
    if isinstance(value, bytes):
        annotations[name] = bytes(value)
    return None


def _id_to_amqp10(value: str) -> Any:
    if value.startswith(_URN):
        try:
            return uuid.UUID(value[len(_URN):])
        except ValueError:
            pass
    return value


class Annotations(dict):
    """The ``annotations`` of neutral properties decoded from stored 1.0 sections: a dict for everyone
    else, which also remembers those sections (``source``), so that encoding the properties again
    changes only what was changed.  (Not a Properties subclass: code that lists a Properties' fields
    by its ``__slots__``, as the HTTP API does, sees the usual ones; ``dataclasses.replace`` keeps
    the same annotations object, so the core's header helpers keep the source.)"""

    __slots__ = ("source",)

    def __init__(self, items: dict, source: bytes | None) -> None:
        super().__init__(items)
        self.source = source


def _neutral(s: Sections, raw: bytes | None) -> Properties:
    props = Properties()
    headers: dict[str, Any] = {}
    annotations: dict[str, Any] = {}
    h = s.header
    if h is not None:
        props.delivery_mode = 2 if h.durable else 1
        if h.priority is not None and h.priority != 4:
            props.priority = int(h.priority)
        if h.ttl is not None:
            props.expiration = str(int(h.ttl))
    for key, (value, _raw) in (s.annotations or {}).items():
        if isinstance(key, str) and key.startswith("x-") and _shortstr(key):
            if key == "x-basic-type":
                props.type = str(value) if isinstance(value, str) else None
            else:
                headers[str(key)] = value_to_neutral(value)
    mp = s.properties
    if mp is not None:
        if mp.message_id is not None:
            props.message_id = _id_to_neutral(mp.message_id, "x-message-id", annotations)
        if mp.correlation_id is not None:
            props.correlation_id = _id_to_neutral(mp.correlation_id, "x-correlation-id", annotations)
        if mp.user_id is not None:
            props.user_id = bytes(mp.user_id).decode("utf-8", "replace")
        if mp.reply_to is not None and _shortstr(mp.reply_to):
            props.reply_to = str(mp.reply_to)
        if mp.content_type is not None:
            props.content_type = str(mp.content_type)
        if mp.content_encoding is not None:
            props.content_encoding = str(mp.content_encoding)
        if mp.creation_time is not None:
            props.timestamp = int(mp.creation_time) // 1000
        if mp.group_id is not None and _shortstr(mp.group_id):
            props.app_id = str(mp.group_id)
    for key, (value, _raw) in (s.application or {}).items():
        if isinstance(key, str) and _shortstr(key):
            headers[str(key)] = value_to_neutral(value)
    if s.flags & (BODY_SECTIONS | BODY_UNCHECKED):
        props.type = AMQP10_TYPE
    props.headers = headers or None
    props.annotations = Annotations(annotations, raw)
    return props


def _header_key(props: Properties) -> tuple:
    return props.delivery_mode, props.priority, props.expiration


def _new_header(base, props: Properties):
    h = p.Header(**{f.attr: getattr(base, f.attr) for f in p.Header.FIELDS}) if base is not None else p.Header()
    h.durable = props.delivery_mode == 2
    h.priority = props.priority if props.priority is not None else 4
    e = props.expiration
    h.ttl = int(e) if e is not None and e.isdigit() and int(e) < 1 << 32 else None
    return h


def _wanted_id(props: Properties, name: str, field: str, headers: dict) -> tuple[Any, bool]:
    """The 1.0 message-id / correlation-id for neutral ``props``, and whether it came from ``headers``
    (an id 0-9-1 could not carry comes back from its annotation or header, as RabbitMQ 4 does)."""
    value = getattr(props, name)
    if value is not None:
        return _id_to_amqp10(value), False
    if isinstance(props.annotations.get(field), (str, bytes)):
        return props.annotations[field], False
    if isinstance(headers.get(field), (str, bytes)):
        return headers[field], True
    return None, False


def _amqp10_fields(props: Properties, headers: dict) -> dict[str, Any]:
    """The 1.0 properties-section fields that neutral ``props`` give (attribute -> value)."""
    return {
        "message_id": _wanted_id(props, "message_id", "x-message-id", headers),
        "correlation_id": _wanted_id(props, "correlation_id", "x-correlation-id", headers),
        "user_id": None if props.user_id is None else props.user_id.encode(),
        "reply_to": props.reply_to,
        "content_type": None if props.content_type is None else t.Symbol(props.content_type),
        "content_encoding": None if props.content_encoding is None else t.Symbol(props.content_encoding),
        "creation_time": None if props.timestamp is None else t.Timestamp(int(props.timestamp) * 1000),
        "group_id": props.app_id,
    }


def _properties_raw(s: Sections, props: Properties, old: Properties, headers: dict) -> bytes:
    """The properties section for ``props``: the stored one's octets when no field of it changed, else
    the stored section with the changed fields replaced.  An id taken from a header leaves ``headers``."""
    new_fields = _amqp10_fields(props, headers)
    old_fields = _amqp10_fields(old, old.headers or {})
    changed = {name: value for name, value in new_fields.items() if value != old_fields[name]}
    if not changed:
        return s.properties_raw
    base = s.properties
    mp = p.Properties(**{f.attr: getattr(base, f.attr) for f in p.Properties.FIELDS}) if base is not None \
        else p.Properties()
    for name, value in changed.items():
        if name in ("message_id", "correlation_id"):
            value, from_header = value
            if from_header:
                headers.pop("x-message-id" if name == "message_id" else "x-correlation-id", None)
        setattr(mp, name, value)
    return mp.encode()


class Amqp10Format:
    number = AMQP100
    name = "AMQP 1.0 header, message-annotations, properties, application-properties"

    def decode(self, raw: bytes) -> Properties:
        """A copy of the cached decoding when ``raw`` was decoded lately: a 0-9-1 or 0-10 consumer of
        1.0 messages decodes every one, and messages published alike have the same properties.
        (A shallow copy: callers replace ``headers`` and ``annotations``, they do not change the dicts
        they were given.)"""
        cached = _DECODED.get(raw)
        if cached is None:
            cached = _neutral(parse(raw), raw)
            if len(_DECODED) >= _MAX_DECODED:
                _DECODED.clear()
            _DECODED[raw] = cached
        return copy.copy(cached)

    def encode(self, properties: Properties) -> bytes:
        source = getattr(properties.annotations, "source", None)
        s = parse(source) if source is not None else Sections(0)
        old = _neutral(s, None) if source is not None else Properties()
        try:
            return self._encode(s, old, properties)
        except (ValueError, TypeError, OverflowError, UnicodeError) as exc:
            raise ValueError(f"not encodable as 1.0 sections: {exc}") from exc

    def _encode(self, s: Sections, old: Properties, props: Properties) -> bytes:
        flags = s.flags
        header_raw = s.header_raw
        if _header_key(props) != _header_key(old) or (s.header is None and props.delivery_mode is not None):
            header_raw = _new_header(s.header, props).encode()
        ma = dict(s.annotations or {})
        ap = dict(s.application or {})
        ma_changed = ap_changed = False
        new_headers = dict(props.headers or {})
        properties_raw = _properties_raw(s, props, old, new_headers)
        if props.type != old.type:
            if props.type == AMQP10_TYPE:
                if not flags & BODY_SECTIONS:
                    flags |= BODY_UNCHECKED
            else:
                flags &= ~BODY_UNCHECKED
                ma.pop("x-basic-type", None)
                if props.type is not None:
                    ma["x-basic-type"] = entry("x-basic-type", props.type, True)
                ma_changed = True
        old_headers = old.headers or {}
        for key in old_headers.keys() - new_headers.keys():
            ma_changed |= ma.pop(key, None) is not None
            ap_changed |= ap.pop(key, None) is not None
        for key, value in new_headers.items():
            if key in old_headers and type(old_headers[key]) is type(value) and old_headers[key] == value:
                continue
            converted = value_to_amqp10(value)
            annotation = key.startswith("x-") and key.isascii()  # annotation keys are symbols (ASCII)
            if key in ap and _simple(converted):
                ap[key], ap_changed = entry(key, converted, False), True
            elif key in ap or key in ma or annotation:
                ap_changed |= ap.pop(key, None) is not None
                if annotation:
                    ma[key], ma_changed = entry(key, converted, True), True
                else:
                    ma_changed |= ma.pop(key, None) is not None
            elif _simple(converted):
                ap[key], ap_changed = entry(key, converted, False), True
        for key, value in props.annotations.items():  # e.g. 0-9-1's cluster-id: only x- names are kept
            if key.startswith("x-") and key.isascii() and key not in _ID_ANNOTATIONS \
                    and old.annotations.get(key) != value:
                ma[key], ma_changed = entry(key, value_to_amqp10(value), True), True
        annotations_raw = (encode_map(p.MessageAnnotations, ma) if ma else b"") if ma_changed else s.annotations_raw
        application_raw = (encode_map(p.ApplicationProperties, ap) if ap else b"") if ap_changed \
            else s.application_raw
        return pack(flags, header_raw + annotations_raw, properties_raw + application_raw)


_DECODED: dict[bytes, Properties] = {}
_MAX_DECODED = 1024

FORMAT = Amqp10Format()
