"""A message's headers as the core reads them (headers exchanges) and rewrites them (dead-lettering:
RabbitMQ's x-death records and x-first-death-* headers; a redelivery's x-delivery-count).

Pure functions of a message's properties -- still AMQP 0-9-1 property bytes, the model's canonical
form, decoded with protocol/amqp091's codec: the one place the core reads a wire format (until the
protocol-neutral message of issue 16) -- so every node computes the same values and bytes.
"""

from __future__ import annotations

from .model import Message, Queue


def wire_headers(props: bytes) -> dict:
    """The headers table as decoded, wire types kept (decimals, timestamps...); {} if the
    properties have none or do not decode."""
    from raftmq.protocol.amqp091.properties import decode_properties

    try:
        headers = decode_properties(props).headers
    except Exception:
        return {}
    return headers or {}


def message_headers(props: bytes) -> dict:
    """The headers as plain values (store/values.py), for matching against bindings' arguments."""
    from .values import to_plain

    headers = wire_headers(props)
    return to_plain(headers) if headers else {}


def add_x_death(message: Message, queue: Queue, reason: str, now: int) -> bytes:
    """The message's properties with RabbitMQ's x-death bookkeeping updated for this dead-lettering."""
    from raftmq.protocol.amqp091.fieldtable import Timestamp
    from raftmq.protocol.amqp091.properties import decode_properties, encode_properties

    props = decode_properties(message.properties)
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
            "time": Timestamp(now // 1_000_000),
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
    return encode_properties(props)


def with_delivery_count(message: Message, count: int) -> Message:
    """The message as a quorum queue redelivers it: header ``x-delivery-count`` = ``count``, the
    number of earlier deliveries that came back (RabbitMQ 3.13's rabbit_fifo_client sets it once the
    count exists, i.e. from the first redelivery on).

    A copy for one delivery, not the queued message: the same message may sit in other queues, and
    the count belongs to this queue's entry.  Outputs only: nothing of it is replicated state.
    """
    from raftmq.protocol.amqp091.properties import decode_properties, encode_properties

    try:
        props = decode_properties(message.properties)
        headers = dict(props.headers or {})
        headers["x-delivery-count"] = count
        props.headers = headers
        properties = encode_properties(props)
    except Exception:
        return message  # a headers table the codec cannot rewrite: delivered as it was published
    return Message(message.id, message.exchange, message.routing_key, properties, message.body,
                   message.persistent, message.priority, message.published_at)
