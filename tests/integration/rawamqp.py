"""A tiny hand-rolled AMQP 0-9-1 client for raw-socket tests.

Frames are built with ``struct.pack`` straight from the general spec (4.2.3 frame layout, 4.2.4 method
payloads, 4.2.5 data fields, 4.2.6 content framing); nothing here imports raftmq's codec, so a bug there
cannot hide a bug in the broker.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8

# (class-id, method-id) pairs used below, from the reference's class and method id summary (1.3).
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_PUBLISH = (60, 40)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_RETURN = (60, 50)
BASIC_ACK = (60, 80)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


# -- field encoders (general spec 4.2.5) --------------------------------------------------------------
def shortstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">B", len(b)) + b


def longstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">I", len(b)) + b


def table(fields: dict[str, str] | None = None) -> bytes:
    """A field table holding only long-string values ('S'), enough for client-properties."""
    body = b"".join(shortstr(k) + b"S" + longstr(v) for k, v in (fields or {}).items())
    return longstr(body)


def read_shortstr(buf: bytes, pos: int) -> tuple[bytes, int]:
    n = buf[pos]
    return buf[pos + 1:pos + 1 + n], pos + 1 + n


def read_longstr(buf: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">I", buf, pos)
    return buf[pos + 4:pos + 4 + n], pos + 4 + n


# -- frames (general spec 4.2.3) ---------------------------------------------------------------------
def frame(ftype: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def method_frame(channel: int, method: tuple[int, int], args: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, struct.pack(">HH", *method) + args)


def content_header_frame(channel: int, body_size: int, class_id: int = 60, flags: int = 0,
                         props: bytes = b"") -> bytes:
    """Content header (4.2.6.1): class-id, weight 0, body size, property flags, property list."""
    return frame(FRAME_HEADER, channel, struct.pack(">HHQH", class_id, 0, body_size, flags) + props)


def body_frame(channel: int, data: bytes) -> bytes:
    return frame(FRAME_BODY, channel, data)


def heartbeat_frame(channel: int = 0) -> bytes:
    return frame(FRAME_HEARTBEAT, channel, b"")


def start_ok(product: str = "raftmq-raw-test") -> bytes:
    """connection.start-ok: PLAIN as guest/guest, en_US."""
    return method_frame(0, CONNECTION_START_OK, table({"product": product}) + shortstr("PLAIN")
                        + longstr(b"\x00guest\x00guest") + shortstr("en_US"))


def tune_ok(channel_max: int, frame_max: int, heartbeat: int) -> bytes:
    return method_frame(0, CONNECTION_TUNE_OK, struct.pack(">HIH", channel_max, frame_max, heartbeat))


def connection_open(vhost: str = "/") -> bytes:
    return method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00")


def opening_frames(queue: str, *, product: str, durable: bool = False, confirms: bool = False) -> list[bytes]:
    """What a client sends from start-ok to a declared ``queue`` on channel 1, without waiting for
    the answers (for connections driven in process: tests/unit/node, bench/ingress.py)."""
    frames = [start_ok(product), tune_ok(2047, 131072, 0), connection_open(), channel_open(1)]
    if confirms:
        frames.append(method_frame(1, CONFIRM_SELECT, b"\x00"))
    frames.append(queue_declare(1, queue, durable=durable))
    return frames


def channel_open(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_OPEN, shortstr(""))


def connection_close(reply_code: int = 200, text: str = "bye") -> bytes:
    return method_frame(0, CONNECTION_CLOSE, struct.pack(">H", reply_code) + shortstr(text) + struct.pack(">HH", 0, 0))


def channel_close(channel: int, reply_code: int = 200, text: str = "bye") -> bytes:
    return method_frame(channel, CHANNEL_CLOSE,
                        struct.pack(">H", reply_code) + shortstr(text) + struct.pack(">HH", 0, 0))


def queue_declare(channel: int, queue: str, *, durable: bool = False, exclusive: bool = False,
                  auto_delete: bool = False) -> bytes:
    bits = (durable << 1) | (exclusive << 2) | (auto_delete << 3)
    return method_frame(channel, QUEUE_DECLARE,
                        struct.pack(">H", 0) + shortstr(queue) + struct.pack(">B", bits) + table())


def basic_publish(channel: int, exchange: str | bytes, routing_key: str | bytes, *, mandatory: bool = False,
                  immediate: bool = False) -> bytes:
    bits = mandatory | (immediate << 1)
    return method_frame(channel, BASIC_PUBLISH,
                        struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key) + bytes((bits,)))


def basic_consume(channel: int, queue: str, tag: str, no_ack: bool = True) -> bytes:
    bits = no_ack << 1  # no-local, no-ack, exclusive, no-wait
    return method_frame(channel, BASIC_CONSUME,
                        struct.pack(">H", 0) + shortstr(queue) + shortstr(tag) + struct.pack(">B", bits) + table())


def basic_get(channel: int, queue: str, no_ack: bool = True) -> bytes:
    return method_frame(channel, BASIC_GET, struct.pack(">H", 0) + shortstr(queue) + struct.pack(">B", no_ack))


@dataclass
class Frame:
    type: int
    channel: int
    payload: bytes

    @property
    def method(self) -> tuple[int, int] | None:
        if self.type != FRAME_METHOD or len(self.payload) < 4:
            return None
        return struct.unpack_from(">HH", self.payload)

    @property
    def size(self) -> int:
        """Size on the wire: 7-octet header + payload + frame-end."""
        return 8 + len(self.payload)


@dataclass
class Close:
    """A decoded connection.close or channel.close."""

    reply_code: int
    reply_text: str
    class_id: int
    method_id: int

    @classmethod
    def decode(cls, payload: bytes) -> Close:
        (code,) = struct.unpack_from(">H", payload, 4)
        text, pos = read_shortstr(payload, 6)
        class_id, method_id = struct.unpack_from(">HH", payload, pos)
        return cls(code, text.decode(errors="replace"), class_id, method_id)


class ConnectionEnded(Exception):
    """The server closed the socket (EOF or reset) before the expected frame arrived."""


class RawClient:
    """One TCP connection speaking hand-built frames. Every read is bounded by ``timeout``."""

    def __init__(self, host: str, port: int, timeout: float = 5.0, source: str | None = None) -> None:
        """``source``: the local address to connect from (e.g. another loopback address, 127.0.0.2)."""
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.frame_max = 0
        self.channel_max = 0
        self.heartbeat = 0
        self.server_properties = b""
        self.mechanisms = b""
        self.locales = b""
        self.version = (0, 0)

    # -- io -------------------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_more(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from the server in time")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError as e:
            raise ConnectionEnded("connection reset by the server") from e
        if not chunk:
            raise ConnectionEnded("server closed the socket")
        self.buf += chunk

    def read_exact(self, n: int, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            self._recv_more(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_all_until_eof(self, timeout: float | None = None) -> bytes:
        """Everything the server sends until it closes the socket (bounded by ``timeout``)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                self._recv_more(deadline)
            except ConnectionEnded:
                out, self.buf = self.buf, b""
                return out

    def read_frame(self, timeout: float | None = None) -> Frame:
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < 7:
            self._recv_more(deadline)
        ftype, channel, size = struct.unpack_from(">BHI", self.buf)
        while len(self.buf) < 8 + size:
            self._recv_more(deadline)
        payload, end = self.buf[7:7 + size], self.buf[7 + size:8 + size]
        self.buf = self.buf[8 + size:]
        assert end == FRAME_END, f"server sent a frame with frame-end {end!r}"
        return Frame(ftype, channel, payload)

    def read_method(self, timeout: float | None = None, skip_heartbeats: bool = True) -> Frame:
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            f = self.read_frame(max(0.01, deadline - time.monotonic()))
            if f.type == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            return f

    def expect_method(self, method: tuple[int, int], channel: int | None = None,
                      timeout: float | None = None) -> Frame:
        f = self.read_method(timeout)
        if f.method == CONNECTION_CLOSE and method != CONNECTION_CLOSE:
            c = Close.decode(f.payload)
            raise AssertionError(f"expected {method}, server closed the connection: {c}")
        assert f.method == method, f"expected method {method}, got frame {f}"
        if channel is not None:
            assert f.channel == channel
        return f

    def expect_connection_close(self, timeout: float | None = None) -> Close:
        """Read until connection.close (skipping anything else), answer close-ok, return the close."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            f = self.read_frame(max(0.01, deadline - time.monotonic()))
            if f.method == CONNECTION_CLOSE and f.channel == 0:
                close = Close.decode(f.payload)
                try:
                    self.send(method_frame(0, CONNECTION_CLOSE_OK))
                except OSError:
                    pass
                return close

    def close_or_eof(self, timeout: float | None = None) -> Close | None:
        """connection.close if the server sends one, None if it just ends the socket."""
        try:
            return self.expect_connection_close(timeout)
        except ConnectionEnded:
            return None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- handshake (general spec 4.1 / reference 1.4) -------------------------------------------------
    def handshake(self, frame_max: int | None = None, heartbeat: int = 0, vhost: str = "/") -> None:
        """Header, start/start-ok (PLAIN guest), tune/tune-ok, open/open-ok."""
        self.send(PROTOCOL_HEADER)
        start = self.expect_method(CONNECTION_START, channel=0)
        p = start.payload
        self.version = (p[4], p[5])
        pos = 6
        (props_len,) = struct.unpack_from(">I", p, pos)
        self.server_properties = p[pos + 4:pos + 4 + props_len]
        pos += 4 + props_len
        self.mechanisms, pos = read_longstr(p, pos)
        self.locales, pos = read_longstr(p, pos)
        self.send(start_ok())
        tune = self.expect_method(CONNECTION_TUNE, channel=0)
        server_channel_max, server_frame_max, _server_hb = struct.unpack_from(">HIH", tune.payload, 4)
        self.channel_max = server_channel_max or 2047
        if frame_max is None:
            self.frame_max = server_frame_max
        else:
            self.frame_max = min(frame_max, server_frame_max) if server_frame_max else frame_max
        self.heartbeat = heartbeat
        self.send(tune_ok(self.channel_max, self.frame_max, heartbeat))
        self.send(connection_open(vhost))
        self.expect_method(CONNECTION_OPEN_OK, channel=0)

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel_open(channel))
        self.expect_method(CHANNEL_OPEN_OK, channel=channel)
