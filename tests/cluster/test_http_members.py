"""What only each member knows, through any member's management API (issue 35; ops/http/members.py).

One 3-node cluster (``raftmq cluster``'s local nodes, real pika clients, real sockets):

1. /api/connections and /api/channels of one node list every member's clients with the ``node``
   they are connected to (RabbitMQ's /api/connections: "A list of all open connections", the
   management API's cluster-wide lists), n3's too though it serves no HTTP API (it answers the
   others all the same: ops/services.py); paged by the server as RabbitMQ's (``page``,
   ``page_size``, ``items``, ``total_count``); a management user sees only its own connection,
   on whichever member it is; /api/overview's object_totals count every member's.
2. /api/raftmq/cluster gives each member's own commit and applied index (``reported``, asked
   from the member), and the snapshots each wrote (index, size, time) once the log was compacted.
3. /api/raftmq/digests: every member's state digest side by side; at one applied index they agree.
4. A member killed (kill -9 by the PID this test started): its connections are gone from the
   lists and the answer names it in ``X-Raftmq-Members-Missing``.
"""

from __future__ import annotations

import urllib.request

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port
from tests.support.http_api import GUEST, basic_auth, call, path
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def _connect(node, user: str = "guest", password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", node.port, credentials=pika.PlainCredentials(user, password), heartbeat=0))


def _missing(base: str, url_path: str) -> tuple[int, str | None]:
    request = urllib.request.Request(base + url_path, headers=basic_auth(GUEST))
    with urllib.request.urlopen(request, timeout=15) as answer:
        return answer.status, answer.headers.get("X-Raftmq-Members-Missing")


def test_every_members_connections_raft_numbers_and_digests(tmp_path):
    cluster = Cluster(3, tmp_path, extra_config="snapshot_entries = 30\nsnapshot_seconds = 1.0")
    bases = {}
    for node in cluster.nodes[:2]:  # n3 serves no HTTP API: it still answers the others (ops/services.py)
        port = free_port()
        node.extra_args = ["--http-port", str(port)]
        bases[node.node_id] = f"http://127.0.0.1:{port}"
    with cluster:
        cluster.wait_formed()
        n1, n2, n3 = cluster.nodes
        assert call(bases["n1"], "PUT", path("users", "alice"), body={"password": "pw", "tags": "management"})[0] \
            in (201, 204)
        assert call(bases["n1"], "PUT", path("permissions", "/", "alice"),
                    body={"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
        clients = []
        try:
            first = _connect(n1)
            clients.append(first)
            first.channel(), first.channel()
            second = _connect(n3)
            clients.append(second)
            second.channel()
            alice = wait_for(lambda: _try_connect(n3, "alice", "pw"), what="alice's login on n3")
            clients.append(alice)
            alice.channel()

            # 1. Every member's connections and channels, from n2 (which has none of its own).
            def three_connections():
                status, rows = call(bases["n2"], "GET", "/api/connections")
                return rows if status == 200 and len(rows) == 3 else None

            rows = wait_for(three_connections, what="three connections listed by n2")
            by_user = sorted((r["node"], r["user"], r["channels"]) for r in rows)
            assert by_user == [("raftmq@n1", "guest", 2), ("raftmq@n3", "alice", 1), ("raftmq@n3", "guest", 1)]
            status, page = call(bases["n2"], "GET", "/api/connections?page=1&page_size=2")
            assert status == 200 and len(page["items"]) == 2 and page["total_count"] == 3 and page["page_count"] == 2
            status, channels = call(bases["n2"], "GET", "/api/channels")
            assert status == 200
            assert sorted(c["node"] for c in channels) == ["raftmq@n1", "raftmq@n1", "raftmq@n3", "raftmq@n3"]
            status, own = call(bases["n1"], "GET", "/api/connections", auth=("alice", "pw"))
            assert status == 200 and [(r["node"], r["user"]) for r in own] == [("raftmq@n3", "alice")]
            status, overview = call(bases["n2"], "GET", "/api/overview")
            assert overview["object_totals"]["connections"] == 3 and overview["object_totals"]["channels"] == 4
            assert _missing(bases["n2"], "/api/connections") == (200, None)

            # 2. Log entries for every member to snapshot (snapshot_entries = 30, snapshot_seconds = 1).
            ch = first.channel()
            ch.queue_declare("members-snap", durable=True)
            for i in range(120):
                ch.basic_publish("", "members-snap", f"m{i}".encode(),
                                 pika.BasicProperties(delivery_mode=2))
                if i % 10 == 9:
                    first.process_data_events(0)  # (publishes go in the order written)

            def every_member_snapshotted():
                status, view = call(bases["n2"], "GET", "/api/raftmq/cluster")
                if status != 200 or view["members_missing"]:
                    return None
                reported = {m["name"]: m["reported"] for m in view["members"]}
                if not all(r and r["snapshots"] for r in reported.values()):
                    return None
                return reported

            reported = wait_for(every_member_snapshotted, timeout=60, what="a snapshot on every member")
            assert set(reported) == {"raftmq@n1", "raftmq@n2", "raftmq@n3"}
            for name, own_view in reported.items():
                assert own_view["role"] in ("leader", "follower"), name
                assert own_view["applied_index"] >= 1 and own_view["commit_index"] >= own_view["applied_index"] - 1
                newest = own_view["snapshots"][0]
                assert 1 <= newest["index"] <= own_view["applied_index"], (name, newest, own_view)
                assert newest["bytes"] > 0 and newest["time"] > 0, (name, newest)
                assert newest["how"] in ("written", "loaded")

            # 3. Digests side by side: with no traffic the replicas reach one applied index and agree.
            def digests_agree():
                status, body = call(bases["n1"], "GET", "/api/raftmq/digests")
                assert status == 200, body
                rows = body["members"]
                if len(rows) != 3 or len({r["applied_index"] for r in rows}) != 1:
                    return None
                return body

            body = wait_for(digests_agree, timeout=60, what="three digests at one applied index")
            assert body["digests_agree"] is True and body["members_missing"] == []
            assert len({r["digest"] for r in body["members"]}) == 1
            assert all(len(r["digest"]) == 64 and r["model_digest"] and r["bodies_digest"] for r in body["members"])
            assert call(bases["n1"], "GET", "/api/raftmq/digests", auth=("alice", "pw"))[0] == 403

            # 4. n1 killed: its connection is gone from n2's list, and n1 is named as missing.
            n1.kill9()

            def n1_missing():
                status, rows = call(bases["n2"], "GET", "/api/connections")
                if status != 200 or any(r["node"] == "raftmq@n1" for r in rows):
                    return None
                return _missing(bases["n2"], "/api/connections")[1]

            assert wait_for(n1_missing, timeout=30, what="n1's connections gone, n1 missing") == "raftmq@n1"
        finally:
            for client in clients:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - n1's connection died with it
                    pass


def _try_connect(node, user: str, password: str):
    """A login as a user just added through the log: None until this node has applied it."""
    try:
        return _connect(node, user, password)
    except pika.exceptions.AMQPError:
        return None
