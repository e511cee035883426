"""Filters on 1.0 receivers in a 3-node cluster (issue 37): evaluated in the replicated state machine,
so every replica assigns the same messages to the same consumers.

Two proton receivers with complementary JMS selectors, each on another follower, share a queue fed
through the leader; a backlog of non-matching messages longer than one dispatch scans
(store/core/delivery.py SCAN_LIMIT) sits in front of a match, so the scan goes on through TICK entries in
the log.  Each receiver gets exactly its messages, and the replicas' state digests (which cover each
consumer's filter and scan cursor) are equal.
"""

from __future__ import annotations

import pika
import pytest
from proton import Message
from proton.reactor import Selector
from proton.utils import BlockingConnection

from raftmq.ops.local.cluster import Cluster
from raftmq.store.core.delivery import SCAN_LIMIT

pytestmark = pytest.mark.cluster

TIMEOUT = 20


def test_complementary_selectors_on_two_followers(tmp_path) -> None:
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        first, second = cluster.followers()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=leader.port))
        channel = admin.channel()
        channel.queue_declare("a10-sel")
        backlog = SCAN_LIMIT + 200
        for _ in range(backlog):
            channel.basic_publish("", "a10-sel", b"filler", pika.BasicProperties(headers={"colour": "grey"}))
        red_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{first.port}", timeout=TIMEOUT)
        rest_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{second.port}", timeout=TIMEOUT)
        try:
            red = red_conn.create_receiver("/queues/a10-sel", credit=50, options=Selector("colour = 'red'"))
            rest = rest_conn.create_receiver("/queues/a10-sel", credit=50,
                                             options=Selector("colour IN ('green', 'blue')"))
            sender_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{leader.port}", timeout=TIMEOUT)
            sender = sender_conn.create_sender("/queues/a10-sel")
            colours = ["red", "green", "blue", "red", "green", "red"]
            for i, colour in enumerate(colours):
                sender.send(Message(body=f"{colour}{i}", properties={"colour": colour}))
            sender_conn.close()
            got_red, got_rest = [], []
            for _ in range(3):
                got_red.append(red.receive(timeout=TIMEOUT).body)
                red.accept()
                got_rest.append(rest.receive(timeout=TIMEOUT).body)
                rest.accept()
            assert got_red == ["red0", "red3", "red5"]
            assert got_rest == ["green1", "blue2", "green4"]
            cluster.wait_applied_equal()
            digests = cluster.digests()
            assert len({d for _, d in digests.values()}) == 1, digests
        finally:
            red_conn.close()
            rest_conn.close()
        assert channel.queue_declare("a10-sel", passive=True).method.message_count == backlog
        admin.close()
