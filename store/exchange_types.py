"""The exchange types two RabbitMQ community plugins add, as raftmq offers them (issue 21).

* ``x-delayed-message`` (rabbitmq-delayed-message-exchange): routes as its ``x-delayed-type``
  argument says, after the delay in a message's ``x-delay`` header (store/delayed.py).
* ``x-message-deduplication`` (rabbitmq-message-deduplication): routes to every binding (the plugin
  matches all of them, like fanout) a message whose ``x-deduplication-header`` it has not seen within
  the cache's lifetime (store/exchange_dedup.py).

Declaring either is validated here, as the plugins validate it, before anything changes: a missing or
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
    if type_ == DEDUPLICATION:
        return "fanout"
    return type_


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
