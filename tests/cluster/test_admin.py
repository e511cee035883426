"""The gRPC admin API and `raftmq admin` against a running 3-node cluster."""

from __future__ import annotations

import json
import time

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port
from tests.support.cli import raftmq

pytestmark = pytest.mark.cluster


def admin(address: str, *args: str) -> str:
    done = raftmq("admin", "--address", address, *args, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def admin_fails(address: str, *args: str) -> str:
    """The error output of an admin command that must fail (exit status 1)."""
    done = raftmq("admin", "--address", address, *args, timeout=30)
    assert done.returncode == 1, done.stdout
    return done.stderr


def test_admin_cli_status_declare_list_purge_close(tmp_path):
    with Cluster(3, tmp_path) as cluster:
        ports = []
        for node in cluster.nodes:  # restart with admin ports (same data, same cluster)
            port = free_port()
            ports.append(port)
            node.extra_args = ["--admin-port", str(port)]
            node.restart()
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        address = f"127.0.0.1:{ports[cluster.nodes.index(follower)]}"

        deadline = time.monotonic() + 10
        status = json.loads(admin(address, "--json", "status"))
        while not status["leader_node"] and time.monotonic() < deadline:  # still catching up
            time.sleep(0.2)
            status = json.loads(admin(address, "--json", "status"))
        assert status["role"] == "follower" and status["leader_node"] == cluster.leader().node_id
        assert sorted(m["node_id"] for m in status["members"]) == ["n1", "n2", "n3"]

        admin(address, "declare-queue", "audit", "--durable", "--arg", "x-max-length=100")
        admin(address, "declare-exchange", "audit-x", "--type", "fanout", "--durable")
        exchanges = json.loads(admin(address, "--json", "exchanges"))["exchanges"]
        assert any(e["name"] == "audit-x" and e["type"] == "fanout" and e["durable"] for e in exchanges)
        admin(address, "delete-exchange", "audit-x")
        assert "audit-x" not in admin(address, "exchanges")
        conn = pika.BlockingConnection(pika.URLParameters(leader.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "audit", str(i).encode())
        queues = json.loads(admin(address, "--json", "queues"))["queues"]
        audit = next(q for q in queues if q["name"] == "audit")
        assert audit["durable"] and int(audit["messages_ready"]) == 5
        assert "audit" in admin(address, "queues")  # the table form
        assert json.loads(admin(address, "--json", "purge-queue", "audit"))["count"] == "5"
        ch.basic_consume("audit", lambda *a: None, consumer_tag="watcher")
        consumers = json.loads(admin(address, "--json", "consumers"))["consumers"]
        assert [(c["queue"], c["tag"], c["ack_required"]) for c in consumers] == [("audit", "watcher", True)]
        leader_status = json.loads(admin(f"127.0.0.1:{ports[cluster.nodes.index(leader)]}", "--json", "status"))
        assert all(int(m["lag"]) < 1000 for m in leader_status["members"])  # all caught up (a few in flight)

        leader_address = f"127.0.0.1:{ports[cluster.nodes.index(leader)]}"
        connections = json.loads(admin(leader_address, "--json", "connections"))["connections"]
        assert len(connections) == 1 and connections[0]["protocol"] == "0-9-1"
        admin(leader_address, "close-connection", connections[0]["id"], "--reason", "maintenance")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            for _ in range(50):
                conn.process_data_events(time_limit=0.1)
        assert info.value.reply_code == 320 and "maintenance" in info.value.reply_text

        # Deleting a missing queue succeeds (as queue.delete does in RabbitMQ); purging one is NOT_FOUND.
        assert json.loads(admin(address, "--json", "delete-queue", "missing"))["count"] == "0"
        assert "NOT_FOUND" in admin_fails(address, "purge-queue", "missing")

        # The standard grpc.health.v1 service: SERVING with a leader; NOT_SERVING once the node
        # is alone (its two peers stopped: no quorum, no progress possible).
        assert health(address) == "SERVING"
        assert health(address, "raftmq.admin.Admin") == "SERVING"
        for node in cluster.nodes:
            if node is not follower:
                node.terminate()
        deadline = time.monotonic() + 15
        while health(address) != "NOT_SERVING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert health(address) == "NOT_SERVING"


def health(address: str, service: str = "") -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def serve_admin_on_first_node(cluster: Cluster) -> str:
    """Restart the cluster's first node with the gRPC admin API on a free port; its address."""
    port = free_port()
    first = cluster.nodes[0]
    first.extra_args = ["--admin-port", str(port)]
    first.restart()
    cluster.wait_formed()
    return f"127.0.0.1:{port}"


def test_members_added_and_removed_through_the_admin_api(tmp_path):
    with Cluster(3, tmp_path) as cluster:
        address = serve_admin_on_first_node(cluster)
        new = cluster.add_node(admin_address=address)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (cluster.status(new) or {}).get("ready"):
            time.sleep(0.2)
        assert (cluster.status(new) or {}).get("ready"), cluster.status(new)
        members = lambda: sorted(m["node_id"] for m in json.loads(admin(address, "--json", "status"))["members"])  # noqa: E731
        deadline = time.monotonic() + 10
        while members() != ["n1", "n2", "n3", "n4"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert members() == ["n1", "n2", "n3", "n4"]
        removed = cluster.nodes[2]
        cluster.remove_node(removed, admin_address=address)
        deadline = time.monotonic() + 10
        while members() != ["n1", "n2", "n4"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert members() == ["n1", "n2", "n4"]
        # ... and back again (the node kept running; it rejoins and announces itself).
        cluster.grpc_admin(address, "add-member", cluster.raft_address(removed))
        deadline = time.monotonic() + 20
        while members() != ["n1", "n2", "n3", "n4"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert members() == ["n1", "n2", "n3", "n4"]
        cluster.wait_applied_equal(nodes=cluster.nodes)
        # Refusals come back as gRPC errors with the reason, not as a crash.
        assert "INVALID_ARGUMENT" in admin_fails(address, "add-member", "")


def test_users_and_permissions_replicate_and_the_journal_compacts(tmp_path):
    """Users managed on one node log in on another; permissions are RabbitMQ's (403 ACCESS_REFUSED
    outside them); a deleted user is refused; a compaction snapshots and cuts the journal."""
    with Cluster(3, tmp_path) as cluster:
        address = serve_admin_on_first_node(cluster)
        other = cluster.nodes[1]

        admin(address, "put-user", "alice", "--password", "wonderland", "--tag", "monitoring")
        admin(address, "set-permissions", "alice", "^alice-.*", "^alice-.*", "^alice-.*")
        users = {u["name"]: u for u in json.loads(admin(address, "--json", "users"))["users"]}
        assert users["alice"]["source"] == "cluster" and users["alice"]["tags"] == ["monitoring"]
        assert users["alice"]["permissions"] == [{"vhost": "/", "configure": "^alice-.*", "write": "^alice-.*",
                                                  "read": "^alice-.*"}]
        assert users["guest"]["source"] == "config"
        assert "wonderland" not in admin(address, "--json", "users")
        # A configuration-file user: its permissions change through the log (the overlay), as any
        # user's would in RabbitMQ; the user itself stays the file's.
        admin(address, "set-permissions", "guest", "^guest-", ".*", ".*")
        users = {u["name"]: u for u in json.loads(admin(address, "--json", "users"))["users"]}
        assert users["guest"]["source"] == "config"
        assert users["guest"]["permissions"] == [{"vhost": "/", "configure": "^guest-", "write": ".*", "read": ".*"}]
        admin(address, "set-permissions", "guest", ".*", ".*", ".*")
        assert "FAILED_PRECONDITION" in admin_fails(address, "delete-user", "guest")
        assert "NOT_FOUND" in admin_fails(address, "set-permissions", "nobody", ".*", ".*", ".*")
        assert "INVALID_ARGUMENT" in admin_fails(address, "set-permissions", "alice", "(", ".*", ".*")
        assert "NOT_FOUND" in admin_fails(address, "delete-user", "nobody")

        url = f"amqp://alice:wonderland@{other.host}:{other.port}/%2F"
        cluster.wait_applied_equal(nodes=cluster.nodes)
        conn = pika.BlockingConnection(pika.URLParameters(url))  # on another node than the admin's
        ch = conn.channel()
        ch.queue_declare("alice-jobs")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            ch.queue_declare("bob-jobs")
        assert info.value.reply_code == 403 and "ACCESS_REFUSED" in info.value.reply_text
        conn.close()

        admin(address, "delete-user", "alice")
        cluster.wait_applied_equal(nodes=cluster.nodes)
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(pika.URLParameters(url))

        before = json.loads(admin(address, "--json", "status"))
        reply = json.loads(admin(address, "--json", "compact"))
        assert int(reply["snapshot_index"]) >= int(before["applied_index"]) - 1
        assert int(reply["journal_entries"]) < int(before["applied_index"])
