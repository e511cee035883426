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


def test_failover_list_and_redirect_to_leader(tmp_path) -> None:
    """open's failover-server-list names every member; with amqp10_redirect_to_leader a follower answers
    open with amqp:connection:redirect (2.8.16) whose info is the leader's address, the leader opens."""
    from raftmq.protocol.amqp10 import performatives as p
    from tests.integration.test_amqp10_raw import Raw

    with Cluster(3, tmp_path, extra_config="amqp10_redirect_to_leader = true") as cluster:
        leader = cluster.leader()
        follower = cluster.followers()[0]
        raw = Raw(follower.port)
        try:
            raw.login()
            servers = raw.open.properties["failover-server-list"]
            assert sorted(s["port"] for s in servers) == sorted(n.port for n in cluster.nodes)
            close = raw.performative()
            assert isinstance(close, p.Close) and close.error.condition == "amqp:connection:redirect"
            assert (close.error.info["network-host"], close.error.info["port"]) == ("127.0.0.1", leader.port)
        finally:
            raw.close()
        raw = Raw(leader.port)
        try:
            raw.login()
            raw.send(p_encode_begin())
            assert isinstance(raw.performative(), p.Begin)  # open, not redirected
        finally:
            raw.close()


def p_encode_begin() -> bytes:
    from raftmq.protocol.amqp10 import performatives as p
    from raftmq.protocol.amqp10.frames import encode_frame

    return encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10))
