"""Raw-frame scenarios for the 0-9-1 behaviours real clients rely on (issue 22), shared by the
single-broker tests (tests/integration/test_compat091.py, also run against RabbitMQ) and the
three-node ones (tests/cluster/test_compat091_cluster.py, where confirms and returns are resolved
only after the Raft commit).

Each scenario drives one RawClient (tests/integration/rawamqp.py) and returns what the server sent,
as small tuples a test compares with the expected sequence, or asserts the ordering rule itself when
the exact frames may legitimately differ (how acks are coalesced with ``multiple``). Every read is
bounded by a timeout and every load is a fixed count.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from dataclasses import dataclass, field

from tests.integration import rawamqp as r
from tests.integration.rawamqp import RawClient

BASIC_NACK = (60, 120)
CONNECTION_UPDATE_SECRET = (10, 70)  # RabbitMQ's extension of class connection (3.8+)
CONNECTION_UPDATE_SECRET_OK = (10, 71)
EXCHANGE_DECLARE = (40, 10)
CONTENT_METHODS = {r.BASIC_RETURN, (60, 60), r.BASIC_GET_OK}  # return, deliver, get-ok: content follows


def uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def publish(channel: int, routing_key: str, body: bytes, *, mandatory: bool = False) -> bytes:
    """basic.publish to the default exchange + content header + one body frame (general 4.2.6)."""
    return (r.basic_publish(channel, "", routing_key, mandatory=mandatory)
            + r.content_header_frame(channel, len(body)) + r.body_frame(channel, body))


def confirm_select(channel: int) -> bytes:
    return r.method_frame(channel, r.CONFIRM_SELECT, b"\x00")


def update_secret(secret: bytes, reason: str = "token refresh") -> bytes:
    """connection.update-secret: new-secret (longstr), reason (shortstr), on channel 0."""
    return r.method_frame(0, CONNECTION_UPDATE_SECRET, r.longstr(secret) + r.shortstr(reason))


def exchange_declare(channel: int, exchange: str, xtype: str = "direct", *, passive: bool = False) -> bytes:
    return r.method_frame(channel, EXCHANGE_DECLARE, struct.pack(">H", 0) + r.shortstr(exchange)
                          + r.shortstr(xtype) + bytes((int(passive),)) + r.table())


@dataclass
class Event:
    """One method as the client sees it, with its content when it carries some."""

    channel: int
    method: tuple[int, int] | None
    payload: bytes
    body: bytes = b""

    @property
    def close(self) -> r.Close:
        return r.Close.decode(self.payload)

    @property
    def ack(self) -> tuple[int, bool]:
        """(delivery-tag, multiple) of a basic.ack or basic.nack."""
        tag, bits = struct.unpack_from(">QB", self.payload, 4)
        return tag, bool(bits & 1)

    def short(self) -> tuple:
        """What a test compares: close codes with class/method, ack tags, returned bodies."""
        if self.method in (r.CONNECTION_CLOSE, r.CHANNEL_CLOSE):
            c = self.close
            return (self.channel, self.method, c.reply_code, (c.class_id, c.method_id))
        if self.method in (r.BASIC_ACK, BASIC_NACK):
            return (self.channel, self.method, *self.ack)
        if self.method == r.BASIC_RETURN:
            (code,) = struct.unpack_from(">H", self.payload, 4)
            return (self.channel, self.method, code, self.body)
        return (self.channel, self.method)


def next_event(client: RawClient, timeout: float) -> Event:
    """The next method (heartbeats skipped), with its content header and body frames read too."""
    f = client.read_method(timeout)
    event = Event(f.channel, f.method, f.payload)
    if f.method in CONTENT_METHODS:
        header = client.read_frame(timeout)
        assert header.type == r.FRAME_HEADER and header.channel == f.channel, header
        (size,) = struct.unpack_from(">Q", header.payload, 4)
        parts = []
        while sum(map(len, parts)) < size:
            body = client.read_frame(timeout)
            assert body.type == r.FRAME_BODY and body.channel == f.channel, body
            parts.append(body.payload)
        event.body = b"".join(parts)
    return event


def events_for(client: RawClient, seconds: float) -> list[Event]:
    """Everything the server sends within ``seconds`` (stops early if it ends the socket)."""
    out: list[Event] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(next_event(client, left))
        except (TimeoutError, r.ConnectionEnded):
            break
    return out


def answers(client: RawClient, count: int, *, timeout: float = 10.0, quiet: float = 0.5) -> list[tuple]:
    """The next ``count`` methods (waiting up to ``timeout`` for them, so a slow machine does not fail
    the test) and anything more that arrives within ``quiet`` seconds after them, as ``Event.short``."""
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count:
            out.append(next_event(client, max(0.01, deadline - time.monotonic())))
    except (TimeoutError, r.ConnectionEnded):
        return [e.short() for e in out]
    return [e.short() for e in out + events_for(client, quiet)]


def opened(host: str, port: int, channels: int = 1, **handshake) -> RawClient:
    c = RawClient(host, port, timeout=10.0)
    c.handshake(**handshake)
    for n in range(1, channels + 1):
        c.open_channel(n)
    return c


# -- item 2: every confirm before channel.close-ok ------------------------------------------------------
@dataclass
class ChannelOutcome:
    confirmed: set[int] = field(default_factory=set)  # sequence numbers acked or nacked before close-ok
    duplicates: int = 0
    closed: bool = False
    after_close: list[tuple] = field(default_factory=list)  # anything on the channel after its close-ok


def _settle(outcome: ChannelOutcome, tag: int, multiple: bool, published: int) -> None:
    tags = range(1, tag + 1) if multiple else (tag,)
    for t in tags:
        if t in outcome.confirmed:
            if not multiple:
                outcome.duplicates += 1
            continue
        assert 1 <= t <= published, f"confirm for sequence number {t} of {published} publishes"
        outcome.confirmed.add(t)


def confirms_then_close(host: str, port: int, *, channels: int, per_channel: int, body: bytes = b"m" * 64,
                        timeout: float = 60.0) -> dict[int, ChannelOutcome]:
    """Confirm mode on ``channels`` channels; each publishes ``per_channel`` messages to an exclusive
    queue and closes at once, all in one write. Reads until every channel's close-ok and the
    connection's close-ok, recording per channel what was confirmed before its close-ok and what
    (if anything) came on it afterwards."""
    c = opened(host, port, channels)
    try:
        queue = uniq("compat-confirms")
        c.send(r.queue_declare(1, queue, exclusive=True))
        c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
        for n in range(1, channels + 1):
            c.send(confirm_select(n))
            c.expect_method(r.CONFIRM_SELECT_OK, channel=n)
        burst = b"".join(publish(n, queue, body) * per_channel + r.channel_close(n)
                         for n in range(1, channels + 1))
        c.send(burst)
        outcomes = {n: ChannelOutcome() for n in range(1, channels + 1)}
        deadline = time.monotonic() + timeout
        while not all(o.closed for o in outcomes.values()):
            e = next_event(c, max(0.1, deadline - time.monotonic()))
            assert e.channel in outcomes, f"a frame on channel {e.channel}, never opened: {e.short()}"
            o = outcomes[e.channel]
            if o.closed:
                o.after_close.append(e.short())
            elif e.method in (r.BASIC_ACK, BASIC_NACK):
                _settle(o, *e.ack, per_channel)
            elif e.method == r.CHANNEL_CLOSE_OK:
                o.closed = True
            else:
                raise AssertionError(f"unexpected frame before close-ok: {e.short()}")
        c.send(r.connection_close())
        while True:
            e = next_event(c, max(0.1, deadline - time.monotonic()))
            if e.method == r.CONNECTION_CLOSE_OK:
                break
            assert e.channel in outcomes, e.short()
            outcomes[e.channel].after_close.append(e.short())
        return outcomes
    finally:
        c.close()


# -- item 3: close-ok, then the server waits for the client to close -------------------------------------
@dataclass
class CloseOutcome:
    before_close_ok: list[tuple]  # frames between the burst and connection.close-ok
    open_after: bool  # the socket neither ended nor was reset within the hold time after close-ok
    answered_later_frames: list[tuple]  # what the server answered to frames sent after close-ok


def start_burst_then_close(host: str, port: int, publishes: int, heartbeat: int = 0) -> tuple[RawClient, str]:
    """An exclusive queue, ``publishes`` messages to it and connection.close, all sent at once."""
    c = opened(host, port, 1, heartbeat=heartbeat)
    queue = uniq("compat-close")
    c.send(r.queue_declare(1, queue, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    c.send(publish(1, queue, b"p" * 32) * publishes + r.connection_close())
    return c, queue


def finish_close(c: RawClient, queue: str, *, hold: float, timeout: float = 30.0) -> CloseOutcome:
    """Read up to close-ok (a reset or an early end fails), then check the socket stays open for
    ``hold`` seconds while the client sends more frames, which the server must discard."""
    before: list[tuple] = []
    deadline = time.monotonic() + timeout
    while True:
        e = next_event(c, max(0.1, deadline - time.monotonic()))
        if e.method == r.CONNECTION_CLOSE_OK:
            break
        before.append(e.short())
    c.send(r.channel_open(2) + publish(1, queue, b"late"))
    answered = [e.short() for e in events_for(c, hold)]
    c.sock.settimeout(0.05)
    try:
        open_after = c.sock.recv(1, socket.MSG_PEEK) != b""
    except TimeoutError:
        open_after = True
    except OSError:
        open_after = False
    return CloseOutcome(before, open_after, answered)


def seconds_until_server_ends(c: RawClient, limit: float) -> float | None:
    """After close-ok: how long until the server ends the socket (heartbeats ignored), None if not
    within ``limit`` seconds."""
    start = time.monotonic()
    c.sock.settimeout(0.2)
    while time.monotonic() - start < limit:
        try:
            data = c.sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - start
        if not data:
            return time.monotonic() - start
        assert data.replace(r.heartbeat_frame(0), b"") == b"", f"sent after close-ok: {data!r}"
    return None


# -- item 4: basic.return before the reply to any later method --------------------------------------------
def returns_then_selects(host: str, port: int, *, channels: int, rounds: int,
                         timeout: float = 60.0) -> dict[int, list[tuple]]:
    """Per channel, ``rounds`` times: a mandatory publish nothing routes, then confirm.select, all in
    one write. Returns each channel's events in arrival order."""
    c = opened(host, port, channels)
    try:
        nowhere = uniq("compat-no-such-queue")
        c.send(b"".join(publish(n, nowhere, f"{n}:{i}".encode(), mandatory=True) + confirm_select(n)
                        for i in range(rounds) for n in range(1, channels + 1)))
        seen: dict[int, list[tuple]] = {n: [] for n in range(1, channels + 1)}
        selects = dict.fromkeys(seen, 0)
        deadline = time.monotonic() + timeout
        while any(v < rounds for v in selects.values()):
            e = next_event(c, max(0.1, deadline - time.monotonic()))
            assert e.channel in seen, e.short()
            seen[e.channel].append(e.short())
            if e.method == r.CONFIRM_SELECT_OK:
                selects[e.channel] += 1
        c.send(r.connection_close())
        return seen
    finally:
        c.close()


def expected_returns_then_selects(channel: int, rounds: int) -> list[tuple]:
    """reference 1.8.3.9 basic.return and RabbitMQ's ordering: the return of publish i, then (once in
    confirm mode, i.e. from the second publish on) its ack as sequence number i, then select-ok i."""
    out: list[tuple] = []
    for i in range(rounds):
        out.append((channel, r.BASIC_RETURN, 312, f"{channel}:{i}".encode()))
        if i:
            out.append((channel, r.BASIC_ACK, i, False))
        out.append((channel, r.CONFIRM_SELECT_OK))
    return out
