"""A 0-10 transfer's header to a core publish, and a stored message to a 0-10 transfer's header.

The message is stored in the 0-10 property format (protocol/amqp010/neutral.py): a 0-10 consumer
gets the publisher's structs back, a consumer of another protocol gets them converted through the
core's neutral properties (store/core/message.py); docs/message-mapping.md has the mapping.
"""

from __future__ import annotations

from raftmq.protocol.amqp010.neutral import delivery_headers, message_structs, stored
from raftmq.store.core.model import Message


def to_core(headers: list | None) -> tuple[str, bytes, bool, int, int | None]:
    """(routing key, stored property bytes, persistent, priority, expiration ms) of a transfer's
    header; the bytes are in format AMQP010."""
    dp, mp = message_structs(headers)
    if dp is None:
        return "", stored(None, mp), False, 0, None
    priority = min(dp.priority, 255) if dp.priority is not None else 0
    return dp.routing_key or "", stored(dp, mp), dp.delivery_mode == 2, priority, dp.ttl


def from_core(message: Message, redelivered: bool) -> list:
    """The 0-10 header structs for delivering a stored message (protocol/amqp010/neutral.py)."""
    return delivery_headers(message, redelivered)
