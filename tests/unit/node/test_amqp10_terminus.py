"""node/amqp10/terminus.py: what a receiver's source or a sender's target asks for, as a plan (no I/O).

3.5.3 source (distribution-mode, dynamic), 3.5.4 target (dynamic), 3.5.5/3.5.6 durability and
expiry-policy (a durable subscription: configuration or unsettled-state, and never), 3.5.7 std-dist-mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from raftmq.node.amqp10.address import AddressError, Target
from raftmq.node.amqp10.terminus import Refusal, plan_source, target_of
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.store.core.commands import QueueBind, QueueDeclare


@dataclass
class Conn:
    """The three connection attributes plan_source reads."""

    conn_id: str = "c1"
    vhost: str = "/"
    container_id: str = "app"


def test_queue_sources_plan_nothing_extra() -> None:
    """A plain queue source (and a dynamic one) subscribes as before: no queue of its own, move."""
    for source in (p.Source(address="q"), p.Source(dynamic=True), None):
        plan = plan_source(Conn(), source, "l")
        assert plan.queue is None and plan.setup == [] and not plan.browse


def test_copy_browses_and_other_modes_are_refused() -> None:
    """3.5.7: copy browses; move is the default; anything else is amqp:not-implemented."""
    assert plan_source(Conn(), p.Source(address="q", distribution_mode=t.Symbol("copy")), "l").browse
    assert not plan_source(Conn(), p.Source(address="q", distribution_mode=t.Symbol("move")), "l").browse
    with pytest.raises(Refusal) as refused:
        plan_source(Conn(), p.Source(address="q", distribution_mode=t.Symbol("round-robin")), "l")
    assert refused.value.condition == "amqp:not-implemented"


def test_non_durable_topic_subscription() -> None:
    """topic://name: a server-named exclusive auto-delete queue bound to amq.topic with the key."""
    plan = plan_source(Conn(), p.Source(address="topic://a.*"), "l")
    declare, bind = plan.setup
    assert isinstance(declare, QueueDeclare) and isinstance(bind, QueueBind)
    assert plan.queue.startswith("amq.gen-") and not plan.durable
    assert (declare.durable, declare.exclusive, declare.auto_delete, declare.server_named) == (False, True, True, True)
    assert (bind.queue, bind.exchange, bind.routing_key) == (plan.queue, "amq.topic", "a.*")


@pytest.mark.parametrize("durable", [1, 2])
def test_durable_subscription_is_named_by_container_and_link(durable: int) -> None:
    """Durable (configuration or unsettled-state) + expiry never: a durable queue named by the
    container-id and link name, so a reconnect finds it; without 'never' it is not durable."""
    source = p.Source(address="/exchanges/amq.topic/k", durable=durable, expiry_policy=t.Symbol("never"))
    plan = plan_source(Conn(container_id="app"), source, "sub")
    declare, bind = plan.setup
    assert plan.durable and plan.queue == "amq.sub.app.sub" == declare.name == bind.queue
    assert (declare.durable, declare.exclusive, declare.auto_delete) == (True, False, False)
    source.expiry_policy = t.Symbol("session-end")
    assert not plan_source(Conn(), source, "sub").durable


def test_topic_capability_and_default_exchange() -> None:
    """Qpid JMS: a plain address with capability 'topic' is that topic; the default exchange cannot
    be subscribed to."""
    plan = plan_source(Conn(), p.Source(address="news", capabilities=[t.Symbol("topic")]), "l")
    assert plan.setup[1].exchange == "amq.topic" and plan.setup[1].routing_key == "news"
    with pytest.raises(AddressError):
        plan_source(Conn(), p.Source(address="/exchanges/amq.default/k"), "l")


def test_targets() -> None:
    """3.5.4: a dynamic target is refused (not-implemented); 'topic' capability and topic:// route to
    amq.topic; a null target routes by each message's 'to'."""
    with pytest.raises(Refusal):
        target_of(p.Target(dynamic=True))
    assert target_of(p.Target(address="news", capabilities=[t.Symbol("topic")])) == Target("amq.topic", "news")
    assert target_of(p.Target(address="topic://x.y")) == Target("amq.topic", "x.y")
    assert target_of(p.Target(address="q")) == Target("", "q")
    assert target_of(p.Target()) is None and target_of(None) is None
