"""What a receiver's source asks for beyond "read this queue" (3.5.3): browsing, topics and durable
subscriptions -- and a truthful refusal of what we do not do.

* **Browsing** -- ``distribution-mode`` ``copy`` (3.5.7 std-dist-mode): "once successfully transferred
  over the link, the message will still be available to other links from the same node".  The link
  subscribes with the core's browse mode (``MESSAGE_SUBSCRIBE`` browse, the 0-10 not-acquired
  subscription of store/core/sessions.py): it sees the queue's ready messages in order and takes none.
  Its deliveries are sent pre-settled (an outcome could not change anything) and the attach reply
  echoes ``copy``.  Other distribution modes are refused with ``amqp:not-implemented``.
* **Topics** -- a source address ``topic://name`` (ActiveMQ / Artemis, rhea's pub-sub examples), a
  plain address with the source capability ``topic`` (Qpid JMS), or RabbitMQ 4's
  ``/exchanges/:exchange/:binding-key``: the receiver gets a queue of its own bound to the exchange
  (``topic://`` means ``amq.topic``, the name the binding key; ActiveMQ's multi-word wildcard ``>`` is
  read as ``#``, Artemis' ``#`` and ``*`` are the topic exchange's own).  A non-durable subscription
  is a server-named exclusive auto-delete queue: it goes with the link (or the connection).
* **Durable subscriptions** (the JMS-over-AMQP mapping): a topic source with ``durable``
  configuration or unsettled-state and ``expiry-policy`` never names a durable queue after the
  client's container-id and the link name, ``amq.sub.<container-id>.<link-name>``; it stays bound
  while the client is away (messages published meanwhile wait in it) and the client gets it back
  by attaching the same link name from the same container-id.  A detach with ``closed`` deletes it
  (2.6.6: closing a link ends the subscription).  With ``durable`` unsettled-state the link is also
  a durable link (recovery.py: its unsettled deliveries resume across connections and nodes).

The plan is computed before anything is submitted, so a refused attach changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Container
from dataclasses import dataclass, field

from raftmq.protocol.amqp10 import performatives as p
from raftmq.store.core.commands import QueueBind, QueueDeclare

from .address import TOPIC_EXCHANGE, AddressError, Target, parse_target, parse_topic

MOVE, COPY = "move", "copy"  # std-dist-mode (3.5.7)
NEVER = "never"  # terminus-expiry-policy (3.5.6)
CONFIGURATION = 1  # terminus-durability (3.5.5): 1 configuration, 2 unsettled-state
TOPIC_CAPABILITY = "topic"  # Qpid JMS marks a topic destination's terminus with it
SUBSCRIPTION_PREFIX = "amq.sub."  # durable subscription queues (server-named: clients cannot declare amq.*)


class Refusal(Exception):
    """An attach we answer at once with a null terminus and a detach carrying this error (2.6.3)."""

    def __init__(self, condition: str, text: str) -> None:
        super().__init__(text)
        self.condition, self.text = condition, text


@dataclass
class SourcePlan:
    """How an outgoing link reads: ``queue`` set for a topic subscription (its queue, created by
    ``setup`` on the link's core channel before the subscribe), ``browse`` for distribution-mode copy."""

    browse: bool = False
    queue: str | None = None
    setup: list = field(default_factory=list)
    durable: bool = False  # a durable subscription: detach with closed deletes its queue


def _capabilities(terminus) -> set[str]:
    caps = terminus.capabilities or []
    return {str(c) for c in (caps if isinstance(caps, list) else [caps])}


def topic_of(address, capabilities: set[str]) -> Target | None:
    """The exchange and binding key a topic address names, None for a queue address."""
    if not isinstance(address, str):
        return None
    topic = parse_topic(address)
    if topic is None and TOPIC_CAPABILITY in capabilities and address and not address.startswith("/"):
        topic = parse_topic("topic://" + address)
    return topic


def plan_source(conn, source, link_name: str, exchanges: Container[str] | None = None) -> SourcePlan:
    """The plan for a receiver's source; raises :class:`Refusal` or AddressError.  ``exchanges``: the
    vhost's, to refuse a subscription to a missing exchange with not-found before declaring its queue."""
    plan = SourcePlan()
    if not isinstance(source, p.Source):
        return plan
    mode = source.distribution_mode
    if mode is not None and str(mode) not in (MOVE, COPY):
        raise Refusal("amqp:not-implemented", f"distribution-mode '{mode}' is not supported (move, copy)")
    plan.browse = mode is not None and str(mode) == COPY
    if source.dynamic:
        return plan
    topic = topic_of(source.address, _capabilities(source))
    if topic is None:
        return plan
    if not topic.exchange:
        raise AddressError("the default exchange cannot be subscribed to (use /queues/:queue)")
    if exchanges is not None and topic.exchange not in exchanges:
        raise Refusal("amqp:not-found", f"no exchange '{topic.exchange}' in vhost '{conn.vhost}'")
    durable = (source.durable or 0) >= CONFIGURATION and str(source.expiry_policy or "") == NEVER
    if durable:
        name = f"{SUBSCRIPTION_PREFIX}{conn.container_id}.{link_name}"
        declare = QueueDeclare(conn.conn_id, None, 0, conn.vhost, name, False, True, False, False, {}, True)
    else:
        name = f"amq.gen-{uuid.uuid4()}"
        declare = QueueDeclare(conn.conn_id, None, 0, conn.vhost, name, False, False, True, True, {}, True)
    bind = QueueBind(conn.conn_id, None, 0, conn.vhost, name, topic.exchange, topic.routing_key or "", {})
    plan.queue, plan.setup, plan.durable = name, [declare, bind], durable
    return plan


def check_target(target) -> None:
    """A sender's target: a dynamic target (a node we would create for the client) is not supported."""
    if isinstance(target, p.Target) and target.dynamic:
        raise Refusal("amqp:not-implemented", "dynamic targets are not supported (use a dynamic source)")


def target_of(target) -> Target | None:
    """Where a sender's target routes (None: a null target, each message's 'to'); a plain address with
    the capability ``topic`` (Qpid JMS) is that topic.  Raises :class:`Refusal` or AddressError."""
    check_target(target)
    address = target.address if isinstance(target, p.Target) else None
    if address is None:
        return None
    if not isinstance(address, str):
        raise AddressError("target address must be a string")
    if TOPIC_CAPABILITY in _capabilities(target) and address and not address.startswith("/") \
            and "://" not in address:
        return Target(TOPIC_EXCHANGE, address)
    return parse_target(address)
