"""AMQP 0-10 message headers as the core's neutral message properties (store/core/message.py).

A message published with 0-10 is stored in format ``AMQP010``: its delivery-properties (only the
fields that belong to the message: delivery mode, priority, TTL, timestamp; routing key, exchange and
redelivered are the delivery's) and its whole message-properties, as struct32 entries.  A 0-10
consumer gets those structs back as they came (``structs``); another protocol's consumer gets them
through ``Properties``, following the usual bridge conventions (as Qpid's):

* delivery-properties: delivery-mode, priority, ttl (``expiration`` in ms), timestamp;
* message-properties: content-type/encoding, application-headers (``headers``), message-id (a UUID:
  a 0-9-1 message-id that is not one travels as the header ``x-message-id``), correlation-id,
  reply-to (``exchange/routing-key``), user-id, app-id.

docs/message-mapping.md has the whole table.
"""

from __future__ import annotations

import uuid
from typing import Any

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010.errors import Amqp010Error
from raftmq.store.core.message import AMQP010, Properties, convert
from raftmq.store.core.values import to_plain


def message_structs(headers: list | None) -> tuple[Any, Any]:
    """The delivery- and message-properties of a transfer's header (None where absent)."""
    dp = mp = None
    for h in headers or ():
        if isinstance(h, c.DeliveryProperties):
            dp = h
        elif isinstance(h, c.MessageProperties):
            mp = h
    return dp, mp


def stored(dp: Any, mp: Any) -> bytes:
    """The bytes stored for a transfer's header: the message's own delivery-properties fields and
    its message-properties."""
    own = c.DeliveryProperties()
    if dp is not None:
        own.delivery_mode, own.priority, own.ttl, own.timestamp = dp.delivery_mode, dp.priority, dp.ttl, dp.timestamp
    return c.encode_struct32(own) + c.encode_struct32(mp if mp is not None else c.MessageProperties())


def structs(raw: bytes) -> tuple[Any, Any]:
    """(delivery-properties, message-properties) of stored bytes; ValueError if they do not decode."""
    dp = mp = None
    pos = 0
    try:
        while pos < len(raw):
            value, pos = c.decode_struct32(raw, pos)
            if isinstance(value, c.DeliveryProperties):
                dp = value
            elif isinstance(value, c.MessageProperties):
                mp = value
    except (Amqp010Error, ValueError, IndexError) as exc:
        raise ValueError(f"0-10 message headers do not decode: {exc}") from exc
    return dp or c.DeliveryProperties(), mp or c.MessageProperties()


def delivery_headers(message: Any, redelivered: bool) -> list:
    """The header structs of a 0-10 transfer of a stored message (``store.core.model.Message``): the
    message's own delivery-properties fields with this delivery's exchange, routing key and
    redelivered flag, and its message-properties -- only what the publisher set (a 0-10 consumer
    gets the structs as they came), so an empty message-properties is left out.  A message of
    another protocol gets content-length too (docs/message-mapping.md)."""
    try:
        dp, mp = structs(convert(message.properties, message.format, AMQP010))
    except (ValueError, LookupError):
        dp, mp = c.DeliveryProperties(), c.MessageProperties()  # unreadable: delivered with none
    dp.exchange, dp.routing_key, dp.redelivered = message.exchange, message.routing_key, redelivered
    if message.format != AMQP010:
        mp.content_length = message.size
    if mp.encode_fields() == _EMPTY_FIELDS:
        return [dp]
    return [dp, mp]


_EMPTY_FIELDS = c.MessageProperties().encode_fields()


def transfer_credit(message: Any) -> int:
    """The byte credit a transfer of ``message`` takes: message.set-flow-mode rule byte-accounting
    (L6118ff) "The byte count is decremented by the payload size of each transmitted frame with
    segment type header or body": the header segment as :func:`delivery_headers` builds it (the
    redelivered flag is a packing bit and takes no octet) plus the body.  Pure, so every replica's
    state machine charges the same (registered with the core by node/core/formats.py).

    The header's size depends only on the stored properties, their format, the exchange and the
    routing key (content-length is a fixed 8 octets), so it is remembered per those: building and
    encoding the structs took 32-44 us a call, and the dispatcher asks for every delivery to a
    subscription with finite byte credit.  Bounded as the publish path's shared properties are."""
    key = (message.properties, message.format, message.exchange, message.routing_key)
    header = _HEADER_SIZES.get(key)
    if header is None:
        if len(_HEADER_SIZES) >= _HEADER_SIZES_MAX:
            _HEADER_SIZES.clear()
        header = sum(len(c.encode_struct32(h)) for h in delivery_headers(message, False))
        _HEADER_SIZES[key] = header
    return header + message.size


_HEADER_SIZES: dict[tuple, int] = {}
_HEADER_SIZES_MAX = 4096


def _text(value: bytes | None) -> str | None:
    return None if value is None else bytes(value).decode("utf-8", "replace")


class Amqp010Format:
    number = AMQP010
    name = "AMQP 0-10 delivery- and message-properties"

    def decode(self, raw: bytes) -> Properties:
        dp, mp = structs(raw)
        props = Properties(delivery_mode=dp.delivery_mode, priority=dp.priority, timestamp=dp.timestamp,
                           expiration=None if dp.ttl is None else str(dp.ttl))
        props.content_type, props.content_encoding = mp.content_type, mp.content_encoding
        props.headers = dict(mp.application_headers) if mp.application_headers else None
        if mp.message_id is not None:
            props.message_id = str(mp.message_id)
        props.correlation_id = _text(mp.correlation_id)
        if mp.reply_to is not None:
            props.reply_to = f"{mp.reply_to.exchange or ''}/{mp.reply_to.routing_key or ''}"
        props.user_id, props.app_id = _text(mp.user_id), _text(mp.app_id)
        return props

    def encode(self, properties: Properties) -> bytes:
        dp = c.DeliveryProperties(delivery_mode=properties.delivery_mode, priority=properties.priority,
                                  timestamp=properties.timestamp)
        if properties.expiration is not None and properties.expiration.isdigit():
            dp.ttl = int(properties.expiration)
        headers = {k: to_plain(v) for k, v in (properties.headers or {}).items()}
        for key, value in properties.annotations.items():
            headers.setdefault(key if key.startswith("x-") else f"x-amqp-{key}", to_plain(value))
        mp = c.MessageProperties(content_type=properties.content_type,
                                 content_encoding=properties.content_encoding)
        if properties.message_id:
            try:
                mp.message_id = uuid.UUID(properties.message_id)
            except ValueError:
                headers["x-message-id"] = properties.message_id
        if properties.correlation_id is not None:
            mp.correlation_id = properties.correlation_id.encode()
        if properties.reply_to:
            exchange, _, key = properties.reply_to.partition("/")
            mp.reply_to = c.ReplyTo(exchange=exchange if key else "", routing_key=key if key else exchange)
        if properties.user_id is not None:
            mp.user_id = properties.user_id.encode()
        if properties.app_id is not None:
            mp.app_id = properties.app_id.encode()
        mp.application_headers = headers or None
        return c.encode_struct32(dp) + c.encode_struct32(mp)


FORMAT = Amqp010Format()
