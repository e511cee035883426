"""AMQP 1.0 front end with a real client (python-qpid-proton 0.40) and pika on the same port.

Section numbers cite the OASIS AMQP 1.0 spec (/work/shared/specs/amqp-1-0.txt): 2.6.7 flow control
(credit, drain), 2.6.12 transfers and settlement, 3.4 delivery states, 3.5.3/3.5.4 dynamic source.
Queues are declared with pika (0-9-1) so each test has its own; every wait is bounded.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest

proton = pytest.importorskip("proton")
from proton import Delivery, Link, Message  # noqa: E402
from proton.reactor import AtMostOnce, LinkOption  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached, SendException  # noqa: E402

from tests.integration.helpers import uniq, wait_until  # noqa: E402

TIMEOUT = 10


@pytest.fixture(autouse=True)
def _raftmq_only(broker) -> None:
    if broker.kind != "raftmq":
        pytest.skip("RabbitMQ 3.10's 1.0 plugin is not enabled in the reference peer")


class RcvSecond(LinkOption):
    """receiver-settle-mode second (2.6.12: the receiver settles after the sender)."""

    def apply(self, link) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


def _queue(ch, **arguments) -> str:
    name = uniq("a10")
    ch.queue_declare(name, arguments=arguments or None)
    return name


def _pump(amqp) -> bool:
    """Let proton write what it holds (pre-settled sends return before their frames are written); its
    I/O wait bounded (BlockingConnection.wait sets the container's timeout the same way)."""
    amqp.container.timeout = 0.05
    amqp.container.process()
    return True


def _count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def test_send_receive_accepted_after_commit(ch, amqp) -> None:
    """2.6.12: an unsettled transfer is answered with accepted once the message is stored."""
    queue = _queue(ch)
    sender = amqp.create_sender(f"/queues/{queue}")
    for i in range(5):
        delivery = sender.send(Message(body=f"m{i}"))
        assert delivery.remote_state == Delivery.ACCEPTED
    assert _count(ch, queue) == 5
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=5)
    got = []
    for _ in range(5):
        got.append(receiver.receive(timeout=TIMEOUT).body)
        receiver.accept()
    assert got == [f"m{i}" for i in range(5)]
    receiver.close()
    wait_until(lambda: _count(ch, queue) == 0, what="accepted messages gone")


def test_presettled_send(ch, amqp) -> None:
    """snd-settle-mode settled (2.8.2): at-most-once, no disposition awaited."""
    queue = _queue(ch)
    sender = amqp.create_sender(f"/queues/{queue}", options=AtMostOnce())
    for i in range(20):
        sender.send(Message(body=f"p{i}"))
    wait_until(lambda: _pump(amqp) and _count(ch, queue) == 20, what="20 pre-settled messages stored")


def test_presettled_receive(ch, amqp) -> None:
    """A receiver asking for settled deliveries gets them settled; the queue forgets them on delivery."""
    queue = _queue(ch)
    sender = amqp.create_sender(f"/queues/{queue}")
    for i in range(3):
        sender.send(Message(body=f"x{i}"))
    # (string bodies: proton frees a settled delivery's buffer, which a binary body's memoryview points into)
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=3, options=AtMostOnce())
    assert receiver.link.remote_snd_settle_mode == Link.SND_SETTLED
    bodies = [receiver.receive(timeout=TIMEOUT).body for _ in range(3)]
    assert bodies == ["x0", "x1", "x2"]
    wait_until(lambda: _count(ch, queue) == 0, what="queue empty")


def test_credit_limits_deliveries_and_drain(ch, amqp) -> None:
    """2.6.7: the sender sends no more than link-credit; drain uses up the credit and reports it."""
    queue = _queue(ch)
    for i in range(10):
        ch.basic_publish("", queue, f"c{i}".encode())
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=0)
    incoming = receiver.fetcher.incoming
    receiver.link.flow(3)
    amqp.wait(lambda: len(incoming) >= 3, timeout=TIMEOUT, msg="3 deliveries")
    with pytest.raises(proton.Timeout):  # anything beyond the credit would arrive within this
        amqp.wait(lambda: len(incoming) > 3, timeout=0.5, msg="a delivery beyond the credit")
    assert len(incoming) == 3  # not one more than the credit
    # Drain with more credit than messages: 7 arrive, then the credit is used up (delivery-count advanced).
    receiver.link.drain(20)
    amqp.wait(lambda: receiver.link.credit == 0, timeout=TIMEOUT, msg="drain completed")
    assert len(incoming) == 10
    # Empty queue: the drain is answered at once with the credit used up and nothing sent.
    receiver.link.drain(5)
    assert receiver.link.credit == 5
    amqp.wait(lambda: receiver.link.credit == 0, timeout=TIMEOUT, msg="second drain completed")
    assert len(incoming) == 10
    # After a drain the link still works: new credit, new messages (the core's byte credit came back too).
    ch.basic_publish("", queue, b"after")
    receiver.link.flow(1)
    amqp.wait(lambda: len(incoming) == 11, timeout=TIMEOUT, msg="a delivery after the drain")


def test_released_modified_rejected(ch, amqp) -> None:
    """3.4.4 released: back, not counted; 3.4.5 modified delivery-failed: back, counted (delivery-count);
    3.4.3 rejected: dead-lettered (the queue's x-dead-letter-exchange)."""
    dlq = _queue(ch)
    queue = _queue(ch, **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", queue, b"one")
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    first = receiver.receive(timeout=TIMEOUT)
    assert first.delivery_count == 0 and first.first_acquirer
    receiver.release(delivered=False)  # released
    again = receiver.receive(timeout=TIMEOUT)
    assert bytes(again.body) == b"one" and again.delivery_count == 0
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.local.failed = True  # (BlockingReceiver.release(delivered=True) leaves delivery-failed unset)
    delivery.update(Delivery.MODIFIED)
    delivery.settle()  # modified{delivery-failed}
    third = receiver.receive(timeout=TIMEOUT)
    assert bytes(third.body) == b"one" and third.delivery_count >= 1 and not third.first_acquirer
    receiver.reject()  # rejected -> dead-lettered
    wait_until(lambda: _pump(amqp) and _count(ch, dlq) == 1, what="dead-lettered message")
    assert _count(ch, queue) == 0


def test_receiver_settle_mode_second(ch, amqp) -> None:
    """2.6.12 mode second: the receiver's unsettled accepted is answered by the sender's settlement."""
    queue = _queue(ch)
    ch.basic_publish("", queue, b"second")
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1, options=RcvSecond())
    assert receiver.link.remote_rcv_settle_mode == Link.RCV_SECOND
    message = receiver.receive(timeout=TIMEOUT)
    assert bytes(message.body) == b"second"
    delivery = receiver.fetcher.unsettled.popleft()
    delivery.update(Delivery.ACCEPTED)  # the outcome, not settled yet
    amqp.wait(lambda: delivery.settled, timeout=TIMEOUT, msg="the sender settles")  # remote settled
    assert delivery.remote_state == Delivery.ACCEPTED
    delivery.settle()
    wait_until(lambda: _count(ch, queue) == 0, what="accepted in mode second")


def test_sender_rcv_settle_mode_second(ch, amqp) -> None:
    """Our receiving link in mode second: the outcome arrives unsettled; the client then settles."""
    queue = _queue(ch)
    sender = amqp.create_sender(f"/queues/{queue}", options=RcvSecond())
    assert sender.link.remote_rcv_settle_mode == Link.RCV_SECOND
    delivery = sender.link.delivery(b"t1")
    msg = Message(body="s2")
    sender.link.send(msg.encode())
    sender.link.advance()
    amqp.wait(lambda: delivery.remote_state == Delivery.ACCEPTED, timeout=TIMEOUT, msg="outcome")
    assert not delivery.settled  # mode second: the receiver waits for our settlement
    delivery.settle()
    wait_until(lambda: _count(ch, queue) == 1, what="stored")


def test_message_larger_than_max_frame_size(ch, amqp) -> None:
    """2.6.14 multi-frame transfers, both directions: 600 KB through 128 KB / 32 KB frames."""
    queue = _queue(ch)
    body = bytes(range(256)) * 2400
    sender = amqp.create_sender(f"/queues/{queue}")
    assert sender.send(Message(body=body)).remote_state == Delivery.ACCEPTED
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    got = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert bytes(got.body) == body


def test_request_reply_dynamic_receiver(broker, ch, amqp) -> None:
    """3.5.3 dynamic source: a temporary queue; the reply is sent through a null target with ``to``."""
    requests = _queue(ch)
    replies = amqp.create_receiver(None, dynamic=True, credit=1)
    reply_to = replies.remote_source.address
    assert reply_to.startswith("/queues/")
    amqp.create_sender(f"/queues/{requests}").send(
        Message(body="ping", reply_to=reply_to, correlation_id="c-1"))
    server = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=TIMEOUT)
    try:
        request = server.create_receiver(f"/queues/{requests}", credit=1).receive(timeout=TIMEOUT)
        anonymous = server.create_sender(None)
        outcome = anonymous.send(Message(address=request.reply_to, body="pong",
                                         correlation_id=request.correlation_id))
        assert outcome.remote_state == Delivery.ACCEPTED
    finally:
        server.close()
    reply = replies.receive(timeout=TIMEOUT)
    replies.accept()
    assert (reply.body, reply.correlation_id) == ("pong", "c-1")
    queue = reply_to[len("/queues/"):]
    replies.close()
    wait_until(lambda: _gone(ch, queue), what="temporary queue deleted with its receiver")


def _gone(ch, queue: str) -> bool:
    try:
        ch.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker:
        return True
    return False


def test_pika_to_amqp10_and_back(ch, amqp) -> None:
    """0-9-1 -> 1.0 -> 0-9-1 (RabbitMQ 4's conversions): properties and headers survive both ways."""
    queue, back = _queue(ch), _queue(ch)
    message_id = f"urn:uuid:{uuid.uuid4()}"
    props = pika.BasicProperties(content_type="application/json", content_encoding="utf-8", delivery_mode=2,
                                 priority=5, correlation_id="corr-1", reply_to="/queues/r", expiration="60000",
                                 message_id=message_id, timestamp=1_700_000_000, type="order", user_id="guest",
                                 app_id="shop", headers={"tenant": "acme", "count": 7, "x-trace": "t1"})
    ch.basic_publish("", queue, b'{"a": 1}', props)
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    m = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert bytes(m.body) == b'{"a": 1}'
    assert (m.content_type, m.content_encoding) == ("application/json", "utf-8")
    assert m.durable and m.priority == 5 and m.ttl == 60.0
    assert str(m.id) == message_id[len("urn:uuid:"):] and m.correlation_id == "corr-1"
    assert m.reply_to == "/queues/r" and m.user_id == b"guest" and m.group_id == "shop"
    assert m.creation_time == 1_700_000_000
    assert m.properties == {"tenant": "acme", "count": 7}
    assert m.annotations["x-trace"] == "t1" and m.annotations["x-basic-type"] == "order"
    assert m.annotations["x-routing-key"] == queue
    # and back: a 1.0 message to a 0-9-1 consumer
    out = Message(body=b"bin", inferred=True, content_type="text/plain", durable=True, priority=3, id="mid-2",
                  correlation_id="corr-2", properties={"k": "v", "n": 2}, annotations={"x-opt-z": "z"},
                  creation_time=1_700_000_123.0, reply_to="/queues/rr")
    amqp.create_sender(f"/queues/{back}").send(out)
    method, p, body = None, None, None
    deadline = time.monotonic() + TIMEOUT
    while method is None and time.monotonic() < deadline:
        method, p, body = ch.basic_get(back, auto_ack=True)
    assert body == b"bin"
    assert (p.content_type, p.delivery_mode, p.priority, p.message_id, p.correlation_id, p.reply_to) == (
        "text/plain", 2, 3, "mid-2", "corr-2", "/queues/rr")
    assert p.timestamp == 1_700_000_123
    assert p.headers == {"k": "v", "n": 2, "x-opt-z": "z"} and p.type is None


def _typed_message(body=b"bin"):
    """A message with what 0-9-1 cannot carry: typed application-properties (3.2.5), non-x and typed
    annotations, absolute-expiry-time, group-sequence, reply-to-group-id, subject, creation-time in ms."""
    return Message(body=body, inferred=True, durable=True, priority=6, ttl=120.0, id=proton.ulong(99),
                   subject="subj", group_id="g", group_sequence=7, reply_to_group_id="rg",
                   expiry_time=1_900_000_000.123, creation_time=1_700_000_000.456,
                   properties={"u8": proton.ubyte(200), "i16": proton.short(-3), "sym": proton.symbol("s"),
                               "c": proton.char("é"), "f": proton.float32(1.5),
                               "ts": proton.timestamp(1_600_000_000_321), "id": uuid.UUID(int=7), "plain": "v"},
                   annotations={"x-opt-partition": proton.symbol("p1"), "x-opt-n": proton.uint(5)})


def _assert_typed(got) -> None:
    assert type(got.properties["u8"]) is proton.ubyte and got.properties["u8"] == 200
    assert type(got.properties["i16"]) is proton.short and got.properties["i16"] == -3
    assert type(got.properties["sym"]) is proton.symbol and type(got.properties["c"]) is proton.char
    assert type(got.properties["f"]) is proton.float32 and got.properties["f"] == 1.5
    assert type(got.properties["ts"]) is proton.timestamp and got.properties["ts"] == 1_600_000_000_321
    assert got.properties["id"] == uuid.UUID(int=7) and got.properties["plain"] == "v"
    assert got.id == 99  # a ulong id (proton hands ids back as int)
    assert (got.subject, got.group_id, got.group_sequence, got.reply_to_group_id) == ("subj", "g", 7, "rg")
    assert got.expiry_time == pytest.approx(1_900_000_000.123) and got.creation_time == pytest.approx(1_700_000_000.456)
    assert got.durable and got.priority == 6 and got.ttl == 120.0
    assert got.annotations["x-opt-partition"] == "p1" and type(got.annotations["x-opt-n"]) is proton.uint


def test_amqp10_to_amqp10_keeps_what_0_9_1_cannot_carry(ch, amqp) -> None:
    """1.0 -> 1.0 (format AMQP100, docs/message-mapping.md): the bare message (3.2: properties,
    application-properties) comes back as sent, every value with its type; the annotations too."""
    queue = _queue(ch)
    amqp.create_sender(f"/queues/{queue}").send(_typed_message())
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    got = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert bytes(got.body) == b"bin"
    _assert_typed(got)
    assert got.annotations["x-routing-key"] == queue and got.annotations["x-exchange"] == ""


def test_amqp10_via_0_9_1_and_back(ch, amqp) -> None:
    """1.0 -> 0-9-1 -> 1.0: a pika consumer gets RabbitMQ 4's conversion, republishes the message as it
    got it, and a 1.0 consumer gets back what 0-9-1 carries (values as plain types)."""
    first, second = _queue(ch), _queue(ch)
    amqp.create_sender(f"/queues/{first}").send(_typed_message())
    method, props, body = None, None, None
    deadline = time.monotonic() + TIMEOUT
    while method is None and time.monotonic() < deadline:
        method, props, body = ch.basic_get(first, auto_ack=True)
    assert body == b"bin" and props.message_id == "99" and props.app_id == "g"
    assert (props.delivery_mode, props.priority, props.expiration, props.timestamp) == (2, 6, "120000", 1_700_000_000)
    assert props.headers["u8"] == 200 and props.headers["sym"] == "s" and props.headers["x-opt-partition"] == "p1"
    ch.basic_publish("", second, body, props)
    receiver = amqp.create_receiver(f"/queues/{second}", credit=1)
    got = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert bytes(got.body) == b"bin" and got.id == "99" and got.group_id == "g"
    assert got.durable and got.priority == 6 and got.ttl == 120.0 and got.creation_time == 1_700_000_000
    assert got.properties["u8"] == 200 and got.properties["sym"] == "s" and got.properties["plain"] == "v"
    assert got.annotations["x-opt-partition"] == "p1" and got.annotations["x-opt-n"] == 5


def test_headers_exchange_and_dead_letters_read_amqp10_messages(ch, amqp) -> None:
    """The core reads a 1.0 message's application-properties as its headers (headers exchange, x-match
    all) and writes x-death into its message-annotations when it dead-letters it; the bare message
    still comes back as sent."""
    exchange, dlx = uniq("a10h"), uniq("a10dlx")
    ch.exchange_declare(exchange, "headers")
    ch.exchange_declare(dlx, "fanout")
    dead = _queue(ch)
    ch.queue_bind(dead, dlx)
    queue = _queue(ch, **{"x-dead-letter-exchange": dlx})
    ch.queue_bind(queue, exchange, arguments={"x-match": "all", "plain": "v", "u8": 200})
    sender = amqp.create_sender(f"/exchanges/{exchange}")
    assert sender.send(_typed_message()).remote_state == Delivery.ACCEPTED
    with pytest.raises(SendException):  # no binding matches: released (unroutable)
        sender.send(Message(body="other", properties={"plain": "w"}))
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    got = receiver.receive(timeout=TIMEOUT)
    receiver.reject()  # dead-lettered (3.4.3: rejected)
    dead_receiver = amqp.create_receiver(f"/queues/{dead}", credit=1)
    again = dead_receiver.receive(timeout=TIMEOUT)
    dead_receiver.accept()
    assert bytes(got.body) == bytes(again.body) == b"bin"
    _assert_typed(again)
    death = again.annotations["x-death"][0]
    assert death["queue"] == queue and death["reason"] == "rejected" and death["count"] == 1
    assert again.annotations["x-first-death-reason"] == "rejected"
    assert again.annotations["x-exchange"] == dlx


def test_quorum_redeliveries_and_deduplication_of_amqp10_messages(ch, amqp) -> None:
    """A quorum queue's x-delivery-count (written into a 1.0 message's annotations by the core) is
    header.delivery-count for a 1.0 consumer (3.2.1: unsuccessful previous delivery attempts) and the
    x-delivery-count header for a 0-9-1 one; the delivery limit dead-letters it.  A deduplicating
    queue reads x-deduplication-header from application-properties."""
    dlq = _queue(ch)
    queue = uniq("a10q")
    ch.queue_declare(queue, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dlq})
    amqp.create_sender(f"/queues/{queue}").send(Message(body=b"poison", inferred=True, durable=True,
                                                                properties={"k": "v"}))
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    counts = []
    for _ in range(2):
        got = receiver.receive(timeout=TIMEOUT)
        counts.append(got.delivery_count)
        delivery = receiver.fetcher.unsettled.popleft()
        delivery.local.failed = True
        delivery.update(Delivery.MODIFIED)  # 3.4.5 modified{delivery-failed}: counted
        delivery.settle()
    receiver.close()
    method, props, body = None, None, None
    deadline = time.monotonic() + TIMEOUT
    while method is None and time.monotonic() < deadline:
        _pump(amqp)
        method, props, body = ch.basic_get(queue, auto_ack=False)
    assert counts == [0, 1] and body == b"poison" and props.headers["x-delivery-count"] == 2
    assert props.headers["k"] == "v"
    ch.basic_nack(method.delivery_tag, requeue=True)  # the third failure: over the limit
    wait_until(lambda: _count(ch, dlq) == 1, what="dead-lettered after the delivery limit")
    dedup = uniq("a10dd")
    ch.queue_declare(dedup, durable=True, arguments={"x-message-deduplication": True})
    sender = amqp.create_sender(f"/queues/{dedup}")
    for body in (b"a", b"again", b"b"):
        key = "k2" if body == b"b" else "k1"
        assert sender.send(Message(body=body, inferred=True, properties={"x-deduplication-header": key})).remote_state \
            == Delivery.ACCEPTED
    dedup_receiver = amqp.create_receiver(f"/queues/{dedup}", credit=10)
    got = []
    for _ in range(2):
        message = dedup_receiver.receive(timeout=TIMEOUT)  # (kept: its body is a view of its buffer)
        got.append(bytes(message.body))
        dedup_receiver.accept()
    assert got == [b"a", b"b"] and _count(ch, dedup) == 0


def test_amqp_value_body_round_trip(ch, amqp) -> None:
    """A non-data body (amqp-value map) travels as encoded 1.0 sections (type amqp-1.0) and comes back whole."""
    queue = _queue(ch)
    amqp.create_sender(f"/queues/{queue}").send(Message(body={"a": [1, 2], "b": "c"}))
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
    got = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert got.body == {"a": [1, 2], "b": "c"}


def test_exchange_addresses(ch, amqp) -> None:
    """/exchanges/:x/:key and /exchanges/:x with the message's subject as key."""
    queue = _queue(ch)
    exchange = uniq("a10x")
    ch.exchange_declare(exchange, "direct")
    ch.queue_bind(queue, exchange, "k1")
    assert amqp.create_sender(f"/exchanges/{exchange}/k1").send(Message(body="a")).remote_state == Delivery.ACCEPTED
    by_subject = amqp.create_sender(f"/exchanges/{exchange}")
    assert by_subject.send(Message(body="b", subject="k1")).remote_state == Delivery.ACCEPTED
    # unroutable: released (as RabbitMQ 4)
    with pytest.raises(SendException) as info:
        by_subject.send(Message(body="c", subject="nobody"))
    assert info.value.state == Delivery.RELEASED
    wait_until(lambda: _count(ch, queue) == 2, what="two routed")


def test_plain_queue_name_addresses(ch, amqp) -> None:
    queue = _queue(ch)
    amqp.create_sender(queue).send(Message(body="plain"))
    receiver = amqp.create_receiver(queue, credit=1)
    assert receiver.receive(timeout=TIMEOUT).body == "plain"
    receiver.accept()


def test_missing_queue_is_not_found(amqp) -> None:
    """2.6.3: the attach is answered with a null terminus and a detach carrying amqp:not-found."""
    with pytest.raises(LinkDetached) as info:
        amqp.create_receiver(f"/queues/{uniq('none')}")
    assert "amqp:not-found" in str(info.value)
    with pytest.raises(LinkDetached) as info:
        amqp.create_sender(f"/exchanges/{uniq('none')}/k")
    assert "amqp:not-found" in str(info.value)


def test_wrong_password_fails_sasl(broker) -> None:
    """5.3.3.6: sasl-outcome auth for bad credentials; no connection."""
    with pytest.raises(proton.ConnectionException):
        BlockingConnection(f"amqp://guest:wrong@{broker.host}:{broker.port}", timeout=5).close()



def test_audit_history_of_amqp10_traffic(tmp_path) -> None:
    """1.0 traffic leaves the same audit history as 0-9-1's (the core records it; store/disk/history.py):
    published/routed per transfer, delivered per delivery, acked/rejected/requeued per outcome.
    With queue groups (issue 34) the queue's events are in its group's history: the snapshot's
    histories of every group are read (``groups/g<N>``, each written once its group caught up)."""
    from collections import Counter

    from raftmq.ops.group_dirs import queue_group_histories
    from raftmq.ops.local.node import RaftmqNode
    from raftmq.store.disk import history as ev
    from tests.support.cli import raftmq
    from tests.support.groups import GROUPS, wait_histories

    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        admin = pika.BlockingConnection(pika.URLParameters(node.url))
        admin.channel().queue_declare("audited")
        admin.close()
        conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=TIMEOUT)
        sender = conn.create_sender("/queues/audited")
        for i in range(4):
            assert sender.send(Message(body=f"a{i}")).remote_state == Delivery.ACCEPTED
        receiver = conn.create_receiver("/queues/audited", credit=1)
        outcomes = ["accept", "reject", "release", "accept", "accept"]
        for outcome in outcomes:
            receiver.receive(timeout=TIMEOUT)
            {"accept": receiver.accept, "reject": receiver.reject,
             "release": lambda: receiver.release(delivered=False)}[outcome]()
        conn.close()
        wait_histories(node)
        out = tmp_path / "snap"
        done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out))
        assert done.returncode == 0, done.stderr
        histories = [str(out), *(history for _group, history in queue_group_histories(str(out)))]
        assert len(histories) == GROUPS
        kinds = Counter(ev.KIND_NAMES[r[2]] for history in histories for r in ev.read_events(history))
    assert kinds["published"] == 4 and kinds["routed"] == 4
    assert kinds["delivered"] == 5  # four, and the released one again
    assert kinds["acked"] == 3 and kinds["rejected"] == 1 and kinds["requeued"] == 1


def test_amqps(broker, tmp_path) -> None:
    """The amqps port (TLS, then the protocol header) takes 1.0 clients too: proton over TLS."""
    from proton import SSLDomain

    from raftmq.ops.local.node import RaftmqNode, free_port
    from tests.integration.test_tls import self_signed

    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    with RaftmqNode(tmp_path / "n", extra_args=["--tls-port", str(tls_port), "--tls-cert", str(cert),
                                                "--tls-key", str(key)]) as node:
        admin = pika.BlockingConnection(pika.URLParameters(node.url))
        admin.channel().queue_declare("over-tls")
        admin.close()
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(str(cert))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        conn = BlockingConnection(f"amqps://guest:guest@localhost:{tls_port}", timeout=TIMEOUT, ssl_domain=domain)
        try:
            assert conn.create_sender("/queues/over-tls").send(Message(body="tls")).remote_state == Delivery.ACCEPTED
            receiver = conn.create_receiver("/queues/over-tls", credit=1)
            assert receiver.receive(timeout=TIMEOUT).body == "tls"
            receiver.accept()
        finally:
            conn.close()


def test_metrics_count_connections_per_protocol(tmp_path) -> None:
    """raftmq_connections_by_protocol: a 0-9-1 and a 1.0 connection open, each counted under its protocol."""
    from raftmq.ops.local.node import RaftmqNode, free_port
    from tests.integration.test_metrics import scrape, value

    metrics_port = free_port()
    with RaftmqNode(tmp_path / "n", extra_args=["--metrics-port", str(metrics_port)]) as node:
        pika_conn = pika.BlockingConnection(pika.URLParameters(node.url))
        amqp10 = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=TIMEOUT)
        try:
            samples = scrape(metrics_port)
            assert value(samples, "raftmq_connections_by_protocol", protocol="AMQP 1-0") == 1
            assert value(samples, "raftmq_connections_by_protocol", protocol="AMQP 0-9-1") == 1
            assert value(samples, "raftmq_connections_by_protocol", protocol="AMQP 0-10") == 0
        finally:
            amqp10.close()
            pika_conn.close()
