"""Limits before login, idle handshakes and connection limits, against real nodes (issue 17).

Each test reproduces one finding of issue 17 on a private raftmq node (raftmq only: the 0-10 front
end and the configuration are raftmq's) and asserts the bound:

1. a 0-10 array of 2^32-1 zero-width elements in connection.start-ok (decoded before the password
   is checked) is refused with connection.close framing-error (501, spec L3777ff) within a second,
   and the node's RSS barely moves;
2. unfinished 0-10 assemblies before the connection is open are bounded per connection (64 KiB), and
   once open by max_message_size + 64 KiB for all channels and tracks together: 501 beyond;
3. sockets that send the protocol header (or more of the handshake) and then nothing are closed once
   ``handshake_timeout`` passes; 0-10 connections count toward ``max_connections``; and
   ``max_connections_per_address`` limits connections from one source address (0-9-1: 530 NOT_ALLOWED,
   reference 1.2; 0-10: 320 connection-forced, the 0-10 close code that tells the client to retry);
7. a 0-10 map nested 3,000 deep is a framing error (501), one log line, no RecursionError or traceback.

Plus a hypothesis fuzz of 0-10 connection.start-ok before authentication, bounded in time per example
and in the node's memory over the run.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions as pex
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010 import types as t
from raftmq.protocol.amqp010.frames import (
    FIRST_FRAME,
    FIRST_SEG,
    SEG_COMMAND,
    SEG_CONTROL,
    FrameReader,
    encode_assembly,
)
from raftmq.protocol.amqp010.frames import (
    PROTOCOL_HEADER as AMQP010_HEADER,
)
from tests.integration import rawamqp as r
from tests.integration.helpers import connect, round_trip, wait_until
from tests.integration.rawamqp import RawClient

U32 = struct.Struct(">I")
FRAME_HEADER_010 = struct.Struct(">BBHxBH4x")
MB = 1 << 20
HANDSHAKE_TIMEOUT = 1.0  # configured on the hardening node


# -- nodes ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def raftmq_only(broker_kind: str) -> None:
    if broker_kind == "rabbitmq":
        pytest.skip("drives private raftmq nodes (0-10 front end, raftmq configuration)")


def start_node(base: Path, toml: str) -> RaftmqNode:
    config = base / "raftmq.toml"
    config.write_text("disk_free_limit = 1\n" + toml)  # no disk alarm from a nearly full test disk
    return RaftmqNode(base / "data", config=config).start()


@pytest.fixture(scope="module")
def node(raftmq_only, tmp_path_factory) -> Iterator[RaftmqNode]:
    n = start_node(tmp_path_factory.mktemp("hardening"),
                   f"handshake_timeout = {HANDSHAKE_TIMEOUT}\nmax_message_size = 100000\n")
    yield n
    n.terminate()


def rss(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def log_since(n: RaftmqNode, offset: int) -> str:
    with open(n.log_path, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


# -- a raw 0-10 client ------------------------------------------------------------------------------------------
class Raw010:
    """One TCP connection speaking hand-built 0-10 frames (raftmq's codec); every read bounded."""

    def __init__(self, port: int, source: str | None = None, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.reader = FrameReader()
        self.inbox: list = []

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, method, channel: int = 0) -> None:
        track, segments = c.segments_of(method)
        self.sock.sendall(encode_assembly(channel, track, segments))

    def send_segment(self, channel: int, track: int, seg_type: int, payload: bytes) -> None:
        self.sock.sendall(encode_assembly(channel, track, [(seg_type, payload)]))

    def receive(self, timeout: float = 5.0):
        """The next control or command; None once the node closed the socket."""
        deadline = time.monotonic() + timeout
        while not self.inbox:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer from the node")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.inbox += [c.decode_assembly(a) for a in self.reader.feed(data)]
        return self.inbox.pop(0)

    def until(self, classes: tuple, timeout: float = 5.0):
        """Skip other methods until one of ``classes`` (or the end of the socket: None)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.receive(max(0.01, deadline - time.monotonic()))
            if m is None or isinstance(m, classes):
                return m

    def start(self) -> None:
        self.send_bytes(AMQP010_HEADER)
        header = b""
        while len(header) < 8:
            chunk = self.sock.recv(8 - len(header))
            assert chunk, "socket closed before the protocol header"
            header += chunk
        assert header == AMQP010_HEADER
        assert isinstance(self.receive(), c.ConnectionStart)

    def handshake(self, password: str = "guest"):
        """Start through open; the method that ended it (ConnectionOpenOk or ConnectionClose)."""
        self.start()
        self.send(c.ConnectionStartOk(mechanism="PLAIN", response=b"\0guest\0" + password.encode(),
                                      locale="en_US"))
        m = self.until((c.ConnectionTune, c.ConnectionClose))
        if not isinstance(m, c.ConnectionTune):
            return m
        self.send(c.ConnectionTuneOk(channel_max=8, max_frame_size=65535))
        self.send(c.ConnectionOpen(virtual_host="/", insist=True))
        return self.until((c.ConnectionOpenOk, c.ConnectionClose))

    def close(self) -> None:
        self.sock.close()


def start_ok_with_properties(properties: bytes, password: str = "wrong") -> bytes:
    """A connection.start-ok control segment whose client-properties map is ``properties`` (raw)."""
    payload = c.ConnectionStartOk(client_properties={}, mechanism="PLAIN", response=b"\0guest\0" + password.encode(),
                                  locale="en_US").encode_segment()
    empty = t.encode_map({})
    assert payload[4:4 + len(empty)] == empty  # class, code, 2 octets of packing flags, then the map
    return payload[:4] + properties + payload[4 + len(empty):]


def answer_to_start_ok(port: int, properties: bytes):
    """Open a raw 0-10 connection, send a start-ok with ``properties`` (and a wrong password): the
    node's connection.close (None if it sent none) and the seconds it took."""
    raw = Raw010(port)
    try:
        raw.start()
        started = time.monotonic()
        raw.send_segment(0, 0, SEG_CONTROL, start_ok_with_properties(properties))
        close = raw.until((c.ConnectionClose,), timeout=5.0)
        return close, time.monotonic() - started
    finally:
        raw.close()


def map_of(key: bytes, code: int, value: bytes) -> bytes:
    body = U32.pack(1) + bytes((len(key),)) + key + bytes((code,)) + value
    return U32.pack(len(body)) + body


def zero_width_array(count: int) -> bytes:
    body = bytes((t.CODE_OF["void"],)) + U32.pack(count)
    return U32.pack(len(body)) + body


def nested_maps(depth: int) -> bytes:
    encoded = t.encode_map({})
    for _ in range(depth):
        encoded = map_of(b"k", t.CODE_OF["map"], encoded)
    return encoded


# == item 1 =====================================================================================================
def test_zero_width_array_in_start_ok_is_refused_at_once_before_the_password_check(node):
    """A start-ok whose client-properties hold an array of 2^32-1 voids (9 octets, spec L3566ff) and a
    wrong password: the node answers connection.close 501 within 1 s -- the decoder refuses the count
    before the password is looked at (else the answer would be 320 authentication failed) -- five
    times in a row, and its RSS grows by less than 50 MB (before: 1.5 GB and 13.5 s for 2*10^8)."""
    before = rss(node.pid)
    properties = map_of(b"big", t.CODE_OF["array"], zero_width_array(0xFFFFFFFF))
    for _ in range(5):
        close, elapsed = answer_to_start_ok(node.port, properties)
        assert close is not None and close.reply_code == 501, close
        assert elapsed < 1.0, f"the node took {elapsed:.2f} s to refuse the frame"
    grown = rss(node.pid) - before
    assert grown < 50 * MB, f"RSS grew by {grown / MB:.1f} MB"
    round_trip(node.url)


# == item 2 =====================================================================================================
def frame010(channel: int, track: int, payload: bytes) -> bytes:
    """The first frame of an assembly that never ends (first segment, first frame, no last flags)."""
    return FRAME_HEADER_010.pack(FIRST_SEG | FIRST_FRAME, SEG_COMMAND, 12 + len(payload), track, channel) + payload


def flood_until_answered(raw: Raw010, frames: Iterator[bytes], limit_s: float = 10.0) -> int:
    """Send frames one by one until the node sends anything (or ``frames`` runs out); how many went."""
    sel = selectors.DefaultSelector()
    sel.register(raw.sock, selectors.EVENT_READ)
    sent = 0
    deadline = time.monotonic() + limit_s
    try:
        for f in frames:
            if sel.select(timeout=0) or time.monotonic() > deadline:
                break
            try:
                raw.sock.sendall(f)
            except OSError:
                break
            sent += 1
    finally:
        sel.close()
    return sent


def test_unfinished_assemblies_before_open_are_bounded_per_connection(node):
    """Before start-ok, unfinished assemblies on 500 channels x 2 tracks of ~60 KB each (60 MB if
    buffered, as before: 300 MB were held for a client that never authenticated): the node closes
    with 501 after 64 KiB, and its RSS grows by less than 30 MB."""
    before = rss(node.pid)
    raw = Raw010(node.port)
    try:
        raw.start()
        frames = (frame010(ch, track, b"x" * 60_000) for ch in range(1, 501) for track in (0, 1))
        sent = flood_until_answered(raw, frames)
        close = raw.until((c.ConnectionClose,), timeout=5.0)
    finally:
        raw.close()
    assert close is not None and close.reply_code == 501, close
    assert "unfinished assemblies" in close.reply_text, close.reply_text
    assert sent < 1000, f"all {sent} frames were taken without an answer"
    grown = rss(node.pid) - before
    assert grown < 30 * MB, f"RSS grew by {grown / MB:.1f} MB"
    round_trip(node.url)


def test_unfinished_assemblies_after_open_share_one_budget(node):
    """Once open, each unfinished assembly is below max_message_size (100000) but together they pass
    max_message_size + 64 KiB: 501 naming the unfinished assemblies (not the per-message limit)."""
    raw = Raw010(node.port)
    try:
        assert isinstance(raw.handshake(), c.ConnectionOpenOk)
        frames = (frame010(ch, 1, b"y" * 60_000) for ch in range(1, 51))
        sent = flood_until_answered(raw, frames)
        close = raw.until((c.ConnectionClose,), timeout=5.0)
    finally:
        raw.close()
    assert close is not None and close.reply_code == 501, close
    assert "unfinished assemblies" in close.reply_text, close.reply_text
    assert sent >= 2  # two of them (120 KB) are within the 165,536 octets


def frames_091(data: bytes) -> list[tuple[int, int, bytes]]:
    """The complete 0-9-1 frames in ``data`` (general 4.2.3) as (type, channel, payload)."""
    out, pos = [], 0
    while len(data) - pos >= 8:
        ftype, channel, size = struct.unpack_from(">BHI", data, pos)
        if len(data) - pos < 8 + size:
            break
        out.append((ftype, channel, data[pos + 7:pos + 7 + size]))
        pos += 8 + size
    return out


# == item 3: handshake timeout ==================================================================================
def test_sockets_that_stall_their_handshake_are_closed_after_the_handshake_timeout(node):
    """12 sockets send only the 0-9-1 header, 12 only the 0-10 header, 4 nothing, 4 stop after 0-9-1
    start-ok: every one is closed between handshake_timeout (1 s) and 4 s later; those that sent a
    header get connection.close 320 first (0-9-1 reference 1.2 / 0-10 L3777ff connection-forced).  A connection that opened in time is left alone."""
    opened = connect(node.url)
    socks: list[tuple[str, socket.socket]] = []
    try:
        for kind, n in (("091", 12), ("010", 12), ("silent", 4), ("091-start-ok", 4)):
            for _ in range(n):
                s = socket.create_connection((node.host, node.port), timeout=5)
                if kind != "silent":
                    s.sendall(AMQP010_HEADER if kind == "010" else r.PROTOCOL_HEADER)
                if kind == "091-start-ok":
                    s.sendall(r.start_ok())
                socks.append((kind, s))
        started = time.monotonic()
        ended: dict[int, tuple[float, bytes]] = {}
        sel = selectors.DefaultSelector()
        data: dict[int, bytes] = {}
        for i, (_kind, s) in enumerate(socks):
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, i)
            data[i] = b""
        deadline = started + HANDSHAKE_TIMEOUT + 4.0
        while len(ended) < len(socks) and time.monotonic() < deadline:
            for key, _ev in sel.select(timeout=0.1):
                i = key.data
                try:
                    chunk = socks[i][1].recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    data[i] += chunk
                else:
                    ended[i] = (time.monotonic() - started, data[i])
                    sel.unregister(socks[i][1])
        sel.close()
        assert len(ended) == len(socks), f"{len(socks) - len(ended)} sockets still open after 5 s"
        for i, (kind, _s) in enumerate(socks):
            after, received = ended[i]
            assert after >= HANDSHAKE_TIMEOUT - 0.2, f"{kind} socket closed after {after:.2f} s"
            if kind == "010":
                reader = FrameReader()
                methods = [c.decode_assembly(a) for a in reader.feed(received[len(AMQP010_HEADER):])]
                assert [type(m) for m in methods] == [c.ConnectionStart, c.ConnectionClose], methods
                assert methods[-1].reply_code == 320, methods[-1]
            if kind.startswith("091"):
                closes = [r.Close.decode(p) for ftype, ch, p in frames_091(received)
                          if ftype == r.FRAME_METHOD and ch == 0 and p[:4] == struct.pack(">HH", *r.CONNECTION_CLOSE)]
                assert [cl.reply_code for cl in closes] == [320], (kind, closes)
        assert opened.is_open
        ch = opened.channel()
        ch.queue_declare("", exclusive=True)
    finally:
        for _kind, s in socks:
            s.close()
        opened.close()


def test_a_tls_socket_that_never_starts_its_tls_handshake_is_closed_after_the_timeout(raftmq_only, tmp_path):
    """On the amqps port the TLS handshake comes before the protocol header: it is bounded by the same
    handshake_timeout (asyncio's default would be 60 s)."""
    from raftmq.ops.local.node import free_port
    from tests.integration.test_tls import self_signed

    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    config = tmp_path / "raftmq.toml"
    config.write_text(f"disk_free_limit = 1\nhandshake_timeout = {HANDSHAKE_TIMEOUT}\n")
    n = RaftmqNode(tmp_path / "data", config=config, extra_args=[
        "--tls-port", str(tls_port), "--tls-cert", str(cert), "--tls-key", str(key)]).start()
    try:
        with socket.create_connection((n.host, tls_port), timeout=HANDSHAKE_TIMEOUT + 4.0) as s:
            started = time.monotonic()
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            elapsed = time.monotonic() - started
        assert HANDSHAKE_TIMEOUT - 0.2 <= elapsed < HANDSHAKE_TIMEOUT + 3.0, f"closed after {elapsed:.2f} s"
    finally:
        n.terminate()


# == item 3: connection limits ==================================================================================
@pytest.fixture
def limit_node(raftmq_only, tmp_path) -> Iterator[RaftmqNode]:
    n = start_node(tmp_path, "max_connections = 3\n")
    yield n
    n.terminate()


@pytest.fixture
def per_address_node(raftmq_only, tmp_path) -> Iterator[RaftmqNode]:
    n = start_node(tmp_path, "max_connections_per_address = 2\n")
    yield n
    n.terminate()


def refused_091(host: str, port: int, source: str | None = None) -> r.Close | None:
    """A raw 0-9-1 handshake; the connection.close it ended with (None if it opened)."""
    with RawClient(host, port, source=source) as client:
        client.send(r.PROTOCOL_HEADER)
        client.expect_method(r.CONNECTION_START, channel=0)
        client.send(r.start_ok())
        f = client.read_method()
        if f.method == r.CONNECTION_CLOSE:
            return r.Close.decode(f.payload)
        return None


def test_0_10_connections_count_toward_max_connections(limit_node):
    """max_connections = 3 counts both protocols: with three 0-9-1 connections open a 0-10 one is
    refused after start-ok with connection.close 320 connection-forced (spec L3777ff; no tune); with
    three 0-10 connections open a 0-9-1 one is refused with 530 NOT_ALLOWED (reference 1.2)."""
    n = limit_node
    pikas = [connect(n.url) for _ in range(3)]
    try:
        raw = Raw010(n.port)
        try:
            answer = raw.handshake()
        finally:
            raw.close()
        assert isinstance(answer, c.ConnectionClose) and answer.reply_code == 320, answer
        assert "connection limit" in answer.reply_text
    finally:
        for p in pikas:
            p.close()
    raws: list[Raw010] = []
    try:
        def open_010():
            raw = Raw010(n.port)
            if isinstance(raw.handshake(), c.ConnectionOpenOk):
                raws.append(raw)
                return True
            raw.close()
            return False

        for _ in range(3):  # the pika connections' slots are released as the node sees them go
            wait_until(open_010, timeout=5, interval=0.1, what="a 0-10 connection to open")
        close = refused_091(n.host, n.port)
        assert close is not None and close.reply_code == 530, close
        assert close.reply_text.startswith("NOT_ALLOWED"), close
        with pytest.raises(pex.AMQPConnectionError):
            pika.BlockingConnection(pika.URLParameters(n.url))
    finally:
        for raw in raws:
            raw.close()
    wait_until(lambda: refused_091(n.host, n.port) is None, timeout=5, interval=0.1,
               what="a slot once the 0-10 connections closed")


def test_connections_per_source_address_are_limited(per_address_node):
    """max_connections_per_address = 2: a third connection from 127.0.0.1 is refused (0-9-1: 530),
    while 127.0.0.2 still gets two (one per protocol) and its third (0-10) is refused with 320."""
    n = per_address_node
    first = [connect(n.url) for _ in range(2)]
    try:
        close = refused_091(n.host, n.port)
        assert close is not None and close.reply_code == 530 and "per address" in close.reply_text, close
        other_010 = Raw010(n.port, source="127.0.0.2")
        other_091 = RawClient(n.host, n.port, source="127.0.0.2")
        try:
            assert isinstance(other_010.handshake(), c.ConnectionOpenOk)
            other_091.handshake()
            third = Raw010(n.port, source="127.0.0.2")
            try:
                answer = third.handshake()
            finally:
                third.close()
            assert isinstance(answer, c.ConnectionClose) and answer.reply_code == 320, answer
        finally:
            other_010.close()
            other_091.close()
    finally:
        for p in first:
            p.close()


# == item 7 =====================================================================================================
def test_a_map_nested_3000_deep_is_a_framing_error_with_one_log_line(node):
    """0-10 client-properties nested 3,000 deep (before login), then exchange.declare arguments nested
    3,000 deep (after open): connection.close 501 each time, within a second; the node logs one
    line per connection and no RecursionError or traceback."""
    offset = node.log_path.stat().st_size
    deep = nested_maps(3000)
    for _ in range(3):
        raw = Raw010(node.port)
        try:
            raw.start()
            started = time.monotonic()
            raw.send_segment(0, 0, SEG_CONTROL, start_ok_with_properties(deep, password="guest"))
            close = raw.until((c.ConnectionClose,), timeout=5.0)
        finally:
            raw.close()
        assert close is not None and close.reply_code == 501, close
        assert time.monotonic() - started < 1.0
    declare = c.ExchangeDeclare(exchange="deep", type="direct", arguments={}).encode_segment()
    empty = t.encode_map({})
    assert declare.endswith(empty)
    raw = Raw010(node.port)
    try:
        assert isinstance(raw.handshake(), c.ConnectionOpenOk)
        raw.send_segment(1, 1, SEG_COMMAND, declare[:-len(empty)] + deep)
        close = raw.until((c.ConnectionClose,), timeout=5.0)
    finally:
        raw.close()
    assert close is not None and close.reply_code == 501, close
    time.sleep(0.2)  # the log line is written as the close is sent; let it reach the file
    text = log_since(node, offset)
    assert "RecursionError" not in text and "Traceback" not in text, text[-3000:]
    assert text.count("closing with 501") == 4, text[-3000:]


def test_a_0_9_1_field_table_nested_3000_deep_is_a_clean_connection_error(node):
    """0-9-1 (general 4.2.5.5): queue.declare arguments nested 3,000 deep (33 KB, within frame_max
    after tune) end in connection.close 502 syntax-error -- the depth limit -- not a RecursionError or
    541 internal-error, and no traceback in the node's log."""
    offset = node.log_path.stat().st_size
    items = b""
    for _ in range(3000):
        items = r.shortstr("k") + b"F" + r.longstr(items)
    with RawClient(node.host, node.port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(r.method_frame(1, (50, 10), struct.pack(">H", 0) + r.shortstr("deep-091") + b"\x00"
                                   + r.longstr(items)))
        close = client.expect_connection_close(timeout=5.0)
    assert close.reply_code == 502, close
    time.sleep(0.2)
    text = log_since(node, offset)
    assert "RecursionError" not in text and "Traceback" not in text, text[-3000:]


# == fuzz: 0-10 start-ok before authentication, bounded ========================================================
FUZZ_SETTINGS = dict(derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_rss_baseline: dict[int, int] = {}
codes = st.sampled_from(sorted(t.TYPE_BY_CODE))


@pytest.mark.timeout(120)
@settings(max_examples=60, **FUZZ_SETTINGS)
@given(kind=st.sampled_from(["array", "list", "map"]), code=codes,
       count=st.one_of(st.integers(0, 8), st.integers(0, 0xFFFFFFFF), st.just(0xFFFFFFFF)),
       tail=st.binary(max_size=48), depth=st.integers(0, 200))
def test_fuzz_start_ok_counts_and_depths_before_login(node, kind, code, count, tail, depth):
    """A start-ok whose client-properties hold a map/list/array with any declared count and element
    type, random octets after it, wrapped in up to 200 maps: the node answers (close 501, or 320 for
    the wrong password when the properties decode) within 1 s, stays up, and over the whole run its
    RSS grows by less than 50 MB."""
    if kind == "array":
        body = bytes((code,)) + U32.pack(count) + tail
    else:
        body = U32.pack(count) + tail
    inner = U32.pack(len(body)) + body
    properties = map_of(b"v", t.CODE_OF[kind], inner)
    for _ in range(depth):
        properties = map_of(b"k", t.CODE_OF["map"], properties)
    _rss_baseline.setdefault(node.pid, rss(node.pid))
    close, elapsed = answer_to_start_ok(node.port, properties)
    assert close is not None and close.reply_code in (501, 320), close
    assert elapsed < 1.0, f"{elapsed:.2f} s to answer"
    grown = rss(node.pid) - _rss_baseline[node.pid]
    assert grown < 50 * MB, f"RSS grew by {grown / MB:.1f} MB over the run"
