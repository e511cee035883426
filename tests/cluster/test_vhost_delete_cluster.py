"""A vhost deleted through a follower's HTTP API, in a 3-node cluster: VHOST_DELETE goes through the
log, so every node drops the vhost and its queues, and every node closes its own clients' connections
on it (OUT_VHOST_CLOSED) with 320 CONNECTION_FORCED, as RabbitMQ does; the replicas' states stay
identical (digests).  Permissions for the configuration file's guest set through one node's API (the
replicated overlay) let guest log in through every node.
"""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port
from tests.support.http_api import call, path
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def _connect(node, vhost: str, timeout: float = 15.0) -> pika.BlockingConnection:
    """A pika connection to ``vhost`` through ``node``, retried while the node has not applied the
    vhost or the permission yet (a follower applies the log a moment after the leader)."""
    params = pika.ConnectionParameters("127.0.0.1", node.port, vhost, pika.PlainCredentials("guest", "guest"),
                                       connection_attempts=1, socket_timeout=5)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return pika.BlockingConnection(params)
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_vhost_delete_through_a_follower_takes_effect_on_every_node(tmp_path):
    cluster = Cluster(3, tmp_path)
    bases = {}
    for node in cluster.nodes:
        port = free_port()
        node.extra_args = ["--http-port", str(port)]
        bases[node.node_id] = f"http://127.0.0.1:{port}"
    with cluster:
        leader = cluster.leader()
        cluster.wait_formed()
        follower = next(n for n in cluster.nodes if n is not leader)
        via = bases[follower.node_id]
        vhost = "doomed"
        # Created through the follower by guest, a configuration-file administrator: the creator's
        # permissions (overlay) replicate, so guest may log in through every node.
        assert call(via, "PUT", path("vhosts", vhost))[0] == 201
        conns = {n.node_id: _connect(n, vhost) for n in cluster.nodes}
        ch = conns[leader.node_id].channel()
        ch.queue_declare("dq", durable=True)
        for i in range(5):
            ch.basic_publish("", "dq", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        consumer_ch = conns[follower.node_id].channel()
        consumer_ch.basic_qos(prefetch_count=2)
        got: list = []
        consumer_ch.basic_consume("dq", lambda c, m, p, b: got.append(b))
        for _ in range(50):
            if len(got) == 2:
                break
            conns[follower.node_id].process_data_events(time_limit=0.1)
        assert len(got) == 2  # two unacked on the follower's connection, three ready
        for base in bases.values():
            wait_for(lambda b=base: call(b, "GET", path("queues", vhost, "dq"))[0] == 200, what="the queue everywhere")

        assert call(via, "DELETE", path("vhosts", vhost))[0] == 204

        for node_id, conn in conns.items():
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                for _ in range(150):
                    conn.process_data_events(time_limit=0.1)
            assert closed.value.reply_code == 320, node_id
            assert "vhost 'doomed' is deleted" in closed.value.reply_text
        for node_id, base in bases.items():
            wait_for(lambda b=base: call(b, "GET", path("vhosts", vhost))[0] == 404, what=f"the delete on {node_id}")
            assert not [q for q in call(base, "GET", "/api/queues")[1] if q["vhost"] == vhost]
            assert not [p for p in call(base, "GET", "/api/permissions")[1] if p["vhost"] == vhost]
            assert call(base, "DELETE", path("vhosts", vhost))[0] == 404
        cluster.wait_applied_equal()
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests
