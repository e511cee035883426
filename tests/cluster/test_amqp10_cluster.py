"""AMQP 1.0 in a 3-node cluster: a sender on a follower, a receiver on the other follower, and the
leader killed after every message was accepted.

2.6.12: an unsettled transfer's outcome is sent once the publish is applied, which in a cluster means
committed by a majority; so every accepted message must survive the loss of the leader.
"""

from __future__ import annotations

import pika
import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection

from raftmq.ops.local.cluster import Cluster

pytestmark = pytest.mark.cluster

N = 200


def test_accepted_messages_survive_a_leader_kill(tmp_path) -> None:
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        first, second = cluster.followers()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=first.port))
        admin.channel().queue_declare("a10-durable", durable=True)
        admin.close()
        sender_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{first.port}", timeout=20)
        sender = sender_conn.create_sender("/queues/a10-durable")
        for i in range(N):
            delivery = sender.send(Message(body=f"{i}", durable=True))
            assert delivery.remote_state == Delivery.ACCEPTED
        sender_conn.close()
        leader.kill9()
        cluster.leader(timeout=20, exclude=leader)
        receiver_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{second.port}", timeout=20)
        receiver = receiver_conn.create_receiver("/queues/a10-durable", credit=50)
        got = []
        for _ in range(N):
            got.append(int(receiver.receive(timeout=20).body))
            receiver.accept()
        receiver_conn.close()
        assert got == list(range(N))
