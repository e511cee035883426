"""node/amqp091/autoack.py: the credit slices a 0-9-1 channel gives the core for an auto-ack consumer."""

from __future__ import annotations

from raftmq.node.amqp091.autoack import MIN_SLICE, AutoAckCredit

MB = 1 << 20


def test_large_messages_keep_the_smallest_slice_and_no_top_up_while_nothing_is_written() -> None:
    """1 MiB messages with a 1 MiB write_buffer_high: the slice stays MIN_SLICE (4), the first top-up
    comes once half of it was written, and the core is never more than 4 ahead of what was written."""
    credit = AutoAckCredit(most=256, high=MB)
    assert credit.granted == MIN_SLICE
    assert credit.wrote(MB) == 0  # 3 still ahead of the socket
    assert credit.wrote(MB) == 2  # 2 ahead: topped up to 4 ahead
    assert credit.granted - credit.written == MIN_SLICE
    for _ in range(20):
        credit.wrote(MB)
        assert credit.granted - credit.written <= MIN_SLICE


def test_small_messages_grow_the_slice_to_the_configured_most() -> None:
    """256-octet messages: the slice grows to ``most`` (write_buffer_high / 256 is larger), topped up
    each time a quarter of it was written, so a fast reader costs one top-up per quarter slice."""
    credit = AutoAckCredit(most=256, high=MB)
    grants = [credit.wrote(256) for _ in range(1000)]
    assert 192 <= credit.granted - credit.written <= 256
    assert sum(1 for g in grants if g) <= 1000 // 64 + 2


def test_larger_messages_shrink_the_slice_and_small_ones_widen_it_again() -> None:
    """After small messages, large ones bring no top-up until the core is within the smaller slice of the
    socket; later small ones widen it again (the size halves towards them at each top-up)."""
    credit = AutoAckCredit(most=256, high=MB)
    for _ in range(300):
        credit.wrote(256)
    grants = [credit.wrote(MB // 4) for _ in range(300)]
    assert credit.granted - credit.written <= 256
    assert credit.slice() == MIN_SLICE
    assert sum(grants) < 300  # fewer granted than written while the slice was shrinking
    for _ in range(1000):
        credit.wrote(100)
    assert credit.slice() == 256


async def _consumer_credit(slice_setting: int) -> tuple[int | None, int, int]:
    """In process (node/broker.Broker, no sockets): 300 x 64 B queued, an auto-ack consumer whose
    transport is paused (its client does not read) from the start; the core consumer's credit, the
    deliveries the core assigned, and the messages left queued."""
    import asyncio
    import shutil
    import tempfile

    from raftmq.node.amqp091.connection import Amqp091Connection
    from raftmq.node.broker import Broker
    from raftmq.ops.config import Config
    from tests.integration import rawamqp as raw
    from tests.support.transport import RecordingTransport

    async def settle() -> None:
        for _ in range(2000):
            await asyncio.sleep(0.001)
            if broker.log.idle:
                return

    async def connection(product: str) -> tuple[Amqp091Connection, RecordingTransport]:
        transport = RecordingTransport()
        conn = Amqp091Connection(broker, transport)
        conn.start(b"")
        for frame in raw.opening_frames("q", product=product):
            conn.data_received(frame)
            for _ in range(2000):  # start-ok's password is checked in the login pool
                if not conn.checking_login:
                    break
                await asyncio.sleep(0.001)
            await settle()
        return conn, transport

    data_dir = tempfile.mkdtemp(prefix="raftmq-autoack-")
    broker = Broker(Config(data_dir=data_dir, port=0, autoack_slice=slice_setting))
    await broker.start()
    try:
        await settle()
        publisher, _ = await connection("publisher")
        body = b"x" * 64
        publisher.data_received((raw.basic_publish(1, "", "q") + raw.content_header_frame(1, len(body))
                                 + raw.body_frame(1, body)) * 300)
        await settle()
        consumer, _ = await connection("consumer")
        consumer.pause_writing()  # the client's socket is full from the start
        consumer.data_received(raw.basic_consume(1, "q", "c", no_ack=True))
        await settle()
        queue = broker.machine.vhosts["/"].queues["q"]
        core = broker.machine.channels[consumer.conn_id][1].consumers["c"]
        return core.credit_messages, broker.machine.stats["delivered"], len(queue.ready)
    finally:
        await broker.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_consumer_whose_socket_is_full_is_assigned_one_slice_and_0_turns_it_off() -> None:
    """With autoack_slice 256, a paused consumer is assigned the first slice (MIN_SLICE) and no
    more, the core holding no credit for it; with autoack_slice = 0 (rolling upgrades) the node gives no
    credit and the whole backlog is assigned as before."""
    import asyncio

    credit, delivered, left = asyncio.run(_consumer_credit(256))
    assert (credit, delivered, left) == (0, MIN_SLICE, 300 - MIN_SLICE)
    credit, delivered, left = asyncio.run(_consumer_credit(0))
    assert (credit, delivered, left) == (None, 300, 0)
