"""AMQP 1.0 durable topic subscriptions in a 3-node cluster (node/amqp10/terminus.py, recovery.py).

3.5.5/3.5.6 with the JMS-over-AMQP mapping: a topic source with durable unsettled-state and
expiry-policy never is a durable queue named by the client's container-id and the link name,
replicated like every queue; the subscriber that re-attaches the link by name on any node gets what
was published while it was away.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest
from proton import Message
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection

from raftmq.ops.local.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_durable_subscription_survives_a_leader_kill(tmp_path) -> None:
    """Subscribed on the leader, the subscriber leaves, the leader is killed -9, five messages are
    published to the topic through a follower; the subscriber re-attaches the same link name from the
    same container-id on the other follower and receives the five, in order.  m0, accepted before the
    kill, may come again (first-mode settlement is at-least-once across a failover) but nothing else."""
    container, name, topic = f"c-{uuid.uuid4().hex[:8]}", "prices", "PRICE.STOCK.NYSE.RHT"
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        first, second = cluster.followers()
        conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{leader.port}", timeout=20,
                                  container_id=container)
        receiver = conn.create_receiver(f"topic://{topic}", name=name, credit=10, options=DurableSubscription())
        publisher = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{leader.port}", timeout=20)
        publisher.create_sender(f"topic://{topic}").send(Message(body="m0"))
        publisher.close()
        assert receiver.receive(timeout=20).body == "m0"
        receiver.accept()
        conn.close()  # the subscriber goes away; its subscription stays
        time.sleep(0.5)  # bounded: lets the settlement reach the log before the kill (not required)
        leader.kill9()
        cluster.leader(timeout=20, exclude=leader)
        publisher = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{first.port}", timeout=20)
        sender = publisher.create_sender(f"topic://{topic}")
        for i in range(1, 6):
            sender.send(Message(body=f"m{i}", durable=True))  # unsettled: accepted once committed
        publisher.close()
        conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{second.port}", timeout=20,
                                  container_id=container)
        receiver = conn.create_receiver(f"topic://{topic}", name=name, credit=10, options=DurableSubscription())
        got = []
        while len(got) < 6:
            got.append(receiver.receive(timeout=20).body)
            receiver.accept()
            if got[-1] == "m5":
                break
        receiver.close()  # detach closed=true: the subscription ends
        conn.close()
        assert got[-5:] == [f"m{i}" for i in range(1, 6)] and set(got[:-5]) <= {"m0"}
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=second.port))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            admin.channel().queue_declare(f"amq.sub.{container}.{name}", passive=True)
        assert gone.value.reply_code == 404
        admin.close()
