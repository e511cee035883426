"""Vhost and user limits in a 3-node cluster (issue 31 item 7): limits are replicated state.

Set through one follower's HTTP API, a vhost's max-queues holds on every node -- a declare through
another node is refused with 406 at the count, since the state machine checks it at apply -- and a
vhost's max-connections and a user's limits are seen by every node's API and enforced by every node
against its own clients (node/limits.py: counts are per node, so a vhost with max-connections 1 takes
one connection through *each* node; the approximation docs/design.md states).  The replicas' state
digests (which cover the limits) stay equal.
"""

from __future__ import annotations

import re

import pika
import pika.exceptions as pex
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port
from tests.support.http_api import call, path
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def _params(node, vhost: str) -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", node.port, vhost, pika.PlainCredentials("guest", "guest"),
                                     connection_attempts=1, socket_timeout=5)


def test_limits_set_on_one_node_hold_on_the_others(tmp_path):
    cluster = Cluster(3, tmp_path)
    bases = {}
    for node in cluster.nodes:
        port = free_port()
        node.extra_args = ["--http-port", str(port)]
        bases[node.node_id] = f"http://127.0.0.1:{port}"
    with cluster:
        leader = cluster.leader()
        cluster.wait_formed()
        follower, other = [n for n in cluster.nodes if n is not leader]
        via = bases[follower.node_id]
        vhost = "limited"
        assert call(via, "PUT", path("vhosts", vhost))[0] == 201
        assert call(via, "PUT", path("vhost-limits", vhost, "max-queues"), body={"value": 3})[0] == 204
        assert call(via, "PUT", path("vhost-limits", vhost, "max-connections"), body={"value": 1})[0] == 204
        expected = [{"vhost": vhost, "value": {"max-queues": 3, "max-connections": 1}}]
        for node_id, base in bases.items():
            wait_for(lambda b=base: call(b, "GET", path("vhost-limits", vhost))[1] == expected,
                  what=f"the limits on {node_id}")

        # max-queues: two queues through the leader, one through the other follower, then refused there.
        conns = {}
        for node in (leader, other):
            conns[node.node_id] = wait_for(lambda n=node: _try_connect(n, vhost), what=f"a connection to {node.node_id}")
        ch = conns[leader.node_id].channel()
        ch.queue_declare("a")
        ch.queue_declare("b")
        ch = conns[other.node_id].channel()
        ch.queue_declare("c")
        with pytest.raises(pex.ChannelClosedByBroker) as refused:
            ch.queue_declare("d")
        assert refused.value.reply_code == 406
        assert "queue limit in vhost 'limited' (3) is reached" in refused.value.reply_text

        # max-connections 1 is enforced by each node for its own clients: a second one through the
        # same node is refused with 530 (the first connection through each node was admitted above).
        with pytest.raises(pex.AMQPConnectionError) as over:
            pika.BlockingConnection(_params(other, vhost))
        assert re.search(r"\(530\) .*connection limit \(1\) is reached", str(over.value)), over.value
        for conn in conns.values():
            conn.close()

        cluster.wait_applied_equal()
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests
        for base in bases.values():
            assert len([q for q in call(base, "GET", path("queues", vhost))[1]]) == 3


def _try_connect(node, vhost: str) -> pika.BlockingConnection | None:
    """A connection, or None while the node has not applied the vhost yet."""
    try:
        return pika.BlockingConnection(_params(node, vhost))
    except pex.AMQPConnectionError:
        return None
