"""Message properties between AMQP 0-10 header structs and raftmq's canonical 0-9-1 property bytes.

The core stores one property format (0-9-1 basic properties, see docs/design.md), so a message
published with 0-10 can be consumed with 0-9-1 and the other way round.  The mapping follows the
usual bridge conventions (as in Qpid): delivery-properties carry routing key, delivery mode,
priority and TTL; message-properties carry content type/encoding, application headers (0-9-1
``headers``), message and correlation ids, reply-to, user and app id.  A 0-10 message-id is a UUID;
a 0-9-1 message-id that is not one travels in the header ``x-message-id`` instead.
"""

from __future__ import annotations

import uuid

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp091.properties import BasicProperties, decode_properties, encode_properties
from raftmq.store.values import to_plain


def to_core(headers: list | None) -> tuple[str, bytes, bool, int, int | None]:
    """(routing key, 0-9-1 property bytes, persistent, priority, expiration ms) of a transfer's headers."""
    dp = mp = None
    for h in headers or ():
        if isinstance(h, c.DeliveryProperties):
            dp = h
        elif isinstance(h, c.MessageProperties):
            mp = h
    props = BasicProperties()
    routing_key = ""
    persistent = False
    priority = 0
    ttl = None
    if dp is not None:
        routing_key = dp.routing_key or ""
        if dp.delivery_mode is not None:
            props.delivery_mode = dp.delivery_mode
            persistent = dp.delivery_mode == 2
        if dp.priority is not None:
            props.priority = priority = min(dp.priority, 255)
        if dp.ttl is not None:
            ttl = dp.ttl
            props.expiration = str(dp.ttl)
        if dp.timestamp is not None:
            props.timestamp = dp.timestamp
    if mp is not None:
        props.content_type = mp.content_type
        props.content_encoding = mp.content_encoding
        headers_map = dict(to_plain(mp.application_headers)) if mp.application_headers else {}
        if mp.message_id is not None:
            props.message_id = str(mp.message_id)
        if mp.correlation_id is not None:
            props.correlation_id = mp.correlation_id.decode("utf-8", "replace")
        if mp.reply_to is not None:
            props.reply_to = f"{mp.reply_to.exchange or ''}/{mp.reply_to.routing_key or ''}"
        if mp.user_id is not None:
            props.user_id = mp.user_id.decode("utf-8", "replace")
        if mp.app_id is not None:
            props.app_id = mp.app_id.decode("utf-8", "replace")
        props.headers = headers_map or None
    return routing_key, encode_properties(props), persistent, priority, ttl


def from_core(properties: bytes, exchange: str, routing_key: str, redelivered: bool, body_size: int) -> list:
    """The 0-10 header structs for a stored message."""
    props = decode_properties(properties)
    dp = c.DeliveryProperties(exchange=exchange, routing_key=routing_key, redelivered=redelivered,
                              delivery_mode=props.delivery_mode or 1, priority=props.priority or 4)
    if props.expiration and props.expiration.isdigit():
        dp.ttl = int(props.expiration)
    if props.timestamp is not None:
        dp.timestamp = props.timestamp
    mp = c.MessageProperties(content_length=body_size, content_type=props.content_type,
                             content_encoding=props.content_encoding,
                             application_headers=dict(props.headers) if props.headers else None)
    if props.message_id:
        try:
            mp.message_id = uuid.UUID(props.message_id)
        except ValueError:
            mp.application_headers = {**(mp.application_headers or {}), "x-message-id": props.message_id}
    if props.correlation_id is not None:
        mp.correlation_id = props.correlation_id.encode()
    if props.reply_to:
        exchange_part, _, key_part = props.reply_to.partition("/")
        mp.reply_to = c.ReplyTo(exchange=exchange_part if key_part else "",
                                routing_key=key_part if key_part else exchange_part)
    if props.user_id is not None:
        mp.user_id = props.user_id.encode()
    if props.app_id is not None:
        mp.app_id = props.app_id.encode()
    return [dp, mp]
