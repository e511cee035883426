"""Prometheus metrics of a node (ops/metrics.py), scraped over HTTP after real traffic."""

from __future__ import annotations

import urllib.request

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from raftmq.ops.local.node import RaftmqNode, free_port


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    wanted = tuple(sorted({"node": "n1", **labels}.items()))
    return samples[(name, wanted)]


@pytest.fixture
def node(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's metrics")
    metrics_port = free_port()
    n = RaftmqNode(tmp_path / "n", extra_args=["--metrics-port", str(metrics_port)])
    n.metrics_port = metrics_port
    with n:
        yield n


def test_counters_and_queue_gauges_follow_traffic(node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("metered")
    for i in range(7):
        ch.basic_publish("", "metered", str(i).encode())
    ch.basic_publish("", "nowhere", b"x")
    for _ in range(3):
        method, _p, _b = ch.basic_get("metered")
        ch.basic_ack(method.delivery_tag)
    samples = scrape(node.metrics_port)
    conn.close()
    assert value(samples, "raftmq_messages_published_total") == 8
    assert value(samples, "raftmq_messages_unroutable_total") == 1
    assert value(samples, "raftmq_messages_acked_total") == 3
    assert value(samples, "raftmq_queue_messages_ready", vhost="/", queue="metered") == 4
    assert value(samples, "raftmq_connections") == 1


def test_messages_are_counted_per_protocol(node):
    """issue 19, "metrics per protocol": publishes and deliveries through each front end.  Each
    protocol's queue holds exactly what its consumer takes, so a client that grants more credit
    than it uses cannot be sent more."""
    from proton import Message
    from proton.utils import BlockingConnection

    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("by-091")
    ch.queue_declare("by-10")
    for i in range(5):
        ch.basic_publish("", "by-091", str(i).encode())
    amqp10 = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=10)
    sender = amqp10.create_sender("/queues/by-10")
    for i in range(3):
        sender.send(Message(body=f"one-{i}".encode()))
    receiver = amqp10.create_receiver("/queues/by-10", credit=10)
    for _ in range(3):
        receiver.receive(timeout=10)
        receiver.accept()
    amqp10.close()
    for _ in range(5):
        method, _p, _b = ch.basic_get("by-091", auto_ack=True)
        assert method is not None
    conn.close()
    samples = scrape(node.metrics_port)
    assert value(samples, "raftmq_messages_published_by_protocol_total", protocol="AMQP 0-9-1") == 5
    assert value(samples, "raftmq_messages_published_by_protocol_total", protocol="AMQP 1-0") == 3
    assert value(samples, "raftmq_messages_delivered_by_protocol_total", protocol="AMQP 1-0") == 3
    assert value(samples, "raftmq_messages_delivered_by_protocol_total", protocol="AMQP 0-9-1") == 5
    assert value(samples, "raftmq_messages_published_by_protocol_total", protocol="AMQP 0-10") == 0
