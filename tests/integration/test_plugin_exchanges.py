"""Issue 21's plugin exchange types against a real node, with pika and kombu.

* ``x-delayed-message`` as rabbitmq-delayed-message-exchange offers it (its README and
  src/rabbit_exchange_type_delayed_message.erl): ``x-delayed-type`` required and an existing type
  (406 otherwise), ``x-delay`` in ms; ``0 < x-delay <= 2^32-1`` delays, anything else (missing,
  negative, beyond, not a number) routes at once; mandatory is "not supported": the plugin's
  ``route/2`` answers no queue for a delayed message, so the publisher gets basic.return NO_ROUTE at
  once and the message is still delivered after its delay.  Beyond ``max_delayed_messages`` raftmq
  refuses a delayed publish with basic.nack (as a full queue with x-overflow reject-publish).
* ``x-message-deduplication`` as rabbitmq-message-deduplication offers it (README "Exchange level
  deduplication"): ``x-cache-size`` required, ``x-cache-ttl`` and a message's ``x-cache-ttl`` header.

The reference RabbitMQ here has neither plugin: these tests run on raftmq only.
"""

from __future__ import annotations

import time

import pika
import pytest
from kombu import Connection, Exchange, Producer
from kombu import Queue as KQueue

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import get_bodies, uniq, wait_until
from tests.integration.test_metrics import scrape, value
from tests.support.http_api import call, path

OP = 5.0
H = "x-deduplication-header"


@pytest.fixture
def raftmq_only(broker):
    if broker.kind == "rabbitmq":
        pytest.skip("the reference RabbitMQ has neither the delayed-message nor the deduplication plugin")


def delayed_setup(ch, inner: str = "direct", key: str = "k", arguments: dict | None = None) -> tuple[str, str]:
    x = uniq("dx")
    ch.exchange_declare(x, "x-delayed-message", arguments={"x-delayed-type": inner})
    q = ch.queue_declare(uniq("dq"), exclusive=True).method.queue
    ch.queue_bind(q, x, key, arguments=arguments)
    return x, q


def wait_message(ch, queue: str, timeout: float = OP) -> tuple:
    holder: list = []

    def fetch():
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            holder.append((time.monotonic(), props, body))
        return holder

    wait_until(fetch, timeout=timeout, interval=0.005, what=f"a message in {queue}")
    return holder[0]


def test_pika_delayed_message_arrives_after_its_delay_with_x_delay_negated(raftmq_only, ch):
    x, q = delayed_setup(ch)
    ch.confirm_delivery()
    sent = time.monotonic()
    ch.basic_publish(x, "k", b"later", pika.BasicProperties(headers={"x-delay": 400}))
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    arrived, props, body = wait_message(ch, q)
    assert body == b"later"
    assert arrived - sent >= 0.4  # never before the delay
    assert arrived - sent < 0.4 + 1.0, arrived - sent  # and promptly after it
    assert props.headers["x-delay"] == -400  # rabbit_delayed_message_utils:swap_delay_header


@pytest.mark.parametrize("headers", [None, {"x-delay": -1000}, {"x-delay": 0}, {"x-delay": 2**32},
                                     {"x-delay": "not a number"}, {"x-delay": [1, 2]}],
                         ids=["missing", "negative", "zero", "huge", "non-integer", "list"])
def test_pika_without_a_valid_delay_the_message_is_routed_at_once(raftmq_only, ch, headers):
    x, q = delayed_setup(ch)
    ch.confirm_delivery()
    ch.basic_publish(x, "k", b"now", pika.BasicProperties(headers=headers))
    assert get_bodies(ch, q) == [b"now"]  # confirmed, hence routed: already in the queue


def test_pika_string_delay_is_converted_as_the_plugin_does(raftmq_only, ch):
    """rabbit_delayed_message_utils:get_delay converts a longstr (a float too: pika cannot send
    one; tests/unit/store/test_plugin_exchanges.py covers it)."""
    x, q = delayed_setup(ch)
    ch.confirm_delivery()
    ch.basic_publish(x, "k", b"s", pika.BasicProperties(headers={"x-delay": "300"}))
    assert get_bodies(ch, q) == []
    time.sleep(0.3)
    wait_until(lambda: ch.queue_declare(q, passive=True).method.message_count == 1, timeout=OP)
    assert get_bodies(ch, q) == [b"s"]


@pytest.mark.parametrize(("inner", "key", "binding_key", "args", "headers"), [
    ("direct", "a.b", "a.b", None, {}),
    ("topic", "a.b", "a.*", None, {}),
    ("fanout", "whatever", "", None, {}),
    ("headers", "", "", {"x-match": "all", "kind": "x"}, {"kind": "x"}),
])
def test_pika_each_x_delayed_type_routes_as_that_type(raftmq_only, ch, inner, key, binding_key, args, headers):
    x, q = delayed_setup(ch, inner, binding_key, args)
    miss = ch.queue_declare(uniq("dmiss"), exclusive=True).method.queue
    ch.queue_bind(miss, x, "zzz", arguments={"x-match": "all", "kind": "y"} if inner == "headers" else None)
    ch.confirm_delivery()
    ch.basic_publish(x, key, b"m", pika.BasicProperties(headers={"x-delay": 150, **headers}))
    assert wait_message(ch, q)[2] == b"m"
    time.sleep(0.1)
    assert get_bodies(ch, miss) == ([b"m"] if inner == "fanout" else [])


def test_pika_delayed_and_mandatory_is_returned_at_once_and_still_delivered(raftmq_only, ch):
    """The plugin's README, Limitations: "Mandatory flag is not supported by this exchange"; its
    route/2 gives no queue for a delayed message, so RabbitMQ returns it (312 NO_ROUTE)."""
    x, q = delayed_setup(ch)
    returned = []
    ch.add_on_return_callback(lambda _ch, method, _props, body: returned.append((method.reply_code, body)))
    ch.basic_publish(x, "k", b"mand", pika.BasicProperties(headers={"x-delay": 200}), mandatory=True)
    wait_until(lambda: returned or ch.connection.process_data_events(0.05), timeout=OP, what="basic.return")
    assert returned == [(312, b"mand")]
    assert wait_message(ch, q)[2] == b"mand"


@pytest.mark.parametrize("args", [{}, {"x-delayed-type": "x-delayed-message"}])
def test_pika_delayed_exchange_declare_needs_an_x_delayed_type(raftmq_only, conn, args):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(uniq("bad"), "x-delayed-message", arguments=args)
    assert info.value.reply_code == 406


def test_pika_unknown_x_delayed_type_closes_the_connection_with_503(raftmq_only, connections):
    """rabbit_exchange:check_type: an unknown type is COMMAND_INVALID, a connection error (0-9-1
    reference 1.2: 503 is a connection exception)."""
    conn = connections()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel().exchange_declare(uniq("bad"), "x-delayed-message", arguments={"x-delayed-type": "nope"})
    assert info.value.reply_code == 503


def test_kombu_delayed_publish_and_consume(raftmq_only, broker, ch):
    x = uniq("kdx")
    exchange = Exchange(x, type="x-delayed-message", arguments={"x-delayed-type": "direct"})
    queue = KQueue(uniq("kdq"), exchange, routing_key="task")
    with Connection(broker.url, connect_timeout=OP, transport_options={"confirm_publish": True}) as kconn:
        producer = Producer(kconn)
        sent = time.monotonic()
        producer.publish({"n": 1}, exchange=exchange, routing_key="task", declare=[queue],
                         headers={"x-delay": 300})
        producer.publish({"n": 0}, exchange=exchange, routing_key="task", headers={"x-delay": 100})
        got = []
        simple = kconn.SimpleQueue(queue)
        while len(got) < 2:
            message = simple.get(timeout=OP)
            got.append((message.payload["n"], time.monotonic() - sent))
            message.ack()
        simple.close()
    assert [n for n, _ in got] == [0, 1]
    assert got[0][1] >= 0.1 and got[1][1] >= 0.3
    ch.queue_delete(queue.name)
    ch.exchange_delete(x)


def test_limit_refuses_with_nack_and_counts_show_in_http_and_metrics(raftmq_only, tmp_path):
    http_port, metrics_port = free_port(), free_port()
    config = tmp_path / "n.toml"
    config.write_text("max_delayed_messages = 3\n")
    with RaftmqNode(tmp_path / "n", config=config,
                    extra_args=["--http-port", str(http_port), "--metrics-port", str(metrics_port)]) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.exchange_declare("dx", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        ch.queue_declare("dq")
        ch.queue_bind("dq", "dx", "k")
        ch.confirm_delivery()
        for i in range(3):
            ch.basic_publish("dx", "k", b"%d" % i, pika.BasicProperties(headers={"x-delay": 60_000}))
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("dx", "k", b"over", pika.BasicProperties(headers={"x-delay": 60_000}))
        ch.basic_publish("dx", "k", b"undelayed")  # no x-delay: not held, not limited
        base = f"http://127.0.0.1:{http_port}"
        status, view = call(base, "GET", path("exchanges", "/", "dx"))
        assert status == 200 and view["messages_delayed"] == 3 and view["type"] == "x-delayed-message"
        status, overview = call(base, "GET", "/api/overview")
        assert overview["queue_totals"]["messages_delayed"] == 3
        samples = scrape(metrics_port)
        assert value(samples, "raftmq_delayed_messages") == 3
        assert value(samples, "raftmq_messages_delayed_total") == 3
        assert value(samples, "raftmq_messages_delay_refused_total") == 1
        assert get_bodies(ch, "dq") == [b"undelayed"]
        conn.close()


def test_delayed_messages_survive_a_single_node_restart(raftmq_only, tmp_path):
    with RaftmqNode(tmp_path / "n") as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.exchange_declare("dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        ch.queue_declare("dq", durable=True)
        ch.queue_bind("dq", "dx", "k")
        ch.confirm_delivery()
        sent = time.monotonic()
        ch.basic_publish("dx", "k", b"kept", pika.BasicProperties(headers={"x-delay": 2500}, delivery_mode=2))
        conn.close()
        node.restart(hard=True)  # kill -9, then the same data directory
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        early = get_bodies(ch, "dq")
        assert early == [] or time.monotonic() - sent >= 2.5, early
        if early:
            return  # the restart took longer than the delay; released on time all the same
        arrived, _props, body = wait_message(ch, "dq", timeout=OP + 3)
        assert body == b"kept" and arrived - sent >= 2.5
        conn.close()


# ------------------------------------------------------------------ deduplication exchange

def dedup_setup(ch, args: dict) -> tuple[str, list[str]]:
    x = uniq("ddx")
    ch.exchange_declare(x, "x-message-deduplication", arguments=args)
    queues = []
    for _ in range(2):
        q = ch.queue_declare(uniq("ddq"), exclusive=True).method.queue
        ch.queue_bind(q, x, "")
        queues.append(q)
    return x, queues


def test_pika_dedup_exchange_routes_each_header_value_once_and_messages_without_it_always(raftmq_only, ch):
    x, (q1, q2) = dedup_setup(ch, {"x-cache-size": 100})
    ch.confirm_delivery()
    for body, headers in ((b"a", {H: "1"}), (b"dup", {H: "1"}), (b"b", {H: "2"}), (b"plain", None),
                          (b"plain", {})):
        ch.basic_publish(x, "any-key", body, pika.BasicProperties(headers=headers))  # all confirmed
    assert get_bodies(ch, q1) == [b"a", b"b", b"plain", b"plain"]
    assert get_bodies(ch, q2) == [b"a", b"b", b"plain", b"plain"]


def test_pika_dedup_exchange_duplicate_with_mandatory_is_returned(raftmq_only, ch):
    """The plugin's route/2 gives no queue for a duplicate: with mandatory, basic.return."""
    x, (q1, _q2) = dedup_setup(ch, {"x-cache-size": 100})
    ch.confirm_delivery()
    ch.basic_publish(x, "", b"first", pika.BasicProperties(headers={H: "m"}), mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(x, "", b"again", pika.BasicProperties(headers={H: "m"}), mandatory=True)
    assert get_bodies(ch, q1) == [b"first"]


def test_pika_dedup_exchange_cache_full_evicts_the_oldest(raftmq_only, ch):
    x, (q1, _q2) = dedup_setup(ch, {"x-cache-size": 2})
    ch.confirm_delivery()
    for key in ("a", "b", "c", "a", "c"):
        ch.basic_publish(x, "", key.encode(), pika.BasicProperties(headers={H: key}))
    assert get_bodies(ch, q1) == [b"a", b"b", b"c", b"a"]


def test_pika_dedup_exchange_ttl_and_message_ttl_expire(raftmq_only, ch):
    x, (q1, _q2) = dedup_setup(ch, {"x-cache-size": 100, "x-cache-ttl": 300})
    ch.confirm_delivery()
    ch.basic_publish(x, "", b"a", pika.BasicProperties(headers={H: "a"}))
    ch.basic_publish(x, "", b"b", pika.BasicProperties(headers={H: "b", "x-cache-ttl": 5000}))
    ch.basic_publish(x, "", b"a-dup", pika.BasicProperties(headers={H: "a"}))
    time.sleep(0.4)
    ch.basic_publish(x, "", b"a-again", pika.BasicProperties(headers={H: "a"}))  # exchange TTL passed
    ch.basic_publish(x, "", b"b-dup", pika.BasicProperties(headers={H: "b"}))  # its own TTL has not
    assert get_bodies(ch, q1) == [b"a", b"b", b"a-again"]


@pytest.mark.parametrize("args", [{}, {"x-cache-size": 0}, {"x-cache-size": 10, "x-cache-ttl": 0}])
def test_pika_dedup_exchange_declare_needs_a_cache_size(raftmq_only, conn, args):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(uniq("bad"), "x-message-deduplication", arguments=args)
    assert info.value.reply_code == 406


def test_kombu_dedup_exchange_resends_are_confirmed_and_routed_once(raftmq_only, broker, ch):
    x = uniq("kddx")
    exchange = Exchange(x, type="x-message-deduplication", arguments={"x-cache-size": 1000})
    queue = KQueue(uniq("kddq"), exchange, routing_key="")
    with Connection(broker.url, connect_timeout=OP, transport_options={"confirm_publish": True}) as kconn:
        producer = Producer(kconn)
        for _ in range(3):  # confirm_publish: returns once confirmed
            producer.publish({"id": 1}, exchange=exchange, declare=[queue], headers={H: "job-1"})
        producer.publish({"id": 2}, exchange=exchange, headers={H: "job-2"})
    assert ch.queue_declare(queue.name, passive=True).method.message_count == 2
    ch.queue_delete(queue.name)
    ch.exchange_delete(x)


def test_amqp010_publisher_gets_the_same_delay_and_deduplication(raftmq_only, broker, ch):
    """The core does both for every protocol: an 0-10 message.transfer's application headers carry
    x-delay and x-deduplication-header as a 0-9-1 publish's headers do (the exchanges are declared
    with pika: raftmq's 0-10 client declares exchanges without arguments)."""
    import asyncio

    from raftmq.client.amqp010 import Connection as Connection010

    x, q = delayed_setup(ch)
    dx, (dq, _other) = dedup_setup(ch, {"x-cache-size": 10})

    async def scenario() -> float:
        conn = await Connection010.connect([f"{broker.host}:{broker.port}"])
        session = await conn.session()
        sent = time.monotonic()
        await session.publish(x, "k", b"later", headers={"x-delay": 300})
        for _ in range(3):
            await session.publish(dx, "", b"once", headers={H: "k"})
        await conn.close()
        return sent

    sent = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert get_bodies(ch, dq) == [b"once"]
    arrived, props, body = wait_message(ch, q)
    assert body == b"later" and arrived - sent >= 0.3
    assert props.headers["x-delay"] == -300
