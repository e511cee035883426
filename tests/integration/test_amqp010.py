"""AMQP 0-10 on a single node with raftmq's client: the same core as 0-9-1 (spec 0-10 part 2).

RabbitMQ does not speak 0-10: these run against raftmq only.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import pika
import pytest

from raftmq.client.amqp010 import ClientError, Connection, ConnectionLost, SessionException
from raftmq.protocol.amqp010 import codec as c


@pytest.fixture
def hosts(broker):
    if broker.kind != "raftmq":
        pytest.skip("AMQP 0-10 is raftmq's")
    return [f"{broker.host}:{broker.port}"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def name() -> str:
    return f"t010-{uuid.uuid4().hex[:8]}"


def test_publish_subscribe_accept_and_open_ok_known_hosts(hosts):
    queue = name()

    async def scenario():
        conn = await Connection.connect(hosts)
        assert conn.known_hosts == hosts  # connection.open-ok known-hosts (spec L4186)
        session = await conn.session()
        await session.queue_declare(queue, auto_delete=False)
        for i in range(20):
            await session.publish("", queue, f"m{i}".encode(), headers={"i": i})
        subscription = await session.subscribe(queue, window=5)
        got = []
        for _ in range(20):
            message = await subscription.get(timeout=5)
            got.append((message.body, message.headers["i"], message.routing_key))
            await message.accept()
        await conn.close()
        return got

    assert run(scenario()) == [(f"m{i}".encode(), i, queue) for i in range(20)]


def test_released_message_comes_back_redelivered(hosts):
    queue = name()

    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        await session.queue_declare(queue)
        await session.publish("", queue, b"again")
        subscription = await session.subscribe(queue, window=1)
        first = await subscription.get(timeout=5)
        await first.release(redelivered=True)
        second = await subscription.get(timeout=5)
        await second.accept()
        await conn.close()
        return first.redelivered, second.body, second.redelivered

    assert run(scenario()) == (False, b"again", True)


def test_execution_exception_for_a_missing_queue(hosts):
    """3.4.1.3: an operational error is an execution.exception and ends the session."""

    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        with pytest.raises(SessionException) as info:
            await session.execute(c.QueueDeclare(queue=name(), passive=True))
        await conn.close()
        return info.value.error_code

    assert run(scenario()) == 404


def test_unknown_command_is_not_implemented(hosts):
    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        with pytest.raises(SessionException) as info:
            await session.execute(c.DtxSelect())  # distributed transactions are not supported
        await conn.close()
        return info.value.error_code

    assert run(scenario()) == 540


def test_0_10_publish_is_consumed_by_0_9_1(broker, hosts):
    """One core: a message published over 0-10 reaches a pika consumer with its properties."""
    queue = name()

    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        await session.queue_declare(queue)
        await session.publish("", queue, b"cross", persistent=True, headers={"k": "v"})
        await conn.close()

    run(scenario())
    pconn = pika.BlockingConnection(pika.URLParameters(broker.url))
    ch = pconn.channel()
    method, props, body = ch.basic_get(queue, auto_ack=True)
    pconn.close()
    assert body == b"cross" and props.delivery_mode == 2 and props.headers == {"k": "v"}


def test_queue_query_returns_a_result(hosts):
    """queue.query (L7912): the answer travels in execution.result before the command completes."""
    queue = name()

    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        await session.queue_declare(queue, durable=True)
        await session.publish("", queue, b"1")
        await session.publish("", queue, b"2")
        found = await session.queue_query(queue)
        missing = await session.queue_query(name())
        bound = await session.execute(c.ExchangeBound(exchange="amq.direct", queue=queue, binding_key="k"))
        await conn.close()
        return found, missing, bound

    found, missing, bound = run(scenario())
    assert (found.queue, found.durable, found.message_count, found.subscriber_count) == (queue, True, 2, 0)
    assert missing.message_count is None and missing.durable is False
    assert bound.queue_not_matched and not bound.exchange_not_found and not bound.queue_not_found


def test_transactions_commit_and_rollback(hosts):
    """Class tx (L6205ff): transfers and accepts take effect at tx.commit, vanish at tx.rollback."""
    queue = name()

    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        await session.queue_declare(queue)
        await session.tx_select()
        await session.publish("", queue, b"rolled-back")
        await session.tx_rollback()
        await session.publish("", queue, b"committed")
        before = (await session.queue_query(queue)).message_count
        await session.tx_commit()
        after = (await session.queue_query(queue)).message_count
        subscription = await session.subscribe(queue, window=1)
        message = await subscription.get(timeout=5)
        await message.accept()  # transactional: takes effect at commit
        pending = (await session.queue_query(queue)).message_count
        await session.tx_commit()
        await conn.close()
        return before, after, message.body, pending

    assert run(scenario()) == (0, 1, b"committed", 0)


def test_browse_then_acquire(hosts):
    """acquire-mode not-acquired (L5529) and message.acquire (L5854): browsing leaves messages on the
    queue; acquire takes those still there and reports exactly which."""
    queue = name()

    async def scenario():
        conn = await Connection.connect(hosts)
        session = await conn.session()
        await session.queue_declare(queue)
        for body in (b"a", b"b", b"c"):
            await session.publish("", queue, body)
        browser = await session.subscribe(queue, destination="browse", acquire=False)
        seen = [await browser.get(timeout=5) for _ in range(3)]
        still = (await session.queue_query(queue)).message_count
        taken = await session.acquire(seen[:2])
        for message in taken:
            await message.accept()
        again = await session.acquire(seen[:1])  # already taken: nothing
        left = (await session.queue_query(queue)).message_count
        await conn.close()
        return [m.body for m in seen], still, [m.body for m in taken], again, left

    assert run(scenario()) == ([b"a", b"b", b"c"], 3, [b"a", b"b"], [], 1)


def test_blocking_wrapper(hosts):
    from raftmq.client.amqp010 import BlockingConnection

    queue = name()
    conn = BlockingConnection(hosts, timeout=10)
    session = conn.session()
    session.queue_declare(queue)
    session.publish("", queue, b"sync")
    message = session.subscribe(queue).get(timeout=5)
    message.accept()
    assert message.body == b"sync"
    conn.close()


def test_a_session_whose_brokers_are_gone_fails_its_commands_instead_of_waiting(fresh_node):
    """When no broker can be reached within ``reconnect_timeout``, the pending command and every
    later one fail with ClientError: nothing waits for a resume that will not come."""
    hosts = [f"{fresh_node.host}:{fresh_node.port}"]

    async def scenario():
        conn = await Connection.connect(hosts, reconnect_timeout=1.0)
        session = await conn.session()
        queue = name()
        await session.queue_declare(queue, auto_delete=False)
        await session.publish("", queue, b"before")
        fresh_node.kill9()
        pending = session.publish_nowait("", queue, b"during", sync=True)
        with pytest.raises(ClientError):
            await asyncio.wait_for(pending, 20)
        with pytest.raises(ClientError):
            await asyncio.wait_for(session.publish("", queue, b"after"), 5)
        assert conn.reconnects == 1

    run(scenario())


def test_waiting_for_the_broker_ends_when_the_connection_drops(fresh_node):
    """A resume waits for session.attached and the session's state with ``Connection.answer``: a
    node that dies meanwhile ends the wait at once (ConnectionLost), so the client moves on to the
    next node instead of waiting out the timeout."""
    hosts = [f"{fresh_node.host}:{fresh_node.port}"]

    async def scenario():
        conn = await Connection.connect(hosts, reconnect_timeout=60.0)
        never_answered = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(conn.answer(never_answered, timeout=25.0))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        fresh_node.kill9()
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(waiting, 10)  # well before the 25 s timeout

    run(scenario())


def test_a_frozen_node_is_left_after_stall_timeout_and_nothing_is_done_twice(fresh_node):
    """A node that stops answering (SIGSTOP: a frozen VM, a stalled disk, a network black hole)
    never closes the connection; with commands waiting and nothing heard for ``stall_timeout``
    the client leaves it and resumes its session once a node answers: the transfer in flight is
    stored once."""
    hosts = [f"{fresh_node.host}:{fresh_node.port}"]
    queue = name()

    async def scenario():
        loop = asyncio.get_running_loop()
        conn = await Connection.connect(hosts, stall_timeout=1.0)
        session = await conn.session(timeout=60)
        await session.queue_declare(queue, auto_delete=False)
        await session.publish("", queue, b"before")
        os.kill(fresh_node.pid, signal.SIGSTOP)
        try:
            during = session.publish_nowait("", queue, b"during", sync=True)
            deadline = loop.time() + 10
            while conn.stalls == 0 and loop.time() < deadline:
                await asyncio.sleep(0.1)
            assert conn.stalls == 1
        finally:
            os.kill(fresh_node.pid, signal.SIGCONT)
        await asyncio.wait_for(during, 30)
        subscription = await session.subscribe(queue, window=10)
        got = []
        while (message := await subscription.get(timeout=1.5)) is not None:
            got.append(message.body)
            await message.accept()
        await conn.close()
        return got

    assert run(scenario()) == [b"before", b"during"]
