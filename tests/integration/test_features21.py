"""Issue 21 against a real node, with pika and kombu: the quorum-queue delivery limit and queue-level
publisher deduplication.

Delivery limit: RabbitMQ's quorum queues (docs "Quorum Queues", section "Poison Message Handling";
3.x rabbit_fifo ``return_one``): a message returned more than ``x-delivery-limit`` times is
dead-lettered with reason ``delivery_limit``; redeliveries carry ``x-delivery-count``.  The queues
here are declared as RabbitMQ needs them for that (``x-queue-type: quorum``, durable), so the same
tests run against RabbitMQ (RAFTMQ_TEST_BROKER=rabbitmq).

Deduplication: the rabbitmq-message-deduplication plugin's queue interface (its README, "Queue level
deduplication"): ``x-message-deduplication: true``, header ``x-deduplication-header``.  RabbitMQ
needs that plugin, which the reference broker here does not have: those tests run on raftmq only.
"""

from __future__ import annotations

import time

import pika
import pytest
from kombu import Connection, Consumer, Producer
from kombu import Queue as KQueue

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import get_bodies, uniq, wait_until
from tests.integration.test_metrics import scrape, value

OP = 5.0
H = "x-deduplication-header"


def limited_queue(ch, limit: int) -> tuple[str, str]:
    """A quorum-type queue with ``x-delivery-limit`` dead-lettering to a fresh queue: (queue, dlq)."""
    dlq = ch.queue_declare(uniq("f21-dlq"), durable=True).method.queue
    q = ch.queue_declare(uniq("f21-limited"), durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": limit,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}).method.queue
    return q, dlq


def get_one(ch, queue: str, timeout: float = OP) -> tuple:
    holder: list = []

    def fetch():
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            holder.append((method, props, body))
        return holder

    wait_until(fetch, timeout=timeout, what=f"a message in {queue}")
    return holder[0]


def test_pika_consumer_nacking_with_requeue_ends_in_the_dlq_after_limit_plus_one_deliveries(conn, ch):
    """x-delivery-limit 2: three deliveries, x-delivery-count absent then 1 then 2, then the
    message is in the dead-letter queue with an x-death record of reason delivery_limit."""
    q, dlq = limited_queue(ch, 2)
    ch.basic_publish("", q, b"poison", pika.BasicProperties(delivery_mode=2, headers={"app": "f21"}))
    ch.basic_qos(prefetch_count=1)
    seen = []
    deadline = time.monotonic() + 10
    for method, props, body in ch.consume(q, inactivity_timeout=1.0):
        if method is None:
            if seen and ch.queue_declare(dlq, passive=True).method.message_count:
                break
            assert time.monotonic() < deadline, seen
            continue
        seen.append((method.redelivered, (props.headers or {}).get("x-delivery-count"), body))
        ch.basic_nack(method.delivery_tag, requeue=True)
        assert len(seen) <= 5, seen
    ch.cancel()
    assert seen == [(False, None, b"poison"), (True, 1, b"poison"), (True, 2, b"poison")]
    _method, props, body = get_one(ch, dlq)
    assert body == b"poison"
    (death,) = props.headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", q, 1)
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    assert props.headers["app"] == "f21"
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)
    ch.queue_delete(dlq)


def test_pika_limit_zero_and_channel_close_and_reject_each_count(connections):
    """Limit 1 counts returns of every kind: a channel closed with the message unacked, then a
    basic.reject with requeue: the second return dead-letters it.  Limit 0: the first return."""
    conn = connections()
    ch = conn.channel()
    q, dlq = limited_queue(ch, 1)
    ch.basic_publish("", q, b"m", pika.BasicProperties(delivery_mode=2))
    first = conn.channel()
    method, props, _ = wait_until(lambda: (r := first.basic_get(q, auto_ack=False))[0] and r, timeout=OP,
                                  what="first delivery")
    # basic.get's first delivery: RabbitMQ 3.10 sets x-delivery-count 0 (rabbit_fifo_client dequeue),
    # 3.13 and raftmq leave it out until there is a count (add_delivery_count_header, Count > 0).
    assert not method.redelivered and (props.headers or {}).get("x-delivery-count", 0) == 0
    first.close()  # return 1
    method, props, _ = wait_until(lambda: (r := ch.basic_get(q, auto_ack=False))[0] and r, timeout=OP,
                                  what="second delivery")
    assert method.redelivered and props.headers["x-delivery-count"] == 1
    ch.basic_reject(method.delivery_tag, requeue=True)  # return 2 > 1
    _m, props, _ = get_one(ch, dlq)
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"

    q0, dlq0 = limited_queue(ch, 0)
    ch.basic_publish("", q0, b"z", pika.BasicProperties(delivery_mode=2))
    method, _props, _ = wait_until(lambda: (r := ch.basic_get(q0, auto_ack=False))[0] and r, timeout=OP,
                                   what="the only delivery")
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert get_one(ch, dlq0)[2] == b"z"
    assert ch.basic_get(q0, auto_ack=True)[0] is None
    for name in (q, dlq, q0, dlq0):
        ch.queue_delete(name)


def test_kombu_consumer_requeueing_sees_the_count_and_the_message_ends_dead_lettered(broker, ch):
    q, dlq = limited_queue(ch, 3)
    counts = []
    with Connection(broker.url, connect_timeout=OP, transport_options={"confirm_publish": True}) as kconn:
        queue = KQueue(q, no_declare=True)
        Producer(kconn).publish({"job": 1}, routing_key=q, delivery_mode=2)

        def on_message(body, message):
            counts.append(message.headers.get("x-delivery-count"))
            message.requeue()

        with Consumer(kconn, [queue], callbacks=[on_message], prefetch_count=1):
            deadline = time.monotonic() + 10
            while len(counts) < 4 and time.monotonic() < deadline:
                try:
                    kconn.drain_events(timeout=0.5)
                except TimeoutError:
                    pass
        dead = wait_until(lambda: kconn.default_channel.basic_get(dlq, no_ack=True), timeout=OP,
                          what="the dead-lettered message")
    assert counts == [None, 1, 2, 3]
    assert dead.headers["x-death"][0]["reason"] == "delivery_limit"
    assert dead.body == b'{"job": 1}' or dead.body == '{"job": 1}'
    ch.queue_delete(q)
    ch.queue_delete(dlq)


# ------------------------------------------------------------------------------------ deduplication


@pytest.fixture
def raftmq_only(broker):
    if broker.kind == "rabbitmq":
        pytest.skip("the reference RabbitMQ has no rabbitmq-message-deduplication plugin")


def test_pika_confirmed_resends_are_all_confirmed_and_stored_once(raftmq_only, ch):
    """A confirm-mode publisher that resends (its confirm lost, say) gets a basic.ack every time;
    mandatory does not return the duplicate (it was routed); the queue holds one copy."""
    q = ch.queue_declare(uniq("f21-dedup"), durable=True, arguments={"x-message-deduplication": True}).method.queue
    ch.confirm_delivery()
    for i in range(5):  # BlockingChannel raises on a nack or a return: each send is confirmed
        ch.basic_publish("", q, f"send {i}".encode(),
                         pika.BasicProperties(delivery_mode=2, headers={H: "order-42"}), mandatory=True)
    ch.basic_publish("", q, b"other", pika.BasicProperties(headers={H: "order-43"}), mandatory=True)
    ch.basic_publish("", q, b"no header", mandatory=True)
    ch.basic_publish("", q, b"no header", mandatory=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 4
    assert get_bodies(ch, q) == [b"send 0", b"other", b"no header", b"no header"]
    # The plugin's rule: the first copy consumed, the header is free again.
    ch.basic_publish("", q, b"after consume", pika.BasicProperties(headers={H: "order-42"}), mandatory=True)
    assert get_bodies(ch, q) == [b"after consume"]
    ch.queue_delete(q)


def test_pika_cache_ttl_drops_a_resend_after_the_first_copy_was_consumed(raftmq_only, ch):
    q = ch.queue_declare(uniq("f21-ttl"), arguments={"x-message-deduplication": True,
                                                     "x-cache-ttl": 60_000}).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"first", pika.BasicProperties(headers={H: "k"}))
    assert get_bodies(ch, q) == [b"first"]
    ch.basic_publish("", q, b"resend", pika.BasicProperties(headers={H: "k"}))
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)


def test_pika_dedup_cache_size_bounds_and_evicts_the_oldest(raftmq_only, ch):
    q = ch.queue_declare(uniq("f21-size"), arguments={"x-message-deduplication": True,
                                                      "x-cache-size": 2}).method.queue
    ch.confirm_delivery()
    for key in ("a", "b", "c", "a", "c"):  # c evicts a: "a" is accepted again, "c" is not
        ch.basic_publish("", q, key.encode(), pika.BasicProperties(headers={H: key}))
    assert get_bodies(ch, q) == [b"a", b"b", b"c", b"a"]
    ch.queue_delete(q)


@pytest.mark.parametrize("args", [{"x-message-deduplication": "yes"},
                                  {"x-message-deduplication": True, "x-cache-size": 0},
                                  {"x-message-deduplication": True, "x-cache-ttl": -5},
                                  {"x-delivery-limit": -1}])
def test_invalid_arguments_close_the_channel_with_406(raftmq_only, conn, args):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(uniq("f21-bad"), arguments=args)
    assert info.value.reply_code == 406


def test_kombu_confirmed_producer_resending_stores_one_copy(raftmq_only, broker, ch):
    q = ch.queue_declare(uniq("f21-kdedup"), durable=True, arguments={"x-message-deduplication": True}).method.queue
    with Connection(broker.url, connect_timeout=OP, transport_options={"confirm_publish": True}) as kconn:
        producer = Producer(kconn)
        for _ in range(4):  # confirm_publish: publish() returns once the broker confirmed it
            producer.publish({"id": 7}, routing_key=q, headers={H: "task-7"}, delivery_mode=2)
        producer.publish({"id": 8}, routing_key=q, headers={H: "task-8"}, delivery_mode=2)
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    ch.queue_delete(q)


def test_metrics_count_duplicates_and_delivery_limited_messages(raftmq_only, tmp_path):
    metrics_port = free_port()
    with RaftmqNode(tmp_path / "n", extra_args=["--metrics-port", str(metrics_port)]) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dedup", arguments={"x-message-deduplication": True})
        ch.queue_declare("limited", arguments={"x-delivery-limit": 0})
        for _ in range(3):
            ch.basic_publish("", "dedup", b"m", pika.BasicProperties(headers={H: "same"}))
        ch.basic_publish("", "limited", b"m")
        method, _props, _body = ch.basic_get("limited")
        ch.basic_nack(method.delivery_tag, requeue=True)
        assert ch.queue_declare("limited", passive=True).method.message_count == 0
        conn.close()
        samples = scrape(metrics_port)
    assert value(samples, "raftmq_messages_deduplicated_total") == 2
    assert value(samples, "raftmq_messages_delivery_limited_total") == 1


def test_amqp010_publisher_and_subscriber_get_the_same_core_rules(raftmq_only, broker):
    """The core does both features for every protocol: a 0-10 publisher's x-deduplication-header
    (application headers) is deduplicated, and 0-10 releases with set-redelivered count as returns
    (x-delivery-count in the transfer's application headers; amqp-0-10.txt message.release, L5819:
    "marked as redelivered on their next transfer"; a release without it is not counted)."""
    import asyncio

    from raftmq.client.amqp010 import Connection as Connection010

    dedup, limited, dlq = uniq("f21-010d"), uniq("f21-010l"), uniq("f21-010dlq")

    async def scenario():
        conn = await Connection010.connect([f"{broker.host}:{broker.port}"])
        session = await conn.session()
        await session.queue_declare(dedup, arguments={"x-message-deduplication": True})
        await session.queue_declare(dlq)
        await session.queue_declare(limited, arguments={"x-delivery-limit": 1, "x-dead-letter-exchange": "",
                                                        "x-dead-letter-routing-key": dlq})
        for _ in range(3):
            await session.publish("", dedup, b"once", headers={H: "k"})
        stored = (await session.queue_query(dedup)).message_count
        await session.publish("", limited, b"poison")
        subscription = await session.subscribe(limited, window=1)
        counts = []
        for _ in range(2):
            message = await subscription.get(timeout=5)
            counts.append((message.headers or {}).get("x-delivery-count"))
            await message.release(redelivered=True)
        dead = (await session.queue_query(dlq)).message_count
        left = (await session.queue_query(limited)).message_count
        await session.publish("", limited, b"released")
        for _ in range(3):  # without set-redelivered: the delivery is taken back, not counted
            message = await subscription.get(timeout=5)
            assert message.body == b"released" and not message.redelivered
            await message.release(redelivered=False)
        message = await subscription.get(timeout=5)
        unhurt = (message.body, (message.headers or {}).get("x-delivery-count"))
        await message.accept()
        await conn.close()
        return stored, counts, dead, left, unhurt

    stored, counts, dead, left, unhurt = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert stored == 1
    assert counts == [None, 1]
    assert (dead, left) == (1, 0)
    assert unhurt == (b"released", None)


def test_kill_9_keeps_dedup_for_queued_messages_and_the_delivery_count(fresh_node):
    """A single node after SIGKILL: the cache is rebuilt from the persistent messages still queued
    (a confirmed resend is still dropped), and a message delivered before the crash counts that
    delivery (limit 0: dead-lettered instead of delivered again)."""
    conn = pika.BlockingConnection(pika.URLParameters(fresh_node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dedup", durable=True, arguments={"x-message-deduplication": True})
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare("limited", durable=True, arguments={
        "x-delivery-limit": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    ch.basic_publish("", "dedup", b"kept", pika.BasicProperties(delivery_mode=2, headers={H: "k"}))
    ch.basic_publish("", "limited", b"poison", pika.BasicProperties(delivery_mode=2))
    method, _props, _body = ch.basic_get("limited", auto_ack=False)
    assert method is not None  # held, unacked, when the node dies
    fresh_node.restart(hard=True)
    conn = pika.BlockingConnection(pika.URLParameters(fresh_node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "dedup", b"resend", pika.BasicProperties(delivery_mode=2, headers={H: "k"}))
    assert get_bodies(ch, "dedup") == [b"kept"]
    assert ch.basic_get("limited", auto_ack=True)[0] is None
    _method, props, body = get_one(ch, "dlq")
    assert body == b"poison" and props.headers["x-death"][0]["reason"] == "delivery_limit"
    conn.close()
