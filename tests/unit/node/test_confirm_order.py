"""Publisher confirms of one 0-9-1 channel when outcomes arrive out of order (issue 34: with queue
groups a publish is confirmed when its groups applied it, so a publish to a busy group can come
back after a later one to another group).  node/amqp091/channel.py ``flush_confirms``.

Checked: the frames a channel writes never ack (singly or through multiple=true) a publish whose
outcome has not arrived; every publish is answered exactly once; confirms are sent in publish order;
in order (one group) a run of acks is still one basic.ack with multiple=true.  AMQP 0-9-1 confirms
are RabbitMQ's extension (https://www.rabbitmq.com/docs/confirms): basic.ack with ``multiple``
confirms every tag up to and including ``delivery-tag`` (reference 1.8.3.13 for the fields).
"""

from __future__ import annotations

import struct

from raftmq.node.amqp091.channel import Channel
from raftmq.protocol.amqp091 import methods as m


class _Conn:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.frames.append(data)


def _channel() -> tuple[Channel, _Conn]:
    ch = Channel.__new__(Channel)  # only the confirm state: flush_confirms needs nothing else
    conn = _Conn()
    ch.conn = conn  # type: ignore[assignment]  # a recorder in place of the connection (write only)
    ch.number = 1
    ch._confirms = []
    ch._confirms_held = {}
    ch._answered_through = 0
    return ch, conn


def _decoded(conn: _Conn) -> list[tuple[str, int, bool]]:
    out = []
    for frame in conn.frames:
        (size,) = struct.unpack_from(">I", frame, 3)
        method = m.decode_method(frame[7:7 + size])
        out.append((type(method).__name__, method.delivery_tag, bool(method.multiple)))
    conn.frames.clear()
    return out


def _settled(sent: list[tuple[str, int, bool]], answered: set[int], seen: set[int]) -> None:
    """Apply the frames as a client does, checking that none covers a publish not yet answered."""
    for name, tag, multiple in sent:
        covered = {t for t in range(1, tag + 1) if t not in seen} if multiple else {tag}
        assert covered <= answered, (name, tag, multiple, sorted(covered - answered))
        assert tag not in seen, ("answered twice", tag)
        seen |= covered


def test_in_order_a_run_of_acks_is_one_multiple_ack():
    ch, conn = _channel()
    ch._confirms.extend([(1, True), (2, True), (3, True), (4, False), (5, True)])
    ch.flush_confirms()
    assert _decoded(conn) == [("BasicAck", 3, True), ("BasicNack", 4, False), ("BasicAck", 5, False)]


def test_outcomes_out_of_order_are_held_until_the_earlier_ones_came():
    ch, conn = _channel()
    answered: set[int] = set()
    seen: set[int] = set()
    batches = [[(1, True), (2, True), (5, True), (6, False), (3, True)],  # 4 still to come
               [(8, True), (9, True)],  # 4 and 7 still to come
               [(4, True)],  # releases 4, 5, 6
               [(7, True), (10, True)]]  # releases 7..10
    for batch in batches:
        answered |= {seq for seq, _ in batch}
        ch._confirms.extend(batch)
        ch.flush_confirms()
        sent = _decoded(conn)
        _settled(sent, answered, seen)
        tags = [tag for _name, tag, _multiple in sent]
        assert tags == sorted(tags)  # in publish order
    assert seen == set(range(1, 11))
    assert ch._confirms_held == {} and ch._answered_through == 10
