"""Issue 32's 0-9-1 items with the real clients: lenient unbind and update-secret, as RabbitMQ 3.x.

* Unbind of what is gone: queue.unbind / exchange.unbind naming an exchange or a queue that no longer
  exists is answered unbind-ok by RabbitMQ (``rabbit_binding:remove`` drops not-found resources,
  ``absent_errs_only``), where raftmq answered 404 and closed the channel; bind keeps 404 (0-9-1
  reference 1.7.2.3 queue.bind, "The server MUST raise ... not-found"; queue.unbind, 1.7.2.5, names no
  rule for a missing queue or exchange). aio-pika's ``patterns.RPC.close()`` unbinds its result
  queue from the auto-deleted dead-letter exchange ``rpc.dlx``: every use of it hit this.
* connection.update-secret (RabbitMQ's extension of class connection, 10/70): RabbitMQ's internal
  user store accepts any new secret for a connection already authenticated
  (``rabbit_access_control:update_state`` asks only backends whose state can expire, OAuth 2);
  pika's and amqplib's own suites send a made-up token.

One node (the session's broker); the amqplib scenario needs node and npm (skipped without them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import aio_pika
import pika
import pika.exceptions as pex
import pytest
from aio_pika.patterns import RPC

from tests.integration import compat091 as x
from tests.integration import rawamqp as r
from tests.integration.helpers import connect, uniq
from tests.support.npm import npm_package

AMQPLIB_VERSION = "2"
SCRIPT = Path(__file__).with_name("amqp091_amqplib.js")


# -- unbind of what is gone ------------------------------------------------------------------------------
def test_unbind_of_a_missing_exchange_or_queue_is_unbind_ok(ch):
    """queue.unbind from a missing exchange, of a missing queue, exchange.unbind with a missing
    source or destination: each answered unbind-ok (pika returns the Unbind-Ok frame), and the
    channel stays open and usable, as on RabbitMQ 3.10."""
    queue, exchange = uniq("unbind-q"), uniq("unbind-x")
    ch.queue_declare(queue, exclusive=True)
    ch.exchange_declare(exchange, "direct", auto_delete=True)
    frames = [
        ch.queue_unbind(queue, uniq("missing-x"), "k"),
        ch.queue_unbind(uniq("missing-q"), exchange, "k"),
        ch.exchange_unbind(uniq("missing-dest"), exchange, "k"),
        ch.exchange_unbind(exchange, uniq("missing-source"), "k"),
    ]
    assert [type(f.method).__name__ for f in frames] == ["UnbindOk", "UnbindOk", "UnbindOk", "UnbindOk"]
    assert ch.is_open
    ch.basic_publish("", queue, b"after the unbinds")
    assert ch.basic_get(queue, auto_ack=True)[2] == b"after the unbinds"


def test_unbind_after_the_queue_and_its_exchange_went(ch):
    """The sequence aio-pika's RPC runs: a queue bound to an auto-delete exchange is deleted, the
    exchange auto-deletes with its last binding, and the unbind that follows is unbind-ok."""
    queue, exchange = uniq("gone-q"), uniq("gone-x")
    ch.exchange_declare(exchange, "headers", auto_delete=True)
    ch.queue_declare(queue)
    ch.queue_bind(queue, exchange, "", arguments={"From": queue, "x-match": "any"})
    ch.queue_delete(queue)
    with pytest.raises(pex.ChannelClosedByBroker):  # the exchange went with its last binding
        probe = ch.connection.channel()
        probe.exchange_declare(exchange, passive=True)
    frame = ch.queue_unbind(queue, exchange, "", arguments={"From": queue, "x-match": "any"})
    assert type(frame.method).__name__ == "UnbindOk" and ch.is_open


@pytest.mark.parametrize("what", ["queue.bind to a missing exchange", "queue.bind of a missing queue",
                                  "exchange.bind from a missing source"])
def test_bind_of_a_missing_exchange_or_queue_is_still_404(conn, what):
    """Bind keeps 404 NOT_FOUND and closes the channel (reference 1.7.2.3, RabbitMQ alike)."""
    ch = conn.channel()
    queue = uniq("bind-q")
    ch.queue_declare(queue, exclusive=True)
    act = {"queue.bind to a missing exchange": lambda: ch.queue_bind(queue, uniq("missing-x"), "k"),
           "queue.bind of a missing queue": lambda: ch.queue_bind(uniq("missing-q"), "amq.direct", "k"),
           "exchange.bind from a missing source": lambda: ch.exchange_bind("amq.fanout", uniq("missing-x"), "k")}
    with pytest.raises(pex.ChannelClosedByBroker) as refused:
        act[what]()
    assert refused.value.reply_code == 404 and "NOT_FOUND" in refused.value.reply_text
    assert conn.is_open  # a channel exception


def test_aio_pika_rpc_pattern_closes_without_a_channel_error(broker):
    """aio-pika's ``patterns.RPC``: create, register, call, close. close() cancels the result
    queue's consumer (the auto-delete queue goes, then the auto-delete ``rpc.dlx`` with its last
    binding) and unbinds from ``rpc.dlx``: unbind-ok, so no channel is closed, and the channel then
    takes another call (raftmq before issue 32: 404 NOT_FOUND, the channel closed)."""

    async def main() -> None:
        connection = await aio_pika.connect(broker.url, timeout=10)
        try:
            channel = await connection.channel()
            closed: list = []
            channel.close_callbacks.add(lambda _ch, exc=None: closed.append(exc))
            rpc = await RPC.create(channel)
            method = uniq("rpc-double")

            async def double(*, value: int) -> int:
                return value * 2

            await rpc.register(method, double, auto_delete=True)
            assert await asyncio.wait_for(rpc.call(method, kwargs={"value": 21}), 10) == 42
            await asyncio.wait_for(rpc.close(), 10)
            assert not channel.is_closed and closed == []
            again = await RPC.create(channel)  # the same channel serves a second RPC
            await again.register(method + "-2", double, auto_delete=True)
            assert await asyncio.wait_for(again.call(method + "-2", kwargs={"value": 5}), 10) == 10
            await asyncio.wait_for(again.close(), 10)
            assert not channel.is_closed and closed == []
        finally:
            await connection.close()

    asyncio.run(asyncio.wait_for(main(), 60))


# -- update-secret ---------------------------------------------------------------------------------------
def test_update_secret_with_a_made_up_token_over_raw_frames(broker):
    """update-secret whose secret is not the user's password: update-secret-ok on channel 0, and the
    frames pipelined after it are answered after it (RabbitMQ's internal store accepts any secret)."""
    with x.opened(broker.host, broker.port, 1) as c:
        c.send(x.update_secret(b"a made-up token") + r.channel_open(2))
        assert x.answers(c, 2) == [(0, x.CONNECTION_UPDATE_SECRET_OK), (2, r.CHANNEL_OPEN_OK)]


def test_update_secret_with_pika_and_a_made_up_token(conn):
    """pika's BlockingConnection.update_secret with a token that is not the password (what pika's
    acceptance tests send): it returns, and the connection goes on as the same user."""
    conn.update_secret("new-secret-" + uniq(), "token refresh")
    ch = conn.channel()
    queue = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", queue, b"after update-secret")
    assert ch.basic_get(queue, auto_ack=True)[2] == b"after update-secret"
    assert conn.is_open


@pytest.fixture(scope="session")
def amqplib_dir() -> Path:
    return npm_package("amqplib", AMQPLIB_VERSION)


def test_amqplib_update_secret_and_unbind(broker, amqplib_dir: Path):
    """amqplib (callback and promise APIs): updateSecret with a made-up token completes and emits
    'update-secret-ok' (before issue 32 the callback API never heard of the 530 close and hung);
    unbindQueue / unbindExchange naming missing ones resolve; bindQueue to a missing exchange is
    still rejected with 404."""
    setup = connect(broker.url)
    queue = uniq("amqplib")
    setup.channel().queue_declare(queue)
    env = {**os.environ, "NODE_PATH": str(amqplib_dir / "node_modules")}
    try:
        result = subprocess.run(["node", str(SCRIPT), str(broker.port), queue], capture_output=True, text=True,
                                timeout=60, env=env)
        assert result.returncode == 0, (result.stdout, result.stderr[-2000:])
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen["callback"] == {"event": True, "queue": queue}
        assert seen["promise"] == {"body": "after unbind", "channelClosed": False}
        assert seen["bind"] == 404
        assert seen["closedEarly"] is None
    finally:
        setup.channel().queue_delete(queue)
        setup.close()


def test_pika_connection_survives_both(broker):
    """Both items on one pika connection, in the order a token-refreshing RPC client meets them."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        ch = connection.channel()
        connection.update_secret("refreshed-token", "token refresh")
        ch.queue_unbind(uniq("missing-q"), "amq.topic", "#")
        assert ch.is_open and connection.is_open
    finally:
        connection.close()
