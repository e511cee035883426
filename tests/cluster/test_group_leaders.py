"""Every Raft group's leader in a three-node cluster with ``raft_groups = 3`` (issue 34: "Failover
per group: a killed node's groups get new leaders; status.json, /api/nodes, metrics and `raftmq
cluster status` show every group"; "group leaders are spread over the nodes and rebalanced ...
`raftmq cluster rebalance` and the HTTP API show and move them").

One cluster for the module (three nodes and six workers take ~10 s to start on this machine), its
tests in order: what each checks is in its docstring.  Real processes, pika, the CLI as a
subprocess and the HTTP API over a socket.  Queues are placed with the ``x-queue-group`` argument
of queue.declare (0-9-1 reference 1.7.2.1.8, arguments), published with publisher confirms
(basic.publish, 0-9-1 reference 1.8.3.7; confirm.select is RabbitMQ's extension).
"""

from __future__ import annotations

import json
import urllib.request

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import consume_acked
from tests.support.http_api import call
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

GROUPS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(3, tmp_path_factory.mktemp("group-leaders"),
                      extra_config=f"raft_groups = {GROUPS}\nleader_rebalance_seconds = 2")
    for node in cluster.nodes:
        http, metrics = free_port(), free_port()
        node.extra_args = ["--http-port", str(http), "--metrics-port", str(metrics)]
        node.http = f"http://127.0.0.1:{http}"  # type: ignore[attr-defined]
        node.metrics = f"http://127.0.0.1:{metrics}/metrics"  # type: ignore[attr-defined]
    with cluster:
        yield cluster


def group_status(node: RaftmqNode) -> list[dict]:
    st = node.status() or {}
    return st.get("group_status") or []


def leaders_seen(cluster: Cluster) -> dict[int, str] | None:
    """Each group's leader, when every live node's status.json names the same one for every group
    and that node itself says it leads; else None."""
    live = [n for n in cluster.nodes if n.is_alive()]
    named: dict[int, set] = {}
    leading: dict[int, set] = {}
    for node in live:
        views = group_status(node)
        if len(views) != GROUPS or (node.status() or {}).get("pid") != node.pid:
            return None
        for view in views:
            named.setdefault(view["group"], set()).add(view["leader"])
            if view["role"] == "leader":
                leading.setdefault(view["group"], set()).add(node.node_id)
    out = {}
    for group in range(GROUPS):
        names = named.get(group, set())
        if len(names) != 1 or None in names or leading.get(group) != names:
            return None
        out[group] = names.pop()
    return out


def test_every_group_visible_and_leaders_spread_one_per_node(cluster):
    """The metadata leader spreads the groups' leaders one per node (leader_rebalance_seconds after
    forming); every node's status.json lists every group with role, term, indexes, lag and leader,
    and so do /api/nodes (raft.groups), the metrics (label group) and `raftmq cluster status`."""
    leaders = wait_for(lambda: (lambda seen: seen if seen and len(set(seen.values())) == 3 else None)(
        leaders_seen(cluster)), timeout=40, what="one group leader per node")
    for node in cluster.nodes:
        for view in group_status(node):
            assert view["role"] == ("leader" if leaders[view["group"]] == node.node_id else "follower")
            assert view["term"] >= 1 and view["lag"] >= 0
            assert 0 < view["applied_index"] <= view["commit_index"] + 1
    node = cluster.nodes[0]
    status, nodes = call(node.http, "GET", "/api/nodes")
    assert status == 200
    me = next(n for n in nodes if n["name"] == f"raftmq@{node.node_id}")
    assert [g["group"] for g in me["raft"]["groups"]] == [0, 1, 2]
    assert {g["group"]: g["leader"] for g in me["raft"]["groups"]} == leaders
    with urllib.request.urlopen(node.metrics, timeout=10) as response:
        text = response.read().decode()
    for group, leader in leaders.items():
        assert f'raftmq_group_leader{{group="{group}",leader="{leader}",node="{node.node_id}"}} 1.0' in text
        assert f'raftmq_group_raft_term{{group="{group}",node="{node.node_id}"}}' in text
    shown = json.loads(cluster.admin("status"))["groups"]
    assert {row["group"]: row["leader"] for row in shown} == leaders
    assert all(len(row["replicas"]) == 3 and all(r["lag"] is not None for r in row["replicas"]) for row in shown)


def test_rebalance_moves_a_leader_and_the_http_api_spreads_them_again(cluster):
    """`raftmq cluster rebalance --to NODE --group 1` moves group 1's leader there (and prints it);
    POST /api/raftmq/rebalance (administrator) spreads them one per node again; GET
    /api/raftmq/groups shows the same leaders."""
    before = wait_for(lambda: leaders_seen(cluster), timeout=20, what="every group's leader")
    target = next(n.node_id for n in cluster.nodes if n.node_id != before[1])
    printed = json.loads(cluster.admin("rebalance", "--to", target, "--group", "1"))
    assert printed["failed"] == [] and printed["leaders"]["1"] == target
    wait_for(lambda: (leaders_seen(cluster) or {}).get(1) == target, timeout=10, what="status.json to show the move")
    node = cluster.nodes[1]
    status, body = call(node.http, "POST", "/api/raftmq/rebalance", body={})
    assert status == 200 and body["failed"] == []
    assert sorted(body["leaders"].values()) == ["n1", "n2", "n3"]
    status, shown = call(node.http, "GET", "/api/raftmq/groups")
    assert status == 200 and sorted(shown["alive"]) == ["n1", "n2", "n3"]
    assert {str(row["group"]): row["leader"] for row in shown["groups"]} == body["leaders"]
    status, _ = call(node.http, "POST", "/api/raftmq/rebalance", body={"node": "nobody"})
    assert status == 400


def test_kill_9_of_a_node_leading_two_groups_every_group_confirms_again(cluster):
    """A node made to lead both queue groups is killed -9 (main process and workers): every group
    gets a leader among the survivors, and a confirmed publish to a queue of each group (placed
    with x-queue-group) through a survivor succeeds; each queue then holds its messages.  Once
    the node returns, the metadata leader spreads the leaders one per node again, the returned
    node leading one."""
    victim = cluster.nodes[2]
    printed = json.loads(cluster.admin("rebalance", "--to", victim.node_id, "--group", "1", "--group", "2"))
    assert printed["failed"] == [] and printed["leaders"]["1"] == printed["leaders"]["2"] == victim.node_id
    survivor = cluster.nodes[0]
    conn = cluster.connection(survivor)
    ch = conn.channel()
    ch.confirm_delivery()
    for group in range(GROUPS):
        ch.queue_declare(f"lead-q{group}", durable=True, arguments={"x-queue-group": group})
        ch.basic_publish("", f"lead-q{group}", b"before", pika.BasicProperties(delivery_mode=2))
    conn.close()
    victim.kill9_whole()
    seen = wait_for(lambda: leaders_seen(cluster), timeout=30, what="a leader for every group among the survivors")
    assert victim.node_id not in seen.values()
    conn = cluster.connection(survivor, timeout=20)
    ch = conn.channel()
    ch.confirm_delivery()
    for group in range(GROUPS):
        ch.basic_publish("", f"lead-q{group}", b"after", pika.BasicProperties(delivery_mode=2))  # raises unless confirmed
    for group in range(GROUPS):
        assert consume_acked(ch, f"lead-q{group}", 2) == [b"before", b"after"]
    conn.close()
    victim.start()
    spread = wait_for(lambda: (lambda seen: seen if seen and len(set(seen.values())) == 3 else None)(
        leaders_seen(cluster)), timeout=60, what="the returned node to be given a group to lead")
    assert victim.node_id in spread.values()
