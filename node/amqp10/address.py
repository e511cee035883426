"""AMQP 1.0 addresses (3.5.3 source/target address) as core routing: which exchange and routing key a
message goes to, which queue a receiver reads.

Accepted, as RabbitMQ 4 (its "address v2" format, percent-encoded segments):

* ``/queues/:queue`` -- the queue (published through the default exchange, key = queue name);
* ``/exchanges/:exchange/:routing-key`` -- that exchange with that key;
* ``/exchanges/:exchange`` -- that exchange, the key taken from each message's ``subject``;
* a null target -- each message's ``to`` property is one of the above;

and plain queue names (``my-queue``, as Artemis and Qpid brokers take them), for sources and targets.
The legacy RabbitMQ 3 forms ``/queue/:q`` and ``/exchange/:x/:key`` are read as their v2 twins.

Topics (ActiveMQ / Artemis): ``topic://name`` is ``amq.topic`` with the name as routing key, as a target
and -- with ``/exchanges/:exchange/:key`` -- as a source, where it is a subscription (terminus.py);
``queue://name`` is the queue ``name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote


class AddressError(ValueError):
    """An address this broker cannot resolve (the link is refused with amqp:invalid-field)."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where published messages go: ``routing_key`` None means "the message's subject"."""

    exchange: str
    routing_key: str | None


def _segments(address: str, prefix: str) -> list[str]:
    return [unquote(s) for s in address[len(prefix):].split("/")]


TOPIC_EXCHANGE = "amq.topic"
TOPIC_PREFIX, QUEUE_PREFIX = "topic://", "queue://"


def _topic_key(name: str) -> str:
    """A topic name as a binding key: ActiveMQ's multi-word wildcard ``>`` is the topic exchange's ``#``."""
    return ".".join("#" if word == ">" else word for word in name.split("."))


def parse_topic(address: str) -> Target | None:
    """A receiver's topic address as the exchange and binding key it subscribes to; None for a queue."""
    if address.startswith(TOPIC_PREFIX):
        name = address[len(TOPIC_PREFIX):]
        if not name:
            raise AddressError(f"bad topic address '{address}'")
        return Target(TOPIC_EXCHANGE, _topic_key(name))
    if address.startswith("/exchanges/") or address.startswith("/exchange/"):
        target = parse_target(address)
        if target.routing_key is None:
            raise AddressError(f"a receiver needs a binding key: /exchanges/:exchange/:key, not '{address}'")
        return target
    return None


def parse_target(address: str) -> Target:
    if address.startswith(TOPIC_PREFIX) and len(address) > len(TOPIC_PREFIX):
        return Target(TOPIC_EXCHANGE, address[len(TOPIC_PREFIX):])
    if address.startswith(QUEUE_PREFIX) and len(address) > len(QUEUE_PREFIX):
        return Target("", address[len(QUEUE_PREFIX):])
    if address.startswith("/queues/") or address.startswith("/queue/"):
        parts = _segments(address, address[:address.index("/", 1) + 1])
        if len(parts) != 1 or not parts[0]:
            raise AddressError(f"bad queue address '{address}'")
        return Target("", parts[0])
    if address.startswith("/exchanges/") or address.startswith("/exchange/"):
        parts = _segments(address, address[:address.index("/", 1) + 1])
        if not parts[0] or len(parts) > 2:
            raise AddressError(f"bad exchange address '{address}'")
        exchange = "" if parts[0] == "amq.default" else parts[0]
        return Target(exchange, parts[1] if len(parts) == 2 else None)
    if not address or address.startswith("/"):
        raise AddressError(f"unsupported address '{address}'")
    return Target("", address)


def parse_source(address: str) -> str:
    """The queue a receiver reads from."""
    if address.startswith(QUEUE_PREFIX) and len(address) > len(QUEUE_PREFIX):
        return address[len(QUEUE_PREFIX):]
    if address.startswith("/queues/") or address.startswith("/queue/"):
        parts = _segments(address, address[:address.index("/", 1) + 1])
        if len(parts) == 1 and parts[0]:
            return parts[0]
    elif address and not address.startswith("/"):
        return address
    raise AddressError(f"unsupported source address '{address}' (use /queues/:queue)")


def queue_address(queue: str) -> str:
    """The v2 address of a queue (a dynamic receiver's source address)."""
    return "/queues/" + quote(queue, safe="")
