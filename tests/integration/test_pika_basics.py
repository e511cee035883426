"""pika (BlockingConnection) against a real broker: routing, queues, acknowledgements, confirms,
transactions, TTL, dead-lettering, queue limits, priorities, heartbeats and large messages.

Spec references: "general N" is a section of /work/shared/specs/amqp-0-9-1-general.txt, "reference N" a
section of amqp-0-9-1-reference.txt (that text carries the rules as "Guidelines for implementers" under
each numbered section rather than by rule name). Features that 0-9-1 leaves to the server (publisher
confirms, exchange-to-exchange bindings, alternate exchanges, TTL, dead-lettering, x-max-length,
x-max-priority, consumer cancel notification) are RabbitMQ extensions; raftmq promises RabbitMQ's
behaviour for them, so the tests follow RabbitMQ's documented semantics there.
"""

from __future__ import annotations

import os
import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from tests.integration.helpers import (
    consume,
    get_bodies,
    get_one,
    message_count,
    pump,
    uniq,
    wait_for_count,
    wait_until,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def declare_queue(ch, name=None, **kw):
    return ch.queue_declare(name or uniq("q"), **kw).method.queue


# -- exchanges and routing ------------------------------------------------------------------------------
def test_default_exchange_routes_by_queue_name_and_keeps_properties(conn, ch):
    """reference 1.7.2.1 (queue.declare): "The server MUST create a default binding for a newly-declared
    queue to the default exchange, which is an exchange of type 'direct' and use the queue name as the
    routing key." Content properties travel unchanged (general 4.2.6.1 content header)."""
    q = declare_queue(ch)
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", headers={"a": 1, "b": "two", "c": [1, 2]},
        delivery_mode=2, priority=3, correlation_id="corr-1", reply_to="rq", expiration="60000",
        message_id="mid-1", timestamp=1_700_000_000, type="t", user_id="guest", app_id="tests")
    ch.basic_publish("", q, b'{"n": 1}', props)
    method, got_props, body = get_one(ch, q)
    assert body == b'{"n": 1}'
    assert (method.exchange, method.routing_key, method.redelivered) == ("", q, False)
    for field in ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(got_props, field) == getattr(props, field), field

    # the same through basic.consume / basic.deliver
    ch.basic_publish("", q, b"second", props)
    [(deliver, got_props, body)] = consume(conn, ch, q, 1)
    assert body == b"second"
    assert (deliver.exchange, deliver.routing_key, deliver.redelivered) == ("", q, False)
    assert got_props.headers == props.headers and got_props.message_id == "mid-1"


def test_direct_exchange_routes_on_exact_key(conn, ch):
    """general 3.1.3.1: a direct exchange passes a message to the queues bound with key K == R.
    reference 1.7.2.3 (queue.bind): duplicate bindings are ignored and a queue never gets one message twice."""
    x = uniq("direct")
    ch.exchange_declare(x, "direct")
    q1, q2, q3 = (declare_queue(ch) for _ in range(3))
    ch.queue_bind(q1, x, "red")
    ch.queue_bind(q1, x, "red")  # duplicate binding: not an error, no duplicate delivery
    ch.queue_bind(q2, x, "red")
    ch.queue_bind(q2, x, "green")
    ch.queue_bind(q3, x, "blue")
    ch.confirm_delivery()
    for key in ("red", "green", "blue", "black", "Red"):
        ch.basic_publish(x, key, key.encode())
    assert get_bodies(ch, q1) == [b"red"]
    got = consume(conn, ch, q2, 2)
    assert [b for _, _, b in got] == [b"red", b"green"]
    assert [m.routing_key for m, _, _ in got] == ["red", "green"]
    assert {m.exchange for m, _, _ in got} == {x}
    assert get_bodies(ch, q3) == [b"blue"]
    assert get_bodies(ch, q2) == []


def test_fanout_exchange_ignores_routing_key(conn, ch):
    """general 3.1.3.2: a fanout exchange routes every message to every bound queue, unconditionally."""
    x = uniq("fanout")
    ch.exchange_declare(x, "fanout")
    queues = [declare_queue(ch) for _ in range(3)]
    for i, q in enumerate(queues):
        ch.queue_bind(q, x, f"ignored-{i}")
    ch.confirm_delivery()
    for key in ("a", "", "zzz"):
        ch.basic_publish(x, key, f"m-{key}".encode())
    for q in queues[:2]:
        assert get_bodies(ch, q) == [b"m-a", b"m-", b"m-zzz"]
    assert [b for _, _, b in consume(conn, ch, queues[2], 3)] == [b"m-a", b"m-", b"m-zzz"]


def test_topic_exchange_patterns(conn, ch):
    """general 3.1.3.3: '*' matches one word, '#' zero or more; "*.stock.#" matches "usd.stock" and
    "eur.stock.db" but not "stock.nasdaq". reference 1.7.2.3: a message matching several bindings of one
    queue is delivered to it once."""
    x = uniq("topic")
    ch.exchange_declare(x, "topic")
    bindings = {
        "stock": ["*.stock.#"],
        "all": ["#"],
        "usd": ["usd.*"],
        "multi": ["*.*.db", "eur.#", "#.db"],
        "exact": ["stock.nasdaq"],
    }
    queues = {}
    for name, patterns in bindings.items():
        queues[name] = declare_queue(ch)
        for p in patterns:
            ch.queue_bind(queues[name], x, p)
    ch.confirm_delivery()
    keys = ["usd.stock", "eur.stock.db", "stock.nasdaq", "usd", "", "usd.stock.x.y"]
    for k in keys:
        ch.basic_publish(x, k, k.encode() or b"<empty>")
    assert get_bodies(ch, queues["stock"]) == [b"usd.stock", b"eur.stock.db", b"usd.stock.x.y"]
    assert get_bodies(ch, queues["all"]) == [b"usd.stock", b"eur.stock.db", b"stock.nasdaq", b"usd",
                                             b"<empty>", b"usd.stock.x.y"]
    assert get_bodies(ch, queues["usd"]) == [b"usd.stock"]
    assert [b for _, _, b in consume(conn, ch, queues["multi"], 1)] == [b"eur.stock.db"]
    assert get_bodies(ch, queues["multi"]) == []  # matched three bindings, delivered once
    assert get_bodies(ch, queues["exact"]) == [b"stock.nasdaq"]


def test_headers_exchange_x_match_all_and_any(conn, ch):
    """general 3.1.3.4: the headers exchange matches on the message's headers table; x-match=all needs every
    bound header to match, x-match=any at least one; other 'x-' binding arguments are ignored."""
    x = uniq("headers")
    ch.exchange_declare(x, "headers")
    q_all, q_any, q_none, q_keyonly = (declare_queue(ch) for _ in range(4))
    ch.queue_bind(q_all, x, arguments={"x-match": "all", "format": "pdf", "type": "report"})
    ch.queue_bind(q_any, x, arguments={"x-match": "any", "format": "zip", "type": "report"})
    ch.queue_bind(q_none, x, arguments={"x-match": "all", "format": "pdf", "type": "log"})
    ch.queue_bind(q_keyonly, x, "some-key", arguments={"x-match": "any", "x-ignored": "1", "lang": "en"})
    ch.confirm_delivery()
    msgs = [
        ("m1", {"format": "pdf", "type": "report"}),
        ("m2", {"format": "zip", "type": "log"}),
        ("m3", {"format": "pdf", "type": "report", "lang": "en"}),
        ("m4", None),
        ("m5", {"type": "report"}),
    ]
    for body, headers in msgs:
        ch.basic_publish(x, "routing-key-is-ignored", body.encode(), pika.BasicProperties(headers=headers))
    assert get_bodies(ch, q_all) == [b"m1", b"m3"]
    assert [b for _, _, b in consume(conn, ch, q_any, 4)] == [b"m1", b"m2", b"m3", b"m5"]
    assert get_bodies(ch, q_none) == []
    assert get_bodies(ch, q_keyonly) == [b"m3"]


@pytest.mark.parametrize(("exchange", "bind_key", "bind_args", "publish_key", "headers"), [
    ("amq.direct", "k", None, "k", None),
    ("amq.fanout", "", None, "anything", None),
    ("amq.topic", "a.#", None, "a.b.c", None),
    ("amq.headers", "", {"x-match": "all", "h": "v"}, "", {"h": "v"}),
    ("amq.match", "", {"x-match": "any", "h": "v"}, "", {"h": "v"}),
])
def test_predeclared_amq_exchanges(ch, exchange, bind_key, bind_args, publish_key, headers):
    """reference 1.6 (exchange class guidelines): the server MUST pre-declare amq.direct, amq.fanout,
    amq.topic and (general 3.1.3.4) amq.match for headers; the test scenario binds a temporary queue to each
    one. They exist (passive declare succeeds) and route."""
    ch.exchange_declare(exchange, passive=True)
    q = declare_queue(ch, exclusive=True)
    ch.queue_bind(q, exchange, bind_key, arguments=bind_args)
    ch.confirm_delivery()
    body = uniq("body").encode()
    ch.basic_publish(exchange, publish_key, body, pika.BasicProperties(headers=headers))
    method, _props, got = get_one(ch, q)
    assert got == body
    assert method.exchange == exchange


def test_exchange_to_exchange_binding(ch):
    """exchange.bind (RabbitMQ extension): a message routed by the source exchange to a bound destination
    exchange is routed on by the destination; a cycle of exchange bindings still delivers it once."""
    src, dst = uniq("e2e-src"), uniq("e2e-dst")
    ch.exchange_declare(src, "topic")
    ch.exchange_declare(dst, "direct")
    q = declare_queue(ch)
    ch.queue_bind(q, dst, "a.b")
    ch.exchange_bind(destination=dst, source=src, routing_key="a.*")
    ch.confirm_delivery()
    ch.basic_publish(src, "a.b", b"via-src")
    ch.basic_publish(src, "a.c", b"dropped-by-dst")  # passes src's binding, not dst's
    ch.basic_publish(src, "b.b", b"dropped-by-src")
    ch.basic_publish(dst, "a.b", b"direct")
    assert get_bodies(ch, q) == [b"via-src", b"direct"]

    # a loop src -> dst -> src must not duplicate (or endlessly route) the message
    ch.exchange_bind(destination=src, source=dst, routing_key="a.b")
    ch.basic_publish(src, "a.b", b"loop")
    assert get_bodies(ch, q) == [b"loop"]

    ch.exchange_unbind(destination=dst, source=src, routing_key="a.*")
    ch.basic_publish(src, "a.b", b"after-unbind")
    assert get_bodies(ch, q) == []


def test_alternate_exchange_receives_unroutable_messages(ch):
    """alternate-exchange (RabbitMQ extension): what the main exchange cannot route goes to its alternate
    exchange; such a message counts as routed, so mandatory does not return it."""
    ae, main = uniq("ae"), uniq("main")
    ch.exchange_declare(ae, "fanout")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    q_main, q_ae = declare_queue(ch), declare_queue(ch)
    ch.queue_bind(q_main, main, "k")
    ch.queue_bind(q_ae, ae)
    ch.confirm_delivery()
    ch.basic_publish(main, "k", b"routed")
    ch.basic_publish(main, "other", b"unroutable", mandatory=True)  # no UnroutableError: the AE took it
    assert get_bodies(ch, q_main) == [b"routed"]
    method, _props, body = get_one(ch, q_ae)
    assert body == b"unroutable"
    assert (method.exchange, method.routing_key) == (main, "other")
    assert get_bodies(ch, q_ae) == []


# -- queues -----------------------------------------------------------------------------------------------
def test_server_named_queue(ch):
    """reference 1.7.2.1.2 / domain queue-name: an empty queue name asks the server to generate a unique
    name and return it in declare-ok; the new queue has the default binding like any other."""
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    assert q1 and q2 and q1 != q2
    assert q1.startswith("amq.gen-")  # RabbitMQ's convention, which raftmq follows
    assert len(q1) <= 255
    ch.confirm_delivery()
    ch.basic_publish("", q1, b"to-generated")
    assert get_bodies(ch, q1) == [b"to-generated"]
    assert ch.queue_declare(q1, passive=True).method.queue == q1


def test_auto_delete_queue_goes_with_its_last_consumer(conn, ch):
    """reference 1.7.2.1.6: an auto-delete queue is deleted when its last consumer is cancelled."""
    q = declare_queue(ch, auto_delete=True)
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    ch.queue_declare(q, passive=True)
    ch.basic_cancel(tag)

    def gone():
        probe = conn.channel()
        try:
            probe.queue_declare(q, passive=True)
        except ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True
        probe.close()
        return False

    wait_until(gone, 5, interval=0.05, what="auto-delete queue to disappear")


def test_exclusive_queue_is_deleted_when_its_connection_closes(connections):
    """reference 1.7.2.1.5: exclusive queues "are deleted when that connection closes"."""
    owner, other = connections(), connections()
    q = declare_queue(owner.channel(), exclusive=True)
    owner.close()

    def gone():
        probe = other.channel()
        try:
            probe.queue_declare(q, passive=True)
        except ChannelClosedByBroker as e:
            assert e.reply_code == 404, e
            return True
        probe.close()
        return False

    wait_until(gone, 5, interval=0.05, what="exclusive queue to disappear")


def test_purge_and_delete_report_message_counts(ch):
    """reference 1.7.2.8 purge-ok and 1.7.2.10 delete-ok carry the number of messages purged / deleted."""
    q = declare_queue(ch)
    ch.confirm_delivery()
    for i in range(7):
        ch.basic_publish("", q, str(i).encode())
    assert ch.queue_purge(q).method.message_count == 7
    assert message_count(ch, q) == 0
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    assert ch.queue_delete(q).method.message_count == 4
    with pytest.raises(ChannelClosedByBroker) as info:
        ch.queue_declare(q, passive=True)
    assert info.value.reply_code == 404


def test_purge_keeps_unacknowledged_messages(connections):
    """reference 1.7.2.7 (queue.purge): "The server MUST NOT purge messages that have already been sent to a
    client but not yet acknowledged." Rejecting the unacked one with requeue brings it back."""
    conn = connections()
    ch = conn.channel()
    q = declare_queue(ch)
    ch.confirm_delivery()
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", q, body)
    method, _, body = ch.basic_get(q, auto_ack=False)
    assert body == b"a"
    other = conn.channel()
    assert other.queue_purge(q).method.message_count == 2
    ch.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = get_one(other, q)
    assert body == b"a" and method.redelivered is True


# -- publishing: mandatory, confirms ---------------------------------------------------------------------
def test_mandatory_unroutable_is_returned_with_312(conn, ch):
    """reference 1.8.3.8 (basic.return): an unroutable message published with mandatory is returned with
    reply code 312 NO_ROUTE; without mandatory it is dropped silently."""
    returned = []
    ch.add_on_return_callback(lambda _c, m, p, b: returned.append((m, p, b)))
    key = uniq("nobody")
    ch.basic_publish("amq.direct", key, b"dropped")  # no mandatory: silently discarded
    ch.basic_publish("amq.direct", key, b"bounce", pika.BasicProperties(message_id="m1"), mandatory=True)
    ch.basic_publish("", uniq("no-such-queue"), b"bounce-default", mandatory=True)
    deadline = time.monotonic() + 5
    while len(returned) < 2 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    pump(conn, 0.2)
    assert len(returned) == 2
    (m1, p1, b1), (m2, _p2, b2) = returned
    assert (m1.reply_code, m1.reply_text, m1.exchange, m1.routing_key) == (312, "NO_ROUTE", "amq.direct", key)
    assert b1 == b"bounce" and p1.message_id == "m1"
    assert m2.reply_code == 312 and m2.exchange == "" and b2 == b"bounce-default"


def test_mandatory_unroutable_with_confirms(ch):
    """With publisher confirms a returned mandatory message is basic.return then basic.ack (pika turns the
    return into UnroutableError); a routable one is just acked."""
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as info:
        ch.basic_publish("amq.direct", uniq("nobody"), b"bounce", mandatory=True)
    [returned] = info.value.messages
    assert returned.body == b"bounce"
    assert returned.method.reply_code == 312
    q = declare_queue(ch)
    ch.basic_publish("", q, b"ok", mandatory=True)
    assert get_bodies(ch, q) == [b"ok"]


def test_publisher_confirms_ack_every_message(ch):
    """confirm.select (RabbitMQ extension): every publish on a confirm channel is acked once the broker took
    responsibility for it; the acked messages are all in the queue, in order."""
    q = declare_queue(ch, durable=True)
    try:
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", q, str(i).encode(), PERSISTENT)  # raises NackError / UnroutableError if not acked
        assert message_count(ch, q) == 100
        assert get_bodies(ch, q) == [str(i).encode() for i in range(100)]
    finally:
        ch.queue_delete(q)


# -- consuming and acknowledgements -------------------------------------------------------------------
def settle(conn, got: list, n: int) -> int:
    """Wait (5 s at most) until ``got`` holds ``n`` deliveries, then 0.3 s more, in which nothing
    beyond the prefetch window may arrive; the count of deliveries."""
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    pump(conn, 0.3)
    return len(got)


def test_qos_prefetch_count_limits_unacked_deliveries(conn, ch):
    """reference 1.8.3.1 (basic.qos prefetch-count): the server sends no more than prefetch-count messages
    ahead of acknowledgements; each ack lets more through."""
    q = declare_queue(ch)
    ch.confirm_delivery()
    for i in range(10):
        ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=3)
    got = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append((m.delivery_tag, b)), auto_ack=False)

    assert settle(conn, got, 3) == 3
    ch.basic_ack(got[0][0])
    assert settle(conn, got, 4) == 4
    ch.basic_ack(got[3][0], multiple=True)  # acks 2, 3, 4 -> three more
    assert settle(conn, got, 7) == 7
    assert [b for _, b in got] == [str(i).encode() for i in range(7)]
    ch.basic_ack(got[-1][0], multiple=True)
    assert settle(conn, got, 10) == 10


@pytest.mark.parametrize("global_qos", [False, True], ids=["per-consumer", "global"])
def test_a_large_prefetch_is_still_exact_and_cancel_leaves_unsent_messages_undelivered(conn, ch, global_qos):
    """reference 1.8.3.1 (basic.qos prefetch-count) with a prefetch large enough for raftmq's read-ahead
    (node/amqp091/window.py: the node is assigned twice the prefetch and holds the rest): the client
    still never has more than prefetch-count unacked, each ack lets exactly as many through, in queue
    order (general 4.7).  After basic.cancel, messages assigned but never sent are back in the queue
    and not marked redelivered (reference 1.8.3.9.3: redelivered means "may have been delivered")."""
    prefetch, total = 40, 200
    q = declare_queue(ch)
    ch.confirm_delivery()
    for i in range(total):
        ch.basic_publish("", q, str(i).encode())
    ch.basic_qos(prefetch_count=prefetch, global_qos=global_qos)
    got = []
    tag = ch.basic_consume(q, lambda _c, m, _p, b: got.append((m.delivery_tag, int(b))), auto_ack=False)

    assert settle(conn, got, prefetch) == prefetch
    ch.basic_ack(got[9][0], multiple=True)  # 10 acked -> exactly 10 more
    assert settle(conn, got, prefetch + 10) == prefetch + 10
    ch.basic_ack(got[12][0])  # one more
    assert settle(conn, got, prefetch + 11) == prefetch + 11
    assert [n for _, n in got] == list(range(prefetch + 11))
    ch.basic_cancel(tag)
    pump(conn, 0.3)
    assert len(got) == prefetch + 11
    rest = []
    while True:
        method, _, body = ch.basic_get(q, auto_ack=True)
        if method is None:
            break
        rest.append((int(body), method.redelivered))
    assert rest == [(n, False) for n in range(prefetch + 11, total)]
    ch.basic_ack(0, multiple=True)  # the 40 still unacked after the cancel
    ch.queue_delete(q)


def test_nack_and_reject_with_requeue_set_redelivered(conn, ch):
    """reference 1.8.3.14 (basic.reject) / basic.nack: a requeued message comes back with redelivered set
    (reference 1.8.3.9.3 / 1.8.3.11.2); requeue=false discards it."""
    q = declare_queue(ch)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"m")
    method, _, body = get_one(ch, q, auto_ack=False)
    assert method.redelivered is False
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = get_one(ch, q, auto_ack=False)
    assert (body, method.redelivered) == (b"m", True)
    ch.basic_reject(method.delivery_tag, requeue=True)
    [(deliver, _, body)] = consume(conn, ch, q, 1, auto_ack=False)
    assert (body, deliver.redelivered) == (b"m", True)
    ch.basic_reject(deliver.delivery_tag, requeue=False)
    assert message_count(ch, q) == 0
    pump(conn, 0.1)
    assert ch.basic_get(q)[0] is None


def test_nack_multiple_requeues_all_up_to_the_tag(ch):
    """basic.nack multiple=true (RabbitMQ extension) covers every outstanding tag up to and including it."""
    q = declare_queue(ch)
    ch.confirm_delivery()
    for b in (b"1", b"2", b"3"):
        ch.basic_publish("", q, b)
    tags = [ch.basic_get(q, auto_ack=False)[0].delivery_tag for _ in range(3)]
    ch.basic_nack(tags[1], multiple=True, requeue=True)
    again = []
    for _ in range(2):
        method, _, body = get_one(ch, q)
        again.append((body, method.redelivered))
    assert sorted(again) == [(b"1", True), (b"2", True)]
    ch.basic_ack(tags[2])
    assert message_count(ch, q) == 0


def test_basic_recover_redelivers_unacked_with_redelivered_flag(conn, ch):
    """reference 1.8.3.16 (basic.recover): redeliver all unacknowledged messages of the channel; "The server
    MUST set the redelivered flag on all messages that are resent." """
    q = declare_queue(ch)
    ch.confirm_delivery()
    for b in (b"x", b"y"):
        ch.basic_publish("", q, b)
    got = []
    ch.basic_consume(q, lambda _c, m, _p, b: got.append((m, b)), auto_ack=False)
    wait_until(lambda: conn.process_data_events(time_limit=0.05) or len(got) >= 2, 5, interval=0)
    assert [(m.redelivered, b) for m, b in got] == [(False, b"x"), (False, b"y")]
    ch.basic_recover(requeue=True)
    wait_until(lambda: conn.process_data_events(time_limit=0.05) or len(got) >= 4, 5, interval=0)
    again = got[2:]
    assert sorted(b for _, b in again) == [b"x", b"y"]
    assert all(m.redelivered for m, _ in again)
    for m, _ in again:
        ch.basic_ack(m.delivery_tag)
    pump(conn, 0.2)
    assert len(got) == 4


def test_unacked_messages_are_requeued_when_the_channel_closes(conn):
    """general 3.1.8 / reference 1.8: messages delivered but not acknowledged when the channel closes are
    returned to the queue and redelivered with the redelivered flag."""
    ch1 = conn.channel()
    q = declare_queue(ch1)
    ch1.confirm_delivery()
    ch1.basic_publish("", q, b"unacked")
    method, _, _ = get_one(ch1, q, auto_ack=False)
    assert method.redelivered is False
    ch1.close()
    ch2 = conn.channel()
    method, _, body = get_one(ch2, q)
    assert (body, method.redelivered) == (b"unacked", True)


# -- transactions -----------------------------------------------------------------------------------------
def test_tx_commit_publishes_and_rollback_discards(connections):
    """reference 1.9 (tx): publishes in a transaction are invisible until tx.commit; tx.rollback abandons
    them, and a new transaction starts immediately after commit or rollback."""
    conn = connections()
    tx, observer = conn.channel(), conn.channel()
    q = declare_queue(observer)
    tx.tx_select()
    tx.basic_publish("", q, b"rolled-back")
    tx.tx_rollback()
    assert message_count(observer, q) == 0
    tx.basic_publish("", q, b"one")
    tx.basic_publish("", q, b"two")
    assert message_count(observer, q) == 0  # not visible before commit
    tx.tx_commit()
    assert get_bodies(observer, q) == [b"one", b"two"]
    tx.basic_publish("", q, b"rolled-back-again")  # still transactional after commit
    tx.tx_rollback()
    assert message_count(observer, q) == 0


def test_tx_rollback_discards_acks(connections):
    """reference 1.9.2.5 (tx.rollback) abandons acknowledgements too; "unacked messages will not be
    automatically redelivered by rollback". Closing the channel then requeues only the one whose ack was
    rolled back."""
    conn = connections()
    setup, tx = conn.channel(), conn.channel()
    q = declare_queue(setup)
    setup.confirm_delivery()
    setup.basic_publish("", q, b"ack-rolled-back")
    setup.basic_publish("", q, b"ack-committed")
    m1 = get_one(tx, q, auto_ack=False)[0]
    m2 = get_one(tx, q, auto_ack=False)[0]
    tx.tx_select()
    tx.basic_ack(m1.delivery_tag)
    tx.tx_rollback()
    tx.basic_ack(m2.delivery_tag)
    tx.tx_commit()
    assert message_count(setup, q) == 0  # m1 is still unacked, not requeued by the rollback
    tx.close()
    method, _, body = get_one(setup, q)
    assert (body, method.redelivered) == (b"ack-rolled-back", True)
    assert get_bodies(setup, q) == []


# -- TTL, dead-lettering, limits, priorities -----------------------------------------------------------------
def test_queue_message_ttl_expires_messages(ch):
    """x-message-ttl (RabbitMQ extension): messages older than the queue's TTL are discarded."""
    q = declare_queue(ch, arguments={"x-message-ttl": 50})
    keep = declare_queue(ch)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
        ch.basic_publish("", keep, str(i).encode())
    time.sleep(0.25)
    assert ch.basic_get(q, auto_ack=True)[0] is None
    wait_for_count(ch, q, 0)
    assert get_bodies(ch, keep) == [b"0", b"1", b"2"]  # no TTL there


def test_per_message_expiration(ch):
    """Per-message TTL (the expiration property, in milliseconds): an expired message is not delivered;
    expiry happens at the head of the queue, so the short-lived message goes first."""
    q = declare_queue(ch)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))
    ch.basic_publish("", q, b"forever")
    time.sleep(0.25)
    method, props, body = get_one(ch, q)
    assert body == b"long" and props.expiration == "60000"
    assert get_bodies(ch, q) == [b"forever"]


def test_dead_letter_expired_message_has_x_death(ch):
    """x-dead-letter-exchange: a message expired by the queue TTL is republished to the DLX with its
    original routing key and an x-death header whose first entry has reason 'expired'."""
    dlx = uniq("dlx")
    ch.exchange_declare(dlx, "fanout")
    dlq = declare_queue(ch)
    ch.queue_bind(dlq, dlx)
    q = declare_queue(ch, arguments={"x-message-ttl": 30, "x-dead-letter-exchange": dlx})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"dead", pika.BasicProperties(headers={"keep": "me"}, message_id="d1"))
    method, props, body = get_one(ch, dlq)
    assert body == b"dead"
    assert (method.exchange, method.routing_key) == (dlx, q)
    assert props.message_id == "d1" and props.headers["keep"] == "me"
    [death] = props.headers["x-death"]
    assert death["reason"] == "expired"
    assert death["queue"] == q
    assert death["exchange"] == ""
    assert list(death["routing-keys"]) == [q]
    assert death["count"] == 1


def test_dead_letter_rejected_and_per_message_expiry(ch):
    """Dead-lettering with x-dead-letter-routing-key: basic.reject(requeue=false) -> reason 'rejected';
    an expired per-message TTL -> reason 'expired', and the expiration property is dropped on the way so the
    message does not expire again in the dead-letter queue (RabbitMQ's documented behaviour)."""
    dlq = declare_queue(ch)
    q = declare_queue(ch, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"rejected")
    method, _, _ = get_one(ch, q, auto_ack=False)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(ch, dlq)
    assert body == b"rejected"
    assert (method.exchange, method.routing_key) == ("", dlq)
    [death] = props.headers["x-death"]
    assert (death["reason"], death["queue"], list(death["routing-keys"]), death["count"]) == \
        ("rejected", q, [q], 1)

    ch.basic_publish("", q, b"expired", pika.BasicProperties(expiration="30"))
    method, props, body = get_one(ch, dlq)
    assert body == b"expired"
    assert props.expiration is None
    [death] = props.headers["x-death"]
    assert death["reason"] == "expired" and death["queue"] == q


def test_max_length_drop_head(ch):
    """x-max-length with the default overflow 'drop-head': the oldest messages make room for new ones."""
    q = declare_queue(ch, arguments={"x-max-length": 3})
    ch.confirm_delivery()
    for i in range(1, 6):
        ch.basic_publish("", q, str(i).encode())
    assert message_count(ch, q) == 3
    assert get_bodies(ch, q) == [b"3", b"4", b"5"]


def test_max_length_reject_publish_nacks_with_confirms(ch):
    """x-overflow=reject-publish: a publish into a full queue is refused; with confirms it is nacked."""
    q = declare_queue(ch, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"3")
    assert get_bodies(ch, q) == [b"1", b"2"]
    ch.basic_publish("", q, b"4")  # room again
    assert get_bodies(ch, q) == [b"4"]


def test_max_priority_orders_deliveries(conn, ch):
    """x-max-priority: higher priority first, FIFO within a priority; priorities above the maximum count as
    the maximum."""
    q = declare_queue(ch, arguments={"x-max-priority": 5})
    ch.confirm_delivery()
    for body, prio in [("p1", 1), ("p5a", 5), ("p3", 3), ("none", None), ("p9", 9), ("p5b", 5), ("p0", 0)]:
        ch.basic_publish("", q, body.encode(), pika.BasicProperties(priority=prio))
    assert get_bodies(ch, q) == [b"p5a", b"p9", b"p5b", b"p3", b"p1", b"none", b"p0"]
    for body, prio in [("low", 1), ("high", 4)]:
        ch.basic_publish("", q, body.encode(), pika.BasicProperties(priority=prio))
    assert [b for _, _, b in consume(conn, ch, q, 2)] == [b"high", b"low"]


# -- consumer cancel notification, heartbeats, frames -----------------------------------------------------
def test_consumer_cancel_notification_when_queue_is_deleted(connections):
    """basic.cancel from the server (RabbitMQ's consumer_cancel_notify capability, which pika advertises):
    deleting a queue cancels its consumers and tells them so."""
    conn = connections()
    consumer_ch, admin_ch = conn.channel(), conn.channel()
    q = declare_queue(admin_ch)
    cancels = []
    consumer_ch.add_on_cancel_callback(lambda frame: cancels.append(frame.method))
    tag = consumer_ch.basic_consume(q, lambda *a: None, auto_ack=True)
    assert consumer_ch.consumer_tags == [tag]
    assert admin_ch.queue_delete(q).method.message_count == 0
    deadline = time.monotonic() + 5
    while not cancels and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert len(cancels) == 1
    assert cancels[0].consumer_tag == tag
    assert consumer_ch.consumer_tags == []
    assert consumer_ch.is_open  # a cancel notification does not close the channel
    consumer_ch.queue_declare(uniq("still-usable"), exclusive=True)


def test_heartbeats_negotiated_and_idle_connection_survives(connections):
    """reference 1.4.2.5.3 / 1.4.2.6.3 (tune / tune-ok heartbeat) and general 4.2.7: with heartbeat=2 both
    peers send heartbeats, so a connection idle for 5 s (more than two intervals) stays open."""
    conn = connections(heartbeat=2)
    assert conn._impl.params.heartbeat == 2  # pika stores the negotiated value there
    ch = conn.channel()
    q = declare_queue(ch, exclusive=True)
    conn.sleep(5.0)  # idle, but pika keeps servicing I/O (sends and receives heartbeats)
    assert conn.is_open
    ch.basic_publish("", q, b"after-idle")
    assert get_one(ch, q)[2] == b"after-idle"


def test_large_message_split_across_4096_byte_frames(connections):
    """general 4.2.6.2: a content body is split into as many frames as frame_max needs; the peer MUST handle
    that and deliver the reassembled body. frame_max=4096 (the minimum, reference 1.2 frame-min-size) makes a
    1 MiB body about 260 frames each way."""
    conn = connections(frame_max=4096)
    assert conn._impl.params.frame_max == 4096  # negotiated value
    ch = conn.channel()
    q = declare_queue(ch, exclusive=True)
    ch.confirm_delivery()
    big = os.urandom(1 << 20)
    ch.basic_publish("", q, big, pika.BasicProperties(headers={"size": len(big)}))
    method, props, body = get_one(ch, q)
    assert len(body) == len(big) and body == big
    assert props.headers == {"size": len(big)}
    ch.basic_publish("", q, big[::-1])
    [(_, _, body)] = consume(conn, ch, q, 1, timeout=10)
    assert body == big[::-1]
