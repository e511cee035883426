"""The exchange types two RabbitMQ community plugins add, as raftmq offers them (issue 21).

* ``x-delayed-message`` (rabbitmq-delayed-message-exchange): routes as its ``x-delayed-type``
  argument says, after the delay in a message's ``x-delay`` header (store/core/delayed.py).
* ``x-message-deduplication`` (rabbitmq-message-deduplication): routes to every binding (the plugin
  matches all of them, like fanout) a message whose ``x-deduplication-header`` it has not seen within
  the cache's lifetime (store/core/exchange_dedup.py).

RabbitMQ 4's own ``x-local-random`` (rabbit_exchange_type_local_random) is here too: it routes each
message to *one* queue bound to it, chosen at random among the queues local to the publisher's node;
bindings must be to queues, with an empty key (406 otherwise, RabbitMQ's binding_invalid).  Every
raftmq queue is on every node (the replicated state machine holds it, any node delivers from it), so
every bound queue counts as local -- RabbitMQ also refuses quorum queues here, raftmq takes any queue.
"Random" must be the same on every replica: the queue is chosen by a hash of the message's id (given
by the state machine, store/core/delivery.py), :func:`pick_local_random` -- spread evenly over the bound
queues, the same choice on every node and on a replay of the log.

Declaring either plugin type is validated here, as the plugins validate it, before anything changes: a missing or
invalid argument is 406 PRECONDITION_FAILED with the plugin's text, an unknown ``x-delayed-type``
503 COMMAND_INVALID as RabbitMQ answers an unknown exchange type.
"""

from __future__ import annotations

from .errors import CommandError
from .values import as_int

BUILTIN_TYPES = ("direct", "fanout", "topic", "headers")
DELAYED = "x-delayed-message"
DEDUPLICATION = "x-message-deduplication"
PLUGIN_TYPES = (DELAYED, DEDUPLICATION)
LOCAL_RANDOM = "x-local-random"
_MASK = (1 << 64) - 1


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def positive_int(value: object) -> int | None:
    """An integer > 0, or a string of one (the dedup plugin accepts a longstr it can parse)."""
    number = as_int(value)
    if number is None:
        text = _text(value)
        if text is not None:
            try:
                number = int(text.strip(), 10)
            except ValueError:
                return None
    return number if number is not None and number > 0 else None


def routing_type(type_: str, arguments: dict) -> str:
    """The built-in type whose matching an exchange of ``type_`` uses for its bindings."""
    if type_ == DELAYED:
        return _text(arguments.get("x-delayed-type")) or "direct"
    if type_ in (DEDUPLICATION, LOCAL_RANDOM):
        return "fanout"  # x-local-random: every binding is a candidate, pick_local_random keeps one
    return type_


def validate_binding(type_: str, to_queue: bool, routing_key: str) -> None:
    """Refuse a binding an ``x-local-random`` exchange cannot have (RabbitMQ's validate_binding)."""
    if type_ != LOCAL_RANDOM:
        return
    if routing_key:
        raise CommandError(406, f"binding_invalid: Non empty binding '{routing_key}' key not permitted")
    if not to_queue:
        raise CommandError(406, "binding_invalid: Destination not found (x-local-random binds queues only)")


def pick_local_random(candidates: list, message_id: int) -> list:
    """The one binding an ``x-local-random`` exchange routes message ``message_id`` to: chosen by a
    hash of the id (splitmix64's finalizer), so consecutive messages spread like random picks and
    every replica picks the same one."""
    if len(candidates) < 2:
        return candidates
    x = message_id & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return [candidates[x % len(candidates)]]


def validate(type_: str, arguments: dict) -> None:
    """Refuse a declare of a plugin exchange type with the plugin's error (before any change)."""
    if type_ == DELAYED:
        inner = _text(arguments.get("x-delayed-type"))
        if inner == DELAYED:
            raise CommandError(406, "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
        if inner is None:
            raise CommandError(406, "Invalid argument, 'x-delayed-type' must be an existing exchange type")
        if inner not in BUILTIN_TYPES:
            raise CommandError(503, f"unknown exchange type '{inner}'")
    elif type_ == DEDUPLICATION:
        if positive_int(arguments.get("x-cache-size")) is None:
            raise CommandError(406, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0")
        if "x-cache-ttl" in arguments and positive_int(arguments["x-cache-ttl"]) is None:
            raise CommandError(406, "Invalid argument, 'x-cache-ttl' must be an integer greater than 0")
        persistence = _text(arguments.get("x-cache-persistence", "memory"))
        if persistence not in ("memory", "disk"):
            raise CommandError(406, "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'")
