"""The outputs of apply have the layout their types in store/core/commands.py declare (issue 33).

The front ends unpack outputs by position (node/broker.py dispatches on ``out[1]`` and hands
``out[2:]`` on) and tell a delivery with its body from one without by its length, so these tests pin
each kind's arity, kind and fields as the machine builds them, and the body that fill_bodies
appends (store/disk/bodies.py).  The checker verifies the same types statically; this verifies
that the values at run time agree with them.
"""

from __future__ import annotations

import typing

from raftmq.store.core.commands import (
    OK,
    OUT_CANCEL,
    OUT_CLOSE,
    OUT_DELIVER,
    OUT_REPLY,
    OUT_SESSION_DETACHED,
    OUT_TRANSFER,
    OUT_VHOST_CLOSED,
    ChannelOpen,
    Consume,
    Delivered,
    DeliveredWithBody,
    NodeReset,
    Ok,
    Op,
    OutCancel,
    OutClose,
    OutDeliver,
    OutReply,
    OutSessionDetached,
    OutTransfer,
    OutVhostClosed,
    Publish,
    QueueDeclare,
    QueueDelete,
    Transferred,
    TransferredWithBody,
    VhostAdd,
    VhostDelete,
)
from raftmq.store.core.machine import StateMachine
from raftmq.store.core.model import Message
from raftmq.store.disk.bodies import DictBodies, fill_bodies
from tests.unit.store.test_sessions import attach, machine_with_queue

NOW = 1_700_000_000_000_000
C = "n1.boot.1"


def _arity(alias: object) -> int:
    """The number of items of a typed tuple alias."""
    return len(typing.get_args(alias))


def _machine() -> StateMachine:
    """A vhost, connection C's channel 1 and a queue ``q``."""
    m = StateMachine()
    _apply(m, VhostAdd(None, None, "/"), ChannelOpen(C, None, 1),
           QueueDeclare(C, None, 1, "/", "q", False, False, False, False, {}))
    return m


def _apply(m: StateMachine, *commands) -> list:
    """Apply, then give the outputs their bodies as the node does (bodies kept in a dict)."""
    effects = m.apply(NOW, list(commands))
    bodies = DictBodies()
    bodies.put(effects.body_puts)
    fill_bodies(effects.outputs, bodies)
    return effects.outputs


def test_reply_and_delivery_before_and_after_fill_bodies():
    """A confirmed publish to a queue with a consumer: the reply is (conn, OUT_REPLY, token, Ok,
    channel) and the delivery (conn, OUT_DELIVER, channel, tag, (qid, seq, redelivered, Message)) as
    apply leaves it; fill_bodies makes the delivery (..., Message, body), the arities of OutReply,
    OutDeliver, Delivered and DeliveredWithBody."""
    m = _machine()
    _apply(m, Consume(C, None, 1, "/", "q", "ctag", False, False, {}))
    effects = m.apply(NOW, [Publish(C, 7, 1, "/", "", "q", False, b"\x00\x00", b"hello", False, 0, None)])
    reply = next(o for o in effects.outputs if o[1] == OUT_REPLY)
    deliver = next(o for o in effects.outputs if o[1] == OUT_DELIVER)
    assert len(reply) == _arity(OutReply) and reply[0] == C and reply[2] == 7 and reply[4] == 1
    assert reply[3].__class__ is Ok and reply[3][0] == OK
    assert len(deliver) == _arity(OutDeliver) and deliver[0] == C and deliver[2:4] == (1, "ctag")
    delivery = deliver[4]
    assert len(delivery) == _arity(Delivered)
    qid, seq, redelivered, message = delivery
    assert qid == m.vhosts["/"].queues["q"].qid and redelivered is False and message.__class__ is Message
    bodies = DictBodies()
    bodies.put(effects.body_puts)
    fill_bodies(effects.outputs, bodies)
    filled = next(o for o in effects.outputs if o[1] == OUT_DELIVER)[4]
    assert len(filled) == _arity(DeliveredWithBody) and filled[:4] == delivery and filled[4] == b"hello"


def test_cancel_close_and_vhost_closed_are_named_records():
    """The rare kinds are NamedTuples with the fields commands.py names: a consumer cancelled by its
    queue's delete (OutCancel), a connection of a node declared down (OutClose), a deleted vhost
    (OutVhostClosed, addressed to no connection)."""
    m = _machine()
    _apply(m, Consume(C, None, 1, "/", "q", "ctag", False, False, {}))
    outputs = _apply(m, QueueDelete(C, None, 1, "/", "q", False, False))
    cancel = next(o for o in outputs if o[1] == OUT_CANCEL)
    assert cancel.__class__ is OutCancel and (cancel.conn, cancel.channel, cancel.consumer_tag) == (C, 1, "ctag")
    outputs = _apply(m, NodeReset(None, None, "n1", None))
    close = next(o for o in outputs if o[1] == OUT_CLOSE)
    assert close.__class__ is OutClose and close.conn == C and close.reply_code == 320
    assert close.reply_text.startswith("CONNECTION_FORCED")
    outputs = _apply(m, VhostDelete(None, 1, "/"))
    closed = next(o for o in outputs if o[1] == OUT_VHOST_CLOSED)
    assert closed.__class__ is OutVhostClosed and closed.conn is None and closed.vhost == "/"
    assert closed.reply_code == 320


def test_transfer_and_session_detached():
    """0-10: a transfer is (conn, OUT_TRANSFER, channel, destination, (transfer_id, qid, seq,
    redelivered, Message[, body])) -- the test client fills the body in -- and a session taken over by
    another connection answers the old one with OutSessionDetached (session.attach force,
    shared/specs/amqp-0-10.txt L4490, and the forced attach of L1447ff)."""
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.command(Op.QUEUE_DECLARE, "/", "q", False, True, False, False, {})
    a.command(Op.PUBLISH, "/", "", "q", False, b"\x00\x00", b"m0", True, 0, None)
    a.command(Op.MESSAGE_SUBSCRIBE, "/", "q", "dest", False, False, {})
    a.command(Op.MESSAGE_FLOW, "dest", 0, 1)
    a.command(Op.MESSAGE_FLOW, "dest", 1, 0xFFFFFFFF)
    [transfer] = a.transfers()
    assert len(transfer) == _arity(OutTransfer) and transfer[1] == OUT_TRANSFER
    assert transfer[0] == "n1.x.1" and transfer[3] == "dest"
    assert len(transfer[4]) == _arity(TransferredWithBody) and transfer[4][5] == b"m0"
    assert transfer[4][0] == 0 and transfer[4][4].__class__ is Message
    assert _arity(TransferredWithBody) == _arity(Transferred) + 1
    b, _ = attach(m, "n2.y.1", force=True)
    detached = next(o for o in b.outputs if o[1] == OUT_SESSION_DETACHED)
    assert detached.__class__ is OutSessionDetached and detached.conn == "n1.x.1" and detached.name == b"session-1"
