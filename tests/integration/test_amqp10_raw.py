"""AMQP 1.0 front end with hand-built frames: handshake rules, limits and error conditions, and a
hypothesis fuzz of everything a client can send before it is authenticated.

Spec: /work/shared/specs/amqp-1-0.txt -- 2.2 protocol header negotiation, 2.3.1 frame layout, 2.4.5
idle time-out, 2.7.1 max-frame-size and channel-max, 2.7.2 handle-max, 2.8.15/2.8.16 error conditions,
5.3 SASL (5.3.1: SASL frames of at most 512 octets).  Every read is bounded.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, FrameReader, encode_frame

READ_TIMEOUT = 5.0


@pytest.fixture(autouse=True)
def _raftmq_only(broker) -> None:
    if broker.kind != "raftmq":
        pytest.skip("RabbitMQ 3.10's 1.0 plugin is not enabled in the reference peer")


class Raw:
    """A socket speaking 1.0 frames through the project's codec."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT)
        self.reader = FrameReader(1 << 20)
        self.pending: list = []
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def header(self) -> bytes:
        while len(self.buf) < 8:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise EOFError("closed before a header")
            self.buf += chunk
        head, self.buf = self.buf[:8], self.buf[8:]
        return head

    def frame(self, timeout: float = READ_TIMEOUT):
        deadline = time.monotonic() + timeout
        while not self.pending:
            if self.buf:
                self.pending.extend(self.reader.feed(self.buf))
                self.buf = b""
                continue
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.pending.extend(self.reader.feed(chunk))
        return self.pending.pop(0)

    def performative(self, timeout: float = READ_TIMEOUT):
        while True:
            frame = self.frame(timeout)
            if frame.performative is not None:
                return frame.performative

    def closed(self, timeout: float = READ_TIMEOUT) -> bool:
        """True when the server ends the connection within ``timeout`` (anything it sends is read)."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not self.sock.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return False

    def login(self, container_id: str = "raw") -> None:
        """SASL PLAIN as guest, then the AMQP header and open; returns after the server's open."""
        self.send(SASL_HEADER)
        assert self.header() == SASL_HEADER
        assert isinstance(self.performative(), p.SaslMechanisms)
        self.send(encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"), initial_response=b"\0guest\0guest"), 0,
                               frame_type=TYPE_SASL))
        assert self.performative().code == 0
        self.send(AMQP_HEADER)
        assert self.header() == AMQP_HEADER
        self.send(encode_frame(p.Open(container_id=container_id)))
        opened = self.performative()
        assert isinstance(opened, p.Open)
        self.open = opened

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw(broker):
    client = Raw(broker.port)
    yield client
    client.close()


def _expect_close(raw: Raw, condition: str) -> None:
    while True:
        body = raw.performative()
        if isinstance(body, p.Close):
            assert body.error is not None and body.error.condition == condition, body
            return


def test_amqp_header_without_sasl_is_answered_with_sasl_header(raw) -> None:
    """2.2 / 5.3.1: ANONYMOUS is off by default, so a client skipping SASL gets the SASL header, then EOF."""
    raw.send(AMQP_HEADER)
    assert raw.header() == SASL_HEADER
    assert raw.closed()


def test_open_announces_limits(raw) -> None:
    """2.7.1: our open carries max-frame-size, channel-max (amqp10_session_max 64 - 1) and idle-time-out."""
    raw.login()
    assert raw.open.max_frame_size == 131072 and raw.open.channel_max == 63 and raw.open.idle_time_out


def test_oversized_sasl_frame_before_authentication(raw) -> None:
    """5.3.1: SASL frames are at most 512 octets: a larger one ends the connection before it is buffered."""
    raw.send(SASL_HEADER)
    assert raw.header() == SASL_HEADER
    raw.send(struct.pack(">IBBH", 1 << 30, 2, 1, 0))
    assert raw.closed()


def test_frame_beyond_max_frame_size_is_framing_error(raw) -> None:
    """2.7.1: a frame larger than the max-frame-size we announced: close with framing-error."""
    raw.login()
    raw.send(struct.pack(">IBBH", 131072 + 1, 2, 0, 0))
    _expect_close(raw, "amqp:connection:framing-error")


def test_channel_beyond_channel_max(raw) -> None:
    raw.login()
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10), channel=4000))
    _expect_close(raw, "amqp:connection:framing-error")


def test_handle_beyond_handle_max(raw) -> None:
    """2.7.2 handle-max: a handle outside the range closes the connection with framing-error."""
    raw.login()
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10, handle_max=10)))
    begun = raw.performative()
    assert isinstance(begun, p.Begin) and begun.handle_max == 10
    raw.send(encode_frame(p.Attach(name="x", handle=11, role=False, target=p.Target(address="/queues/x"),
                                   initial_delivery_count=0)))
    _expect_close(raw, "amqp:connection:framing-error")


def test_flow_on_unattached_handle_ends_session(raw) -> None:
    """2.8.17 amqp:session:unattached-handle ends the session, not the connection."""
    raw.login()
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)))
    assert isinstance(raw.performative(), p.Begin)
    raw.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=10, next_outgoing_id=0, outgoing_window=10,
                                 handle=3, delivery_count=0, link_credit=5)))
    end = raw.performative()
    assert isinstance(end, p.End) and end.error.condition == "amqp:session:unattached-handle"


def test_idle_timeout_keepalive(raw) -> None:
    """2.4.5: the client asks for 400 ms; we send (empty) frames at least every 200 ms."""
    raw.send(SASL_HEADER)
    raw.header()
    raw.performative()
    raw.send(encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"), initial_response=b"\0guest\0guest"), 0,
                          frame_type=TYPE_SASL))
    raw.performative()
    raw.send(AMQP_HEADER)
    raw.header()
    raw.send(encode_frame(p.Open(container_id="idle", idle_time_out=400)))
    assert isinstance(raw.performative(), p.Open)
    start = time.monotonic()
    empties = 0
    while time.monotonic() - start < 1.0:
        if raw.frame(timeout=1.0).performative is None:
            empties += 1
    assert empties >= 3


def test_decode_error_closes_with_condition(raw) -> None:
    """2.8.15 amqp:decode-error for a frame body that is no performative."""
    raw.login()
    raw.send(struct.pack(">IBBH", 8 + 3, 2, 0, 0) + b"\x00\x53\xff")
    _expect_close(raw, "amqp:decode-error")


# ---------------------------------------------------------------------------------------------- fuzz

def _valid_prefix() -> bytes:
    init = encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"), initial_response=b"\0guest\0guest"), 0,
                        frame_type=TYPE_SASL)
    return init + AMQP_HEADER + encode_frame(p.Open(container_id="fuzz", max_frame_size=512))


def _mutate(data: bytes, flips: list[tuple[int, int]], cut: int) -> bytes:
    out = bytearray(data)
    for pos, value in flips:
        out[pos % len(out)] = value
    return bytes(out[:max(1, cut % (len(out) + 1))])


FILLER = b"\x00" * 4200  # completes any frame the server may accept before open, then a size-0 header


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.fixture(scope="module")
def fuzz_budget(broker):
    """Time and memory bounds for the whole fuzz: the node's RSS may grow by at most 64 MB."""
    pid = broker.process.pid
    before = _rss_kb(pid)
    started = time.monotonic()
    yield
    assert time.monotonic() - started < 240
    assert _rss_kb(pid) - before < 64 * 1024, "the node held on to memory after the pre-authentication fuzz"


@settings(max_examples=int(60 * float(os.environ.get("RAFTMQ_FUZZ_SCALE", "1"))), deadline=None,
          derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(["random", "mutated", "sasl-frames"]),
       data=st.binary(max_size=2048),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       cut=st.integers(0, 10_000),
       frames=st.lists(st.tuples(st.integers(0, 1), st.binary(max_size=600)), max_size=4))
def test_fuzz_before_authentication(broker, fuzz_budget, kind, data, flips, cut, frames) -> None:
    """Whatever arrives after the SASL header, the node ends the connection (or keeps serving it) without
    hanging, and a new client still gets the SASL header: limits hold before authentication."""
    client = Raw(broker.port)
    try:
        client.send(SASL_HEADER)
        if kind == "random":
            payload = data
        elif kind == "mutated":
            payload = _mutate(_valid_prefix(), flips, cut)
        else:
            payload = b"".join(struct.pack(">IBBH", 8 + len(body), 2, ftype, 0) + body for ftype, body in frames)
        try:
            client.send(payload + FILLER)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed already: what we want
        assert client.closed(timeout=5.0), "the connection was neither closed nor failed after the filler"
    finally:
        client.close()
    probe = Raw(broker.port)
    try:
        probe.send(SASL_HEADER)
        assert probe.header() == SASL_HEADER
    finally:
        probe.close()


# ---------------------------------------------------------------------------------------------- a node configured for ANONYMOUS

@pytest.fixture(scope="module")
def anonymous_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("amqp10-anon")
    config = directory / "node.toml"
    config.write_text('amqp10_anonymous_user = "guest"\nhandshake_timeout = 1.0\nmax_connections = 3\nheartbeat = 1\n'
                      '[users.guest]\npassword = "guest"\n'
                      '[users.limited]\npassword = "pw"\npermissions = {"/" = ["", "^amq\\\\.default$", "^mine$"]}\n')
    node = RaftmqNode(directory / "data", config=config)
    with node:
        yield node


def test_anonymous_when_configured(anonymous_node) -> None:
    """5.3.3.1: ANONYMOUS is offered only when configured; a client without SASL is then let in too."""
    from proton import Message
    from proton.utils import BlockingConnection

    raw = Raw(anonymous_node.port)
    raw.send(SASL_HEADER)
    raw.header()
    mechanisms = raw.performative()
    assert set(mechanisms.sasl_server_mechanisms) == {"PLAIN", "ANONYMOUS"}
    raw.close()
    conn = BlockingConnection(f"amqp://127.0.0.1:{anonymous_node.port}", timeout=10,
                              allowed_mechs="ANONYMOUS")
    try:
        conn.create_sender("/queues/anon-missing")
    except Exception as exc:  # the queue does not exist: the login worked, the link is refused
        assert "amqp:not-found" in str(exc)
    conn.close()
    del Message
    raw = Raw(anonymous_node.port)
    raw.send(AMQP_HEADER)
    assert raw.header() == AMQP_HEADER
    raw.send(encode_frame(p.Open(container_id="no-sasl")))
    assert isinstance(raw.performative(), p.Open)
    raw.close()


def test_idle_timeout_closes_a_silent_client(anonymous_node) -> None:
    """2.4.5: we announce idle-time-out 1000 ms (heartbeat = 1); a client silent for twice that is closed
    with amqp:resource-limit-exceeded."""
    raw = Raw(anonymous_node.port)
    try:
        raw.login()
        assert raw.open.idle_time_out == 1000
        started = time.monotonic()
        _expect_close(raw, "amqp:resource-limit-exceeded")
        assert 1.0 <= time.monotonic() - started <= 4.5
    finally:
        raw.close()


def test_permissions_are_the_cores(anonymous_node) -> None:
    """Access.authorize decides: read on the source queue, write on the target exchange (RabbitMQ's rules);
    a refusal is a null terminus and a detach with amqp:unauthorized-access (2.6.3)."""
    import pika
    from proton import Message
    from proton.utils import BlockingConnection, LinkDetached

    admin = pika.BlockingConnection(pika.ConnectionParameters(port=anonymous_node.port))
    channel = admin.channel()
    for name in ("mine", "theirs"):
        channel.queue_declare(name)
    admin.close()
    conn = BlockingConnection(f"amqp://limited:pw@127.0.0.1:{anonymous_node.port}", timeout=10)
    try:
        with pytest.raises(LinkDetached) as info:
            conn.create_receiver("/queues/theirs")
        assert "amqp:unauthorized-access" in str(info.value)
        with pytest.raises(LinkDetached) as info:
            conn.create_sender("/exchanges/amq.fanout")
        assert "amqp:unauthorized-access" in str(info.value)
        conn.create_sender("/queues/mine").send(Message(body="ok"))  # write on amq.default
        receiver = conn.create_receiver("/queues/mine", credit=1)
        assert receiver.receive(timeout=10).body == "ok"
        receiver.accept()
    finally:
        conn.close()


def test_handshake_timeout_and_connection_limit(anonymous_node) -> None:
    """A client that sends the SASL header and nothing more is closed after handshake_timeout; with
    max_connections = 3 a fourth concurrent connection is refused at SASL (sys-temp)."""
    time.sleep(0.5)  # the earlier tests' sockets are gone from the node's count
    idle = Raw(anonymous_node.port)
    idle.send(SASL_HEADER)
    idle.header()
    started = time.monotonic()
    assert idle.closed(timeout=5.0)
    assert time.monotonic() - started < 3.0
    idle.close()
    held = []
    for _ in range(3):
        client = Raw(anonymous_node.port)
        client.send(SASL_HEADER)
        client.header()
        held.append(client)
    fourth = Raw(anonymous_node.port)
    fourth.send(SASL_HEADER)
    fourth.header()
    fourth.performative()
    fourth.send(encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"), initial_response=b"\0guest\0guest"), 0,
                             frame_type=TYPE_SASL))
    outcome = fourth.performative()
    assert outcome.code == 4  # sys-temp: try again later
    for client in [*held, fourth]:
        client.close()


# ---------------------------------------------------------------------------------------------- link recovery

def _transfers(raw: Raw, n: int) -> list[tuple[bytes, int, bytes, bool]]:
    """The next ``n`` deliveries: (tag, delivery id, body, resume)."""
    out = []
    while len(out) < n:
        frame = raw.frame()
        if isinstance(frame.performative, p.Transfer):
            body = [s for s in p.decode_sections(frame.payload) if isinstance(s, p.Data)][0].value
            out.append((frame.performative.delivery_tag, frame.performative.delivery_id, body,
                        frame.performative.resume))
    return out


def _durable_receiver(raw: Raw, queue: str, unsettled=None) -> p.Attach:
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=1000, outgoing_window=1000)))
    assert isinstance(raw.performative(), p.Begin)
    raw.send(encode_frame(p.Attach(name="durable-1", handle=0, role=True, snd_settle_mode=0, rcv_settle_mode=1,
                                   source=p.Source(address=f"/queues/{queue}", durable=2, timeout=30),
                                   target=p.Target(), unsettled=unsettled)))
    attach = raw.performative()
    assert isinstance(attach, p.Attach) and attach.source is not None
    return attach


def _queue_with(broker, prefix: str, count: int):
    """A fresh queue holding ``count`` messages b"0", b"1"... published with pika:
    (connection, channel, queue name)."""
    import pika

    queue = f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"
    admin = pika.BlockingConnection(pika.ConnectionParameters(port=broker.port))
    channel = admin.channel()
    channel.queue_declare(queue)
    for i in range(count):
        channel.basic_publish("", queue, str(i).encode())
    return admin, channel, queue


def test_durable_link_recovery(broker) -> None:
    """2.6.13: a receiver with a durable source (unsettled-state) loses its connection with 3 deliveries
    unsettled; re-attached by name on a new connection, it is told their tags, the outcome it reports for
    one (accepted) is applied without a resend, the other two are sent again with the same tags, and
    nothing else (the two settled before the loss are not repeated)."""
    admin, channel, queue = _queue_with(broker, "a10-durable", 5)
    first = Raw(broker.port)
    first.login("container-durable")
    _durable_receiver(first, queue)
    first.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=0,
                                   outgoing_window=1000, handle=0, delivery_count=0, link_credit=5)))
    got = _transfers(first, 5)
    assert [body for _t, _d, body, _r in got] == [b"0", b"1", b"2", b"3", b"4"]
    tags = [tag for tag, _d, _b, _r in got]
    first.send(encode_frame(p.Disposition(role=True, first=got[0][1], last=got[1][1], settled=True,
                                          state=p.Accepted())))
    first.send(encode_frame(p.Flow(next_incoming_id=5, incoming_window=1000, next_outgoing_id=0,
                                   outgoing_window=1000, handle=0, delivery_count=5, link_credit=0, echo=True)))
    while not isinstance(first.performative(), p.Flow):  # a barrier: the disposition was read
        pass
    first.sock.close()  # the connection is lost: no detach

    second = Raw(broker.port)
    try:
        second.login("container-durable")
        attach = _durable_receiver(second, queue, unsettled={tags[2]: p.Accepted()})
        assert set(attach.unsettled or {}) == {tags[3], tags[4]}  # 2 was settled by the client's outcome
        second.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=0,
                                        outgoing_window=1000, handle=0, delivery_count=0, link_credit=10)))
        again = _transfers(second, 2)
        assert [(tag, body) for tag, _d, body, _r in again] == [(tags[3], b"3"), (tags[4], b"4")]
        with pytest.raises((TimeoutError, socket.timeout)):
            second.frame(timeout=0.7)  # nothing else: 0, 1 (settled) and 2 (accepted on re-attach) are done
        second.send(encode_frame(p.Disposition(role=True, first=again[0][1], last=again[1][1], settled=True,
                                               state=p.Accepted())))
        second.send(encode_frame(p.Detach(handle=0, closed=True)))
        assert isinstance(second.performative(), p.Detach)
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        second.close()
        admin.close()


def test_read_ahead_never_exceeds_credit_and_releases_what_it_held(broker) -> None:
    """node/amqp10/links.py read-ahead (client credit >= 32): the core is given more than the client's
    credit, yet the client gets exactly its credit (2.6.7: the sender MUST NOT send more); drain (2.6.7)
    sends what is available up to the credit and ends with the credit used; on detach the deliveries
    held on the node, never sent, go back to the queue not marked redelivered."""
    admin, channel, queue = _queue_with(broker, "a10-readahead", 100)
    raw = Raw(broker.port)
    try:
        raw.login("readahead")
        raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=1000, outgoing_window=1000)))
        assert isinstance(raw.performative(), p.Begin)
        raw.send(encode_frame(p.Attach(name="ra", handle=0, role=True, snd_settle_mode=0, rcv_settle_mode=0,
                                       source=p.Source(address=f"/queues/{queue}"), target=p.Target())))
        assert isinstance(raw.performative(), p.Attach)
        raw.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=0,
                                     outgoing_window=1000, handle=0, delivery_count=0, link_credit=40)))
        first = _transfers(raw, 40)
        assert [body for _t, _d, body, _r in first] == [str(i).encode() for i in range(40)]
        with pytest.raises((TimeoutError, socket.timeout)):
            raw.frame(timeout=0.5)  # not one more than the credit, though the core was given more
        raw.send(encode_frame(p.Flow(next_incoming_id=40, incoming_window=1000, next_outgoing_id=0,
                                     outgoing_window=1000, handle=0, delivery_count=40, link_credit=40,
                                     drain=True)))
        second = _transfers(raw, 40)
        assert [body for _t, _d, body, _r in second] == [str(i).encode() for i in range(40, 80)]
        with pytest.raises((TimeoutError, socket.timeout)):
            raw.frame(timeout=0.5)  # the deliveries used the drained credit up: no flow follows (2.6.7)
        raw.send(encode_frame(p.Flow(next_incoming_id=80, incoming_window=1000, next_outgoing_id=0,
                                     outgoing_window=1000, handle=0, delivery_count=80, link_credit=40,
                                     drain=True)))
        third = _transfers(raw, 20)
        assert [body for _t, _d, body, _r in third] == [str(i).encode() for i in range(80, 100)]
        flow = raw.performative()  # 20 of 40 sent: the rest of the credit is used up and said so
        assert isinstance(flow, p.Flow) and flow.drain and flow.link_credit == 0 and flow.delivery_count == 120
        raw.send(encode_frame(p.Disposition(role=True, first=first[0][1], last=second[-1][1], settled=True,
                                            state=p.Accepted())))
        raw.send(encode_frame(p.Disposition(role=True, first=third[0][1], last=third[-1][1], settled=True,
                                            state=p.Released())))
        raw.send(encode_frame(p.Detach(handle=0, closed=True)))
        assert isinstance(raw.performative(), p.Detach)
        rest = []
        deadline = time.monotonic() + 5
        while len(rest) < 20 and time.monotonic() < deadline:
            method, _props, body = channel.basic_get(queue, auto_ack=True)
            if method is not None:
                rest.append((body, method.redelivered))
        assert rest == [(str(i).encode(), False) for i in range(80, 100)]
    finally:
        raw.close()
        admin.close()
