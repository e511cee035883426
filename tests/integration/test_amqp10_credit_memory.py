"""AMQP 1.0 delivery memory is bounded by the session window and the write buffer, not by link credit
(issue 31, item 2).

The three reproductions of the issue, scaled to a few seconds on a private node (a 16 MiB body cache,
so that what the node holds for a link is not hidden by cached bodies), with hand-built 1.0 frames
(the project's codec) so that the session's incoming-window and the socket's reads are the test's:

1. a receiver whose session incoming-window is 0 grants link credit 100,000 on 100 x 1 MiB queued
   messages.  Spec 2.5.6: the sender MUST NOT send a transfer frame while the remote incoming-window
   is 0, so nothing may be sent -- and nothing may be read from disk for it either (before this change
   the node read and encoded every one into the session's parking: heap +109 MB, VmRSS +196 MB);
2. a receiver that never reads its socket, same backlog (before: the whole backlog encoded into the
   write buffer in one batch, heap +110 MB);
3. 20,000 unsettled deliveries on one link (small bodies): what the node keeps per unsettled
   delivery is the delivery id and the core transfer id, no body;
4. a PRE-SETTLED receiver (the core forgets a message once assigned, so the link must hold its body)
   with an open window, credit 100,000 and a socket it does not read: the link gives the core its
   credit in slices (links.OutgoingLink._presettled_slice), so the backlog stays queued (before: all
   100 assigned with their bodies in one batch); and a drain on such a link still uses up or returns
   all of the client's credit (2.6.7).

Each measures the node's RSS growth and another client's round trip (pika) during the attack, then
opens the window (or reads) and checks that every message arrives intact, in order, once.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, FrameReader, encode_frame

MB = 1 << 20
BACKLOG = 100  # x 1 MiB queued
BODY_SIZE = MB
CREDIT = 100_000
RSS_BOUND = 48 * MB  # what the node may grow by while it holds the backlog for the stalled receiver
READ_TIMEOUT = 10.0


@pytest.fixture(scope="module")
def node(broker_kind: str, tmp_path_factory) -> Iterator[RaftmqNode]:
    if broker_kind == "rabbitmq":
        pytest.skip("drives a private raftmq node")
    base = tmp_path_factory.mktemp("amqp10-credit")
    config = base / "raftmq.toml"
    config.write_text("disk_free_limit = 1\nbody_cache_bytes = 16777216\n"
                      '[users.guest]\npassword = "guest"\ntags = ["administrator"]\n')
    n = RaftmqNode(base / "data", config=config).start()
    yield n
    n.terminate()


def rss(pid: int, field: str = "RssAnon") -> int:
    """Resident anonymous memory of ``pid`` (Linux /proc): the node's heap.  Not VmRSS: that also counts
    the pages of LMDB's memory map the node's reads touched (file-backed, the kernel's page cache)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def body_of(i: int, size: int = BODY_SIZE) -> bytes:
    stamp = f"{i:08d}".encode()
    return (stamp * (size // len(stamp) + 1))[:size]


def pika_conn(n: RaftmqNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", n.port, credentials=pika.PlainCredentials("guest", "guest"),
        socket_timeout=15, blocked_connection_timeout=15))


def fill_queue(n: RaftmqNode, queue: str, count: int, size: int) -> None:
    conn = pika_conn(n)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", queue, body_of(i, size))
    finally:
        conn.close()


def queue_depth(n: RaftmqNode, queue: str) -> int:
    conn = pika_conn(n)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def round_trip_seconds(conn: pika.BlockingConnection, queue: str) -> float:
    """One publish-with-confirm and get by another client (its own connection): the loop is not held."""
    ch = conn.channel()
    ch.confirm_delivery()
    start = time.monotonic()
    ch.basic_publish("", queue, b"ping")
    deadline = start + 15
    while time.monotonic() < deadline:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None:
            assert body == b"ping"
            break
    else:
        raise AssertionError("the other client's round trip did not complete in 15 s")
    elapsed = time.monotonic() - start
    ch.close()
    return elapsed


class Receiver:
    """A 1.0 receiver over hand-built frames: one session, one link on ``queue``."""

    def __init__(self, port: int, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect: the window the kernel advertises stays small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(READ_TIMEOUT)
        self.sock.connect(("127.0.0.1", port))
        self.reader = FrameReader(1 << 24)
        self.pending: list = []
        self.buf = b""
        self.next_incoming_id = 0
        self.delivery_count = 0

    def _bytes(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self, timeout: float = READ_TIMEOUT):
        deadline = time.monotonic() + timeout
        while not self.pending:
            if self.buf:
                self.pending.extend(self.reader.feed(self.buf))
                self.buf = b""
                continue
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise EOFError("connection closed")
            self.pending.extend(self.reader.feed(chunk))
        return self.pending.pop(0)

    def performative(self):
        while True:
            frame = self.frame()
            if frame.performative is not None:
                return frame.performative

    def open(self, queue: str, window: int, settled: bool = False, max_frame: int = 65536) -> None:
        send = self.sock.sendall
        send(SASL_HEADER)
        assert self._bytes(8) == SASL_HEADER
        assert isinstance(self.performative(), p.SaslMechanisms)
        send(encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"), initial_response=b"\0guest\0guest"), 0,
                          frame_type=TYPE_SASL))
        assert self.performative().code == 0
        send(AMQP_HEADER)
        self.buf = b""
        assert self._bytes(8) == AMQP_HEADER
        send(encode_frame(p.Open(container_id="credit", max_frame_size=max_frame)))
        assert isinstance(self.performative(), p.Open)
        send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=window, outgoing_window=1000)))
        assert isinstance(self.performative(), p.Begin)
        send(encode_frame(p.Attach(name="credit", handle=0, role=True, snd_settle_mode=1 if settled else 0,
                                   rcv_settle_mode=0, source=p.Source(address=f"/queues/{queue}"),
                                   target=p.Target())))
        assert isinstance(self.performative(), p.Attach)

    def flow(self, window: int, credit: int, drain: bool = False, echo: bool = False) -> None:
        self.sock.sendall(encode_frame(p.Flow(
            next_incoming_id=self.next_incoming_id, incoming_window=window, next_outgoing_id=0,
            outgoing_window=1000, handle=0, delivery_count=self.delivery_count, link_credit=credit,
            drain=drain, echo=echo)))

    def deliveries(self, n: int, window: int, timeout: float = 30.0) -> list[tuple[int, bytes]]:
        """The next ``n`` deliveries, (delivery id, data section), transfers of one delivery joined;
        the session window is widened to ``window`` again each time half of it was used."""
        out: list[tuple[int, bytes]] = []
        parts: list[bytes] = []
        first_id = None
        used = 0
        deadline = time.monotonic() + timeout
        while len(out) < n:
            frame = self.frame(max(0.1, deadline - time.monotonic()))
            body = frame.performative
            if not isinstance(body, p.Transfer):
                continue
            self.next_incoming_id += 1
            used += 1
            if first_id is None:
                first_id = body.delivery_id
            parts.append(frame.payload)
            if not body.more:
                sections = p.decode_sections(b"".join(parts))
                data = b"".join(s.value for s in sections if isinstance(s, p.Data))
                out.append((first_id, data))
                self.delivery_count += 1
                parts, first_id = [], None
            if used >= window // 2:
                used = 0
                self.flow(window, CREDIT - self.delivery_count)
        return out

    def accept(self, first: int, last: int) -> None:
        self.sock.sendall(encode_frame(p.Disposition(role=True, first=first, last=last, settled=True,
                                                     state=p.Accepted())))

    def detach(self) -> None:
        """Detach (closed) and wait for the answer: settlements read before it are applied first
        (links.OutgoingLink.release), and what is still unsettled returns to the queue."""
        self.sock.sendall(encode_frame(p.Detach(handle=0, closed=True)))
        while not isinstance(self.performative(), p.Detach):
            pass

    def close(self) -> None:
        self.sock.close()


def probe_for(n: RaftmqNode, queue: str, seconds: float) -> tuple[int, float]:
    """The node's peak RSS and another pika client's worst round trip over ``seconds`` (a stalled
    client holds the node meanwhile; nothing is waited for)."""
    conn = pika_conn(n)
    probe = f"{queue}-probe"
    conn.channel().queue_declare(probe, exclusive=True)
    worst, peak = 0.0, 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            worst = max(worst, round_trip_seconds(conn, probe))
            peak = max(peak, rss(n.pid))
            time.sleep(0.05)
    finally:
        conn.close()
    return peak, worst


def measure_during(n: RaftmqNode, queue: str, hold: float) -> tuple[int, float]:
    """RSS growth of the node (its peak over ``hold`` seconds after the queue was fully assigned) and the
    worst round trip of another pika client over that time."""
    conn = pika_conn(n)
    probe = f"{queue}-probe"
    conn.channel().queue_declare(probe, exclusive=True)
    worst, peak = 0.0, 0
    try:
        deadline = time.monotonic() + 20
        while queue_depth(n, queue) > 0 and time.monotonic() < deadline:
            worst = max(worst, round_trip_seconds(conn, probe))
            peak = max(peak, rss(n.pid))
        assert queue_depth(n, queue) == 0, "the link's credit covers the backlog: the core assigns all of it"
        end = time.monotonic() + hold
        while time.monotonic() < end:
            worst = max(worst, round_trip_seconds(conn, probe))
            peak = max(peak, rss(n.pid))
            time.sleep(0.05)
    finally:
        conn.close()
    return peak, worst


def check_all(got: list[tuple[int, bytes]], count: int, size: int) -> None:
    assert len(got) == count
    for i, (_delivery_id, data) in enumerate(got):
        assert len(data) == size and data == body_of(i, size), f"delivery {i} is not message {i} intact"
    ids = [d for d, _ in got]
    assert ids == list(range(ids[0], ids[0] + count))  # one delivery id each, none skipped or repeated


@pytest.mark.parametrize("settled", [False, True], ids=["unsettled", "presettled"])
def test_window_zero_receiver_with_huge_credit_holds_no_backlog(node, settled: bool) -> None:
    """Issue 31 item 2, first reproduction: incoming-window 0 and link credit 100,000 on 100 x 1 MiB
    queued.  Spec 2.5.6 (session flow control): no transfer while the remote incoming-window is 0 --
    none arrives -- and the node keeps only references meanwhile: its heap grows by less than 48 MB
    (before this change: each body read and encoded, +109 MB).  A pre-settled link's deliveries carry their bodies (the
    core forgot the messages): the link stops the core assigning past what it holds.  Then the
    receiver opens its window (16 frames at a time, 64 KiB frames: 1 MiB deliveries span 17 frames,
    so deliveries are cut at the window, 2.5.6) and gets all 100, intact, in order; the queue is empty."""
    queue = f"credit-window0-{'settled' if settled else 'unsettled'}"
    fill_queue(node, queue, BACKLOG, BODY_SIZE)
    time.sleep(0.5)
    before = rss(node.pid)
    rx = Receiver(node.port)
    try:
        rx.open(queue, window=0, settled=settled)
        rx.flow(window=0, credit=CREDIT)
        if settled:  # the core stops at what the link holds: the rest stays queued
            time.sleep(1.5)
            conn = pika_conn(node)
            probe = f"{queue}-probe"
            conn.channel().queue_declare(probe, exclusive=True)
            worst = max(round_trip_seconds(conn, probe) for _ in range(5))
            conn.close()
            peak = rss(node.pid)
            assert queue_depth(node, queue) == BACKLOG  # no credit given to the core while blocked
        else:
            peak, worst = measure_during(node, queue, 1.5)
        growth = peak - before
        print(f"\nwindow 0, {'pre-settled' if settled else 'unsettled'}: RSS {before / MB:.0f} -> "
              f"{peak / MB:.0f} MB (+{growth / MB:.1f}); other client's worst round trip {worst * 1000:.0f} ms; VmRSS now {rss(node.pid, 'VmRSS') / MB:.0f} MB")
        with pytest.raises((TimeoutError, socket.timeout)):
            while True:  # nothing but flows: not one transfer frame inside a zero window
                frame = rx.frame(timeout=0.3)
                assert not isinstance(frame.performative, p.Transfer), "transfer sent into a zero window"
        assert growth < RSS_BOUND, f"RSS grew {growth / MB:.0f} MB holding deliveries for a zero window"
        rx.flow(window=16, credit=CREDIT)
        got = rx.deliveries(BACKLOG, window=16)
        check_all(got, BACKLOG, BODY_SIZE)
        if not settled:
            rx.accept(got[0][0], got[-1][0])
        rx.detach()
    finally:
        rx.close()
    assert queue_depth(node, queue) == 0  # every message delivered once and accepted (or pre-settled)


def test_receiver_that_never_reads_holds_no_backlog(node) -> None:
    """Issue 31 item 2, second reproduction: a receiver with an open window and credit 100,000 that
    never reads its socket (a 64 KiB receive buffer).  The node writes until its write buffer passes
    write_buffer_high, then keeps references only (node/writeflow.py's rule, as 0-9-1): its heap grows by
    less than 48 MB (before: the whole backlog was encoded into the write buffer in one batch, +110 MB).  Then the
    receiver reads: all 100, intact, in order."""
    queue = "credit-unread"
    fill_queue(node, queue, BACKLOG, BODY_SIZE)
    time.sleep(0.5)
    before = rss(node.pid)
    rx = Receiver(node.port, rcvbuf=65536)
    try:
        rx.open(queue, window=100_000)
        rx.flow(window=100_000, credit=CREDIT)
        peak, worst = measure_during(node, queue, 1.5)
        growth = peak - before
        print(f"\nunread socket: RSS {before / MB:.0f} -> {peak / MB:.0f} MB (+{growth / MB:.1f}); "
              f"other client's worst round trip {worst * 1000:.0f} ms; VmRSS now {rss(node.pid, 'VmRSS') / MB:.0f} MB")
        assert growth < RSS_BOUND, f"RSS grew {growth / MB:.0f} MB for a receiver that does not read"
        got = rx.deliveries(BACKLOG, window=100_000)
        check_all(got, BACKLOG, BODY_SIZE)
        rx.accept(got[0][0], got[-1][0])
        rx.detach()
    finally:
        rx.close()
    assert queue_depth(node, queue) == 0


def test_twenty_thousand_unsettled_deliveries(node) -> None:
    """Issue 31 item 2, third reproduction: 20,000 deliveries of 1 KiB sent and left unsettled on one
    link.  The node keeps, per unsettled delivery, the delivery id and the core's transfer id (no body,
    no encoded frame): the heap grows by less than 48 MB (+10 to +18 MB measured before and after this
    change: this reproduction, with raw frames and 1 KiB bodies, does not show the issue's +87 MB), another client's
    round trip completes throughout, and all 20,000 arrive in order; settled at once, the queue empties."""
    queue, count, size = "credit-unsettled", 20_000, 1024
    conn = pika_conn(node)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", queue, body_of(i, size))
    finally:
        conn.close()
    time.sleep(0.5)
    before = rss(node.pid)
    rx = Receiver(node.port)
    try:
        rx.open(queue, window=100_000)
        rx.flow(window=100_000, credit=CREDIT)
        got = rx.deliveries(count, window=100_000, timeout=60)
        peak, worst = measure_during(node, queue, 1.0)
        growth = peak - before
        print(f"\n20k unsettled: RSS {before / MB:.0f} -> {peak / MB:.0f} MB (+{growth / MB:.1f}); "
              f"other client's worst round trip {worst * 1000:.0f} ms; VmRSS now {rss(node.pid, 'VmRSS') / MB:.0f} MB")
        check_all(got, count, size)
        assert growth < RSS_BOUND, f"RSS grew {growth / MB:.0f} MB for 20k unsettled deliveries"
        rx.accept(got[0][0], got[-1][0])
        rx.detach()
    finally:
        rx.close()
    assert queue_depth(node, queue) == 0  # all settled: none returned to the queue


def test_accept_then_socket_closed_at_once_is_not_redelivered(node) -> None:
    """Spec 2.6.12: a delivery the receiver settled (accepted, settled=true) is done; the node batches
    settlements for SETTLE_DELAY, and a socket closed right after the disposition (no detach, no
    close frame) must not lose them: the messages were accepted and must not come back."""
    queue = "credit-accept-then-drop"
    fill_queue(node, queue, 10, 1024)
    rx = Receiver(node.port)
    try:
        rx.open(queue, window=1000)
        rx.flow(window=1000, credit=10)
        got = rx.deliveries(10, window=1000)
        check_all(got, 10, 1024)
        rx.accept(got[0][0], got[-1][0])
    finally:
        rx.close()  # at once: the settlement timer has not fired yet
    deadline = time.monotonic() + 5
    while queue_depth(node, queue) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the connection's close has been applied: unsettled ones would be back by now
    assert queue_depth(node, queue) == 0


def test_presettled_receiver_that_never_reads_holds_no_backlog(node) -> None:
    """Issue 31 item 2, the pre-settled case: snd-settle-mode settled, an open window (100,000) and link
    credit 100,000 on 100 x 1 MiB queued, a socket that is not read (64 KiB receive buffer).  The core
    forgets a pre-settled message when it assigns it, so whatever it assigns the link holds with its
    body: the link gives the core credit in slices, topped up as deliveries are written, and the
    backlog stays queued while the socket takes nothing.  The heap grows by less than 48 MB (before:
    all 100 assigned in one batch), another client's round trip completes throughout; then the
    receiver reads: all 100, intact, in order, once (2.6.12 at-most-once: none lost), queue empty, and
    an echo flow reports delivery-count 100 and the client's link-credit (2.6.7), not the slice."""
    queue = "credit-unread-presettled"
    fill_queue(node, queue, BACKLOG, BODY_SIZE)
    time.sleep(0.5)
    before = rss(node.pid)
    rx = Receiver(node.port, rcvbuf=65536)
    try:
        rx.open(queue, window=100_000, settled=True)
        rx.flow(window=100_000, credit=CREDIT)
        peak, worst = probe_for(node, queue, 2.0)
        depth = queue_depth(node, queue)
        growth = peak - before
        print(f"\nunread socket, pre-settled: RSS {before / MB:.0f} -> {peak / MB:.0f} MB (+{growth / MB:.1f}); "
              f"other client's worst round trip {worst * 1000:.0f} ms; {depth} of {BACKLOG} still queued")
        assert growth < RSS_BOUND, f"RSS grew {growth / MB:.0f} MB for a pre-settled receiver that does not read"
        assert depth > BACKLOG // 2, f"only {depth} left queued: credit pulled the backlog off the queue"
        got = rx.deliveries(BACKLOG, window=100_000)
        check_all(got, BACKLOG, BODY_SIZE)
        # 2.6.7: an echo is answered with the sender's view of the client's credit, not the slice
        rx.flow(window=100_000, credit=CREDIT - BACKLOG, echo=True)
        while True:
            frame = rx.performative()
            if isinstance(frame, p.Flow) and frame.handle == 0 and frame.delivery_count == BACKLOG:
                break
        assert frame.link_credit == CREDIT - BACKLOG
        rx.detach()
    finally:
        rx.close()
    assert queue_depth(node, queue) == 0


@pytest.mark.parametrize("credit", [1000, 300])
def test_presettled_drain_uses_up_or_returns_all_credit(node, credit: int) -> None:
    """Spec 2.6.7 (flow control, drain): with drain set the sender sends all available messages, then
    advances its delivery-count to use up all link-credit and sends its flow state.  On a pre-settled
    link whose credit is given to the core in slices: 600 x 1 KiB queued (more than one slice), a
    drain with credit 1,000 delivers all 600 in order and then a flow with delivery-count 1,000 and
    link-credit 0; with credit 300, exactly 300 arrive (the credit is used up by deliveries) and 300 stay
    queued.  Either way an echo flow afterwards reports delivery-count = credit, link-credit 0."""
    queue, count, size = f"credit-drain-presettled-{credit}", 600, 1024
    fill_queue(node, queue, count, size)
    rx = Receiver(node.port)
    try:
        rx.open(queue, window=100_000, settled=True)
        rx.flow(window=100_000, credit=credit, drain=True)
        got = rx.deliveries(min(count, credit), window=100_000)
        check_all(got, min(count, credit), size)
        rx.flow(window=100_000, credit=0, echo=True)  # the receiver's view: delivery-count advanced by what arrived
        deadline = time.monotonic() + READ_TIMEOUT
        state = None
        while time.monotonic() < deadline:
            frame = rx.performative()
            assert not isinstance(frame, p.Transfer), "a transfer beyond the drained credit"
            if isinstance(frame, p.Flow) and frame.handle == 0 and frame.delivery_count == credit:
                state = frame
                break
        assert state is not None, "no flow reporting the credit used up"
        assert state.link_credit == 0
        rx.detach()
    finally:
        rx.close()
    assert queue_depth(node, queue) == max(0, count - credit)
