"""Channel and connection exceptions, as a real client sees them.

Reply codes are the constants of reference 1.2: channel errors (403 access-refused, 404 not-found,
405 resource-locked, 406 precondition-failed) close only the channel; connection errors (5xx, 530) close
the whole connection. After a channel error the connection and its other channels stay usable.
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from tests.integration.helpers import get_bodies, get_one, message_count, uniq


def channel_error(fn, *args, **kwargs) -> ChannelClosedByBroker:
    with pytest.raises(ChannelClosedByBroker) as info:
        fn(*args, **kwargs)
    return info.value


def test_passive_declare_of_missing_queue_is_404_and_only_closes_that_channel(conn):
    """reference 1.7.2.1.3 (queue.declare passive): "raise an error if not" exists -> 404 not-found, a
    channel error (reference 1.2): the connection and its other channels carry on."""
    bystander = conn.channel()
    q = bystander.queue_declare(uniq("q"), exclusive=True).method.queue
    ch = conn.channel()
    err = channel_error(ch.queue_declare, uniq("missing"), passive=True)
    assert err.reply_code == 404
    assert err.reply_text.startswith("NOT_FOUND")
    assert ch.is_closed and conn.is_open and bystander.is_open
    bystander.basic_publish("", q, b"still-fine")
    assert get_one(bystander, q)[2] == b"still-fine"
    fresh = conn.channel()
    assert fresh.queue_declare(q, passive=True).method.queue == q


def test_passive_declare_of_missing_exchange_is_404(ch):
    """reference 1.6.2.1.4 (exchange.declare passive): error if the exchange does not exist -> 404."""
    assert channel_error(ch.exchange_declare, uniq("missing-x"), passive=True).reply_code == 404


def test_passive_declare_ignores_other_fields(ch):
    """reference 1.7.2.1.3: "When set, all other method fields except name and no-wait are ignored." """
    q = ch.queue_declare(uniq("q"), auto_delete=True, arguments={"x-message-ttl": 1000}).method.queue
    assert ch.queue_declare(q, passive=True, durable=True, arguments={"x-message-ttl": 5}).method.queue == q
    x = uniq("x")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    ch.exchange_declare(x, "topic", passive=True, durable=True)
    ch.queue_delete(q)
    ch.exchange_delete(x)


@pytest.mark.parametrize(("first", "second"), [
    ({}, {"durable": True}),
    ({"auto_delete": True}, {"auto_delete": False}),
    ({"arguments": {"x-message-ttl": 1000}}, {"arguments": {"x-message-ttl": 2000}}),
    ({"arguments": {"x-max-length": 5}}, {}),
], ids=["durable", "auto_delete", "ttl-value", "missing-arg"])
def test_redeclare_queue_with_different_properties_is_406(conn, first, second):
    """Redeclaring an existing queue with other properties is a precondition failure (406); the queue keeps
    its original properties. The same declare repeated is fine (declare is idempotent)."""
    ch = conn.channel()
    q = uniq("q")
    ch.queue_declare(q, **first)
    ch.queue_declare(q, **first)
    err = channel_error(ch.queue_declare, q, **second)
    assert err.reply_code == 406
    assert err.reply_text.startswith("PRECONDITION_FAILED")
    ch = conn.channel()
    ch.queue_declare(q, **first)
    ch.queue_delete(q)


@pytest.mark.parametrize(("first", "second"), [
    ({"exchange_type": "direct"}, {"exchange_type": "fanout"}),
    ({"exchange_type": "topic"}, {"exchange_type": "topic", "durable": True}),
], ids=["type", "durable"])
def test_redeclare_exchange_with_different_properties_is_406(conn, first, second):
    """reference 1.6.2.1.3: "It is not valid or meaningful to attempt to change the type of an existing
    exchange." A changed type or durability is refused with 406."""
    ch = conn.channel()
    x = uniq("x")
    ch.exchange_declare(x, **first)
    ch.exchange_declare(x, **first)
    assert channel_error(ch.exchange_declare, x, **second).reply_code == 406
    conn.channel().exchange_delete(x)


@pytest.mark.parametrize("confirms", [False, True], ids=["plain", "confirm-mode"])
def test_publish_to_missing_exchange_closes_channel_with_404(conn, confirms):
    """reference 1.8.3.7.2 (basic.publish exchange): "If the exchange name is specified, and that exchange
    does not exist, the server will raise a channel exception" -> 404 not-found."""
    ch = conn.channel()
    if confirms:
        ch.confirm_delivery()
        err = channel_error(ch.basic_publish, uniq("no-such-exchange"), "k", b"lost")
    else:
        ch.basic_publish(uniq("no-such-exchange"), "k", b"lost")  # asynchronous: the close comes later
        err = channel_error(ch.queue_declare, uniq("q"), exclusive=True)
    assert err.reply_code == 404
    assert conn.is_open
    conn.channel().queue_declare(uniq("q"), exclusive=True)


@pytest.mark.parametrize("operation", [
    "bind-missing-exchange", "bind-missing-queue", "consume-missing-queue", "get-missing-queue",
    "purge-missing-queue", "exchange-bind-missing-source",
])
def test_operations_on_missing_entities_are_404(ch, operation):
    """Binding, consuming, getting or purging a queue or exchange that does not exist -> 404 not-found."""
    q = ch.queue_declare(uniq("q"), exclusive=True).method.queue
    x = uniq("x")
    ch.exchange_declare(x, "direct", auto_delete=True)
    missing = uniq("missing")
    ops = {
        "bind-missing-exchange": lambda: ch.queue_bind(q, missing, "k"),
        "bind-missing-queue": lambda: ch.queue_bind(missing, x, "k"),
        "consume-missing-queue": lambda: ch.basic_consume(missing, lambda *a: None),
        "get-missing-queue": lambda: ch.basic_get(missing),
        "purge-missing-queue": lambda: ch.queue_purge(missing),
        "exchange-bind-missing-source": lambda: ch.exchange_bind(x, missing, "k"),
    }
    assert channel_error(ops[operation]).reply_code == 404


@pytest.mark.parametrize("operation", [
    "passive-declare", "declare", "consume", "get", "purge", "delete", "bind",
])
def test_exclusive_queue_from_another_connection_is_405(connections, operation):
    """reference 1.7.2.1.5 (queue.declare exclusive): "Exclusive queues may only be accessed by the current
    connection ... Passive declaration of an exclusive queue by other connections are not allowed."
    Any such access is refused with 405 resource-locked; the owner is unaffected."""
    owner, intruder = connections(), connections()
    och = owner.channel()
    q = och.queue_declare(uniq("excl"), exclusive=True).method.queue
    ich = intruder.channel()
    ops = {
        "passive-declare": lambda: ich.queue_declare(q, passive=True),
        "declare": lambda: ich.queue_declare(q, exclusive=True),
        "consume": lambda: ich.basic_consume(q, lambda *a: None),
        "get": lambda: ich.basic_get(q),
        "purge": lambda: ich.queue_purge(q),
        "delete": lambda: ich.queue_delete(q),
        "bind": lambda: ich.queue_bind(q, "amq.fanout"),
    }
    err = channel_error(ops[operation])
    assert err.reply_code == 405
    assert err.reply_text.startswith("RESOURCE_LOCKED")
    assert intruder.is_open
    och.basic_publish("", q, b"owner-still-works")
    assert get_one(och, q)[2] == b"owner-still-works"


def test_delete_if_unused_and_if_empty_are_406(conn):
    """reference 1.7.2.9.3 / 1.7.2.9.4 (queue.delete if-unused / if-empty) and 1.6.2.3.3 (exchange.delete
    if-unused): "the server does not delete it but raises a channel exception" -> 406; nothing is deleted."""
    admin = conn.channel()
    admin.confirm_delivery()
    in_use = admin.queue_declare(uniq("in-use")).method.queue
    admin.basic_consume(in_use, lambda *a: None, auto_ack=True)
    non_empty = admin.queue_declare(uniq("non-empty")).method.queue
    admin.basic_publish("", non_empty, b"m")
    bound_x = uniq("bound-x")
    admin.exchange_declare(bound_x, "direct")
    admin.queue_bind(non_empty, bound_x, "k")

    assert channel_error(conn.channel().queue_delete, in_use, if_unused=True).reply_code == 406
    assert channel_error(conn.channel().queue_delete, non_empty, if_empty=True).reply_code == 406
    assert channel_error(conn.channel().exchange_delete, bound_x, if_unused=True).reply_code == 406

    check = conn.channel()
    assert check.queue_declare(in_use, passive=True).method.consumer_count == 1
    assert message_count(check, non_empty) == 1
    check.exchange_declare(bound_x, passive=True)
    # the conditions hold once the queue is idle / empty
    assert check.queue_delete(non_empty, if_unused=True).method.message_count == 1
    check.exchange_delete(bound_x, if_unused=True)
    empty = check.queue_declare(uniq("empty")).method.queue
    assert check.queue_delete(empty, if_empty=True, if_unused=True).method.message_count == 0
    admin.queue_delete(in_use)


@pytest.mark.parametrize("method", ["tx_commit", "tx_rollback"])
def test_tx_commit_or_rollback_without_select_is_406(ch, method):
    """reference 1.9.2.3 / 1.9.2.5: "The client MUST NOT use the Commit [Rollback] method on non-transacted
    channels." On failure: precondition-failed (406)."""
    assert channel_error(getattr(ch, method)).reply_code == 406


@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_declaring_reserved_amq_names_is_403(ch, kind):
    """Names beginning with "amq." are reserved for pre-declared and standardised exchanges and queues
    (0-9-1 exchange-name / queue-name rules): a client may only declare them passively -> 403 access-refused."""
    name = "amq." + uniq(kind)
    if kind == "exchange":
        err = channel_error(ch.exchange_declare, name, "direct")
    else:
        err = channel_error(ch.queue_declare, name)
    assert err.reply_code == 403


def test_exclusive_consumer_locks_out_other_consumers(connections):
    """reference 1.8.3.3.6 (basic.consume exclusive): "only this consumer can access the queue"; another
    consumer is refused with 403 access-refused, and an exclusive consumer cannot join a queue that has
    consumers."""
    a, b = connections(), connections()
    ach = a.channel()
    q = ach.queue_declare(uniq("q")).method.queue
    tag = ach.basic_consume(q, lambda *x: None, exclusive=True)
    assert channel_error(b.channel().basic_consume, q, lambda *x: None).reply_code == 403
    ach.basic_cancel(tag)
    b.channel().basic_consume(q, lambda *x: None)  # free again
    assert channel_error(a.channel().basic_consume, q, lambda *x: None, exclusive=True).reply_code == 403
    a.channel().queue_delete(q)


def test_ack_of_unknown_delivery_tag_is_406(conn):
    """basic.ack with a delivery tag that was never delivered (or was already acked) on the channel is a
    precondition failure (406); the message is unaffected."""
    ch = conn.channel()
    q = ch.queue_declare(uniq("q"), exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"m")
    method, _, _ = get_one(ch, q, auto_ack=False)
    ch.basic_ack(method.delivery_tag)
    ch.basic_ack(method.delivery_tag)  # second ack of the same tag
    assert channel_error(ch.queue_declare, q, passive=True).reply_code == 406
    ch = conn.channel()
    ch.basic_ack(12345)
    assert channel_error(ch.basic_get, q).reply_code == 406
    assert message_count(conn.channel(), q) == 0


@pytest.mark.parametrize("arguments", [
    {"x-max-length": "three"},
    {"x-message-ttl": -1},
    {"x-max-priority": 256},
    {"x-overflow": "not-a-mode"},
], ids=["max-length-string", "negative-ttl", "priority-too-large", "bad-overflow"])
def test_invalid_queue_arguments_are_406(ch, arguments):
    """A queue argument of the wrong type or out of range is refused with 406 and no queue is created."""
    q = uniq("bad-args")
    assert channel_error(ch.queue_declare, q, arguments=arguments).reply_code == 406


def test_unknown_exchange_type_is_a_503_connection_error(connections):
    """The 0-9-1 exchange.declare type rule: declaring an exchange of a type the server does not implement
    fails with command-invalid (503), a connection error (reference 1.2): the whole connection closes."""
    conn = connections()
    ch = conn.channel()
    with pytest.raises(ConnectionClosedByBroker) as info:
        ch.exchange_declare(uniq("x"), "no-such-type")
    assert info.value.reply_code == 503
    assert conn.is_closed
    # a new connection is fine, and the exchange was not created
    other = connections()
    assert channel_error(other.channel().exchange_declare, "no-such-type", passive=True).reply_code == 404


def test_channel_error_discards_the_failed_publish_only(conn):
    """A channel closed by an error drops nothing already accepted: messages published before the failing
    method are in the queue."""
    ch = conn.channel()
    q = ch.queue_declare(uniq("q"), exclusive=True).method.queue
    ch.basic_publish("", q, b"before", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish(uniq("no-such-exchange"), "k", b"failing")
    channel_error(ch.queue_declare, q, passive=True)
    assert get_bodies(conn.channel(), q) == [b"before"]
