"""A 0-9-1 client that pipelines behind a topology change, on a node with queue groups (issue 34).

Every method here goes in one write without waiting for the -ok of the declare, bind or delete before
it, over hand-built frames (pika's BlockingConnection cannot pipeline).  AMQP 0-9-1 general 4.7: a
channel's methods are received in the order sent; 4.6: a synchronous method's effects "MUST be visible
thereafter"; reference 1.7.2.1 / 1.6.2.1: with no-wait the client does not wait for the -ok at all.
So a publish or get behind queue.declare must find the queue -- though the node routes it from its
view of the metadata group, and the queue lives in a queue group that learns of it later
(node/amqp091/channel.py holds such commands until the change's reply came).  Before, the get behind
the declare was refused 404 and the publishes reached only the queue's stub in the metadata group.

One node with three groups (the ``groups_node`` fixture: the metadata group and two queue groups in
workers) per test: 0-9-1's scenarios on a channel each; then 0-10 and 1.0 (node/amqp010/session.py
holds a session's commands behind a change the same way; a 1.0 dynamic receiver's declare and
subscription go to the metadata group).
"""

from __future__ import annotations

import asyncio
import struct
import uuid

import pika
import pytest

from raftmq.client.amqp010 import Connection
from raftmq.client.amqp010 import c as codec
from tests.integration import rawamqp as r

EXCHANGE_DECLARE, EXCHANGE_DECLARE_OK = (40, 10), (40, 11)
QUEUE_BIND, QUEUE_BIND_OK = (50, 20), (50, 21)
QUEUE_DELETE, QUEUE_DELETE_OK = (50, 40), (50, 41)
TX_SELECT, TX_SELECT_OK, TX_COMMIT, TX_COMMIT_OK = (90, 10), (90, 11), (90, 20), (90, 21)
BASIC_DELIVER = (60, 60)
BASIC_NACK = (60, 120)
CONTENT = {r.BASIC_GET_OK, BASIC_DELIVER, r.BASIC_RETURN}
TIMEOUT = 30.0  # seconds for the answers of one scenario (a loaded machine, three processes)


def exchange_declare(channel: int, name: str, kind: str, no_wait: bool = False) -> bytes:
    # reserved-1, exchange, type, bits (passive, durable, auto-delete, internal, no-wait), arguments
    return r.method_frame(channel, EXCHANGE_DECLARE, struct.pack(">H", 0) + r.shortstr(name) + r.shortstr(kind)
                          + bytes((no_wait << 4,)) + r.table())


def queue_declare(channel: int, name: str, no_wait: bool = False) -> bytes:
    # reserved-1, queue, bits (passive, durable, exclusive, auto-delete, no-wait), arguments
    return r.method_frame(channel, r.QUEUE_DECLARE, struct.pack(">H", 0) + r.shortstr(name)
                          + bytes((no_wait << 4,)) + r.table())


def queue_bind(channel: int, queue: str, exchange: str, key: str, no_wait: bool = False) -> bytes:
    return r.method_frame(channel, QUEUE_BIND, struct.pack(">H", 0) + r.shortstr(queue) + r.shortstr(exchange)
                          + r.shortstr(key) + bytes((no_wait,)) + r.table())


def queue_delete(channel: int, queue: str) -> bytes:
    return r.method_frame(channel, QUEUE_DELETE, struct.pack(">H", 0) + r.shortstr(queue) + b"\x00")


def publish(channel: int, exchange: str, key: str, body: bytes, mandatory: bool = False) -> bytes:
    return (r.basic_publish(channel, exchange, key, mandatory=mandatory)
            + r.content_header_frame(channel, len(body)) + r.body_frame(channel, body))


def answers(c: r.RawClient, channel: int, until: tuple[int, int], count: int = 1) -> list[tuple]:
    """The methods the server sends on ``channel`` until the ``count``-th ``until`` (a content-bearing
    one with its body), as (method, body or payload)."""
    out: list[tuple] = []
    seen = 0
    while seen < count:
        f = c.read_method(TIMEOUT)
        if f.method == r.CONNECTION_CLOSE:
            raise AssertionError(f"connection closed: {r.Close.decode(f.payload)}")
        assert f.channel == channel, f"a frame on channel {f.channel}: {f}"
        if f.method == r.CHANNEL_CLOSE:
            raise AssertionError(f"channel closed: {r.Close.decode(f.payload)}")
        if f.method in CONTENT:
            header = c.read_frame(TIMEOUT)
            (size,) = struct.unpack_from(">Q", header.payload, 4)
            body = b""
            while len(body) < size:
                body += c.read_frame(TIMEOUT).payload
            out.append((f.method, body))
        else:
            out.append((f.method, f.payload))
        if f.method == until:
            seen += 1
    return out


def methods(events: list[tuple]) -> list[tuple[int, int]]:
    return [method for method, _ in events if method not in (r.BASIC_ACK,)]


def test_pipelined_behind_declares_binds_and_deletes(groups_node):
    """Each scenario in one write, on its own channel:

    1. confirm mode; queue.declare + publish + mandatory publish + two basic.get: declare-ok, both
       bodies by get-ok in order, both publishes acked, no basic.return, no nack;
    2. exchange.declare, queue.declare and queue.bind all no-wait + a mandatory publish through the
       exchange + basic.get: only the get-ok with the body (no -ok for no-wait methods, no return);
    3. a publish to the first queue, queue.delete, queue.declare of the same name, a mandatory publish
       + get: delete-ok counting the old message, the new queue holding the new message only;
    4. tx.select; queue.declare + publish + tx.commit + get: the committed message is got;
    5. queue.declare + basic.consume (no-ack) + publish: the consumer gets the message.
    """
    run = uuid.uuid4().hex[:8]
    with r.RawClient(groups_node.host, groups_node.port, timeout=TIMEOUT) as c:
        c.handshake()
        for channel in range(1, 6):
            c.open_channel(channel)

        q1 = f"pipe-{run}-1"
        c.send(r.method_frame(1, r.CONFIRM_SELECT, b"\x00"))
        c.expect_method(r.CONFIRM_SELECT_OK, 1)
        c.send(queue_declare(1, q1) + publish(1, "", q1, b"first") + publish(1, "", q1, b"second", mandatory=True)
               + r.basic_get(1, q1) + r.basic_get(1, q1))
        events = answers(c, 1, r.BASIC_GET_OK, 2)
        assert methods(events) == [r.QUEUE_DECLARE_OK, r.BASIC_GET_OK, r.BASIC_GET_OK], events
        assert [body for method, body in events if method == r.BASIC_GET_OK] == [b"first", b"second"]
        acked = [struct.unpack_from(">QB", payload, 4) for method, payload in events if method == r.BASIC_ACK]
        while not acked or acked[-1][0] < 2:  # both confirms, possibly after the get-oks
            f = c.read_method(TIMEOUT)
            assert f.method == r.BASIC_ACK, f
            acked.append(struct.unpack_from(">QB", f.payload, 4))
        assert acked[-1][0] == 2 and (len(acked) == 2 or acked[-1][1] == 1), acked

        q2, ex = f"pipe-{run}-2", f"pipe-{run}-x"
        c.send(exchange_declare(2, ex, "direct", no_wait=True) + queue_declare(2, q2, no_wait=True)
               + queue_bind(2, q2, ex, "k", no_wait=True) + publish(2, ex, "k", b"through the exchange", True)
               + r.basic_get(2, q2))
        assert answers(c, 2, r.BASIC_GET_OK) == [(r.BASIC_GET_OK, b"through the exchange")]

        c.send(publish(3, "", q1, b"old") + queue_delete(3, q1) + queue_declare(3, q1)
               + publish(3, "", q1, b"new", mandatory=True) + r.basic_get(3, q1) + r.basic_get(3, q1))
        events = answers(c, 3, (60, 72))  # the second get: basic.get-empty
        assert [method for method, _ in events] == [QUEUE_DELETE_OK, r.QUEUE_DECLARE_OK, r.BASIC_GET_OK, (60, 72)]
        assert struct.unpack_from(">I", events[0][1], 4) == (1,)  # delete-ok's message-count: "old"
        assert events[2][1] == b"new"

        q4 = f"pipe-{run}-4"
        c.send(r.method_frame(4, TX_SELECT))
        c.expect_method(TX_SELECT_OK, 4)
        c.send(queue_declare(4, q4) + publish(4, "", q4, b"committed") + r.method_frame(4, TX_COMMIT)
               + r.basic_get(4, q4))
        events = answers(c, 4, r.BASIC_GET_OK)
        assert [method for method, _ in events] == [r.QUEUE_DECLARE_OK, TX_COMMIT_OK, r.BASIC_GET_OK]
        assert events[2][1] == b"committed"

        q5 = f"pipe-{run}-5"
        c.send(queue_declare(5, q5) + r.basic_consume(5, q5, "pipe-consumer", no_ack=True)
               + publish(5, "", q5, b"consumed"))
        events = answers(c, 5, BASIC_DELIVER)
        assert [method for method, _ in events] == [r.QUEUE_DECLARE_OK, r.BASIC_CONSUME_OK, BASIC_DELIVER]
        assert events[2][1] == b"consumed"


def test_amqp010_transfer_behind_a_bind_and_amqp10_dynamic_receiver(groups_node):
    """0-10 and 1.0 on the same node with groups.

    0-10: a session sends exchange.declare, exchange.bind of a queue placed in queue group 2 (by a
    0-9-1 client) and a message.transfer through the exchange without waiting (0-10 spec 5.8:
    "the receiving peer MUST execute each command in order"): the transfer is
    completed and the message is in the queue (before, group 2 applied the transfer before the
    forwarded binding and it was routed nowhere, completed and lost).  Also queue.declare + a
    transfer to it, pipelined (a session's queue lives in the metadata group).

    1.0: a receiver with a dynamic source (1.0 spec 3.5.3: the node creates the queue), whose
    declare and subscription the front end sends back to back: a message a 1.0 sender sends to the
    returned address arrives.
    """
    proton = pytest.importorskip("proton")
    from proton.utils import BlockingConnection

    run = uuid.uuid4().hex[:8]
    setup = pika.BlockingConnection(pika.URLParameters(groups_node.url))
    try:
        ch = setup.channel()
        bound, declared, exchange = f"pipe10-{run}-b", f"pipe10-{run}-d", f"pipe10-{run}-x"
        ch.queue_declare(bound, arguments={"x-queue-group": 2})

        async def session_pipelines() -> None:
            client = await Connection.connect([f"127.0.0.1:{groups_node.port}"])
            session = await client.session(f"pipe-{run}".encode(), timeout=60)
            session.send(codec.ExchangeDeclare(exchange=exchange, type="direct"))
            session.send(codec.ExchangeBind(queue=bound, exchange=exchange, binding_key="k"))
            through = session.publish_nowait(exchange, "k", b"behind the bind", sync=True)
            session.send(codec.QueueDeclare(queue=declared))
            direct = session.publish_nowait("", declared, b"behind the declare", sync=True)
            await asyncio.wait_for(asyncio.gather(through, direct), TIMEOUT)
            await client.close()

        asyncio.run(asyncio.wait_for(session_pipelines(), 2 * TIMEOUT))
        assert ch.basic_get(bound, auto_ack=True)[2] == b"behind the bind"
        assert ch.basic_get(declared, auto_ack=True)[2] == b"behind the declare"
    finally:
        setup.close()

    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{groups_node.port}", timeout=TIMEOUT)
    try:
        receiver = amqp.create_receiver(None, dynamic=True)
        address = receiver.link.remote_source.address
        assert address
        amqp.create_sender(address).send(proton.Message(body="to the dynamic queue"))
        assert receiver.receive(timeout=TIMEOUT).body == "to the dynamic queue"
        receiver.accept()
    finally:
        amqp.close()
