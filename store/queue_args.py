"""Queue x-arguments: validated into settings before a queue is created (406 on a bad value).

The arguments RabbitMQ clients use, read as RabbitMQ reads them: integers within their range,
strings (bytes accepted as UTF-8), ``x-overflow`` one of RabbitMQ's three policies.  Parsing is done
before the state machine changes anything, so a refused declare leaves no trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CommandError
from .values import as_int

# The x-arguments whose value must match on a queue redeclare (as RabbitMQ checks them).
EQUIVALENCE_ARGS = (
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-overflow",
    "x-max-priority",
    "x-expires",
)
OVERFLOW_POLICIES = ("drop-head", "reject-publish", "reject-publish-dlx")


@dataclass(frozen=True, slots=True)
class QueueSettings:
    message_ttl: int | None = None  # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    max_priority: int = 0
    expires: int | None = None  # ms without use before the queue is deleted
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    overflow: str = "drop-head"


def parse_queue_arguments(args: dict, queue: str, vhost: str) -> QueueSettings:
    def refuse(key: str, value: object) -> CommandError:
        return CommandError(406, f"invalid arg '{key}' for queue '{queue}' in vhost '{vhost}': {value!r}")

    def int_arg(key: str, low: int, high: int | None = None) -> int | None:
        if key not in args:
            return None
        value = as_int(args[key])
        if value is None or value < low or (high is not None and value > high):
            raise refuse(key, args[key])
        return value

    def str_arg(key: str) -> str | None:
        if key not in args:
            return None
        value = args[key]
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str):
            raise refuse(key, value)
        return value

    overflow = str_arg("x-overflow") or "drop-head"
    if overflow not in OVERFLOW_POLICIES:
        raise refuse("x-overflow", overflow)
    return QueueSettings(
        message_ttl=int_arg("x-message-ttl", 0),
        max_length=int_arg("x-max-length", 0),
        max_length_bytes=int_arg("x-max-length-bytes", 0),
        max_priority=int_arg("x-max-priority", 0, 255) or 0,
        expires=int_arg("x-expires", 1),
        dead_letter_exchange=str_arg("x-dead-letter-exchange"),
        dead_letter_routing_key=str_arg("x-dead-letter-routing-key"),
        overflow=overflow,
    )
