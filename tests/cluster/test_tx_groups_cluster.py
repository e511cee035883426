"""Transactions across queue groups in a three-node cluster (issue 34): ``raft_groups = 3``, the
two-phase commit of store/core/tx_groups.py through the groups' Raft logs, with pika's tx class.

AMQP 0-9-1 reference 1.9 (class tx): "all publish and ack requests issued within a transaction
will complete successfully or none of them will".  Checked with real processes: transactions
through a follower to queues of both queue groups commit in both; a kill -9 of the node leading the metadata group (the coordinator) while
a client on another node commits in a loop leaves every transaction whole -- each body in both
queues or in neither, every commit-ok'd one in both -- once the new leader's forwarder has resent
what the old one had not finished; every group's replicas end identical.
"""

from __future__ import annotations

import threading
import time

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.cluster.test_groups_cluster import group_status, wait_group_digests_equal
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(tmp_path):
    with Cluster(3, tmp_path, extra_config="raft_groups = 3") as c:
        yield c


def bodies(ch, queue: str) -> list[bytes]:
    out = []
    for _ in range(1000):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)
    raise AssertionError("more than 1000 messages")


def test_transactions_through_a_follower_survive_a_kill_of_the_coordinator_whole(cluster):
    leader = cluster.leader()
    client_node = next(n for n in cluster.nodes if n is not leader)
    conn = cluster.connection(client_node)
    ch = conn.channel()
    ch.queue_declare("t-a", durable=True, arguments={"x-queue-group": 1})
    ch.queue_declare("t-b", durable=True, arguments={"x-queue-group": 2})
    ch.tx_select()
    committed: list[int] = []
    for i in range(5):
        ch.basic_publish("", "t-a", b"%d" % i)
        ch.basic_publish("", "t-b", b"%d" % i)
        ch.tx_commit()
        committed.append(i)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        # Commits on until 30 are done, 60 s passed, or the connection fails; bounded both ways.
        deadline = time.monotonic() + 60
        i = 5
        try:
            while i < 30 and time.monotonic() < deadline and not stop.is_set():
                ch.basic_publish("", "t-a", b"%d" % i)
                ch.basic_publish("", "t-b", b"%d" % i)
                ch.tx_commit()
                committed.append(i)
                i += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=loop)
    worker.start()
    deadline = time.monotonic() + 30
    while len(committed) < 8 and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    at_kill = len(committed)
    leader.kill9()  # with transactions in flight: the loop has 22 to go
    cluster.leader(timeout=20, exclude=leader)
    worker.join(timeout=90)
    stop.set()
    assert not worker.is_alive()
    assert not errors, errors
    assert 8 <= at_kill < 30 and committed == list(range(30))
    conn.close()
    conn = cluster.connection(client_node, timeout=20)
    ch = conn.channel()
    a, b = bodies(ch, "t-a"), bodies(ch, "t-b")
    assert a == b == [b"%d" % i for i in committed]
    conn.close()
    for group in (1, 2):
        # (A group the killed node led may still be electing its next leader at this moment.)
        wait_until(lambda group=group: any(group_status(n, group).get("role") == "leader" for n in cluster.nodes if n.is_alive()),
                   timeout=20, interval=0.2, what=f"a leader of group {group} among the living nodes")
        wait_group_digests_equal(cluster, group)
