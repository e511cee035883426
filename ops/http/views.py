"""The broker's objects as RabbitMQ's management API writes them: the JSON field names and values
that tools read (rabbitmqadmin, Flower, KEDA, monitoring scripts).

Field names follow RabbitMQ 3.10's rabbitmq_management (checked against a running 3.10.8 by
tests/integration/test_http_api.py): a queue's ``messages``, ``messages_ready``,
``messages_unacknowledged``, ``consumers``, ``durable``, ``arguments``...; rates in
``*_details: {"rate": per second}`` from ops/http/rates.py.  RabbitMQ's Erlang-specific fields
(garbage_collection, reductions, backing_queue_status) are left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftmq.store.core.queries import queue_counts

if TYPE_CHECKING:
    from raftmq.node.broker import Broker
    from raftmq.node.group_figures import Figures
    from raftmq.store.core.queries import BindingInfo, ExchangeInfo, QueueInfo, VhostInfo

    from .rates import Rates

PRODUCT = "raftmq"
MANAGEMENT_VERSION = "3.10.8"  # the RabbitMQ management API version whose format this follows


def node_name(broker: Broker, node_id: str | None = None) -> str:
    """RabbitMQ names nodes ``name@host``; raftmq nodes are named by node_id."""
    return f"raftmq@{node_id or broker.config.node_id}"


def queue_view(broker: Broker, queue: QueueInfo, rates: Rates, figures: Figures | None = None) -> dict:
    """``figures``: a queue group's queue's counts from its worker (issue 34, node/group_figures.py)."""
    ready, unacked = queue.messages_ready, queue.messages_unacknowledged
    exclusive = queue.exclusive_owner is not None
    view = {
        "name": queue.name,
        "vhost": queue.vhost,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": exclusive,
        "arguments": queue.arguments,
        "node": node_name(broker),
        "type": "classic",
        "state": "running",
        "policy": None,
        "operator_policy": None,
        "effective_policy_definition": {},
        "exclusive_consumer_tag": None,
        "single_active_consumer_tag": None,
        "consumers": queue.consumers,
        "consumer_capacity": 1.0 if queue.consumers else 0,
        "consumer_utilisation": 1.0 if queue.consumers else 0,
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_bytes_ready": queue.message_bytes_ready,
        "messages_details": {"rate": rates.queue_rate(queue, "messages")},
        "messages_ready_details": {"rate": rates.queue_rate(queue, "messages_ready")},
        "messages_unacknowledged_details": {"rate": rates.queue_rate(queue, "messages_unacknowledged")},
        # RabbitMQ's per-queue message_stats (KEDA's MessageRate reads publish_details): publishes
        # since the queue was declared; deliveries (deliver + get) and acks counted by the machine
        # per queue since this node started applying (store/core/machine.py queue_counts).
        "message_stats": _message_stats(broker, queue, rates, figures),
    }
    if exclusive:
        view["owner_pid_details"] = {"name": queue.exclusive_owner}  # the owning connection
    return view


def _message_stats(broker: Broker, queue: QueueInfo, rates: Rates, figures: Figures | None = None) -> dict:
    delivered, acked = (figures.delivered, figures.acked) if figures is not None else \
        queue_counts(broker.machine, queue.qid)
    return {"publish": queue.published, "publish_details": {"rate": rates.queue_rate(queue, "publish")},
            "deliver_get": delivered, "deliver_get_details": {"rate": rates.queue_rate(queue, "deliver_get")},
            "ack": acked, "ack_details": {"rate": rates.queue_rate(queue, "ack")}}


def exchange_view(exchange: ExchangeInfo, plugins: bool = False) -> dict:
    """``plugins``: with the plugin exchanges' own info items (not in definitions)."""
    view = {
        "name": exchange.name,
        "vhost": exchange.vhost,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": dict(exchange.arguments or {}),
        "user_who_performed_action": "rmq-internal" if is_default_exchange(exchange.name) else "",
        "policy": None,
    }
    if plugins:
        # The plugins' own info items: rabbitmq-delayed-message-exchange's messages_delayed, the
        # deduplication plugin's cache_info (issue 21).
        if exchange.type == "x-delayed-message":
            view["messages_delayed"] = exchange.messages_delayed
        elif exchange.type == "x-message-deduplication":
            view["cache_info"] = {"entries": exchange.cache_entries or 0, "size": exchange.cache_size}
    return view


def by_name(item: QueueInfo | ExchangeInfo | VhostInfo) -> str:
    """The sort key of RabbitMQ's listings (queries return model order)."""
    return item.name


def is_default_exchange(name: str) -> bool:
    """The exchanges every vhost is created with (RabbitMQ leaves them out of definitions)."""
    return name == "" or name.startswith("amq.")


def binding_view(vhost: str, binding: BindingInfo) -> dict:
    return {
        "source": binding.source,
        "vhost": vhost,
        "destination": binding.destination,
        "destination_type": "queue" if binding.dest_is_queue else "exchange",
        "routing_key": binding.routing_key,
        "arguments": dict(binding.arguments or {}),
        "properties_key": properties_key(binding.routing_key, binding.arguments),
    }


def properties_key(routing_key: str, arguments: dict | None) -> str:
    """RabbitMQ's handle of a binding in /api/bindings/.../props: the routing key, ``~`` and a hash of
    the arguments when there are any (characters outside the URL-safe set percent-encoded)."""
    from urllib.parse import quote

    key = quote(routing_key, safe="") if routing_key else "~"
    if arguments:
        import hashlib

        digest = hashlib.sha1(repr(sorted(arguments.items())).encode()).hexdigest()[:12]
        key = f"{key}~{digest}"
    return key


def default_binding(vhost: str, queue: QueueInfo) -> dict:
    """Every queue is bound to the default exchange by its name (RabbitMQ lists it first)."""
    return {"source": "", "vhost": vhost, "destination": queue.name, "destination_type": "queue",
            "routing_key": queue.name, "arguments": {}, "properties_key": quote_key(queue.name)}


def quote_key(routing_key: str) -> str:
    return properties_key(routing_key, None)


def permission_view(user: str, vhost: str, patterns: tuple[str, str, str]) -> dict:
    configure, write, read = patterns
    return {"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read}
