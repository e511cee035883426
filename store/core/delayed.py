"""Delayed messages: what an ``x-delayed-message`` exchange holds until its time comes (issue 21).

Compatible with rabbitmq-delayed-message-exchange: a message published to such an exchange with a
header ``x-delay`` of ``D`` milliseconds, ``0 < D <= 2^32-1`` (an integer, or a string or float the
plugin converts: rabbit_delayed_message_utils:get_delay), is held and routed ``D`` ms later by the
exchange's ``x-delayed-type`` matching; any other ``x-delay`` (missing, zero, negative, beyond
2^32-1, not a number) routes the message at once, as the plugin does.  A held message's ``x-delay``
becomes ``-D``, as the plugin rewrites it (so a later delayed exchange does not delay it again).
Held messages are not routed at publish time: like the plugin's ``route/2``, which returns no queue
for them, a mandatory publish gets basic.return 312 NO_ROUTE at once and the message is still
delivered later (the plugin's README: "Mandatory flag is not supported").

Unlike the plugin (one node's Mnesia table), the held messages are replicated state: the due time is
the publish batch's leader-stamped time plus the delay, release happens in a TICK whose stamped time
has reached it (``StateMachine.next_deadline`` tells the node when to propose one), the heap travels
in snapshots, and the single-node store keeps every held message in its ``delayed`` table.  Never
before the delay: time inside the machine never goes backwards.

``StateMachine.delayed_limit`` bounds how many are held (config ``max_delayed_messages``, default
``DEFAULT_LIMIT``; every node of a cluster must use the same value, as the refusal is decided while
applying; it is configuration, not replicated state).  Beyond it a publish is refused as a
full queue with ``x-overflow: reject-publish`` refuses one: basic.nack to a confirm-mode publisher,
dropped otherwise, with a ``delay_refused`` count and audit event.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .message import headers_of, with_header
from .model import Message

HEADER = "x-delay"
_HEADER_BYTES = HEADER.encode()
MAX_DELAY_MS = 2**32 - 1  # the plugin's ?ERL_MAX_T: an Erlang timer's longest delay
DEFAULT_LIMIT = 1_000_000


def delay_of(properties: bytes, format: int = 0) -> int | None:
    """The delay in ms a message asks for, or None if it is to be routed at once (plugin rules)."""
    if _HEADER_BYTES not in properties:
        return None
    value = headers_of(properties, format).get(HEADER)
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        delay = int(value)
    elif isinstance(value, (str, bytes, bytearray)):
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value
        try:
            delay = int(text.strip(), 10)
        except ValueError:
            return None
    elif isinstance(value, float):
        delay = int(value)  # Erlang trunc/1
    else:
        inner = getattr(value, "value", None)  # a typed wrapper of the codec (e.g. a short-short int)
        if not isinstance(inner, int) or isinstance(inner, bool):
            return None
        delay = int(inner)
    return delay if 0 < delay <= MAX_DELAY_MS else None


def with_released_header(properties: bytes, format: int, delay: int) -> bytes:
    """The properties with ``x-delay`` set to ``-delay`` (rabbit_delayed_message_utils:swap_delay_header),
    in the message's own format (store/core/message.py)."""
    try:
        return with_header(properties, format, HEADER, -delay)
    except (ValueError, LookupError):
        return properties


@dataclass(slots=True, eq=False)
class Held:
    """One delayed message: where it goes and when.  ``expiration`` is the per-message TTL (ms)
    from the publish, applied when it is enqueued (its TTL starts then, as with the plugin)."""

    due: int  # microseconds of leader-stamped time
    seq: int
    vhost: str
    exchange: str
    routing_key: str
    message: Message
    expiration: int | None
    delay: int  # ms, as asked


@dataclass(slots=True, eq=False)
class DelayedMessages:
    """The held messages of every delayed exchange, in release order (a heap on (due, seq): the
    sequence number makes the order total, so every replica releases in the same order)."""

    heap: list = field(default_factory=list)  # (due, seq, Held)
    next_seq: int = 1
    counts: dict = field(default_factory=dict)  # (vhost, exchange) -> held

    def __len__(self) -> int:
        return len(self.heap)

    def hold(self, due: int, vhost: str, exchange: str, routing_key: str, message: Message,
             expiration: int | None, delay: int) -> Held:
        held = Held(due, self.next_seq, vhost, exchange, routing_key, message, expiration, delay)
        self.next_seq += 1
        self.add(held)
        return held

    def add(self, held: Held) -> None:
        heapq.heappush(self.heap, (held.due, held.seq, held))
        key = (held.vhost, held.exchange)
        self.counts[key] = self.counts.get(key, 0) + 1
        if held.seq >= self.next_seq:
            self.next_seq = held.seq + 1

    def next_due(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now: int) -> list[Held]:
        """The held messages whose time has come (due <= now), in release order."""
        out = []
        heap = self.heap
        while heap and heap[0][0] <= now:
            held = heapq.heappop(heap)[2]
            key = (held.vhost, held.exchange)
            left = self.counts[key] - 1
            if left:
                self.counts[key] = left
            else:
                del self.counts[key]
            out.append(held)
        return out

    def held_by(self, vhost: str, exchange: str) -> int:
        return self.counts.get((vhost, exchange), 0)

    def ordered(self) -> list[Held]:
        """Every held message in release order (for the digest; does not change the heap)."""
        return [item[2] for item in sorted(self.heap, key=lambda item: (item[0], item[1]))]
