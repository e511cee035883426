"""Queue x-arguments: validated into settings before a queue is created (406 on a bad value).

The arguments RabbitMQ clients use, read as RabbitMQ reads them: integers within their range,
strings (bytes accepted as UTF-8), ``x-overflow`` one of RabbitMQ's three policies.  Parsing is done
before the state machine changes anything, so a refused declare leaves no trace.

Also the arguments of issue 21: ``x-delivery-limit`` (a quorum queue's poison-message limit; with it,
or with ``x-queue-type: quorum``, redeliveries carry ``x-delivery-count``) and the deduplication
plugin's ``x-message-deduplication`` (a boolean) with raftmq's ``x-cache-size`` and ``x-cache-ttl``
(store/core/dedup.py).

``x-queue-type``: ``classic`` and ``quorum`` are what raftmq's queues are (every queue is replicated);
``stream`` is refused (406 "streams are not supported") until streams exist: a stream's reads do not
consume, and a user who asked for one must not silently get a destructive queue.  Every protocol
declares through here (0-9-1 queue.declare, 0-10 queue.declare, 1.0 /management PUT /queues, the HTTP
API), so each refuses it with its own form of 406.  A stream queue that an earlier raftmq created as
an ordinary queue still loads from the single-node store (``parse_stored_queue_arguments``).  Not
guarded: a rolling upgrade -- an older node still accepts the declare the newer ones refuse (their
states would part), and a Raft log written by an older raftmq with such a declare, replayed by this
one before a snapshot covers it, now refuses it; declare no stream queue before every node runs this
version (the same caveat as the issue-21 arguments, docs/design.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .dedup import DEFAULT_CACHE_SIZE, MAX_CACHE_SIZE
from .errors import CommandError
from .values import as_int

log = logging.getLogger(__name__)

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
    "x-delivery-limit",  # a quorum queue's argument, checked on redeclare as RabbitMQ does
)
OVERFLOW_POLICIES = ("drop-head", "reject-publish", "reject-publish-dlx")
# Arguments that earlier raftmq versions stored without reading them (so without validating them).
LATER_ARGS = ("x-delivery-limit", "x-message-deduplication", "x-cache-size", "x-cache-ttl")
UNSUPPORTED_QUEUE_TYPES = ("stream", b"stream")  # refused until streams exist (module docstring)
STREAMS_UNSUPPORTED = "streams are not supported"  # the refusal's text (1.0 /management answers it with 400)


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
    delivery_limit: int | None = None  # returns of a delivered message before it is dead-lettered
    delivery_header: bool = False  # redeliveries carry x-delivery-count
    deduplicate: bool = False  # x-message-deduplication (store/core/dedup.py)
    cache_size: int = DEFAULT_CACHE_SIZE  # x-cache-size: entries of the deduplication cache
    cache_ttl: int | None = None  # x-cache-ttl, ms: how long an entry outlives its message
    no_local: bool = False  # Qpid's no-local: drop what its owner's connection publishes (store/core/delivery.py)


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
    deduplicate = args.get("x-message-deduplication", False)
    if not isinstance(deduplicate, bool):
        raise refuse("x-message-deduplication", deduplicate)
    delivery_limit = int_arg("x-delivery-limit", 0)
    queue_type = args.get("x-queue-type")
    if queue_type in UNSUPPORTED_QUEUE_TYPES:
        raise CommandError(406, f"invalid arg 'x-queue-type' for queue '{queue}' in vhost '{vhost}': "
                                f"{STREAMS_UNSUPPORTED}")
    return QueueSettings(
        delivery_limit=delivery_limit,
        # As a quorum queue: RabbitMQ has no delivery count on classic queues, and raftmq's
        # queues are classic ones unless they ask for quorum semantics.
        delivery_header=delivery_limit is not None or queue_type in ("quorum", b"quorum"),
        deduplicate=deduplicate,
        cache_size=int_arg("x-cache-size", 1, MAX_CACHE_SIZE) or DEFAULT_CACHE_SIZE,
        cache_ttl=int_arg("x-cache-ttl", 1),
        message_ttl=int_arg("x-message-ttl", 0),
        max_length=int_arg("x-max-length", 0),
        max_length_bytes=int_arg("x-max-length-bytes", 0),
        max_priority=int_arg("x-max-priority", 0, 255) or 0,
        expires=int_arg("x-expires", 1),
        dead_letter_exchange=str_arg("x-dead-letter-exchange"),
        dead_letter_routing_key=str_arg("x-dead-letter-routing-key"),
        overflow=overflow,
        no_local=_truthy(args.get(NO_LOCAL)),
    )


#: Qpid's queue argument (its brokers' QueueSettings "no-local"; AMQP 0-10 itself has no no-local on
#: message.subscribe, only on the file and stream classes' consume): messages published on the
#: connection that holds the queue -- its exclusive owner's, or an exclusive subscriber's -- are
#: not enqueued.  Not an x-argument, so 0-9-1 never had it to ignore.
NO_LOCAL = "no-local"


def _truthy(value: object) -> bool:
    """Qpid reads the value as a boolean (qpid::types::Variant::asBool): true, a non-zero number, or
    the text "true"/"1".  Anything else is false, never refused: a stored queue always loads."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return isinstance(value, (bool, int, float)) and bool(value)


def parse_stored_queue_arguments(args: dict, queue: str, vhost: str) -> QueueSettings:
    """``parse_queue_arguments`` for a queue declared earlier (the single-node store's): an argument
    that an older raftmq accepted without reading it and that is invalid now is ignored, with a
    warning, instead of stopping the node from loading its queues."""
    try:
        return parse_queue_arguments(args, queue, vhost)
    except CommandError as exc:
        log.warning("queue '%s' in vhost '%s': %s; ignoring %s", queue, vhost, exc.text, ", ".join(LATER_ARGS))
        # A stream queue an earlier raftmq accepted as an ordinary queue stays one.
        return parse_queue_arguments({k: v for k, v in args.items() if k not in LATER_ARGS
                                      and not (k == "x-queue-type" and v in UNSUPPORTED_QUEUE_TYPES)},
                                     queue, vhost)
