"""AMQP 1.0 local transactions (spec part 4) with a real client: python-qpid-proton 0.40's own
transaction API (``Container.declare_transaction``, ``Transaction.send/accept/commit/abort``) on a
BlockingConnection, against real raftmq processes.  Queues are declared and counted with pika (0-9-1).

Section numbers cite /work/shared/specs/amqp-1-0.txt: 4.2 declaring, 4.3 discharging, 4.4.1
transactional posting, 4.4.2 transactional retirement, 4.4.3 acquisition, 4.5.1 coordinator, 4.5.8
transaction errors.  Every wait is bounded.
"""

from __future__ import annotations

import pika
import pytest

proton = pytest.importorskip("proton")
from proton import Delivery, Message, Terminus, symbol  # noqa: E402
from proton.handlers import TransactionHandler  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

from raftmq.ops.local.node import RaftmqNode  # noqa: E402
from tests.integration.helpers import pika_params, uniq, wait_until  # noqa: E402

TIMEOUT = 10
TRANSACTIONAL_STATE = 0x34  # 4.5.6: proton reports a delivery's remote state by its descriptor


@pytest.fixture(autouse=True)
def _raftmq_only(broker) -> None:
    if broker.kind != "raftmq":
        pytest.skip("RabbitMQ 3.10's 1.0 plugin is not enabled in the reference peer (and has no transactions)")


class TxEvents(TransactionHandler):
    """What proton tells the application about one transaction."""

    def __init__(self) -> None:
        self.outcome: str | None = None  # declared / declare_failed / committed / commit_failed / aborted
        self.declared = False
        self.condition: str | None = None

    def on_transaction_declared(self, event) -> None:
        self.declared = True

    def on_transaction_declare_failed(self, event) -> None:
        self.outcome = "declare_failed"
        self.condition = _condition(event.delivery)

    def on_transaction_committed(self, event) -> None:
        self.outcome = "committed"

    def on_transaction_commit_failed(self, event) -> None:
        self.outcome = "commit_failed"
        self.condition = _condition(event.delivery)

    def on_transaction_aborted(self, event) -> None:
        self.outcome = "aborted"


def _condition(delivery) -> str | None:
    cond = delivery.remote.condition
    return str(cond.name) if cond is not None else None


def declare(amqp: BlockingConnection, settle_before_discharge: bool = False):
    """A declared transaction (4.2) and its events."""
    events = TxEvents()
    txn = amqp.container.declare_transaction(amqp.conn, handler=events,
                                             settle_before_discharge=settle_before_discharge)
    amqp.wait(lambda: events.declared or events.outcome is not None, timeout=TIMEOUT, msg="declare")
    assert events.declared, events.condition
    return txn, events


def discharge(amqp: BlockingConnection, txn, events: TxEvents, commit: bool) -> str:
    events.outcome = None
    if commit:
        txn.commit()
    else:
        txn.abort()
    amqp.wait(lambda: events.outcome is not None, timeout=TIMEOUT, msg="discharge")
    return events.outcome


def _queue(ch) -> str:
    name = uniq("tx")
    ch.queue_declare(name)
    return name


def _count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def _move_in_transaction(amqp: BlockingConnection, txn, a: str, b: str):
    """Receive from A, send its body to B and accept A's delivery, all in ``txn``: the receiver (its
    credit is used up: a message released later comes back to it), the deliveries."""
    receiver = amqp.create_receiver(f"/queues/{a}", credit=1)
    message = receiver.receive(timeout=TIMEOUT)
    received = receiver.fetcher.unsettled.popleft()  # ours to settle, transactionally
    sender = amqp.create_sender(f"/queues/{b}")
    sent = txn.send(sender.link, Message(body=message.body))
    amqp.wait(lambda: sent.remote_state == TRANSACTIONAL_STATE, timeout=TIMEOUT, msg="posting outcome")
    txn.accept(received)
    return receiver, received, sent


def test_move_a_to_b_committed(broker, ch, amqp) -> None:
    """4.4.1 + 4.4.2: a message received from A, sent to B and accepted in one transaction.  The send is
    answered with transactional-state(txn, accepted) before the discharge (4.4.1) but B stays empty
    until the commit; the commit (4.3, fail=false) makes both happen: B holds the message, A's is gone
    for good (still gone after the connection closed), and the unsettled accept is settled by us."""
    a, b = _queue(ch), _queue(ch)
    ch.basic_publish("", a, b"moved")
    txn, events = declare(amqp)
    _receiver, received, sent = _move_in_transaction(amqp, txn, a, b)
    assert _txn_state(sent)[:2] == (bytes(txn.id), 0x24)  # the txn it was posted in, accepted
    assert _count(ch, b) == 0  # held by the transaction: not published before the commit
    assert discharge(amqp, txn, events, commit=True) == "committed"
    assert _count(ch, b) == 1
    assert _count(ch, a) == 0
    amqp.wait(lambda: received.settled, timeout=TIMEOUT, msg="our settlement of the accepted delivery")
    amqp.close()
    wait_until(lambda: _count(ch, a) == 0 and _count(ch, b) == 1, timeout=5, what="after close")
    reader = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=TIMEOUT)
    try:
        assert reader.create_receiver(f"/queues/{b}", credit=1).receive(timeout=TIMEOUT).body == b"moved"
    finally:
        reader.close()


@pytest.mark.parametrize("settle_before_discharge", [False, True])
def test_move_a_to_b_rolled_back(ch, amqp, settle_before_discharge: bool) -> None:
    """4.3 fail=true rolls the transaction back: the held send to B is dropped, and A's message is
    released to A -- delivered again to the receiver that still has credit.  Settled before the
    discharge (4.4.4.2: the resource applies the default outcome, released) or left unsettled (4.4.2: it
    stays acquired; proton releases it after the abort)."""
    a, b = _queue(ch), _queue(ch)
    ch.basic_publish("", a, b"stays")
    txn, events = declare(amqp, settle_before_discharge)
    receiver, _received, _sent = _move_in_transaction(amqp, txn, a, b)
    assert discharge(amqp, txn, events, commit=False) == "aborted"
    again = receiver.receive(timeout=TIMEOUT)  # released back to A, so delivered again
    assert again.body == b"stays" and again.delivery_count == 0  # released, not modified (3.4.4)
    assert _count(ch, b) == 0
    receiver.close()
    wait_until(lambda: _count(ch, a) == 1, timeout=5, what="A's message back")


def test_several_messages_across_queues_in_one_commit(ch, amqp) -> None:
    """4.1: one transaction's work spans links: 10 sends to two queues and 3 accepts from a third,
    all visible at once after the commit and none before."""
    a, b, c = _queue(ch), _queue(ch), _queue(ch)
    for i in range(3):
        ch.basic_publish("", a, f"a{i}".encode())
    txn, events = declare(amqp)
    receiver = amqp.create_receiver(f"/queues/{a}", credit=3)
    for _ in range(3):
        receiver.receive(timeout=TIMEOUT)
    accepted = list(receiver.fetcher.unsettled)
    receiver.fetcher.unsettled.clear()
    to_b, to_c = amqp.create_sender(f"/queues/{b}"), amqp.create_sender(f"/queues/{c}")
    sent = [txn.send((to_b if i % 2 else to_c).link, Message(body=f"m{i}")) for i in range(10)]
    amqp.wait(lambda: all(d.remote_state == TRANSACTIONAL_STATE for d in sent), timeout=TIMEOUT, msg="posted")
    for delivery in accepted:
        txn.accept(delivery)
    assert (_count(ch, b), _count(ch, c)) == (0, 0)
    assert discharge(amqp, txn, events, commit=True) == "committed"
    assert (_count(ch, a), _count(ch, b), _count(ch, c)) == (0, 5, 5)


def test_discharge_unknown_id_and_twice(ch, amqp) -> None:
    """4.5.8 amqp:transaction:unknown-id: a discharge naming a txn-id that was never declared, and one of
    a transaction already discharged, are rejected with it; a transfer posted in an unknown
    transaction is rejected too and publishes nothing."""
    b = _queue(ch)
    txn, events = declare(amqp)
    real_id = txn.id
    txn.id = b"no-such-txn"
    assert discharge(amqp, txn, events, commit=True) == "commit_failed"
    assert events.condition == "amqp:transaction:unknown-id"
    txn.id = real_id
    assert discharge(amqp, txn, events, commit=True) == "committed"
    assert discharge(amqp, txn, events, commit=True) == "commit_failed"  # discharged already
    assert events.condition == "amqp:transaction:unknown-id"
    sender = amqp.create_sender(f"/queues/{b}")
    stale = txn.send(sender.link, Message(body="late"))
    amqp.wait(lambda: stale.remote_state != 0, timeout=TIMEOUT, msg="outcome")
    assert stale.remote_state == Delivery.REJECTED
    assert stale.remote.condition.name == "amqp:transaction:unknown-id"
    assert _count(ch, b) == 0


def test_connection_closed_mid_transaction_rolls_back(broker, ch) -> None:
    """4.1: a transaction not discharged when its connection goes is rolled back -- for a clean close
    and for a dropped socket: the send never reaches B, A's accepted message returns to A."""
    for how in ("close", "drop"):
        a, b = _queue(ch), _queue(ch)
        ch.basic_publish("", a, b"x")
        amqp = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=TIMEOUT)
        txn, _events = declare(amqp, settle_before_discharge=True)
        _move_in_transaction(amqp, txn, a, b)
        if how == "close":
            amqp.close()
        else:
            amqp.conn.transport.close_tail()  # the socket dropped: no close, no detach
            amqp.conn.transport.close_head()
            amqp.container.process()
        wait_until(lambda a=a: _count(ch, a) == 1, timeout=10, what=f"A's message back after {how}")
        assert _count(ch, b) == 0, how


def test_coordinator_link_detached_rolls_back(ch, amqp) -> None:
    """4.1: "If the control link is closed while there exist non-discharged transactions it created,
    then all such transactions are immediately rolled back" -- the connection stays open."""
    a, b = _queue(ch), _queue(ch)
    ch.basic_publish("", a, b"y")
    txn, _events = declare(amqp, settle_before_discharge=True)
    receiver, _received, _sent = _move_in_transaction(amqp, txn, a, b)
    txn.txn_ctrl.close()
    assert receiver.receive(timeout=TIMEOUT).body == b"y"  # released back to A, delivered again
    assert _count(ch, b) == 0


def test_accepting_link_detached_before_commit_is_a_rollback(ch, amqp) -> None:
    """4.4.4.1/4.5.8: the receiving link whose accept the transaction holds detaches before the commit
    (its deliveries return to A): the work cannot be done, so the commit is rejected with
    amqp:transaction:rollback and nothing of it is applied (B stays empty)."""
    a, b = _queue(ch), _queue(ch)
    ch.basic_publish("", a, b"z")
    txn, events = declare(amqp, settle_before_discharge=True)
    receiver = amqp.create_receiver(f"/queues/{a}", credit=1)
    receiver.receive(timeout=TIMEOUT)
    delivery = receiver.fetcher.unsettled.popleft()
    sender = amqp.create_sender(f"/queues/{b}")
    sent = txn.send(sender.link, Message(body="z"))
    amqp.wait(lambda: sent.remote_state == TRANSACTIONAL_STATE, timeout=TIMEOUT, msg="posted")
    txn.accept(delivery)
    receiver.close()
    assert discharge(amqp, txn, events, commit=True) == "commit_failed"
    assert events.condition == "amqp:transaction:rollback"
    wait_until(lambda: _count(ch, a) == 1, timeout=5, what="A's message back")
    assert _count(ch, b) == 0


def test_target_deleted_before_commit_is_a_rollback(ch, amqp) -> None:
    """4.4.4.1: "If the resource can no longer apply the outcome that it originally indicated ... it
    MUST NOT allow the successful discharge": B is deleted after a send to it was posted (and told
    accepted), so the commit is rejected with amqp:transaction:rollback and A keeps its message."""
    a, b = _queue(ch), _queue(ch)
    ch.basic_publish("", a, b"w")
    txn, events = declare(amqp, settle_before_discharge=True)
    receiver, _received, _sent = _move_in_transaction(amqp, txn, a, b)
    ch.queue_delete(b)
    assert discharge(amqp, txn, events, commit=True) == "commit_failed"
    assert events.condition == "amqp:transaction:rollback"
    assert receiver.receive(timeout=TIMEOUT).body == b"w"  # released back to A, delivered again


def _coordinator(amqp: BlockingConnection, capability: str):
    link = amqp.container.create_sender(amqp.conn, None, name=uniq("ctl"))
    link.target.type = Terminus.COORDINATOR
    link.target.capabilities.put_object(symbol(capability))
    return link


def test_distributed_transactions_refused_at_attach(amqp) -> None:
    """4.5.1/4.5.7: a controller that desires amqp:distributed-transactions is refused at once
    (amqp:not-implemented), not accepted and failed later; amqp:local-transactions is answered with a
    coordinator target listing it."""
    refused = _coordinator(amqp, "amqp:distributed-transactions")
    with pytest.raises(LinkDetached) as info:
        amqp.wait(lambda: refused.state & proton.Endpoint.REMOTE_CLOSED, timeout=TIMEOUT, msg="refusal")
    assert "amqp:not-implemented" in str(info.value) or refused.remote_condition.name == "amqp:not-implemented"
    fresh = BlockingConnection(amqp.url, timeout=TIMEOUT)
    try:
        ok = _coordinator(fresh, "amqp:local-transactions")
        fresh.wait(lambda: ok.state & proton.Endpoint.REMOTE_ACTIVE, timeout=TIMEOUT, msg="attach")
        assert ok.remote_target.type == Terminus.COORDINATOR
        caps = ok.remote_target.capabilities
        caps.rewind()
        caps.next()
        assert "amqp:local-transactions" in [str(c) for c in caps.get_object()]
    finally:
        fresh.close()


def test_transactions_bounded(tmp_path) -> None:
    """Held publishes are node memory, so they are bounded per connection (node/config.py
    amqp10_tx_max_messages, amqp10_tx_max_bytes): the publish beyond is rejected with
    amqp:resource-limit-exceeded inside its transactional-state (4.4.1), and the commit then fails
    with amqp:transaction:rollback -- nothing was published; a body over the byte bound likewise; and
    a declare beyond amqp10_tx_max_open undischarged transactions is rejected."""
    env = {"RAFTMQ_AMQP10_TX_MAX_MESSAGES": "3", "RAFTMQ_AMQP10_TX_MAX_BYTES": "4096",
           "RAFTMQ_AMQP10_TX_MAX_OPEN": "2"}
    with RaftmqNode(tmp_path / "node", env=env) as node:
        admin = pika.BlockingConnection(pika_params(node.url))
        ch = admin.channel()
        b = _queue(ch)
        amqp = BlockingConnection(f"amqp://guest:guest@{node.host}:{node.port}", timeout=TIMEOUT)
        try:
            sender = amqp.create_sender(f"/queues/{b}")
            txn, events = declare(amqp)
            sent = [txn.send(sender.link, Message(body=f"m{i}")) for i in range(4)]
            amqp.wait(lambda: all(d.remote_state != 0 for d in sent), timeout=TIMEOUT, msg="outcomes")
            assert [d.remote_state for d in sent] == [TRANSACTIONAL_STATE] * 4
            assert [_txn_state(d)[1] for d in sent[:3]] == [0x24] * 3  # accepted (presumptively)
            assert _txn_state(sent[3])[1:] == (0x25, "amqp:resource-limit-exceeded")
            assert discharge(amqp, txn, events, commit=True) == "commit_failed"
            assert events.condition == "amqp:transaction:rollback"
            big_txn, big_events = declare(amqp)
            big = big_txn.send(sender.link, Message(body=b"x" * 5000))
            amqp.wait(lambda: big.remote_state != 0, timeout=TIMEOUT, msg="outcome")
            assert _txn_state(big)[1:] == (0x25, "amqp:resource-limit-exceeded")
            declare(amqp)  # the second open transaction
            third = TxEvents()
            amqp.container.declare_transaction(amqp.conn, handler=third)
            amqp.wait(lambda: third.declared or third.outcome is not None, timeout=TIMEOUT, msg="declare")
            assert (third.outcome, third.condition) == ("declare_failed", "amqp:resource-limit-exceeded")
            assert discharge(amqp, big_txn, big_events, commit=True) == "commit_failed"
            assert _count(ch, b) == 0
        finally:
            amqp.close()
            admin.close()


def _txn_state(delivery) -> tuple:
    """(txn-id, outcome descriptor, error condition) of a transactional-state disposition (proton
    0.40 gives its fields as raw data)."""
    txn_id, outcome = (list(delivery.remote.data) + [None])[:2]
    if outcome is None:
        return bytes(txn_id), None, None
    fields = list(outcome.value or [])
    condition = None
    if fields and fields[0] is not None:  # rejected's error: [condition, description, info]
        condition = str(fields[0].value[0])
    return bytes(txn_id), int(outcome.descriptor), condition


def _raw_session(broker):
    """A logged-in raw 1.0 connection (tests/integration/test_amqp10_raw.py) with session 0 begun."""
    from raftmq.protocol.amqp10 import performatives as p
    from raftmq.protocol.amqp10.frames import encode_frame
    from tests.integration.test_amqp10_raw import Raw

    raw = Raw(broker.port)
    raw.login()
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=1000, outgoing_window=1000)))
    assert isinstance(raw.performative(), p.Begin)
    return raw, encode_frame, p


def _next(raw, p, kind):
    """The next performative of ``kind``, skipping flows."""
    while True:
        body = raw.performative()
        if not isinstance(body, p.Flow):
            assert isinstance(body, kind), body
            return body


def test_settled_control_message_and_transactional_acquisition_refused(broker, ch) -> None:
    """4.2: a declare sent settled detaches the control link with amqp:illegal-state (the controller
    must hear the outcome).  4.4.3: a flow asking for transactional acquisition (txn-id in its
    properties) detaches that receiving link with amqp:not-implemented, as the spec requires of a
    resource that does not support it."""
    a = _queue(ch)
    raw, encode_frame, p = _raw_session(broker)
    try:
        raw.send(encode_frame(p.Attach(name="ctl", handle=0, role=False, source=p.Source(),
                                       target=p.Coordinator(capabilities=["amqp:local-transactions"]),
                                       initial_delivery_count=0)))
        attach = _next(raw, p, p.Attach)
        assert isinstance(attach.target, p.Coordinator)
        declare = p.AmqpValue(p.Declare()).encode()
        raw.send(encode_frame(p.Transfer(handle=0, delivery_id=0, delivery_tag=b"d", message_format=0,
                                         settled=True), payload=declare))
        detach = _next(raw, p, p.Detach)
        assert detach.error.condition == "amqp:illegal-state"
        raw.send(encode_frame(p.Detach(handle=0, closed=True)))
        raw.send(encode_frame(p.Attach(name="rcv", handle=1, role=True, source=p.Source(address=f"/queues/{a}"),
                                       target=p.Target())))
        assert isinstance(_next(raw, p, p.Attach), p.Attach)
        raw.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=1,
                                     outgoing_window=1000, handle=1, delivery_count=0, link_credit=5,
                                     properties={"txn-id": b"txn-1"})))
        detach = _next(raw, p, p.Detach)
        assert detach.handle == 1 and detach.error.condition == "amqp:not-implemented"
    finally:
        raw.close()
