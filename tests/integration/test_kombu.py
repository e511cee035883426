"""kombu (py-amqp transport) against a real broker: the client Celery uses."""

from __future__ import annotations

import time

import amqp.exceptions
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue, binding

from tests.integration.helpers import uniq, wait_until

OP = 5.0


@pytest.fixture
def kconn(broker):
    conn = Connection(broker.url, connect_timeout=OP, transport_options={"confirm_publish": True})
    conn.ensure_connection(max_retries=1)
    yield conn
    conn.release()


def drain(conn: Connection, received: list, n: int, timeout: float = OP) -> None:
    """drain_events until ``n`` messages were handled (bounded)."""
    deadline = time.monotonic() + timeout
    while len(received) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"got {len(received)} of {n} messages in {timeout}s")
        try:
            conn.drain_events(timeout=min(0.5, remaining))
        except TimeoutError:
            pass


def test_producer_and_consumer_on_a_direct_exchange(kconn):
    """general 3.1.3.1 direct routing; kombu serialises to JSON and the properties travel with the body."""
    exchange = Exchange(uniq("k-direct"), "direct", auto_delete=True)
    queue = Queue(uniq("k-q"), exchange, routing_key="jobs", auto_delete=True)
    received = []

    def on_message(body, message):
        received.append((body, message))
        message.ack()

    with Consumer(kconn, [queue], callbacks=[on_message]):
        producer = Producer(kconn)
        producer.publish({"n": 1, "s": "x"}, exchange=exchange, routing_key="jobs", declare=[queue],
                         headers={"h": "v"}, correlation_id="c1")
        producer.publish({"n": 2}, exchange=exchange, routing_key="elsewhere")  # routed nowhere
        producer.publish({"n": 3}, exchange=exchange, routing_key="jobs")
        drain(kconn, received, 2)
    assert [b["n"] for b, _ in received] == [1, 3]
    body, message = received[0]
    assert body == {"n": 1, "s": "x"}
    assert message.content_type == "application/json"
    assert message.headers == {"h": "v"}
    assert message.properties["correlation_id"] == "c1"
    assert message.delivery_info["routing_key"] == "jobs"
    assert message.delivery_info["exchange"] == exchange.name
    assert message.delivery_info["redelivered"] is False


def test_simple_queue_put_get_size_and_empty(kconn):
    """SimpleQueue: basic.get based; qsize comes from a passive queue.declare's message-count."""
    sq = kconn.SimpleQueue(uniq("k-simple"), queue_opts={"auto_delete": True})
    try:
        for i in range(3):
            sq.put({"i": i})
        wait_until(lambda: sq.qsize() == 3, OP, what="three messages")
        for i in range(3):
            message = sq.get(timeout=OP)
            assert message.payload == {"i": i}
            message.ack()
        with pytest.raises(sq.Empty):
            sq.get_nowait()
    finally:
        sq.close()
    # a queue nobody consumes from: purge-ok reports what was dropped (reference 1.7.2.8)
    idle = kconn.SimpleQueue(uniq("k-purge"), queue_opts={"auto_delete": True})
    try:
        idle.put("a")
        idle.put("b")
        wait_until(lambda: idle.qsize() == 2, OP, what="two messages")
        assert idle.clear() == 2
        assert idle.qsize() == 0
    finally:
        idle.close()


def test_requeue_sets_redelivered(kconn):
    """reference 1.8.3.14 basic.reject requeue=true: the message comes back with redelivered set."""
    sq = kconn.SimpleQueue(uniq("k-requeue"), queue_opts={"auto_delete": True})
    try:
        sq.put("payload")
        first = sq.get(timeout=OP)
        assert first.delivery_info["redelivered"] is False
        first.requeue()
        again = sq.get(timeout=OP)
        assert again.payload == "payload"
        assert again.delivery_info["redelivered"] is True
        again.ack()
    finally:
        sq.close()


def test_confirm_publish_raises_when_the_broker_nacks(kconn):
    """confirm_publish=True (py-amqp waits for every basic.ack); x-overflow=reject-publish makes the broker
    nack the publish that does not fit, which py-amqp raises as MessageNacked."""
    queue = Queue(uniq("k-full"), auto_delete=False,
                  queue_arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    producer = Producer(kconn)
    producer.publish("fits", routing_key=queue.name, declare=[queue])
    with pytest.raises(amqp.exceptions.MessageNacked):
        producer.publish("overflow", routing_key=queue.name)
    bound = queue(kconn.default_channel)
    try:
        message = bound.get(no_ack=True)
        assert message.payload == "fits"
        assert bound.get(no_ack=True) is None
    finally:
        bound.delete()


def test_topic_and_headers_bindings(kconn):
    """general 3.1.3.3 (topic) and 3.1.3.4 (headers, x-match=any) through kombu's binding declarations."""
    topic = Exchange(uniq("k-topic"), "topic", auto_delete=True)
    headers = Exchange(uniq("k-headers"), "headers", auto_delete=True)
    queue = Queue(uniq("k-multi"), auto_delete=True, bindings=[
        binding(topic, routing_key="a.*.c"),
        binding(headers, arguments={"x-match": "any", "color": "red", "size": "xl"}),
    ])
    received = []

    def on_message(body, message):
        received.append(body)
        message.ack()

    with Consumer(kconn, [queue], callbacks=[on_message]):
        producer = Producer(kconn)
        producer.publish("topic-hit", exchange=topic, routing_key="a.b.c")
        producer.publish("topic-miss", exchange=topic, routing_key="a.b.b.c")
        producer.publish("headers-hit", exchange=headers, headers={"color": "blue", "size": "xl"})
        producer.publish("headers-miss", exchange=headers, headers={"color": "blue"})
        producer.publish("last", exchange=topic, routing_key="a.z.c")
        drain(kconn, received, 3)
    assert received == ["topic-hit", "headers-hit", "last"]


def test_passive_declare_of_missing_queue_raises_not_found(kconn):
    """reference 1.7.2.1.3 passive declare of a missing queue -> channel error 404, which py-amqp raises as
    NotFound; a new channel on the same connection works."""
    channel = kconn.channel()
    try:
        with pytest.raises(amqp.exceptions.NotFound) as info:
            channel.queue_declare(uniq("k-missing"), passive=True)
        assert info.value.code == 404
    finally:
        channel.close()
    other = kconn.channel()
    try:
        assert other.queue_declare(uniq("k-ok"), exclusive=True).message_count == 0
    finally:
        other.close()


def test_priority_queue_and_ttl_dead_letter(kconn):
    """x-max-priority (kombu's max_priority) orders by priority; x-message-ttl with a dead-letter exchange
    moves expired messages on with x-death reason 'expired'."""
    prio = Queue(uniq("k-prio"), auto_delete=False, max_priority=9)
    dlx = Exchange(uniq("k-dlx"), "fanout", auto_delete=True)
    dlq = Queue(uniq("k-dlq"), dlx, auto_delete=False)
    ttl = Queue(uniq("k-ttl"), auto_delete=False, message_ttl=0.05,
                queue_arguments={"x-dead-letter-exchange": dlx.name})
    producer = Producer(kconn)
    for body, priority in [("low", 1), ("high", 8), ("mid", 4)]:
        producer.publish(body, routing_key=prio.name, declare=[prio], priority=priority)
    producer.publish("expires", routing_key=ttl.name, declare=[dlq, ttl])
    channel = kconn.default_channel
    bound_prio, bound_dlq = prio(channel), dlq(channel)
    try:
        assert [bound_prio.get(no_ack=True).payload for _ in range(3)] == ["high", "mid", "low"]
        dead = wait_until(lambda: bound_dlq.get(no_ack=True), OP, interval=0.05, what="dead-lettered message")
        assert dead.payload == "expires"
        [death] = dead.headers["x-death"]
        assert death["reason"] == "expired" and death["queue"] == ttl.name
    finally:
        bound_prio.delete()
        bound_dlq.delete()
        ttl(channel).delete()


def test_heartbeats_keep_an_idle_kombu_connection_alive(broker):
    """general 4.2.7 with py-amqp's heartbeat_check loop: heartbeat=2 negotiated, 5 s idle, still usable."""
    with Connection(broker.url, heartbeat=2, connect_timeout=OP) as conn:
        conn.ensure_connection(max_retries=1)
        assert conn.connection.heartbeat == 2  # py-amqp keeps the negotiated interval
        sq = conn.SimpleQueue(uniq("k-hb"), queue_opts={"auto_delete": True})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.heartbeat_check(rate=4)
            try:
                conn.drain_events(timeout=0.25)
            except TimeoutError:
                pass
        sq.put("after-idle")
        assert sq.get(timeout=OP).payload == "after-idle"
        sq.close()
