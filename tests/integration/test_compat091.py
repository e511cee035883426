"""0-9-1 behaviours that unmodified clients rely on (issue 22), over raw frames.

Each test asserts the frames, in order, that RabbitMQ 3.10 sends for the same input; run them with
``RAFTMQ_TEST_BROKER=rabbitmq`` to check them against it. The one place where raftmq answers
otherwise on purpose says so: the confirms pending at channel.close (raftmq sends them all before
close-ok, RabbitMQ drops some).
The confirm, close and return orderings also run under load here (many channels, thousands of
messages in flight) and in a three-node cluster (tests/cluster/test_compat091_cluster.py).
"""

from __future__ import annotations

import asyncio
import struct

import aio_pika
import pytest

from tests.integration import compat091 as x
from tests.integration import rawamqp as r
from tests.integration.helpers import round_trip
from tests.integration.rawamqp import RawClient

QUEUE_DELETE = (50, 40)


def queue_delete(channel: int, queue: str) -> bytes:
    return r.method_frame(channel, QUEUE_DELETE, struct.pack(">H", 0) + r.shortstr(queue) + b"\x00")


# -- 1. connection.update-secret ---------------------------------------------------------------------------
def test_update_secret_with_the_users_password_is_answered_ok(broker):
    """connection.update-secret (class 10, method 70; RabbitMQ 3.8+, how clients refresh OAuth 2 tokens)
    is answered with update-secret-ok on channel 0 and the connection goes on."""
    with x.opened(broker.host, broker.port, 0) as c:
        c.send(x.update_secret(b"guest"))
        assert x.answers(c, 1) == [(0, x.CONNECTION_UPDATE_SECRET_OK)]
        c.open_channel(1)
        c.send(x.update_secret(b"guest") + r.channel_open(2))
        assert x.answers(c, 2) == [(0, x.CONNECTION_UPDATE_SECRET_OK), (2, r.CHANNEL_OPEN_OK)]


def test_update_secret_that_does_not_authenticate_the_user(broker):
    """A secret that is not the user's password is answered update-secret-ok, as RabbitMQ's internal
    password backend does (rabbit_access_control:update_state asks only backends whose credentials
    expire; issue 32: raftmq checked it as the password and closed with 530 until then)."""
    with x.opened(broker.host, broker.port, 1) as c:
        c.send(x.update_secret(b"not-the-password"))
        events = x.answers(c, 1, quiet=1.0)
    assert events == [(0, x.CONNECTION_UPDATE_SECRET_OK)]
    round_trip(broker.url)


def test_update_secret_through_pika_and_aio_pika(broker, conn):
    """The same through two client libraries' own update_secret calls (pika 1.4 BlockingConnection,
    aio-pika 10 / aiormq): each returns and the connection goes on working."""
    conn.update_secret("guest", "token refresh")
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, b"after update-secret")
    assert ch.basic_get(queue, auto_ack=True)[2] == b"after update-secret"

    async def main() -> None:
        connection = await aio_pika.connect(broker.url, timeout=10)
        try:
            await asyncio.wait_for(connection.update_secret("guest", reason="token refresh"), 10)
            channel = await connection.channel()
            await channel.declare_queue(exclusive=True)
        finally:
            await connection.close()

    asyncio.run(asyncio.wait_for(main(), 30))


# -- 2. confirms before channel.close-ok --------------------------------------------------------------------
def assert_confirmed_before_close_ok(broker, outcomes: dict[int, x.ChannelOutcome], per_channel: int) -> None:
    """Nothing on a channel after its close-ok, no sequence number confirmed twice, and every publish
    confirmed before close-ok. RabbitMQ 3.10 meets the first two but not the last: it drops the
    confirms still pending when the channel closes (seen: the last 178 of 1,000, the last 411 of
    5,000), which its clients must count as unconfirmed; what it does confirm is a prefix."""
    for n, o in outcomes.items():
        assert o.closed, f"channel {n}: no close-ok"
        assert o.after_close == [], f"channel {n}: frames after its close-ok: {o.after_close[:5]}"
        assert o.duplicates == 0, f"channel {n}: {o.duplicates} sequence numbers confirmed twice"
        if broker.kind == "rabbitmq":
            assert o.confirmed == set(range(1, len(o.confirmed) + 1)), f"channel {n}: not a prefix"
            continue
        missing = set(range(1, per_channel + 1)) - o.confirmed
        assert not missing, f"channel {n}: {len(missing)} publishes unconfirmed at close-ok, e.g. {min(missing)}"


def test_every_confirm_precedes_channel_close_ok(broker):
    """1,000 publishes in confirm mode, then channel.close at once: every ack/nack for them comes before
    channel.close-ok (reference 1.5.2.5: close-ok ends the channel; a frame after it would be on a
    channel the client no longer has) and nothing comes on the channel after it."""
    outcomes = x.confirms_then_close(broker.host, broker.port, channels=1, per_channel=1000)
    assert_confirmed_before_close_ok(broker, outcomes, 1000)


@pytest.mark.timeout(120)
def test_confirms_precede_close_ok_under_load(broker):
    """The same on 25 channels of one connection at once: 10,000 publishes in flight."""
    outcomes = x.confirms_then_close(broker.host, broker.port, channels=25, per_channel=400)
    assert_confirmed_before_close_ok(broker, outcomes, 400)


# -- 3. after connection.close-ok the client closes the socket --------------------------------------------
def test_close_ok_then_the_server_waits_for_the_client_to_close(broker):
    """A publish followed at once by connection.close: the server answers close-ok (reference 1.4.2.9/
    1.4.2.10: close-ok tells the client it may close the socket) and then waits for the client to close
    it, discarding the frames that still arrive (a channel.open and a publish get no answer), instead of
    closing first and resetting the connection under the client's feet."""
    c, queue = x.start_burst_then_close(broker.host, broker.port, publishes=1)
    with c:
        outcome = x.finish_close(c, queue, hold=1.5)
    assert outcome.before_close_ok == []
    assert outcome.answered_later_frames == []
    assert outcome.open_after, "the server closed the socket right after close-ok"


@pytest.mark.timeout(120)
def test_close_ok_under_load(broker):
    """Ten connections, each sending 2,000 publishes and connection.close in one write, read only once
    all ten have written: each gets close-ok, no reset, and the socket stays open until it closes it."""
    started = [x.start_burst_then_close(broker.host, broker.port, publishes=2000) for _ in range(10)]
    for c, queue in started:
        with c:
            outcome = x.finish_close(c, queue, hold=0.3)
        assert outcome.before_close_ok == [] and outcome.answered_later_frames == []
        assert outcome.open_after
    round_trip(broker.url)


def test_after_close_ok_the_wait_is_bounded_by_the_heartbeat_timeout(broker):
    """A client that never closes its socket after close-ok: the server ends it after the negotiated
    heartbeat interval (2 s here; RabbitMQ's rule, at most 30 s), sending nothing but heartbeats."""
    c, _queue = x.start_burst_then_close(broker.host, broker.port, publishes=10, heartbeat=2)
    with c:
        c.expect_method(r.CONNECTION_CLOSE_OK, channel=0)
        waited = x.seconds_until_server_ends(c, limit=10.0)
    assert waited is not None, "the server never closed the socket"
    assert 1.0 <= waited <= 6.0, waited


# -- 4. basic.return before the reply to any later method --------------------------------------------------
def test_return_precedes_the_reply_to_a_later_method(broker):
    """A mandatory publish nothing routes, then confirm.select, three times: the return (reference
    1.8.3.9, reply 312 NO_ROUTE) always comes before the reply to the method sent after the publish, and
    in confirm mode the publish's ack comes after its return and before that reply."""
    seen = x.returns_then_selects(broker.host, broker.port, channels=1, rounds=3)
    assert seen[1] == x.expected_returns_then_selects(1, 3)


@pytest.mark.timeout(120)
def test_returns_precede_replies_under_load(broker):
    """20 channels x 50 rounds (1,000 returns and 1,000 selects in flight, one write)."""
    seen = x.returns_then_selects(broker.host, broker.port, channels=20, rounds=50)
    for n, events in seen.items():
        assert events == x.expected_returns_then_selects(n, 50), n


def test_returns_precede_channel_close_ok(broker):
    """200 unroutable mandatory publishes, then channel.close at once: all 200 returns, in publish
    order, before close-ok (close-ok is the reply to a method sent after them)."""
    with x.opened(broker.host, broker.port, 1) as c:
        nowhere = x.uniq("compat-no-such-queue")
        c.send(b"".join(x.publish(1, nowhere, b"%d" % i, mandatory=True) for i in range(200))
               + r.channel_close(1))
        seen = x.answers(c, 201, timeout=30)
    assert seen == [(1, r.BASIC_RETURN, 312, b"%d" % i) for i in range(200)] + [(1, r.CHANNEL_CLOSE_OK)]


# -- 5. exclusive queues: 405 -------------------------------------------------------------------------------
def test_redeclare_with_another_exclusive_flag_is_405_resource_locked(broker):
    """reference 1.7.2.1.6 (queue.declare exclusive): an exclusive queue is locked to its connection.
    RabbitMQ checks the owner before any other property and strictly: redeclaring one's own exclusive
    queue as non-exclusive, another connection's as either, or a shared queue as exclusive is 405
    RESOURCE_LOCKED (not 406 inequivalent arg)."""
    locked = (1, r.CHANNEL_CLOSE, 405, r.QUEUE_DECLARE)
    queue, shared = x.uniq("compat-exclusive"), x.uniq("compat-shared")
    with x.opened(broker.host, broker.port, 1) as owner, x.opened(broker.host, broker.port, 1) as other:
        owner.send(r.queue_declare(1, queue, exclusive=True))
        owner.expect_method(r.QUEUE_DECLARE_OK, channel=1)
        owner.send(r.queue_declare(1, queue, exclusive=False))
        assert x.answers(owner, 1) == [locked]

        for exclusive in (False, True):
            other.send(r.queue_declare(1, queue, exclusive=exclusive))
            assert x.answers(other, 1) == [locked], exclusive
            other.send(r.method_frame(1, r.CHANNEL_CLOSE_OK))
            other.open_channel(1)

        other.send(r.queue_declare(1, shared))
        other.expect_method(r.QUEUE_DECLARE_OK, channel=1)
        other.send(r.queue_declare(1, shared, exclusive=True, durable=True))
        assert x.answers(other, 1) == [locked]
        other.send(r.method_frame(1, r.CHANNEL_CLOSE_OK))
        other.open_channel(1)
        other.send(queue_delete(1, shared))
        other.expect_method((50, 41), channel=1)


# -- 6. the default exchange cannot be declared --------------------------------------------------------------
@pytest.mark.parametrize("passive", [False, True], ids=["active", "passive"])
def test_declaring_the_default_exchange_is_403(broker, passive):
    """reference 1.6 (class exchange): "The server MUST NOT allow clients to access the default exchange
    except by specifying an empty exchange name in the Queue.Bind and content Publish methods."
    RabbitMQ refuses any exchange.declare of "" -- passive or not -- with channel.close 403."""
    with x.opened(broker.host, broker.port, 1) as c:
        c.send(x.exchange_declare(1, "", passive=passive))
        assert x.answers(c, 1) == [(1, r.CHANNEL_CLOSE, 403, x.EXCHANGE_DECLARE)]
        c.send(r.method_frame(1, r.CHANNEL_CLOSE_OK))
        c.open_channel(1)  # the connection is fine


# -- 7. channel numbers and channel_max ---------------------------------------------------------------------
def test_channel_max_limits_open_channels_not_their_numbers(broker):
    """channel-max (reference 1.4.2.5.1) as RabbitMQ applies it: the count of open channels. With the
    default channel-max channel 65535 opens; with channel-max 3 negotiated, channels 1, 2 and 65535
    open, a fourth is connection.close 530 (class/method 0); a channel closed frees its place."""
    with x.opened(broker.host, broker.port, 0) as c:
        c.open_channel(65535)

    def tuned(channel_max: int) -> RawClient:
        c = RawClient(broker.host, broker.port)
        c.send(r.PROTOCOL_HEADER)
        c.expect_method(r.CONNECTION_START)
        c.send(r.start_ok())
        c.expect_method(r.CONNECTION_TUNE)
        c.send(r.tune_ok(channel_max, 131072, 0) + r.connection_open())
        c.expect_method(r.CONNECTION_OPEN_OK)
        return c

    with tuned(3) as c:
        for n in (1, 2, 65535):
            c.open_channel(n)
        c.send(r.channel_close(2))
        c.expect_method(r.CHANNEL_CLOSE_OK, channel=2)
        c.open_channel(7)
        c.send(r.channel_open(8))
        assert x.answers(c, 1) == [(0, r.CONNECTION_CLOSE, 530, (0, 0))]
    round_trip(broker.url)
