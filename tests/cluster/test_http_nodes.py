"""/api/nodes and replicated changes through the HTTP management API of a 3-node cluster.

Every node answers /api/nodes with every member; the ``raft`` object tells who leads (all nodes
agree, with one term), the answering node's commit and applied index, and on the leader each
follower's lag.  A queue declared and a message published through one node's API are seen
through every other node's (changes are log commands).  A killed member shows as not running.
"""

from __future__ import annotations

import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port
from tests.support.http_api import call, path
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_nodes_raft_view_and_replicated_changes(tmp_path):
    cluster = Cluster(3, tmp_path)
    bases = {}
    for node in cluster.nodes:
        port = free_port()
        node.extra_args = ["--http-port", str(port)]
        bases[node.node_id] = f"http://127.0.0.1:{port}"
    with cluster:
        leader = cluster.leader()
        cluster.wait_formed()

        def views_agree():
            views = {}
            for node_id, base in bases.items():
                status, nodes = call(base, "GET", "/api/nodes")
                if status != 200 or len(nodes) != 3:
                    return None
                views[node_id] = nodes
            leaders = {n["name"] for nodes in views.values() for n in nodes if n["raft"]["leader"]}
            terms = {n["raft"]["term"] for nodes in views.values() for n in nodes}
            return views if leaders == {f"raftmq@{leader.node_id}"} and len(terms) == 1 else None

        views = wait_for(views_agree, what="every node to name the same leader in one term")
        for node_id, nodes in views.items():
            me = next(n for n in nodes if n["name"] == f"raftmq@{node_id}")
            assert me["running"] and me["raft"]["role"] == ("leader" if node_id == leader.node_id else "follower")
            assert isinstance(me["raft"]["commit_index"], int) and isinstance(me["raft"]["applied_index"], int)
            assert me["raft"]["applied_index"] <= me["raft"]["commit_index"] + 1
            others = [n for n in nodes if n is not me]
            assert all(n["raft"]["commit_index"] is None for n in others)  # only this node's own index
            lags = [n["raft"]["lag"] for n in nodes]
            if node_id == leader.node_id:
                assert all(isinstance(lag, int) and lag >= 0 for lag in lags), lags
            else:
                assert all(lag is None for lag in lags)  # followers do not know the others' lag

        follower = next(n for n in cluster.nodes if n is not leader)
        other = next(n for n in cluster.nodes if n is not leader and n is not follower)
        via = bases[follower.node_id]
        assert call(via, "PUT", path("queues", "/", "replicated"), body={"durable": True})[0] == 201
        for i in range(3):
            status, routed = call(via, "POST", path("exchanges", "/", "amq.default", "publish"),
                                  body={"properties": {"delivery_mode": 2}, "routing_key": "replicated",
                                        "payload": f"m{i}", "payload_encoding": "string"})
            assert (status, routed) == (200, {"routed": True})
        for node_id, base in bases.items():
            view = wait_for(lambda b=base: (lambda r: r[1] if r[0] == 200 and r[1]["messages"] == 3 else None)(
                call(b, "GET", path("queues", "/", "replicated"))), what=f"the queue on {node_id}")
            assert view["durable"] is True
        got = call(bases[other.node_id], "POST", path("queues", "/", "replicated", "get"),
                   body={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})[1]
        assert [m["payload"] for m in got] == ["m0"]
        assert call(bases[leader.node_id], "GET", path("aliveness-test", "/"))[1] == {"status": "ok"}

        other.kill9()
        leader_base = bases[leader.node_id]

        def killed_not_running():
            nodes = call(leader_base, "GET", "/api/nodes")[1]
            gone = next(n for n in nodes if n["name"] == f"raftmq@{other.node_id}")
            return not gone["running"] and gone["raft"]["role"] == "unknown"

        wait_for(killed_not_running, what="the killed member to show as not running")
        assert call(leader_base, "GET", "/api/health/checks/virtual-hosts")[1] == {"status": "ok"}
