"""AMQP 1.0 links and 0-10 sessions on queues of queue groups (issue 34), one node with 3 groups.

Sessions are replicated in every group and each group executes its part of a session's commands
(store/core/group_sessions.py, docs/design.md "Sessions and links with queue groups"): these tests
place queues with ``x-queue-group`` in the two queue groups (1 and 2, each a worker process) and
check, with real clients over real sockets, that:

- a 1.0 receiver on a queue of group 1 gets what 0-9-1 and 1.0 publishers sent, and its outcomes
  (1.0 spec 3.4.2 accepted, 3.4.3 rejected -> dead-lettered to a queue of group 2, 3.4.4 released)
  reach the queue's group; a 1.0 sender's delivery is settled accepted once stored (2.6.12);
- a 0-10 message.subscribe on a queue of group 2 gets what 0-10, 0-9-1 and 1.0 publishers sent;
  0-10 message.transfer completes once stored in the queue's group (0-10 spec message.accept-mode,
  message.accept L5752ff, message.release); a 0-10 publish reaches a 0-9-1 consumer of group 1;
- a 0-10 session whose transport is cut several times while it publishes to a fanout over both
  queue groups and consumes from both (two subscriptions of one session in two groups) resumes
  (0-10 spec 3.5.4 replay, 3.6.2 re-attaching to an existing session): every message exactly once
  per queue, in order.

Every wait is bounded; the node is started once per test (3 processes).
"""

from __future__ import annotations

import asyncio

import pika
import pytest

from raftmq.client.amqp010 import Connection
from tests.integration.helpers import uniq, wait_until
from tests.support.groups import channel, group_status

proton = pytest.importorskip("proton")
from proton import Delivery, Message  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

TIMEOUT = 10


@pytest.fixture
def node(groups_node):
    return groups_node


def declare(ch, group: int, **arguments) -> str:
    name = uniq(f"g{group}")
    ch.queue_declare(name, durable=True, arguments={"x-queue-group": group, **arguments})
    return name


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_amqp10_receiver_and_outcomes_on_a_queue_of_a_queue_group(node):
    """1.0 receiver on a queue of group 1 (2.6.12, 3.4): three 0-9-1 confirmed publishes and three
    1.0 deliveries, each settled ``accepted`` (3.4.2: stored in group 1); the receiver accepts,
    rejects one (3.4.3: dead-lettered into the queue of group 2, with its x-death), releases one
    (3.4.4: it comes back, redelivered); at the end the queue of group 1 is empty and group 2's
    holds the rejected message alone."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    dlq = declare(ch, 2)
    queue = declare(ch, 1, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    for i in range(3):
        ch.basic_publish("", queue, b"p%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=TIMEOUT)
    try:
        sender = amqp.create_sender(f"/queues/{queue}")
        for i in range(3):
            assert sender.send(Message(body=f"s{i}")).remote_state == Delivery.ACCEPTED
        assert count(ch, queue) == 6
        receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
        got: list[str] = []
        outcomes = {"p1": "reject", "p2": "release"}
        while len(got) < 7:
            message = receiver.receive(timeout=TIMEOUT)
            body = message.body if isinstance(message.body, str) else bytes(message.body).decode()
            seen_before = body in got
            got.append(body)
            outcome = "accept" if seen_before else outcomes.get(body, "accept")
            if outcome == "reject":
                receiver.reject()
            elif outcome == "release":
                receiver.release(delivered=True)
            else:
                receiver.accept()
        assert sorted(got) == sorted(["p0", "p1", "p2", "p2", "s0", "s1", "s2"])
        assert got.count("p2") == 2  # released, then delivered again
        wait_until(lambda: count(ch, queue) == 0 and count(ch, dlq) == 1, what="settlements applied in group 1")
        _method, props, body = ch.basic_get(dlq, auto_ack=True)
        assert body == b"p1" and props.headers["x-death"][0]["queue"] == queue
    finally:
        amqp.close()
        conn.close()


def test_amqp010_subscription_and_transfers_on_queues_of_queue_groups(node):
    """0-10 message.subscribe on a queue of group 2 (accept-mode explicit): ten 0-10 transfers
    (each completed only once stored: the client's publish returns at completion), five 0-9-1 and
    five 1.0 publishes all reach it; one is released (message.release) and comes back redelivered;
    the rest are accepted (message.accept) and the queue is empty.  A 0-10 transfer to a queue of
    group 1 is there for a 0-9-1 basic.get at once after its completion."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    queue = declare(ch, 2)
    other = declare(ch, 1)
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=TIMEOUT)
    hosts = [f"127.0.0.1:{node.port}"]

    async def scenario() -> list[tuple[bytes, bool]]:
        client = await Connection.connect(hosts)
        session = await client.session(uniq("s010").encode(), timeout=60)
        for i in range(10):
            await session.publish("", queue, b"t%d" % i)
        await session.publish("", other, b"to-group-1")
        assert ch.basic_get(other, auto_ack=True)[2] == b"to-group-1"
        for i in range(5):
            ch.basic_publish("", queue, b"p%d" % i, mandatory=True)
        sender = amqp.create_sender(f"/queues/{queue}")
        for i in range(5):
            assert sender.send(Message(body=b"a%d" % i, inferred=True)).remote_state == Delivery.ACCEPTED
        subscription = await session.subscribe(queue, window=5)
        got: list[tuple[bytes, bool]] = []
        released = False
        while len(got) < 21:
            message = await subscription.get(timeout=TIMEOUT)
            assert message is not None, f"stalled after {got}"
            got.append((message.body, message.redelivered))
            if message.body == b"t3" and not released:
                released = True
                await message.release()
            else:
                await message.accept()
        assert await subscription.get(timeout=1) is None  # nothing more: no duplicate
        await client.close()
        return got

    try:
        got = run(scenario())
        bodies = [body for body, _ in got]
        expected = [b"t%d" % i for i in range(10)] + [b"p%d" % i for i in range(5)] + [b"a%d" % i for i in range(5)]
        assert sorted(bodies) == sorted(expected + [b"t3"])
        assert [redelivered for body, redelivered in got if body == b"t3"] == [False, True]
        wait_until(lambda: count(ch, queue) == 0, what="the accepts applied in group 2")
    finally:
        amqp.close()
        conn.close()



def test_amqp010_queue_declare_places_a_queue_with_x_queue_group(node):
    """A 0-10 queue.declare may name the queue's group (x-queue-group, docs/design.md "Sessions and
    links with queue groups"): it was refused as unknown-argument (queue.declare L7791ff) though
    the placement reads it.  The queue is in group 2: twenty confirmed 0-9-1 publishes to it are
    applied there (group 2's commands_applied moves by them, group 1's does not) and the session's
    subscription gets them."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    queue = uniq("q010g2")
    hosts = [f"127.0.0.1:{node.port}"]

    def applied() -> dict[int, int]:
        return {g: group_status(node, g)["commands_applied"] for g in (1, 2)}

    async def scenario() -> list[bytes]:
        client = await Connection.connect(hosts)
        session = await client.session(uniq("s010").encode(), timeout=60)
        await session.queue_declare(queue, durable=True, arguments={"x-queue-group": 2})
        before = applied()
        for i in range(20):
            ch.basic_publish("", queue, b"m%d" % i, mandatory=True)
        wait_until(lambda: applied()[2] >= before[2] + 20, what="the publishes applied in group 2")
        assert applied()[1] < before[1] + 20
        subscription = await session.subscribe(queue, window=20)
        got = []
        for _ in range(20):
            message = await subscription.get(timeout=TIMEOUT)
            assert message is not None, f"stalled after {got}"
            got.append(message.body)
            await message.accept()
        await client.close()
        return got

    try:
        assert run(scenario()) == [b"m%d" % i for i in range(20)]
    finally:
        conn.close()

N = 60


def test_amqp010_session_resume_across_two_queue_groups_no_loss_no_duplicate(node):
    """0-10 spec 3.5.4 / 3.6.2: one session publishes N transfers to a fanout bound to a queue of
    group 1 and one of group 2 (each transfer stored by both groups), while a second session
    consumes both queues (two subscriptions of one session, their transfers numbered by two
    groups).  The client's transport is cut three times with commands in flight; each time the
    client re-attaches with force, learns what the broker completed (the groups' barriers
    intersected), replays the rest, and drops transfers it had (its own barrier).  Each queue
    yields 0..N-1 exactly once, in order, and nothing more; both end empty."""
    conn, ch = channel(node)
    qa, qb = declare(ch, 1), declare(ch, 2)
    fanout = uniq("fan")
    ch.exchange_declare(fanout, "fanout", durable=True)
    ch.queue_bind(qa, fanout)
    ch.queue_bind(qb, fanout)
    hosts = [f"127.0.0.1:{node.port}"]

    async def scenario() -> tuple[dict[str, list[int]], int]:
        client = await Connection.connect(hosts)
        producer = await client.session(uniq("prod").encode(), timeout=60)
        consumer = await client.session(uniq("cons").encode(), timeout=60)
        subs = {qa: await consumer.subscribe(qa, window=10), qb: await consumer.subscribe(qb, window=10)}
        got: dict[str, list[int]] = {qa: [], qb: []}

        async def consume() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 45
            while any(len(v) < N for v in got.values()) and loop.time() < deadline:
                for queue, sub in subs.items():
                    message = await sub.get(timeout=0.05)
                    if message is not None:
                        got[queue].append(int(message.body))
                        await message.accept()

        consuming = asyncio.ensure_future(consume())
        for batch in range(3):
            futures = [producer.publish_nowait(fanout, "", b"%d" % (batch * 20 + i), sync=(i % 5 == 4))
                       for i in range(20)]
            await asyncio.wait_for(asyncio.gather(*futures[:5]), 30)  # completed; the rest in flight
            client._drop_transport()
            await asyncio.wait_for(asyncio.gather(*futures), 30)
            # Both sessions resumed before the next cut: a command on each completes (a queue.query's
            # execution.result comes from the queue's group, numbered there).
            assert (await consumer.queue_query(qa)).queue == qa
            await producer.queue_query(qb)
        await asyncio.wait_for(consuming, 50)
        for queue, sub in subs.items():  # anything more would be a duplicate
            extra = await sub.get(timeout=1)
            if extra is not None:
                got[queue].append(int(extra.body))
        reconnects = client.reconnects
        await client.close()
        return got, reconnects

    try:
        got, reconnects = run(scenario(), timeout=120)
        assert reconnects == 3
        assert got[qa] == list(range(N)) and got[qb] == list(range(N))
        wait_until(lambda: count(ch, qa) == 0 and count(ch, qb) == 0, what="every accept applied")
    finally:
        conn.close()
