"""/management answers while other connections of the same client are stalled (issue 37, "never a hang").

Why this test: rabbitmq-amqp-python-client's suite, run in one pytest process, hung at the first
management request of 7 test_publisher.py tests and 2 test_fifo_consumer_* tests. The hang was
traced to the client side, not the node (docs/amqp10.md, "Management requests that never leave
the client"): the hung tests wrote no frame at all. Before them a consumer handler had raised the
client's ``ArgumentOutOfRangeException`` (a ``BaseException``) inside ``environment.close()``;
pytest's teardown catches only ``Exception``, so the ``connection`` fixture was never torn down and
the following tests got the same, cached ``Connection``, whose cached ``Management`` the previous
test had closed. A request on those detached links leaves nothing on the wire and ``receive()``
waits for ever.

What the node saw during that hang is what this test builds, with proton (and pika) over real
sockets: connections of the client that no longer read -- one holding unsettled deliveries
(credit 10, never settled), one whose receiver was given credit for megabytes so that the node's
write buffer towards it is full (``pause_writing``), each with a /management pair it detached
before stalling. The node must still answer, at once, /management requests on a fresh
connection, on a fresh pair attached after an earlier pair of the same connection was detached,
and a 0-9-1 client's declares: nothing a stalled connection holds (its consumer, its unsettled
deliveries, its paused writes) is a gate for anyone else. AMQP 1.0 2.6.7 (flow control is per
link) and 2.5.6 (session windows are per session): one peer's credit and windows never hold up
another's.

Found on the way (node-side, fixed in node/amqp10/management.py): with two /management pairs on one
session, answers went to the pair attached last; they now go to the pair of the same link name.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.reactor import LinkOption  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

QUEUE_SPEC = {"durable": True, "exclusive": False, "auto_delete": False,
              "arguments": {"x-queue-type": "quorum"}}
BODY = b"s" * 4096
FLOOD = 2000  # 8 MB offered to a receiver that never reads: far beyond the node's write high-water mark
STALLED = 64 * 1024  # unread bytes in that client's socket (its receive buffer; the rest waits in the node's)


@pytest.fixture(scope="module")
def compat_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("amqp10-stalled")
    config = directory / "node.toml"
    config.write_text('amqp10_rabbitmq_compat = true\n[users.guest]\npassword = "guest"\n'
                      'tags = ["administrator"]\n')
    node = RaftmqNode(directory / "data", config=config)
    with node:
        yield node


class Paired(LinkOption):
    """RabbitMQ 4's management link pair: property paired, /management on both ends, one name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def apply(self, link) -> None:
        link.properties = {proton.symbol("paired"): True}
        link.source.address = "/management"
        link.target.address = "/management"
        link.snd_settle_mode = proton.Link.SND_SETTLED


class Pair:
    """One /management link pair on ``conn`` (both links named alike, as RabbitMQ 4's clients do)."""

    def __init__(self, conn: BlockingConnection) -> None:
        name = f"management-link-pair-{uuid.uuid4().hex[:8]}"
        self.sender = conn.create_sender("/management", name=name, options=Paired(name))
        self.receiver = conn.create_receiver("/management", name=name, options=Paired(name))

    def request(self, method: str, path: str, body=None) -> tuple[str, object]:
        request_id = str(uuid.uuid4())
        self.sender.send(Message(id=request_id, address=path, subject=method, reply_to="$me", body=body))
        answer = self.receiver.receive(timeout=15)  # proton raises Timeout: a hang fails the test
        assert answer.correlation_id == request_id
        return answer.subject, answer.body

    def close(self) -> None:
        self.sender.close()
        self.receiver.close()


def connect(node: RaftmqNode) -> BlockingConnection:
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=15)


def publish_091(node: RaftmqNode, queue: str, count: int) -> None:
    params = pika.ConnectionParameters("127.0.0.1", node.port, credentials=pika.PlainCredentials("guest", "guest"))
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for _ in range(count):
            ch.basic_publish("", queue, BODY)
    finally:
        conn.close()


def unread_bytes_towards(conn: BlockingConnection) -> int:
    """Bytes the node sent that this (stalled) client has not read: its socket's receive queue."""
    import fcntl
    import struct
    import termios

    sock = None
    for sel in conn.container._global_handler.base._selector._selectables:  # proton's IO selector
        if sel.fileno() is not None and sel.fileno() >= 0:
            sock = sel.fileno()
    if sock is None:
        return 0
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0]


def test_management_answers_beside_connections_that_stopped_reading(compat_node) -> None:
    """Two connections stop reading: one holds 10 unsettled deliveries of a quorum queue (the
    suite's zombie consumer, whose handler raised), one was offered 8 MB it never reads (the node's
    writes to it are paused). Each detached its /management pair first, as the suite's tests do.
    Then every /management request -- on a fresh connection, and on a new pair of a connection that
    detached an earlier pair -- and a 0-9-1 declare are answered, and the stalled connections still
    hold what they held (nothing was dropped to make room)."""
    node = compat_node
    setup = connect(node)
    pair = Pair(setup)
    for name in ("stall-unsettled", "stall-flooded"):
        assert pair.request("PUT", f"/queues/{name}", QUEUE_SPEC)[0] == "201"
    pair.close()
    setup.close()
    publish_091(node, "stall-unsettled", 100)
    publish_091(node, "stall-flooded", FLOOD)

    zombie = connect(node)  # the consumer whose handler raised: its deliveries are never settled
    zpair = Pair(zombie)
    assert zpair.request("GET", "/queues/stall-unsettled")[0] == "200"
    zpair.close()
    held = zombie.create_receiver("/queues/stall-unsettled", credit=10)
    held.receive(timeout=15)  # one is in hand, unsettled; nine more arrive and are never read

    flooded = connect(node)
    fpair = Pair(flooded)
    assert fpair.request("GET", "/queues/stall-flooded")[0] == "200"
    fpair.close()
    flooded.create_receiver("/queues/stall-flooded", credit=FLOOD)  # and never read again
    deadline = time.monotonic() + 30
    while unread_bytes_towards(flooded) < STALLED and time.monotonic() < deadline:
        time.sleep(0.2)
    assert unread_bytes_towards(flooded) >= STALLED  # the stall is real: the client's socket is full

    fresh = connect(node)
    try:
        m = Pair(fresh)
        assert m.request("PUT", "/queues/after-stall", QUEUE_SPEC)[0] == "201"
        assert m.request("POST", "/bindings", {"source": "amq.direct", "binding_key": "k",
                                               "destination_queue": "after-stall", "arguments": {}})[0] == "204"
        for stalled_queue in ("stall-unsettled", "stall-flooded"):
            status, info = m.request("GET", f"/queues/{stalled_queue}")
            assert status == "200" and info["consumer_count"] == 1  # the stalled consumers are still there
        m.close()
        again = Pair(fresh)  # a new pair after the first was detached: the client's re-open
        assert again.request("DELETE", "/queues/after-stall") == ("200", {"message_count": 0})
    finally:
        fresh.close()

    params = pika.ConnectionParameters("127.0.0.1", node.port, credentials=pika.PlainCredentials("guest", "guest"),
                                       socket_timeout=15, blocked_connection_timeout=15)
    conn = pika.BlockingConnection(params)
    try:
        ch = conn.channel()
        assert ch.queue_declare("stall-091", durable=True).method.message_count == 0
        ch.queue_delete("stall-091")
    finally:
        conn.close()

    for stalled in (zombie, flooded):
        stalled.close()
    cleanup = connect(node)
    try:
        p = Pair(cleanup)
        # the unsettled and the unread deliveries went back to their queues with their connections
        assert p.request("DELETE", "/queues/stall-unsettled") == ("200", {"message_count": 100})
        assert p.request("DELETE", "/queues/stall-flooded") == ("200", {"message_count": FLOOD})
    finally:
        cleanup.close()


def test_a_request_on_a_closed_pair_is_never_answered_but_a_new_pair_is(compat_node) -> None:
    """The client-side half of the suite's hang, with proton: a request sent (pre-settled) on a
    management sender the client already closed raises nothing and puts nothing on the wire, so its
    answer never comes (here: proton's receive gives up after 2 s instead of waiting for ever); the
    node answers the same connection at once on a new pair (what re-opening the management does)."""
    node = compat_node
    conn = connect(node)
    try:
        pair = Pair(conn)
        assert pair.request("GET", "/queues/nope")[0] == "404"
        pair.close()
        pair.sender.send(Message(id="lost", address="/queues/nope", subject="GET", reply_to="$me"))
        with pytest.raises(Exception):  # noqa: B017 - Timeout or LinkDetached, by proton version
            pair.receiver.receive(timeout=2)
        assert Pair(conn).request("GET", "/queues/nope")[0] == "404"
    finally:
        conn.close()
    assert node.is_alive()


def test_two_management_pairs_on_one_session_each_get_their_answers(compat_node) -> None:
    """Two /management pairs on one session (proton's BlockingConnection puts every link on one
    session): each request is answered on the receiving link of its own pair, matched by link name
    as RabbitMQ 4 pairs them. Before, answers went to the pair attached last, so a request on the
    first pair was never answered and its client waited for ever (here: proton's Timeout)."""
    conn = connect(compat_node)
    try:
        first, second = Pair(conn), Pair(conn)
        assert second.request("GET", "/queues/pair-nope")[0] == "404"
        assert first.request("PUT", "/queues/pair-q", QUEUE_SPEC)[0] == "201"
        assert second.request("GET", "/queues/pair-q")[0] == "200"
        assert first.request("DELETE", "/queues/pair-q") == ("200", {"message_count": 0})
    finally:
        conn.close()
