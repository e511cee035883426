"""Network partitions and kills with namespaces: the total-queue checker must find no loss.

Three nodes, each in its own network namespace. Two publishers run throughout: a 0-9-1 publisher
with confirms (at-least-once, fails over between nodes by itself) and an AMQP 0-10 publisher with
session resume (exactly-once). The nemesis partitions the leader from the others, then a follower,
then kills the leader. After healing, both queues are drained and the history is judged by
``raftmq.ops.chaos.checker``: no confirmed message lost, nothing unexpected, no duplicate from the
0-10 publisher; replicas must end with identical state.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pika
import pytest

from raftmq.client.amqp010 import Connection
from raftmq.ops.chaos import netns
from raftmq.ops.chaos.checker import Fault, Operation, check
from raftmq.ops.local.cluster import Cluster

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")]

Q091, Q010 = "chaos-091", "chaos-010"
T0 = time.monotonic()


def now() -> float:
    return time.monotonic() - T0


class Publisher091(threading.Thread):
    """Numbered persistent messages with confirms, failing over between nodes on any error."""

    def __init__(self, urls: list[str], history: list[Operation]) -> None:
        super().__init__(daemon=True)
        self.urls, self.history = urls, history
        self.stop = threading.Event()

    def run(self) -> None:
        seq, i = 0, 0
        while not self.stop.is_set():
            url = self.urls[i % len(self.urls)]
            i += 1
            try:
                conn = pika.BlockingConnection(pika.URLParameters(
                    url + "?connection_attempts=1&socket_timeout=2&blocked_connection_timeout=5"))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(Q091, durable=True)
                while not self.stop.is_set():
                    seq += 1
                    try:
                        ch.basic_publish("", Q091, str(seq).encode(), pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.AMQPError:
                        self.history.append(Operation("enqueue", seq, "info", "p091", "0-9-1", now()))
                        raise
                    self.history.append(Operation("enqueue", seq, "ok", "p091", "0-9-1", now()))
                conn.close()
            except Exception:  # noqa: BLE001 - any failure: try the next node
                time.sleep(0.1)


class Publisher010(threading.Thread):
    """AMQP 0-10 publisher with session resume: the client itself replays across failovers."""

    def __init__(self, hosts: list[str], history: list[Operation]) -> None:
        super().__init__(daemon=True)
        self.hosts, self.history = hosts, history
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    async def _run(self) -> None:
        conn = await Connection.connect(self.hosts, reconnect_timeout=60)
        session = await conn.session(b"chaos-publisher", timeout=120)
        await session.queue_declare(Q010, durable=True)
        seq = 1_000_000
        while not self.stop.is_set():
            seq += 1
            await session.publish("", Q010, str(seq).encode(), persistent=True)
            self.history.append(Operation("enqueue", seq, "ok", "p010", "0-10", now()))
        await conn.close()


def drain(url: str, queue: str, history: list[Operation]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        history.append(Operation("dequeue", int(body), "ok", "drain", time=now()))
    conn.close()


def test_partitions_and_kills_lose_no_confirmed_message(tmp_path):
    # The test's clients reach the nodes over the namespaces' bridge, not loopback: let guest in.
    config = 'node_down_after = 2.0\n[users.guest]\npassword = "guest"\nloopback_only = false\n'
    with netns.NetnsNetwork(3) as net, Cluster(3, tmp_path, network=net, extra_config=config) as cluster:
        history: list[Operation] = []
        faults: list[Fault] = []
        p091 = Publisher091([n.url for n in cluster.nodes], history)
        p010 = Publisher010([f"{n.host}:{n.port}" for n in cluster.nodes], history)
        p091.start()
        p010.start()
        try:
            time.sleep(2)
            leader = cluster.leader()
            start = now()
            net.partition([cluster.nodes.index(leader)])  # a new leader on the majority side
            time.sleep(4)
            net.heal()
            faults.append(Fault(f"partition leader {leader.node_id}", start, now()))
            time.sleep(3)
            follower = next(n for n in cluster.nodes if n is not cluster.leader())
            start = now()
            net.partition([cluster.nodes.index(follower)])
            time.sleep(3)
            net.heal()
            faults.append(Fault(f"partition follower {follower.node_id}", start, now()))
            time.sleep(2)
            victim = cluster.leader()
            start = now()
            victim.kill9()
            time.sleep(3)
            victim.start()
            faults.append(Fault(f"kill -9 leader {victim.node_id}", start, now()))
            time.sleep(3)
        finally:
            p091.stop.set()
            p010.stop.set()
            p091.join(timeout=15)
            p010.join(timeout=60)
        assert p010.error is None, repr(p010.error)
        cluster.wait_applied_equal(timeout=30)
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests
        url = cluster.leader().url
        drain(url, Q091, history)
        drain(url, Q010, history)
        report = check(history, faults)
        print(report.summary(), report.availability)
        assert report.confirmed > 100
        assert report.valid, report.to_json()
