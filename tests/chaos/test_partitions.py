"""Network partitions in namespaces: no confirmed message is lost, replicas converge.

Three nodes, each in its own network namespace. A publisher (0-9-1, confirms) keeps publishing
through whichever node answers while the nemesis partitions the leader from the others, then a
follower, then kills a node; after healing, every confirmed message must be in the queue
(duplicates are allowed for 0-9-1: a publisher that lost its connection before a confirm
republishes), and all replicas must have identical state.
"""

from __future__ import annotations

import threading
import time

import pika
import pytest

from tests.support import netns
from tests.support.cluster import Cluster

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")]

QUEUE = "chaos-q"


class Publisher(threading.Thread):
    """Publishes numbered persistent messages with confirms, failing over between nodes."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.confirmed: list[int] = []
        self.attempted = 0
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        seq = 0
        i = 0
        while not self.stop.is_set():
            url = self.urls[i % len(self.urls)]
            i += 1
            try:
                conn = pika.BlockingConnection(pika.URLParameters(
                    url + "?connection_attempts=1&socket_timeout=2&blocked_connection_timeout=5"))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(QUEUE, durable=True)
                while not self.stop.is_set():
                    seq += 1
                    self.attempted += 1
                    ch.basic_publish("", QUEUE, str(seq).encode(), pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append(seq)
                conn.close()
            except Exception:  # noqa: BLE001 - any failure: try the next node
                self.errors += 1
                time.sleep(0.1)


def drain(url: str) -> list[int]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        got.append(int(body))
    conn.close()
    return got


def test_partitions_and_kills_lose_no_confirmed_message(tmp_path):
    # The test's clients reach the nodes over the namespaces' bridge, not loopback: let guest in.
    config = 'node_down_after = 2.0\n[users.guest]\npassword = "guest"\nloopback_only = false\n'
    with netns.NetnsNetwork(3) as net, Cluster(3, tmp_path, network=net, extra_config=config) as cluster:
        publisher = Publisher([n.url for n in cluster.nodes])
        publisher.start()
        try:
            time.sleep(2)
            faults = []
            leader = cluster.leader()
            index = cluster.nodes.index(leader)
            net.partition([index])  # the leader alone on one side: a new leader on the other
            faults.append(f"partition leader {leader.node_id}")
            time.sleep(4)
            net.heal()
            time.sleep(3)
            follower = next(n for n in cluster.nodes if n is not cluster.leader())
            net.partition([cluster.nodes.index(follower)])
            faults.append(f"partition follower {follower.node_id}")
            time.sleep(3)
            net.heal()
            time.sleep(2)
            victim = cluster.leader()
            victim.kill9()
            faults.append(f"kill -9 {victim.node_id}")
            time.sleep(3)
            victim.start()
            time.sleep(3)
        finally:
            publisher.stop.set()
            publisher.join(timeout=15)
        confirmed_before = len(publisher.confirmed)
        assert confirmed_before > 50, (publisher.confirmed[-5:], publisher.errors)
        cluster.wait_applied_equal(timeout=30)
        digests = cluster.digests()
        assert len({d for _, d in digests.values()}) == 1, digests
        stored = drain(cluster.leader().url)
        lost = sorted(set(publisher.confirmed) - set(stored))
        print(f"faults {faults}: confirmed {len(publisher.confirmed)}, stored {len(stored)} "
              f"({len(stored) - len(set(stored))} duplicates), publisher errors {publisher.errors}")
        assert not lost, f"lost {len(lost)} confirmed messages, e.g. {lost[:10]} after {faults}"
