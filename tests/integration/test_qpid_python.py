"""Apache Qpid's Python 0-10 client drives raftmq (issue 23: clients we did not write).

The client is qpid-python 1.36.0-1 from the package index with only a Python 3 port applied
(tests/support/qpid_python.py, tests/interop/qpid_python3.patch): both of its APIs are used as
their users use them -- ``qpid.messaging`` (addresses, senders, receivers, transactions) and
``qpid.connection`` (one call per 0-10 command). No workaround for the broker is in the client.
Failover with its reconnect options is in tests/cluster/test_qpid_python_failover.py.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support import qpid_python

# The client is Python 2 code run under 3.11: its setDaemon/notifyAll/isSet calls are deprecated.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="session")
def qpid(tmp_path_factory):
    """Makes ``qpid`` importable; skips when the sdist cannot be fetched, except under CI."""
    qpid_python.require(tmp_path_factory)
    import qpid as module

    return module


@pytest.fixture
def node(broker, qpid):
    if broker.kind != "raftmq":
        pytest.skip("AMQP 0-10 is raftmq's")
    return broker


def _name(prefix: str) -> str:
    return f"qpid-{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def messaging(node):
    """An open qpid.messaging Connection (no reconnect) to the session's node."""
    from qpid.messaging import Connection

    conn = Connection(f"127.0.0.1:{node.port}", username="guest", password="guest", reconnect=False)
    conn.open()
    yield conn
    conn.close(timeout=10)


@pytest.fixture
def session(node):
    """A qpid.connection session (the command-level API) on the session's node."""
    from qpid.connection import Connection
    from qpid.util import connect

    conn = Connection(connect("127.0.0.1", node.port), username="guest", password="guest")
    conn.start(timeout=10)
    ssn = conn.session(_name("ssn"), timeout=10)
    yield ssn
    conn.close(timeout=10)


def test_messaging_declares_publishes_and_fetches(messaging):
    """qpid.messaging: an address with create:always queries the queue, declares it, and the
    messages keep their content type (text, amqp/map), subject, id and properties."""
    from qpid.messaging import Message

    queue = _name("hello")
    message_id = uuid.uuid4()
    ssn = messaging.session()
    snd = ssn.sender(f"{queue}; {{create: always}}")
    rcv = ssn.receiver(queue)
    snd.send(Message("text body", subject="greeting", properties={"n": 1, "s": "x"}, id=message_id))
    snd.send(Message({"k": [1, 2, "three"], "nested": {"a": 1.5}}))
    first = rcv.fetch(timeout=10)
    second = rcv.fetch(timeout=10)
    ssn.acknowledge()
    assert first.content == "text body" and first.subject == "greeting" and first.id == message_id
    assert first.properties["n"] == 1 and first.properties["s"] == "x"
    assert second.content == {"k": [1, 2, "three"], "nested": {"a": 1.5}}
    assert rcv.available() == 0


def test_messaging_topic_exchange_and_subject_binding(messaging):
    """qpid.messaging: a sender to amq.topic with subjects, a receiver bound by a subject pattern
    (exchange.bind with the subject as binding key)."""
    from qpid.messaging import Message

    ssn = messaging.session()
    rcv = ssn.receiver("amq.topic/weather.#")
    snd = ssn.sender("amq.topic")
    snd.send(Message("sun", subject="weather.today"))
    snd.send(Message("stocks", subject="news.markets"))
    snd.send(Message("rain", subject="weather.tomorrow"))
    got = [rcv.fetch(timeout=10).content for _ in range(2)]
    ssn.acknowledge()
    assert got == ["sun", "rain"]
    with pytest.raises(Exception):  # noqa: B017  (qpid.messaging.Empty)
        rcv.fetch(timeout=0.5)


def test_messaging_browse_and_unreliable_links(messaging):
    """qpid.messaging: mode browse subscribes not-acquired (acquire-mode 1, L5948ff); an unreliable
    link subscribes with accept-mode none (1): the browsed messages stay, the others are gone
    without an accept."""
    from qpid.messaging import Message

    queue = _name("browse")
    ssn = messaging.session()
    snd = ssn.sender(f"{queue}; {{create: always}}")
    for i in range(3):
        snd.send(Message(f"m{i}"))
    browser = ssn.receiver(f"{queue}; {{mode: browse}}")
    assert [browser.fetch(timeout=10).content for _ in range(3)] == ["m0", "m1", "m2"]
    browser.close()
    unreliable = ssn.receiver(f"{queue}; {{link: {{reliability: unreliable}}}}")
    assert [unreliable.fetch(timeout=10).content for _ in range(3)] == ["m0", "m1", "m2"]
    unreliable.close()
    check = messaging.session().receiver(queue)
    with pytest.raises(Exception):  # noqa: B017  (qpid.messaging.Empty: nothing left)
        check.fetch(timeout=1)


def test_messaging_address_options_and_dispositions(messaging):
    """qpid.messaging address options as its users write them: a topic node declared with x-declare
    (exchange.declare fanout) and deleted on close, a link queue with x-declare (exclusive
    auto-delete), a queue with x-arguments (raftmq's x-max-length), and the reject and release
    dispositions (message.reject L5777ff, message.release L5819ff)."""
    from qpid.messaging import REJECTED, RELEASED, Disposition, Message

    ssn = messaging.session()
    topic = _name("fan")
    snd = ssn.sender(f"{topic}; {{create: always, delete: always, node: {{type: topic, "
                     f"x-declare: {{type: fanout}}}}}}")
    private = ssn.receiver(f"{topic}; {{link: {{x-declare: {{auto-delete: true, exclusive: true}}}}}}")
    plain = ssn.receiver(topic)
    snd.send(Message("fan", subject="s"))
    assert private.fetch(timeout=10).content == "fan" and plain.fetch(timeout=10).content == "fan"
    ssn.acknowledge()
    snd.close()

    queue = _name("capped")
    capped = ssn.sender(f"{queue}; {{create: always, node: {{x-declare: {{arguments: {{'x-max-length': 3}}}}}}}}")
    for i in range(5):
        capped.send(Message(f"m{i}"))
    rcv = ssn.receiver(queue)
    assert [rcv.fetch(timeout=10).content for _ in range(3)] == ["m2", "m3", "m4"]  # drop-head
    ssn.acknowledge()

    capped.send(Message("reject me"))
    ssn.acknowledge(rcv.fetch(timeout=10), Disposition(REJECTED))
    capped.send(Message("release me"))
    ssn.acknowledge(rcv.fetch(timeout=10), Disposition(RELEASED))
    again = rcv.fetch(timeout=10)
    ssn.acknowledge()
    assert again.content == "release me"
    with pytest.raises(Exception):  # noqa: B017  (Empty: the rejected one is gone)
        rcv.fetch(timeout=0.5)


def test_messaging_capacity_is_credit(messaging):
    """qpid.messaging sets flow mode credit (message.set-flow-mode, L6087ff) and gives its capacity as
    message credit: no more than that many messages are prefetched."""
    from qpid.messaging import Message

    queue = _name("credit")
    ssn = messaging.session()
    snd = ssn.sender(f"{queue}; {{create: always}}")
    for i in range(6):
        snd.send(Message(f"c{i}"))
    rcv = ssn.receiver(queue, capacity=2)
    deadline = time.monotonic() + 5
    while rcv.available() < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert rcv.available() == 2
    got = [rcv.fetch(timeout=10).content for _ in range(6)]
    ssn.acknowledge()
    assert got == [f"c{i}" for i in range(6)]


def test_messaging_transactions(messaging):
    """qpid.messaging transactional session (class tx, L6205ff): sends are invisible until commit,
    a rolled back send is discarded, and a rolled back receive is delivered again."""
    from qpid.messaging import Message

    queue = _name("tx")
    plain = messaging.session()
    plain.sender(f"{queue}; {{create: always}}").close()
    txn = messaging.session(transactional=True)
    snd = txn.sender(queue)
    snd.send(Message("kept"))
    snd.send(Message("dropped-1"))
    observer = plain.receiver(f"{queue}; {{mode: browse}}")
    with pytest.raises(Exception):  # noqa: B017  (Empty: not committed yet)
        observer.fetch(timeout=0.5)
    txn.rollback()
    snd.send(Message("kept"))
    txn.commit()
    assert observer.fetch(timeout=10).content == "kept"
    observer.close()
    rcv = txn.receiver(queue)
    other = plain.receiver(queue)  # as Qpid's own txTest: the rolled back message comes back here
    assert rcv.fetch(timeout=10).content == "kept"
    txn.acknowledge()
    txn.rollback()  # the accept is discarded; qpid.messaging then releases what it held
    again = other.fetch(timeout=10)
    assert again.content == "kept" and again.redelivered
    plain.acknowledge()
    txn.commit()
    with pytest.raises(Exception):  # noqa: B017  (Empty: consumed)
        other.fetch(timeout=1)


def test_connection_each_accept_and_acquire_mode(session):
    """qpid.connection, message.subscribe (L5948ff) with each accept-mode (explicit 0, none 1) and
    acquire-mode (pre-acquired 0, not-acquired 1): a not-acquired transfer is taken with
    message.acquire (L5854ff), an explicit one settled with message.accept (L5752ff)."""
    from qpid.datatypes import Message, RangedSet

    ssn = session
    queue = _name("modes")
    ssn.queue_declare(queue=queue, exclusive=True)
    for i in range(4):
        ssn.message_transfer(destination="", message=Message(ssn.delivery_properties(routing_key=queue),
                                                              b"m%d" % i))
    assert ssn.queue_query(queue=queue).message_count == 4
    seen = []
    for accept in (ssn.accept_mode.explicit, ssn.accept_mode.none):
        for acquire in (ssn.acquire_mode.pre_acquired, ssn.acquire_mode.not_acquired):
            dest = f"d{accept}{acquire}"
            ssn.message_subscribe(queue=queue, destination=dest, accept_mode=accept, acquire_mode=acquire)
            ssn.message_flow(destination=dest, unit=ssn.credit_unit.message, value=1)
            ssn.message_flow(destination=dest, unit=ssn.credit_unit.byte, value=0xFFFFFFFF)
            msg = ssn.incoming(dest).get(timeout=10)
            if acquire == ssn.acquire_mode.not_acquired:
                acquired = ssn.message_acquire(RangedSet(msg.id))
                assert msg.id in acquired.transfers
            if accept == ssn.accept_mode.explicit:
                ssn.message_accept(RangedSet(msg.id))
            ssn.message_cancel(destination=dest)
            seen.append(msg.body)
    assert seen == [b"m0", b"m1", b"m2", b"m3"]
    assert ssn.queue_query(queue=queue).message_count == 0


def test_connection_window_flow_mode(session):
    """qpid.connection, message.set-flow-mode window (1, L6087ff): two messages of credit deliver two;
    message.set-flow-mode (L6097ff): "Completion of the transfer command with session.completed is the
    only way credit is implicitly updated; message.accept ... have no effect" -- so session.completed
    alone opens the window for the next two."""
    from qpid.datatypes import Message, RangedSet

    ssn = session
    queue = _name("window")
    ssn.queue_declare(queue=queue, exclusive=True)
    for i in range(4):
        ssn.message_transfer(destination="", message=Message(ssn.delivery_properties(routing_key=queue),
                                                              b"w%d" % i))
    ssn.message_subscribe(queue=queue, destination="w", accept_mode=ssn.accept_mode.explicit,
                          acquire_mode=ssn.acquire_mode.pre_acquired)
    ssn.message_set_flow_mode(destination="w", flow_mode=ssn.flow_mode.window)
    ssn.message_flow(destination="w", unit=ssn.credit_unit.message, value=2)
    ssn.message_flow(destination="w", unit=ssn.credit_unit.byte, value=0xFFFFFFFF)
    incoming = ssn.incoming("w")
    first = [incoming.get(timeout=10) for _ in range(2)]
    with pytest.raises(Exception):  # noqa: B017  (qpid.queue.Empty: the window is full)
        incoming.get(timeout=0.5)
    # As Qpid's own broker test (qpid_tests/broker_0_10/message.py, test_window_flow_messages) does:
    # session.completed for the two transfers, no accept yet.
    for m in first:
        ssn.receiver._completed.add(m.id)
    ssn.channel.session_completed(ssn.receiver._completed)
    rest = [incoming.get(timeout=10) for _ in range(2)]
    ssn.message_accept(RangedSet(*[m.id for m in first + rest]))
    assert [m.body for m in first + rest] == [b"w0", b"w1", b"w2", b"w3"]


def test_connection_queries(session):
    """qpid.connection: queue.query (L7912ff), exchange.query (L7300ff) and exchange.bound
    (L7509ff) results as Qpid's client reads them."""
    ssn = session
    queue = _name("query")
    ssn.queue_declare(queue=queue, exclusive=True, durable=False)
    ssn.exchange_bind(queue=queue, exchange="amq.direct", binding_key="k")
    found = ssn.queue_query(queue=queue)
    assert (found.queue, found.exclusive, found.message_count, found.subscriber_count) == (queue, True, 0, 0)
    assert not ssn.queue_query(queue=_name("missing")).queue
    direct = ssn.exchange_query(name="amq.direct")
    assert direct.type == "direct" and not direct.not_found
    assert ssn.exchange_query(name=_name("no-exchange")).not_found
    bound = ssn.exchange_bound(exchange="amq.direct", queue=queue, binding_key="k")
    assert not (bound.exchange_not_found or bound.queue_not_found or bound.key_not_matched)
    other = ssn.exchange_bound(exchange="amq.direct", queue=queue, binding_key="other")
    assert other.key_not_matched
