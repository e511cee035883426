"""One message, any protocol: properties across AMQP 0-9-1 and 0-10 through the core's neutral
message (store/core/message.py; the table in docs/message-mapping.md), against a real node.

A message is stored in its publisher's property format; a consumer of the same protocol gets it
back as sent, a consumer of the other gets it converted field by field.  RabbitMQ does not speak
0-10: these run against raftmq only.
"""

from __future__ import annotations

import asyncio
import datetime
import uuid

import pika
import pytest

from raftmq.client.amqp010 import Connection
from raftmq.protocol.amqp010 import codec as c


@pytest.fixture
def hosts(broker):
    if broker.kind != "raftmq":
        pytest.skip("AMQP 0-10 is raftmq's")
    return [f"{broker.host}:{broker.port}"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def name() -> str:
    return f"conv-{uuid.uuid4().hex[:8]}"


def publish_010(hosts, exchange: str, routing_key: str, body: bytes, dp: c.DeliveryProperties,
                mp: c.MessageProperties, declare: str | None = None) -> None:
    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        if declare:
            await session.queue_declare(declare)
        dp.routing_key = routing_key
        transfer = c.MessageTransfer(destination=exchange, accept_mode=1, acquire_mode=0, headers=[dp, mp],
                                     body=body)
        await session.send(transfer, sync=True)[1]
        await conn.close()

    run(scenario())


def consume_010(hosts, queue: str):
    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        subscription = await session.subscribe(queue, window=1)
        message = await subscription.get(timeout=5)
        await message.accept()
        await conn.close()
        return message

    return run(scenario())


def test_0_9_1_properties_reach_a_0_10_consumer_field_by_field(broker, hosts):
    """0-9-1 basic properties (spec 0-9-1 section 1.8) onto 0-10 delivery- and message-properties
    (spec 0-10 L5268, L5431): ttl from expiration, reply-to as exchange/routing-key, a UUID
    message-id as a uuid."""
    queue = name()
    message_id = uuid.uuid4()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare(queue)
    props = pika.BasicProperties(content_type="application/json", content_encoding="utf-8",
                                 headers={"k": "v", "n": 7}, delivery_mode=2, priority=3,
                                 correlation_id="corr-1", reply_to="amq.direct/replies", expiration="60000",
                                 message_id=str(message_id), timestamp=1_700_000_000, app_id="app-x")
    ch.basic_publish("", queue, b"from-091", props)
    conn.close()

    message = consume_010(hosts, queue)
    dp, mp = message.delivery_properties, message.message_properties
    assert message.body == b"from-091"
    assert (dp.delivery_mode, dp.priority, dp.ttl, dp.timestamp, dp.routing_key) == (2, 3, 60000, 1_700_000_000, queue)
    assert (mp.content_type, mp.content_encoding, mp.message_id) == ("application/json", "utf-8", message_id)
    assert (mp.correlation_id, mp.app_id) == (b"corr-1", b"app-x")
    assert (mp.reply_to.exchange, mp.reply_to.routing_key) == ("amq.direct", "replies")
    assert mp.application_headers == {"k": "v", "n": 7}
    assert mp.content_length == len(b"from-091")


def test_a_0_9_1_message_id_that_is_no_uuid_travels_as_a_header(broker, hosts):
    queue = name()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"m", pika.BasicProperties(message_id="order-17"))
    conn.close()
    message = consume_010(hosts, queue)
    assert message.message_properties.message_id is None
    assert message.headers == {"x-message-id": "order-17"}


def test_0_10_properties_reach_a_0_9_1_consumer_field_by_field(broker, hosts):
    queue = name()
    message_id = uuid.uuid4()
    dp = c.DeliveryProperties(delivery_mode=2, priority=5, ttl=30000, timestamp=1_700_000_123)
    mp = c.MessageProperties(content_type="text/plain", content_encoding="gzip", message_id=message_id,
                             correlation_id=b"c-9", reply_to=c.ReplyTo(exchange="", routing_key="back"),
                             user_id=b"guest", app_id=b"qpid", application_headers={"a": 1, "s": "x"})
    publish_010(hosts, "", queue, b"from-010", dp, mp, declare=queue)

    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    method, props, body = conn.channel().basic_get(queue, auto_ack=True)
    conn.close()
    assert body == b"from-010" and method.routing_key == queue
    assert (props.delivery_mode, props.priority, props.expiration, props.timestamp) == (2, 5, "30000", 1_700_000_123)
    assert (props.content_type, props.content_encoding, props.message_id) == ("text/plain", "gzip", str(message_id))
    assert (props.correlation_id, props.reply_to, props.user_id, props.app_id) == ("c-9", "/back", "guest", "qpid")
    assert props.headers == {"a": 1, "s": "x"}


def test_0_10_to_0_10_keeps_the_publishers_structs(hosts):
    """Same protocol in and out: the stored 0-10 header comes back as sent (with the delivery's own
    exchange, routing key and redelivered set by the broker, spec 0-10 L5268)."""
    queue = name()
    dp = c.DeliveryProperties(delivery_mode=1, priority=9, ttl=120000)
    mp = c.MessageProperties(content_type="application/octet-stream", correlation_id=b"\x00\xffbin",
                             user_id=b"guest", application_headers={"nested": {"list": [1, 2, "x"]}})
    publish_010(hosts, "", queue, b"same", dp, mp, declare=queue)
    message = consume_010(hosts, queue)
    got_dp, got_mp = message.delivery_properties, message.message_properties
    assert (got_dp.priority, got_dp.ttl, got_dp.redelivered, got_dp.routing_key) == (9, 120000, False, queue)
    assert got_mp.correlation_id == b"\x00\xffbin"  # bytes the 0-9-1 shortstr could not carry
    assert got_mp.application_headers == {"nested": {"list": [1, 2, "x"]}}


def test_a_0_10_message_routes_by_its_headers_and_dead_letters_with_x_death(broker, hosts):
    """The core reads a 0-10 message's application headers for a headers exchange and writes
    RabbitMQ's x-death into them, in the message's own format, when it is dead-lettered."""
    exchange, queue, dlq = name(), name(), name()
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    ch.exchange_declare(exchange, "headers")
    ch.queue_declare(dlq)
    ch.queue_declare(queue, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.queue_bind(queue, exchange, arguments={"x-match": "all", "kind": "order"})
    conn.close()
    mp = c.MessageProperties(application_headers={"kind": "order"}, content_type="text/plain")
    publish_010(hosts, exchange, "ignored", b"routed", c.DeliveryProperties(), mp)
    publish_010(hosts, exchange, "ignored", b"not-routed", c.DeliveryProperties(),
                c.MessageProperties(application_headers={"kind": "other"}))

    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = conn.channel()
    method, _props, body = ch.basic_get(queue)
    assert body == b"routed"
    ch.basic_reject(method.delivery_tag, requeue=False)
    assert ch.basic_get(queue)[0] is None  # the other message matched no binding
    conn.close()

    message = consume_010(hosts, dlq)
    assert message.body == b"routed" and message.message_properties.content_type == "text/plain"
    headers = message.headers
    assert headers["kind"] == "order" and headers["x-first-death-reason"] == "rejected"
    (death,) = headers["x-death"]
    assert (death["queue"], death["reason"], death["count"]) == (queue, "rejected", 1)
    assert abs(death["time"] - datetime.datetime.now(datetime.UTC).timestamp()) < 600
