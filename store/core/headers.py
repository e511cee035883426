"""A message's headers as the core reads them (headers exchanges, deduplication) and rewrites them
(dead-lettering: RabbitMQ's x-death records and x-first-death-* headers; a redelivery's
x-delivery-count).

Pure functions of a message's properties in whatever format it was published with, read through
that protocol's codec (store/core/message.py), so every node computes the same values and bytes and
store/ knows no wire format.  A rewritten message keeps its format: a 0-9-1 message dead-lettered
is still 0-9-1 bytes, with the same encoding RabbitMQ gives x-death.
"""

from __future__ import annotations

import datetime

from . import message as fmt
from .model import Message, Queue
from .values import to_plain


def message_headers(props: bytes, format: int = fmt.AMQP091) -> dict:
    """The headers as plain values (store/core/values.py), for matching against bindings' arguments."""
    headers = fmt.headers_of(props, format)
    return to_plain(headers) if headers else {}


def add_x_death(message: Message, queue: Queue, reason: str, now: int) -> bytes:
    """The message's properties with RabbitMQ's x-death bookkeeping updated for this dead-lettering,
    in the message's own format (a message whose properties do not decode keeps them)."""
    codec = fmt.codec(message.format)
    try:
        props = codec.decode(message.properties)
    except ValueError:
        return message.properties
    headers = dict(props.headers or {})
    deaths = list(headers.get("x-death") or [])
    routing_keys = [message.routing_key]
    record = None
    for i, death in enumerate(deaths):
        if isinstance(death, dict) and death.get("queue") == queue.name and death.get("reason") == reason:
            record = deaths.pop(i)
            break
    if record is None:
        record = {
            "count": 0,
            "reason": reason,
            "queue": queue.name,
            "time": datetime.datetime.fromtimestamp(now // 1_000_000, datetime.UTC),
            "exchange": message.exchange,
            "routing-keys": routing_keys,
        }
    else:
        record = dict(record)
    record["count"] = int(record.get("count", 0)) + 1
    if reason == "expired" and props.expiration is not None:
        record["original-expiration"] = props.expiration
    deaths.insert(0, record)
    headers["x-death"] = deaths
    headers.setdefault("x-first-death-reason", reason)
    headers.setdefault("x-first-death-queue", queue.name)
    headers.setdefault("x-first-death-exchange", message.exchange)
    props.headers = headers
    if reason == "expired":
        props.expiration = None
    return codec.encode(props)


def with_delivery_count(message: Message, count: int) -> Message:
    """The message as a quorum queue redelivers it: header ``x-delivery-count`` = ``count``, the
    number of earlier deliveries that came back (RabbitMQ 3.13's rabbit_fifo_client sets it once the
    count exists, i.e. from the first redelivery on).

    A copy for one delivery, not the queued message: the same message may sit in other queues, and
    the count belongs to this queue's entry.  Outputs only: nothing of it is replicated state.
    """
    try:
        properties = fmt.with_header(message.properties, message.format, "x-delivery-count", count)
    except (ValueError, LookupError):
        return message  # a headers table the codec cannot rewrite: delivered as it was published
    return Message(message.id, message.exchange, message.routing_key, properties, message.size,
                   message.persistent, message.priority, message.published_at, format=message.format)
