"""The modified outcome's message-annotations in the state machine (AMQP 1.0 3.4.5; store/core/modify.py):
merged into the requeued message of this queue only, and into the dead-letter copy on discard;
deterministic (the same bytes from the log on every replica); the ordinary settle unchanged."""

from __future__ import annotations

import raftmq.node.core.formats  # noqa: F401 - registers the property codecs the core reads through
from raftmq.store.applier import StoredMachine
from raftmq.store.core import message as fmt
from raftmq.store.core.commands import (
    OUT_REPLY,
    OUT_TRANSFER,
    MessageModify,
    Op,
    VhostAdd,
    decode_batch,
    encode_batch,
    make,
)
from raftmq.store.core.modify import annotated
from raftmq.store.core.sessions import SETTLE_REJECT, SETTLE_RELEASE, SETTLE_RELEASE_REDELIVERED, UNLIMITED

NOW = 1_700_000_000_000_000
ANNS = {"x-opt-reason": "busy", "x-opt-count": 3, "not-x": "dropped"}


class Link:
    """A 1.0 receiving link as node/amqp10/links.py drives the core: a core session of its own, a
    subscription, credit, then settlements submitted straight on its channel."""

    def __init__(self, m: StoredMachine, conn: str, queue: str, credit: int = UNLIMITED) -> None:
        self.m, self.conn, self.token, self.outputs = m, conn, 0, []
        self.call(Op.SESSION_ATTACH, "/", "guest", conn.encode(), False)
        self.call(Op.MESSAGE_SUBSCRIBE, "/", queue, "d", False, False, {})
        self.call(Op.MESSAGE_FLOW, "d", 0, credit)
        self.call(Op.MESSAGE_FLOW, "d", 1, UNLIMITED)

    def call(self, op, *args):
        self.token += 1
        out = self.m.apply_batch(NOW, [make(op, self.conn, self.token, 1, *args)])
        self.outputs += out
        return next(o[3] for o in out if o[1] == OUT_REPLY and o[2] == self.token)

    def transfers(self) -> list:
        return [o[4] for o in self.outputs if o[1] == OUT_TRANSFER]


def setup(queues=("q",), dlx: bool = False) -> StoredMachine:
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    c = "n1.admin.1"
    m.apply_batch(NOW, [make(Op.CHANNEL_OPEN, c, None, 1)])
    m.apply_batch(NOW, [make(Op.EXCHANGE_DECLARE, c, None, 1, "/", "dlx", "fanout", False, False, False, False, {})])
    m.apply_batch(NOW, [make(Op.QUEUE_DECLARE, c, None, 1, "/", "dead", False, False, False, False, {})])
    m.apply_batch(NOW, [make(Op.QUEUE_BIND, c, None, 1, "/", "dead", "dlx", "", {})])
    m.apply_batch(NOW, [make(Op.EXCHANGE_DECLARE, c, None, 1, "/", "fan", "fanout", False, False, False, False, {})])
    for name in queues:
        args = {"x-dead-letter-exchange": "dlx"} if dlx else {}
        m.apply_batch(NOW, [make(Op.QUEUE_DECLARE, c, None, 1, "/", name, False, False, False, False, args)])
        m.apply_batch(NOW, [make(Op.QUEUE_BIND, c, None, 1, "/", name, "fan", "", {})])
    m.apply_batch(NOW, [make(Op.PUBLISH, c, None, 1, "/", "fan", "", False, b"\x00\x00", b"body", False, 0, None)])
    return m


def headers(message) -> dict:
    return fmt.codec(message.format).decode(message.properties).headers or {}


def test_requeue_merges_the_annotations_into_this_queues_copy_only():
    """3.4.5 message-annotations: "merged with the existing annotations"; the message was routed to two
    queues (fanout): the other queue's copy is untouched, the requeued one is at the head again."""
    m = setup(("q", "other"))
    link = Link(m, "n1.c.1", "q", credit=1)
    transfer_id = link.transfers()[0][0]
    link.call(Op.MESSAGE_MODIFY, [[transfer_id, transfer_id]], SETTLE_RELEASE_REDELIVERED, ANNS)
    q, other = m.vhosts["/"].queues["q"], m.vhosts["/"].queues["other"]
    entry = q.ready.peek()
    requeued = entry.message
    assert headers(requeued) == {"x-opt-reason": "busy", "x-opt-count": 3}  # only x- keys (3.2.10)
    assert entry.delivery_count == 1  # delivery-failed: counted, as a modified without annotations
    untouched = other.ready.peek().message
    assert headers(untouched) == {} and untouched.id != requeued.id
    assert untouched.live == 1 and requeued.live == 1  # each queue holds its own message now
    assert m.message_bytes == 2 * len(b"body")


def test_release_without_delivery_failed_does_not_count_and_redelivers_the_annotated_copy():
    m = setup()
    link = Link(m, "n1.c.1", "q")
    first = link.transfers()[0]
    link.call(Op.MESSAGE_MODIFY, [[first[0], first[0]]], SETTLE_RELEASE, {"x-opt-a": "1"})
    again = link.transfers()[-1]  # unlimited credit: delivered again at once
    assert again[0] != first[0] and headers(again[4]) == {"x-opt-a": "1"}
    assert again[3] is False  # released without delivery-failed: not counted as a redelivery
    assert m.vhosts["/"].queues["q"].unacked_count == 1


def test_discard_dead_letters_with_the_annotations():
    """modified undeliverable-here: dead-lettered (reason rejected) with the annotations merged, as
    RabbitMQ 4's quorum queues do; the original leaves its queue."""
    m = setup(dlx=True)
    link = Link(m, "n1.c.1", "q")
    transfer_id = link.transfers()[0][0]
    link.call(Op.MESSAGE_MODIFY, [[transfer_id, transfer_id]], SETTLE_REJECT, {"x-opt-why": "poison"})
    vhost = m.vhosts["/"]
    assert len(vhost.queues["q"].ready) == 0 and vhost.queues["q"].unacked_count == 0
    dead = vhost.queues["dead"].ready.peek().message
    h = headers(dead)
    assert h["x-opt-why"] == "poison" and h["x-first-death-reason"] == "rejected"


def test_the_command_survives_the_log_and_applies_alike():
    """Deterministic: the command decoded from a log batch gives the same message bytes as the one
    the proposer built (plain values only), on two machines."""
    command = MessageModify("n1.c.1", 5, 1, [[0, 0]], SETTLE_RELEASE, {"x-opt-l": [1, "a", b"b", {"k": 2.5}]})
    decoded = decode_batch(encode_batch([command]))[0]
    assert decoded == command and decoded.__class__ is MessageModify
    results = []
    for cmd in (command, decoded):
        m = setup()
        link = Link(m, "n1.c.1", "q", credit=1)
        m.apply_batch(NOW, [cmd._replace(token=None)])
        results.append(m.vhosts["/"].queues["q"].ready.peek().message.properties)
        assert link.transfers()
    assert results[0] == results[1] and headers_of(results[0])["x-opt-l"][0] == 1


def headers_of(props: bytes) -> dict:
    return fmt.codec(fmt.AMQP091).decode(props).headers or {}


def test_annotated_keeps_undecodable_properties():
    m = setup()
    message = m.vhosts["/"].queues["q"].ready.peek().message
    assert annotated(message, {}) is message.properties
    assert annotated(message, {"no-x": 1}) is message.properties
    message.properties = b"\xff\xff\xff"
    assert annotated(message, {"x-opt-a": 1}) == b"\xff\xff\xff"


def test_a_durable_requeued_copy_survives_a_restart_with_its_body(tmp_path):
    """Single node (LMDB): the entry's record points to the annotated copy, whose record has the body
    (the node stores it again under the copy's id); the original's record is gone with its last holder."""
    from raftmq.store.disk.durable import DurableStore

    path = str(tmp_path / "lmdb")
    store = DurableStore(path)
    m = StoredMachine(store)
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    c = "n1.admin.1"
    m.apply_batch(NOW, [make(Op.CHANNEL_OPEN, c, None, 1)])
    m.apply_batch(NOW, [make(Op.QUEUE_DECLARE, c, None, 1, "/", "q", False, True, False, False, {})])
    m.apply_batch(NOW, [make(Op.PUBLISH, c, None, 1, "/", "", "q", False, b"\x00\x00", b"kept", True, 0, None)])
    original = m.vhosts["/"].queues["q"].ready.peek().message.id
    link = Link(m, "n1.c.1", "q", credit=1)
    transfer_id = link.transfers()[0][0]
    link.call(Op.MESSAGE_MODIFY, [[transfer_id, transfer_id]], SETTLE_RELEASE, {"x-opt-k": "v"})
    store.close()

    again = StoredMachine(DurableStore(path))
    entry = again.vhosts["/"].queues["q"].ready.peek()
    assert entry.message.id != original and headers(entry.message) == {"x-opt-k": "v"}
    assert again.own_bodies.get(entry.message.id) == b"kept"
    assert len(again.vhosts["/"].queues["q"].ready) == 1
