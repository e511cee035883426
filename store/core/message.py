"""The protocol-neutral message: properties every AMQP version can carry, and a codec per protocol.

A message is stored as its publisher sent it: the property bytes of the publisher's protocol with the
number of that format (``Message.format``), so a consumer of the same protocol gets them back byte
for byte with no conversion (the 0-9-1 publish path never decodes them).  Another protocol's
consumer gets them through ``Properties``, the neutral form: each protocol has one ``PropertyFormat``
(its bytes to and from ``Properties``), so N protocols need N codecs, never a translator per pair.
RabbitMQ 3.13's message containers (``mc``) work the same way.

The state machine reads the few things it needs (the application headers, for headers exchanges,
deduplication and dead-letter records) through the same codecs, so store/ knows no wire format: the
codecs live beside their protocols (protocol/*/neutral.py) and register here when imported
(node/core/formats.py imports them all; every node runs the same code, so every replica decodes
alike).  The mapping between the protocols' fields is in docs/message-mapping.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Protocol

# Format numbers: stored with every message (LMDB, snapshots, the log), so never renumbered.
AMQP091 = 0  # 0-9-1 basic properties: property flags + list (protocol/amqp091/properties.py)
AMQP010 = 1  # 0-10 message.transfer header: delivery-properties and message-properties structs
AMQP100 = 2  # 1.0 bare-message sections before the body: header, annotations, properties, app-properties


@dataclass(slots=True)
class Properties:
    """What a message says about itself, whatever protocol carried it.

    Names follow 0-9-1 where the protocols agree.  ``headers`` are the application headers (0-9-1
    headers, 0-10 application-headers, 1.0 application-properties), values as the codec decoded them;
    ``annotations`` what only 1.0 has a place for (message-annotations, and properties such as
    ``to``/``subject`` that other protocols carry as ``x-`` headers when converted).
    """

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None  # 2 = persistent
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None  # milliseconds, as a decimal string (0-9-1's form)
    message_id: str | None = None
    timestamp: int | None = None  # seconds since the epoch
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)


class PropertyFormat(Protocol):
    """One protocol's property bytes, to and from the neutral form."""

    number: int
    name: str

    def decode(self, raw: bytes) -> Properties:
        """The neutral properties of ``raw``; raises ValueError if it does not decode."""
        ...

    def encode(self, properties: Properties) -> bytes: ...


_FORMATS: dict[int, PropertyFormat] = {}


def register(codec: PropertyFormat) -> None:
    _FORMATS[codec.number] = codec


def codec(number: int) -> PropertyFormat:
    try:
        return _FORMATS[number]
    except KeyError:
        raise LookupError(f"no codec registered for message property format {number} "
                          f"(node/core/formats.py registers them)") from None


def decode(raw: bytes, number: int) -> Properties:
    return codec(number).decode(raw)


def convert(raw: bytes, source: int, target: int) -> bytes:
    """``raw`` (format ``source``) in format ``target``: the same bytes when they are the same."""
    if source == target:
        return raw
    return codec(target).encode(codec(source).decode(raw))


def headers_of(raw: bytes, number: int) -> dict[str, Any]:
    """The application headers; {} if there are none or the properties do not decode (a
    message whose properties cannot be read routes as one without headers, on every node)."""
    try:
        headers = codec(number).decode(raw).headers
    except (ValueError, LookupError):
        return {}
    return headers or {}


def with_headers(raw: bytes, number: int, headers: dict[str, Any], clear_expiration: bool = False) -> bytes:
    """``raw`` with its application headers replaced, in the same format (dead-letter records)."""
    fmt = codec(number)
    properties = replace(fmt.decode(raw), headers=headers)
    if clear_expiration:
        properties.expiration = None
    return fmt.encode(properties)


def with_header(raw: bytes, number: int, name: str, value: Any) -> bytes:
    """``raw`` with one application header set, in the same format (decoded once); ValueError or
    LookupError if the properties do not decode."""
    fmt = codec(number)
    properties = fmt.decode(raw)
    properties.headers = {**(properties.headers or {}), name: value}
    return fmt.encode(properties)


def properties_in(message: Any, number: int, empty: bytes = b"") -> bytes:
    """A stored message's properties in format ``number``: its own bytes when it was published in
    that format (no decoding: the same-protocol path), converted otherwise; ``empty`` if they do not
    decode (the message is delivered with no properties rather than not at all)."""
    if message.format == number:
        return message.properties
    try:
        return convert(message.properties, message.format, number)
    except (ValueError, LookupError):
        return empty
