"""aio-pika (asyncio, aiormq underneath) against a real broker.

Each test is a plain function running one coroutine under ``asyncio.run`` with an overall deadline, so the
suite needs no asyncio pytest plugin.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

import aio_pika
import pytest
from aio_pika.exceptions import ChannelNotFoundEntity, DeliveryError, QueueEmpty
from aiormq.exceptions import ChannelLockedResource, ChannelPreconditionFailed
from pamqp.commands import Basic

from tests.integration.helpers import uniq

OP = 10.0  # seconds, per awaited operation


def run(broker, body: Callable[[aio_pika.abc.AbstractConnection], Awaitable[None]], *, query: str = "",
        deadline: float = 30.0) -> None:
    """Connect, run ``body(connection)``, always close; the whole thing is bounded by ``deadline``."""
    async def main() -> None:
        connection = await aio_pika.connect(broker.url + query, timeout=OP)
        try:
            await body(connection)
        finally:
            await connection.close()

    asyncio.run(asyncio.wait_for(main(), deadline))


async def collect(queue: aio_pika.abc.AbstractQueue, n: int, *, ack: bool = True,
                  timeout: float = 5.0) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Consume ``n`` messages with queue.iterator (bounded by ``timeout``)."""
    out = []

    async def loop() -> None:
        async with queue.iterator() as it:
            async for message in it:
                out.append(message)
                if ack:
                    await message.ack()
                if len(out) >= n:
                    return

    await asyncio.wait_for(loop(), timeout)
    return out


def test_publish_with_confirms_and_consume_in_order(broker):
    """With publisher_confirms=True (the default) every publish returns the broker's basic.ack; a consumer
    receives the messages in publication order (general 4.7: order is kept on one path)."""
    async def body(connection):
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(uniq("aio"), durable=True)
        try:
            for i in range(50):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(str(i).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                     headers={"i": i}, message_id=f"m{i}"),
                    routing_key=queue.name, timeout=OP)
                assert isinstance(confirmation, Basic.Ack)
            got = await collect(queue, 50)
            assert [m.body for m in got] == [str(i).encode() for i in range(50)]
            assert [m.headers["i"] for m in got] == list(range(50))
            assert got[0].message_id == "m0" and got[0].delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            assert all(m.redelivered is False and m.routing_key == queue.name for m in got)
        finally:
            await queue.delete(if_unused=False, if_empty=False)

    run(broker, body)


def test_topic_and_fanout_routing(broker):
    """general 3.1.3.2 / 3.1.3.3 through aio-pika's declare/bind API."""
    async def body(connection):
        channel = await connection.channel()
        topic = await channel.declare_exchange(uniq("aio-topic"), aio_pika.ExchangeType.TOPIC, auto_delete=True)
        fanout = await channel.declare_exchange(uniq("aio-fan"), aio_pika.ExchangeType.FANOUT, auto_delete=True)
        q_logs = await channel.declare_queue(uniq("logs"), exclusive=True)
        q_errors = await channel.declare_queue(uniq("errors"), exclusive=True)
        q_fan = await channel.declare_queue(uniq("fan"), exclusive=True)
        await q_logs.bind(topic, "log.#")
        await q_errors.bind(topic, "*.error")
        await q_fan.bind(fanout)
        for key in ("log.info", "log.error", "app.error", "log"):
            await topic.publish(aio_pika.Message(key.encode()), routing_key=key)
        await fanout.publish(aio_pika.Message(b"everyone"), routing_key="whatever")
        assert [m.body for m in await collect(q_logs, 3)] == [b"log.info", b"log.error", b"log"]
        assert [m.body for m in await collect(q_errors, 2)] == [b"log.error", b"app.error"]
        message = await q_fan.get(timeout=OP)
        assert message.body == b"everyone" and message.exchange == fanout.name
        await message.ack()
        assert await q_fan.get(fail=False, timeout=OP) is None

    run(broker, body)


def test_unroutable_mandatory_publish_raises_delivery_error(broker):
    """basic.return 312 NO_ROUTE (reference 1.8.3.8) surfaces as DeliveryError on a confirm channel with
    on_return_raises=True."""
    async def body(connection):
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        with pytest.raises(DeliveryError) as info:
            await channel.default_exchange.publish(aio_pika.Message(b"lost"), routing_key=uniq("nobody"),
                                                   mandatory=True, timeout=OP)
        assert isinstance(info.value.frame, Basic.Return)
        assert info.value.frame.reply_code == 312
        assert info.value.message.body == b"lost"

    run(broker, body)


def test_reject_publish_overflow_is_nacked(broker):
    """x-overflow=reject-publish: the publish that does not fit is answered with basic.nack."""
    async def body(connection):
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(uniq("full"), exclusive=True,
                                            arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ack = await channel.default_exchange.publish(aio_pika.Message(b"fits"), routing_key=queue.name)
        assert isinstance(ack, Basic.Ack)
        with pytest.raises(DeliveryError) as info:
            await channel.default_exchange.publish(aio_pika.Message(b"overflow"), routing_key=queue.name,
                                                   timeout=OP)
        assert isinstance(info.value.frame, Basic.Nack)
        declared = await channel.declare_queue(queue.name, passive=True)
        assert declared.declaration_result.message_count == 1

    run(broker, body)


def test_prefetch_limits_unacked_deliveries(broker):
    """reference 1.8.3.1 (basic.qos prefetch-count) with an asyncio consumer."""
    async def body(connection):
        pub = await connection.channel()
        queue_name = uniq("prefetch")
        await pub.declare_queue(queue_name, exclusive=True)
        for i in range(6):
            await pub.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=queue_name)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2)
        queue = await channel.get_queue(queue_name)
        got: list[aio_pika.abc.AbstractIncomingMessage] = []
        two, three = asyncio.Event(), asyncio.Event()

        async def on_message(message):
            got.append(message)
            if len(got) == 2:
                two.set()
            if len(got) == 3:
                three.set()

        await queue.consume(on_message)
        await asyncio.wait_for(two.wait(), OP)
        await asyncio.sleep(0.3)
        assert len(got) == 2
        await got[0].ack()
        await asyncio.wait_for(three.wait(), OP)
        await asyncio.sleep(0.3)
        assert [m.body for m in got] == [b"0", b"1", b"2"]

    run(broker, body)


def test_exclusive_queue_locked_and_missing_queue_not_found(broker):
    """405 resource-locked for another connection's exclusive queue (reference 1.7.2.1.5), 404 not-found
    for a passive declare of a missing queue; the connections stay usable."""
    async def body(connection):
        channel = await connection.channel()
        owned = await channel.declare_queue(uniq("mine"), exclusive=True)
        other = await aio_pika.connect(broker.url, timeout=OP)
        try:
            other_channel = await other.channel()
            with pytest.raises(ChannelLockedResource):
                await other_channel.declare_queue(owned.name, passive=True)
            other_channel = await other.channel()
            with pytest.raises(ChannelNotFoundEntity):
                await other_channel.declare_queue(uniq("missing"), passive=True)
            other_channel = await other.channel()
            await other_channel.declare_queue(uniq("fine"), exclusive=True)
        finally:
            await other.close()
        assert (await channel.declare_queue(owned.name, passive=True)).name == owned.name

    run(broker, body)


def test_redeclare_with_other_arguments_is_precondition_failed(broker):
    """406 precondition-failed for a redeclare that changes a queue's arguments."""
    async def body(connection):
        channel = await connection.channel()
        name = uniq("args")
        await channel.declare_queue(name, auto_delete=True, arguments={"x-max-length": 10})
        with pytest.raises(ChannelPreconditionFailed):
            await channel.declare_queue(name, auto_delete=True, arguments={"x-max-length": 11})
        channel = await connection.channel()
        await channel.queue_delete(name)

    run(broker, body)


def test_transaction_commit_and_rollback(broker):
    """reference 1.9 (tx): rolled-back publishes never reach the queue; committed ones do."""
    async def body(connection):
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue(uniq("tx"), exclusive=True)
        tx = channel.transaction()
        await tx.select()
        await channel.default_exchange.publish(aio_pika.Message(b"rolled-back"), routing_key=queue.name)
        await tx.rollback()
        await channel.default_exchange.publish(aio_pika.Message(b"committed"), routing_key=queue.name)
        await tx.commit()
        message = await queue.get(timeout=OP)
        assert message.body == b"committed"
        await message.ack()
        await tx.commit()  # acks are transactional too: commit it
        with pytest.raises(QueueEmpty):
            await queue.get(timeout=OP)

    run(broker, body)


def test_reject_requeue_sets_redelivered_and_dead_letters_with_x_death(broker):
    """basic.reject requeue=true -> redelivered (reference 1.8.3.14); requeue=false with a dead-letter
    exchange -> x-death reason 'rejected'."""
    async def body(connection):
        channel = await connection.channel()
        dlq = await channel.declare_queue(uniq("aio-dlq"), exclusive=True)
        queue = await channel.declare_queue(uniq("aio-src"), exclusive=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq.name})
        await channel.default_exchange.publish(aio_pika.Message(b"m"), routing_key=queue.name)
        first = await queue.get(timeout=OP)
        assert first.redelivered is False
        await first.reject(requeue=True)
        second = await queue.get(timeout=OP)
        assert second.redelivered is True and second.body == b"m"
        await second.reject(requeue=False)
        [dead] = await collect(dlq, 1)
        assert dead.body == b"m"
        [death] = dead.headers["x-death"]
        assert death["reason"] == "rejected" and death["queue"] == queue.name

    run(broker, body)


def test_large_message_and_idle_connection_with_heartbeat_2(broker):
    """heartbeat=2 via the URL (aiormq sends it in tune-ok): a 1 MiB body is split over frames of the
    negotiated size and reassembled (general 4.2.6.2), and the connection, idle for 5 s, is still alive
    (general 4.2.7: both peers heartbeat)."""
    async def body(connection):
        channel = await connection.channel()
        queue = await channel.declare_queue(uniq("aio-big"), exclusive=True)
        big = os.urandom(1 << 20)
        await channel.default_exchange.publish(aio_pika.Message(big), routing_key=queue.name, timeout=OP)
        [message] = await collect(queue, 1, timeout=OP)
        assert message.body == big
        await asyncio.sleep(5)
        assert not connection.is_closed
        await channel.default_exchange.publish(aio_pika.Message(b"alive"), routing_key=queue.name, timeout=OP)
        assert (await queue.get(timeout=OP, no_ack=True)).body == b"alive"

    run(broker, body, query="?heartbeat=2")
