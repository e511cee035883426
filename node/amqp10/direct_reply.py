"""RabbitMQ 4.2's direct reply-to over AMQP 1.0, as raftmq offers it.

RabbitMQ 4.2's clients (rabbitmq-amqp-python-client's ``ConsumerSettleStrategy.DirectReplyTo``) attach
a receiver with a *dynamic* source (3.5.3) whose capabilities include ``rabbitmq:volatile-queue``; the
broker answers with the address ``/queues/amq.rabbitmq.reply-to.<id>``, which requesters then send
their replies to.  raftmq's dynamic source is already a server-named exclusive auto-delete queue
(links.py): with that capability it is named ``amq.rabbitmq.reply-to.<id>`` instead of
``amq.gen-<id>``, so the client finds the address it checks for, and sends to it are ordinary sends to
that queue.  Unlike RabbitMQ's volatile queue it is a queue like any other (at-least-once, in the
replicated state); it goes with its link's connection.
"""

from __future__ import annotations

VOLATILE = "rabbitmq:volatile-queue"
REPLY_TO_PREFIX = "amq.rabbitmq.reply-to."
GENERATED_PREFIX = "amq.gen-"


def dynamic_queue_prefix(source) -> str:
    """The name prefix of the queue a dynamic ``source`` gets."""
    capabilities = getattr(source, "capabilities", None) or []  # a multiple field: a list (performatives.py)
    return REPLY_TO_PREFIX if VOLATILE in capabilities else GENERATED_PREFIX
