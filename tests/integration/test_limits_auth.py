"""Configured limits, authentication, permissions, resource alarms and flow control, end to end.

Two kinds of tests live here:

* tests on the shared ``broker`` fixture (authentication failures, AMQPLAIN, channel.flow, basic.qos
  global, pika's asynchronous SelectConnection): they run against raftmq and against RabbitMQ
  (``RAFTMQ_TEST_BROKER=rabbitmq``), the reference implementation;
* tests on private raftmq nodes started with a TOML configuration written to a temporary directory
  (``max_connections``, ``channel_max``, ``max_message_size``, users with restricted permissions, a tiny
  ``memory_high_watermark``): they exercise raftmq's configuration and are skipped under RabbitMQ.

Reply codes are those of the reference's constants table (1.2): 403 access-refused and 406
precondition-failed are channel errors, 530 not-allowed and 540 not-implemented connection errors.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions as pex
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import RaftmqNode
from tests.integration import rawamqp as r
from tests.integration.helpers import (
    OP_TIMEOUT,
    connect,
    consume,
    get_one,
    message_count,
    pump,
    round_trip,
    uniq,
    wait_until,
)
from tests.integration.rawamqp import ConnectionEnded, RawClient

GUEST_PLAIN = b"\x00guest\x00guest"
CONNECTION_BLOCKED = (10, 60)  # RabbitMQ's extension methods (capability connection.blocked)
CONNECTION_UNBLOCKED = (10, 61)


# -- raw handshake with a chosen mechanism (reference 1.4.2.1-1.4.2.8) -----------------------------------
def field_table_items(fields: dict) -> bytes:
    """The items of a field table (general 4.2.5.5) *without* the 4-octet length prefix.

    Values: bool -> 't', dict -> nested table 'F', int -> signed long 'I', anything else -> long string 'S'.
    """
    out = b""
    for key, value in fields.items():
        out += r.shortstr(key)
        if isinstance(value, bool):
            out += b"t" + bytes([value])
        elif isinstance(value, dict):
            out += b"F" + r.longstr(field_table_items(value))
        elif isinstance(value, int):
            out += b"I" + struct.pack(">i", value)
        else:
            out += b"S" + r.longstr(value)
    return out


# Client properties announcing the capabilities pika announces. RabbitMQ answers a failed login with a
# connection.close 403 only to clients that announce authentication_failure_close (otherwise it just
# closes the socket), and sends connection.blocked only to those announcing connection.blocked.
CLIENT_PROPERTIES = r.longstr(field_table_items({
    "product": "raftmq-limits-test",
    "capabilities": {"authentication_failure_close": True, "connection.blocked": True},
}))


def amqplain(login: str, password: str) -> bytes:
    """The AMQPLAIN response: a field table of LOGIN and PASSWORD without its length prefix (RabbitMQ's
    encoding, which every 0-9-1 client that offers AMQPLAIN uses)."""
    return field_table_items({"LOGIN": login, "PASSWORD": password})


@dataclass
class Handshake:
    """How far a raw handshake got: ``opened`` after open-ok; else the server's close (None on EOF)."""

    opened: bool
    close: r.Close | None
    tune: tuple[int, int, int] | None  # channel-max, frame-max, heartbeat offered in connection.tune
    mechanisms: list[bytes]


def raw_handshake(client: RawClient, *, mechanism: str = "PLAIN", response: bytes = GUEST_PLAIN,
                  vhost: str = "/", channel_max: int | None = None, frame_max: int | None = None) -> Handshake:
    """Header, start/start-ok with ``mechanism``/``response``, tune/tune-ok (echoing the server's
    channel-max and frame-max unless given; heartbeat 0), open. Stops at the first connection.close or
    end of socket."""
    client.send(r.PROTOCOL_HEADER)
    start = client.expect_method(r.CONNECTION_START, channel=0)
    pos = 6
    (props_len,) = struct.unpack_from(">I", start.payload, pos)
    mechanisms, _ = r.read_longstr(start.payload, pos + 4 + props_len)
    mechs = mechanisms.split()
    client.send(r.method_frame(0, r.CONNECTION_START_OK, CLIENT_PROPERTIES + r.shortstr(mechanism)
                               + r.longstr(response) + r.shortstr("en_US")))
    try:
        f = client.read_method()
        if f.method == r.CONNECTION_CLOSE:
            return Handshake(False, r.Close.decode(f.payload), None, mechs)
        assert f.method == r.CONNECTION_TUNE, f"expected connection.tune or close, got {f}"
        tune = struct.unpack_from(">HIH", f.payload, 4)
        ch_max = tune[0] if channel_max is None else channel_max
        f_max = tune[1] if frame_max is None else frame_max
        client.send(r.method_frame(0, r.CONNECTION_TUNE_OK, struct.pack(">HIH", ch_max, f_max, 0)))
        client.send(r.method_frame(0, r.CONNECTION_OPEN, r.shortstr(vhost) + r.shortstr("") + b"\x00"))
        f = client.read_method()
        if f.method == r.CONNECTION_CLOSE:
            return Handshake(False, r.Close.decode(f.payload), tune, mechs)
        assert f.method == r.CONNECTION_OPEN_OK, f"expected connection.open-ok or close, got {f}"
        return Handshake(True, None, tune, mechs)
    except ConnectionEnded:
        return Handshake(False, None, None, mechs)


def raw_publish_and_get(client: RawClient, channel: int = 1) -> None:
    """On an opened raw connection: open a channel, declare an exclusive queue, publish one message to it
    through the default exchange and basic.get it back (reference 1.8.3.7 publish, 1.8.3.10 get)."""
    client.open_channel(channel)
    queue = uniq("raw-auth")
    client.send(r.queue_declare(channel, queue, exclusive=True))
    client.expect_method(r.QUEUE_DECLARE_OK, channel=channel)
    body = uuid.uuid4().hex.encode()
    client.send(r.basic_publish(channel, "", queue) + r.content_header_frame(channel, len(body))
                + r.body_frame(channel, body))
    client.send(r.basic_get(channel, queue))
    client.expect_method(r.BASIC_GET_OK, channel=channel)
    header = client.read_frame()
    assert header.type == r.FRAME_HEADER
    assert struct.unpack_from(">Q", header.payload, 4)[0] == len(body)
    got = client.read_frame()
    assert (got.type, got.payload) == (r.FRAME_BODY, body)


@pytest.fixture
def raw(broker) -> Iterator:
    clients: list[RawClient] = []

    def open_client() -> RawClient:
        c = RawClient(broker.host, broker.port, timeout=5.0)
        clients.append(c)
        return c

    yield open_client
    for c in clients:
        c.close()


def url_for(broker, user: str, password: str, vhost: str = "%2F") -> str:
    return f"amqp://{user}:{password}@{broker.host}:{broker.port}/{vhost}"


# -- private raftmq nodes ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def raftmq_only(broker_kind: str) -> None:
    if broker_kind == "rabbitmq":
        pytest.skip("drives a private raftmq node started with its own TOML configuration")


# Every private node sets disk_free_limit = 1 so that a nearly full disk on the test machine cannot raise
# a disk alarm (which would block every publisher and make unrelated tests fail).
BASE_CONFIG = "disk_free_limit = 1\n"


def start_node(tmp_path_factory: pytest.TempPathFactory, name: str, toml: str) -> RaftmqNode:
    base = tmp_path_factory.mktemp(name)
    config = Path(base) / "raftmq.toml"
    config.write_text(toml if "disk_free_limit" in toml else BASE_CONFIG + toml)
    return RaftmqNode(Path(base) / "data", config=config).start()


@pytest.fixture(scope="module")
def conn_limit_node(raftmq_only, tmp_path_factory) -> Iterator[RaftmqNode]:
    node = start_node(tmp_path_factory, "conn-limit", "max_connections = 3\n")
    yield node
    node.terminate()


@pytest.fixture(scope="module")
def limits_node(raftmq_only, tmp_path_factory) -> Iterator[RaftmqNode]:
    node = start_node(tmp_path_factory, "limits",
                      "channel_max = 5\nmax_message_size = 1000\nframe_max = 8192\nheartbeat = 7\n")
    yield node
    node.terminate()


@dataclass
class PermsTarget:
    """A broker with a restricted user (configure/write/read all '^own-.*' on "/") and an extra vhost that
    only guest may use."""

    host: str
    port: int
    user: str
    password: str
    other_vhost: str

    def url(self, user: str, password: str, vhost: str = "%2F") -> str:
        return f"amqp://{user}:{password}@{self.host}:{self.port}/{vhost}"

    def restricted_url(self, vhost: str = "%2F", password: str | None = None) -> str:
        return self.url(self.user, self.password if password is None else password, vhost)

    def guest_url(self, vhost: str = "%2F") -> str:
        return self.url("guest", "guest", vhost)


OWN = "^own-.*"


@pytest.fixture(scope="module")
def perms_target(broker_kind, request, tmp_path_factory) -> Iterator[PermsTarget]:
    """raftmq: a private node whose users and vhosts come from the TOML file ([users.NAME] tables with
    password and permissions, ``vhosts``). RabbitMQ: the same user and vhost added to the session broker
    with rabbitmqctl, so that these expectations are checked against the reference too."""
    suffix = uuid.uuid4().hex[:8]
    user, password, other = f"alice-{suffix}", f"pw-{suffix}", f"other-{suffix}"
    if broker_kind == "rabbitmq":
        b = request.getfixturevalue("broker")
        rmq = b.process
        rmq.ctl("add_user", user, password)
        rmq.ctl("set_permissions", "-p", "/", user, OWN, OWN, OWN)
        rmq.ctl("add_vhost", other)
        rmq.ctl("set_permissions", "-p", other, "guest", ".*", ".*", ".*")
        yield PermsTarget(b.host, b.port, user, password, other)
        rmq.ctl("delete_vhost", other)
        rmq.ctl("delete_user", user)
        return
    toml = f"""\
vhosts = ["/", "{other}"]

[users.guest]
password = "guest"
loopback_only = true
permissions = {{ "/" = [".*", ".*", ".*"], "{other}" = [".*", ".*", ".*"] }}

[users.{user}]
password = "{password}"
permissions = {{ "/" = ["{OWN}", "{OWN}", "{OWN}"] }}
"""
    node = start_node(tmp_path_factory, "perms", toml)
    yield PermsTarget(node.host, node.port, user, password, other)
    node.terminate()


@pytest.fixture(scope="module")
def alarm_node(raftmq_only, tmp_path_factory) -> Iterator[RaftmqNode]:
    # 2000 octets of queued message bodies: three 1000-octet messages cross it.
    node = start_node(tmp_path_factory, "alarm", "memory_high_watermark = 2000\n")
    yield node
    node.terminate()


class Opener:
    """Opens pika connections to one URL and closes whatever is still open at the end of the test."""

    def __init__(self) -> None:
        self.opened: list[pika.BlockingConnection] = []

    def __call__(self, url: str, **overrides) -> pika.BlockingConnection:
        c = connect(url, **overrides)
        self.opened.append(c)
        return c

    def close_all(self) -> None:
        for c in self.opened:
            if c.is_open:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - best effort: the broker may have closed it
                    pass


@pytest.fixture
def opener() -> Iterator[Opener]:
    o = Opener()
    yield o
    o.close_all()


def pika_round_trip(conn: pika.BlockingConnection) -> None:
    """Declare an exclusive queue, publish with a confirm, get the message back on ``conn``."""
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(uniq("rt"), exclusive=True).method.queue
    body = uuid.uuid4().bytes
    ch.basic_publish("", q, body)
    _m, _p, got = get_one(ch, q)
    assert got == body
    ch.close()


# ==========================================================================================================
# max_connections
# ==========================================================================================================
def test_connection_limit_refuses_the_next_connection_with_530(conn_limit_node, opener):
    """max_connections = 3: the fourth connection is refused with connection.close 530 not-allowed
    (reference 1.2: "prohibited by the server ... by some other criteria"), sent in answer to start-ok
    (reference 1.4.2.2) so that it never reaches connection.open; the three open connections keep working,
    and once one of them closes a new connection is accepted again."""
    node = conn_limit_node
    first = [opener(node.url) for _ in range(3)]
    for c in first:
        pika_round_trip(c)

    # a pika client sees the refusal as a failed connection attempt carrying the 530
    with pytest.raises(pex.AMQPConnectionError) as info:
        opener(node.url)
    assert "530" in str(info.value) and "NOT_ALLOWED" in str(info.value), info.value

    # on the wire: connection.close 530 in answer to start-ok, never a connection.tune
    with RawClient(node.host, node.port) as c:
        hs = raw_handshake(c)
        assert not hs.opened and hs.tune is None
        assert hs.close is not None, "server dropped the over-limit connection without connection.close"
        assert hs.close.reply_code == 530, hs.close
        assert hs.close.reply_text.startswith("NOT_ALLOWED"), hs.close
        assert (hs.close.class_id, hs.close.method_id) == r.CONNECTION_START_OK

    # the refusals did not disturb the connections already open
    for c in first:
        assert c.is_open
        pika_round_trip(c)

    # closing one frees a slot (the node releases it asynchronously: retry, bounded)
    first[0].close()

    def attempt():
        try:
            return opener(node.url)
        except pex.AMQPConnectionError:
            return None

    fourth = wait_until(attempt, timeout=5, interval=0.1, what="a connection after one was closed")
    pika_round_trip(fourth)


# ==========================================================================================================
# channel_max
# ==========================================================================================================
def test_channel_max_is_offered_in_tune_and_enforced(limits_node, opener):
    """channel_max = 5: connection.tune offers channel-max 5 (reference 1.4.2.5.1). pika negotiates it
    and refuses a sixth channel itself (NoFreeChannels); a sixth channel.open regardless (number 6) is a
    connection error 530 not-allowed: five channels are open."""
    node = limits_node
    with RawClient(node.host, node.port) as c:
        hs = raw_handshake(c)
        assert hs.opened and hs.tune is not None
        assert hs.tune[0] == 5, hs.tune

    conn = opener(node.url)
    channels = [conn.channel() for _ in range(5)]
    assert sorted(ch.channel_number for ch in channels) == [1, 2, 3, 4, 5]
    with pytest.raises(pex.NoFreeChannels):
        conn.channel()
    for ch in channels:  # all five are usable
        ch.queue_declare("", exclusive=True)

    with pytest.raises(pex.ConnectionClosedByBroker) as info:
        conn.channel(channel_number=6)
    assert info.value.reply_code == 530, info.value
    assert "NOT_ALLOWED" in info.value.reply_text
    assert not conn.is_open
    round_trip(node.url)  # the node itself is fine


def test_raw_channel_open_beyond_channel_max_open_channels_is_530(limits_node):
    """The same limit on the wire, as RabbitMQ applies it (docs/design.md, "Channel numbers"): after
    tune-ok echoing channel-max 5, channel numbers above 5 open while fewer than five channels are
    open; a sixth open channel is answered with connection.close 530."""
    with RawClient(limits_node.host, limits_node.port) as c:
        assert raw_handshake(c).opened
        for number in (5, 6, 4000, 65535, 1):
            c.open_channel(number)
        c.send(r.channel_open(2))
        close = c.expect_connection_close()
        assert close.reply_code == 530, close
        assert "channel_max (5)" in close.reply_text, close


def test_tune_ok_channel_max_above_the_offer_is_refused(limits_node):
    """A client may only lower channel-max (reference 1.4.2.6.1 "negotiated maximum channels"): tune-ok
    with 10 > 5 must not yield an open connection; raftmq answers connection.close 530."""
    with RawClient(limits_node.host, limits_node.port) as c:
        hs = raw_handshake(c, channel_max=10)
        assert not hs.opened
        assert hs.close is None or hs.close.reply_code == 530, hs.close


# ==========================================================================================================
# frame_max and heartbeat
# ==========================================================================================================
def test_tune_offers_the_configured_frame_max_and_heartbeat(limits_node, opener):
    """frame_max = 8192 and heartbeat = 7 are what connection.tune proposes (reference 1.4.2.5.2 / 1.4.2.5.3);
    pika accepts both."""
    with RawClient(limits_node.host, limits_node.port) as c:
        hs = raw_handshake(c)
        assert hs.opened and hs.tune == (5, 8192, 7), hs.tune
    conn = opener(limits_node.url)
    assert (conn._impl.params.frame_max, conn._impl.params.heartbeat) == (8192, 7)
    pika_round_trip(conn)


def padded_queue_declare(channel: int, queue: str, frame_size: int) -> bytes:
    """A queue.declare (exclusive) whose whole frame is ``frame_size`` octets, padded with an ignored
    'x-pad' long-string argument."""
    flags = b"\x04"  # passive, durable, exclusive, auto-delete, no-wait (low bit first): exclusive only

    def build(pad: int) -> bytes:
        args = r.longstr(r.shortstr("x-pad") + b"S" + r.longstr(b"p" * pad))
        return r.method_frame(channel, r.QUEUE_DECLARE, struct.pack(">H", 0) + r.shortstr(queue) + flags + args)

    overhead = len(build(0))
    frame = build(frame_size - overhead)
    assert len(frame) == frame_size
    return frame


def test_frame_larger_than_the_configured_frame_max_is_501(limits_node):
    """general 4.2.3: a frame larger than the negotiated frame-max (8192, counting header and frame-end) is
    a connection error 501 frame-error; a frame of exactly 8192 octets is fine."""
    with RawClient(limits_node.host, limits_node.port) as c:
        assert raw_handshake(c).opened
        c.open_channel(1)
        c.send(padded_queue_declare(1, uniq("pad"), 8192))
        c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
        c.send(padded_queue_declare(1, uniq("pad"), 8193))
        close = c.expect_connection_close()
        assert close.reply_code == 501, close


def test_tune_ok_frame_max_above_the_offer_is_refused(limits_node):
    """A client may only lower frame-max (reference 1.4.2.6.2 "negotiated maximum frame size"): tune-ok
    with 16384 > 8192 must not yield an open connection; raftmq answers connection.close 530."""
    with RawClient(limits_node.host, limits_node.port) as c:
        hs = raw_handshake(c, frame_max=16384)
        assert not hs.opened
        assert hs.close is None or hs.close.reply_code == 530, hs.close


# ==========================================================================================================
# max_message_size
# ==========================================================================================================
def test_message_larger_than_max_message_size_is_406(limits_node, opener):
    """max_message_size = 1000: a 1000-octet body is accepted; a 1001-octet one closes the channel with
    406 precondition-failed (reference 1.2) naming basic.publish (class 60 method 40) -- a channel error:
    the connection and its other channels carry on."""
    conn = opener(limits_node.url)
    ch = conn.channel()
    ch.confirm_delivery()
    other = conn.channel()
    q = ch.queue_declare(uniq("size"), exclusive=True).method.queue
    ch.basic_publish("", q, b"a" * 1000)
    _m, _p, got = get_one(ch, q)
    assert got == b"a" * 1000

    with pytest.raises(pex.ChannelClosedByBroker) as info:
        ch.basic_publish("", q, b"b" * 1001)
    assert info.value.reply_code == 406, info.value
    assert "PRECONDITION_FAILED" in info.value.reply_text
    assert conn.is_open
    assert other.is_open
    assert message_count(other, q) == 0  # the refused message was not enqueued
    other.basic_publish("", q, b"c" * 10)
    _m, _p, got = get_one(other, q)
    assert got == b"c" * 10


def test_oversized_content_header_is_refused_before_the_body(limits_node):
    """The size check uses the content header's body-size (general 4.2.6.1): channel.close 406 arrives for
    a header announcing 5000 octets even though no body frame was sent; then the channel number can be
    reused after close-ok (reference 1.5.2.6)."""
    with RawClient(limits_node.host, limits_node.port) as c:
        assert raw_handshake(c).opened
        c.open_channel(1)
        c.send(r.basic_publish(1, "", "nowhere") + r.content_header_frame(1, 5000))
        f = c.expect_method(r.CHANNEL_CLOSE, channel=1)
        close = r.Close.decode(f.payload)
        assert close.reply_code == 406, close
        assert (close.class_id, close.method_id) == r.BASIC_PUBLISH
        c.send(r.method_frame(1, r.CHANNEL_CLOSE_OK))
        c.open_channel(1)
        raw_publish_and_get(c, channel=2)


# ==========================================================================================================
# authentication (shared broker: raftmq and RabbitMQ)
# ==========================================================================================================
@pytest.mark.parametrize(("user", "password"), [("guest", "wrong-password"), ("nobody-here", "guest")],
                         ids=["wrong-password", "unknown-user"])
def test_failed_login_is_403_access_refused(broker, raw, user, password):
    """A refused login: connection.close 403 access-refused (reference 1.2) in answer to start-ok, never a
    connection.tune (reference 1.4.2.2). pika reports it as ProbableAuthenticationError. (The close is what
    RabbitMQ sends to clients announcing the authentication_failure_close capability.)"""
    with pytest.raises(pex.ProbableAuthenticationError) as info:
        connect(url_for(broker, user, password))
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value), info.value

    hs = raw_handshake(raw(), response=f"\x00{user}\x00{password}".encode())
    assert not hs.opened and hs.tune is None
    assert hs.close is not None and hs.close.reply_code == 403, hs.close
    assert hs.close.reply_text.startswith("ACCESS_REFUSED"), hs.close
    round_trip(broker.url)


def test_amqplain_login_works(broker, raw):
    """AMQPLAIN (offered in connection.start's mechanisms, reference 1.4.2.1.4): the response is a field
    table of LOGIN and PASSWORD without its length prefix. The connection opens and is fully usable."""
    c = raw()
    hs = raw_handshake(c, mechanism="AMQPLAIN", response=amqplain("guest", "guest"))
    assert b"AMQPLAIN" in hs.mechanisms and b"PLAIN" in hs.mechanisms
    assert hs.opened, hs
    raw_publish_and_get(c)


def test_amqplain_with_wrong_password_is_403(broker, raw):
    hs = raw_handshake(raw(), mechanism="AMQPLAIN", response=amqplain("guest", "nope"))
    assert not hs.opened and hs.tune is None
    assert hs.close is not None and hs.close.reply_code == 403, hs.close


def test_unknown_mechanism_never_reaches_tune(broker, raw):
    """start-ok naming a mechanism the server did not offer (reference 1.4.2.2.2 "selected security
    mechanism"): the connection must not proceed to connection.tune. The spec names no reply code:
    raftmq answers 403 access-refused, RabbitMQ 503 command-invalid; a plain socket close is accepted too."""
    hs = raw_handshake(raw(), mechanism="NOT-A-MECHANISM", response=GUEST_PLAIN)
    assert not hs.opened and hs.tune is None
    assert hs.close is None or hs.close.reply_code in {403, 503, 530}, hs.close
    round_trip(broker.url)


def test_unknown_vhost_is_530(broker, raw):
    """connection.open on a virtual host that does not exist (reference 1.4.2.7): connection.close 530
    not-allowed naming connection.open (both raftmq and RabbitMQ; the spec's 402 invalid-path is unused by
    RabbitMQ-compatible servers)."""
    vhost = uniq("no-such-vhost")
    with pytest.raises(pex.ProbableAccessDeniedError) as info:
        connect(url_for(broker, "guest", "guest", vhost))
    assert "530" in str(info.value), info.value

    hs = raw_handshake(raw(), vhost=vhost)
    assert not hs.opened
    assert hs.close is not None and hs.close.reply_code == 530, hs.close
    assert (hs.close.class_id, hs.close.method_id) == r.CONNECTION_OPEN


# ==========================================================================================================
# users, vhosts and permissions (private raftmq node / rabbitmqctl on RabbitMQ)
# ==========================================================================================================
def test_configured_users_and_vhosts(perms_target, opener):
    """A configured user logs in with her password (and not with another one: 403); guest reaches the
    extra vhost; the restricted user has no permissions there, so connection.open is refused with 530
    not-allowed naming connection.open (reference 1.4.2.7); so is a vhost that does not exist."""
    t = perms_target
    alice_round_trip(opener(t.restricted_url()))
    pika_round_trip(opener(t.guest_url(t.other_vhost)))

    with pytest.raises(pex.ProbableAuthenticationError) as info:
        opener(t.restricted_url(password="guest"))
    assert "403" in str(info.value)

    with pytest.raises(pex.ProbableAccessDeniedError) as info:
        opener(t.restricted_url(t.other_vhost))
    assert "530" in str(info.value)

    for user, password, vhost in ((t.user, t.password, t.other_vhost), ("guest", "guest", uniq("missing"))):
        with RawClient(t.host, t.port) as c:
            hs = raw_handshake(c, response=f"\x00{user}\x00{password}".encode(), vhost=vhost)
            assert not hs.opened
            assert hs.close is not None and hs.close.reply_code == 530, hs.close
            assert (hs.close.class_id, hs.close.method_id) == r.CONNECTION_OPEN


def alice_round_trip(conn: pika.BlockingConnection) -> None:
    """A round trip alice is allowed to make: everything named own-*, no default exchange."""
    ch = conn.channel()
    ch.confirm_delivery()
    q, x = uniq("own-rt"), uniq("own-rtx")
    ch.queue_declare(q, exclusive=True)
    ch.exchange_declare(x, "fanout", auto_delete=True)
    ch.queue_bind(q, x)
    ch.basic_publish(x, "", b"alice")
    _m, _p, got = get_one(ch, q)
    assert got == b"alice"
    ch.close()  # the exchange goes away with its last binding, when the exclusive queue does


def expect_403(operation) -> None:
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        operation()
    assert info.value.reply_code == 403, info.value
    assert info.value.reply_text.startswith("ACCESS_REFUSED"), info.value


def test_restricted_user_configure_permission(perms_target, opener):
    """configure '^own-.*': declaring (and deleting) queues and exchanges inside the pattern works; outside
    it is a channel error 403 access-refused (reference 1.2), the connection stays open."""
    conn = opener(perms_target.restricted_url())
    ch = conn.channel()
    own_q, own_x = uniq("own-q"), uniq("own-x")
    ch.queue_declare(own_q, auto_delete=True)
    ch.exchange_declare(own_x, "direct", auto_delete=True)
    for op in (lambda c: c.queue_declare(uniq("other-q")),
               lambda c: c.exchange_declare(uniq("other-x"), "direct"),
               lambda c: c.queue_declare("xown-q")):  # the pattern is anchored
        expect_403(lambda op=op: op(conn.channel()))
    assert conn.is_open
    ch.exchange_delete(own_x)
    ch.queue_delete(own_q)


def test_restricted_user_write_and_read_permissions(perms_target, opener):
    """write '^own-.*' / read '^own-.*': publishing to an own- exchange and binding an own- queue to it
    works, and the message can be read with basic.get and basic.consume. Publishing to the default exchange
    (amq.default) or amq.direct, binding to amq.fanout (read on the exchange), and reading a queue outside
    the pattern (get or consume) are each refused with 403."""
    admin = opener(perms_target.guest_url()).channel()
    foreign_q = uniq("foreign-q")
    admin.queue_declare(foreign_q, auto_delete=False)
    admin.basic_publish("", foreign_q, b"not for alice")

    conn = opener(perms_target.restricted_url())
    ch = conn.channel()
    ch.confirm_delivery()
    own_q, own_x = uniq("own-q"), uniq("own-x")
    ch.queue_declare(own_q, exclusive=True)
    ch.exchange_declare(own_x, "direct", auto_delete=True)
    ch.queue_bind(own_q, own_x, routing_key="k")
    ch.basic_publish(own_x, "k", b"m1")
    ch.basic_publish(own_x, "k", b"m2")
    _m, _p, got = get_one(ch, own_q)
    assert got == b"m1"
    got_consumed = []
    tag = ch.basic_consume(own_q, lambda _c, _m, _p, b: got_consumed.append(b), auto_ack=True)
    wait_until(lambda: (conn.process_data_events(time_limit=0.05), got_consumed)[1], what="a delivery")
    ch.basic_cancel(tag)
    assert got_consumed == [b"m2"]

    def publish_on_new_channel(exchange: str, key: str):
        c = conn.channel()
        c.confirm_delivery()
        c.basic_publish(exchange, key, b"refused")

    expect_403(lambda: publish_on_new_channel("", own_q))            # amq.default
    expect_403(lambda: publish_on_new_channel("amq.direct", own_q))
    expect_403(lambda: conn.channel().queue_bind(own_q, "amq.fanout"))
    expect_403(lambda: conn.channel().basic_get(foreign_q, auto_ack=True))
    expect_403(lambda: conn.channel().basic_consume(foreign_q, lambda *a: None))
    expect_403(lambda: conn.channel().queue_purge(foreign_q))
    assert conn.is_open
    # nothing reached or left the foreign queue
    assert message_count(admin, foreign_q) == 1
    assert message_count(ch, own_q) == 0
    admin.queue_delete(foreign_q)


# ==========================================================================================================
# resource alarm (private raftmq node with a tiny memory_high_watermark)
# ==========================================================================================================
def alarm_transitions(node: RaftmqNode) -> tuple[int, int]:
    """(times set, times cleared) of the resource alarm, from the node's log."""
    text = node.log_path.read_text(errors="replace")
    return text.count("resource alarm set"), text.count("resource alarm cleared")


@pytest.fixture
def alarm_queue(alarm_node) -> Iterator[str]:
    """A queue name on the alarm node; afterwards the queue is deleted and the test waits (bounded) until
    the alarm has cleared, so that every alarm test starts below the watermark."""
    name = uniq("alarm")
    yield name
    c = connect(alarm_node.url)
    try:
        c.channel().queue_delete(name)
    finally:
        c.close()
    wait_until(lambda: len(set(alarm_transitions(alarm_node))) == 1, timeout=OP_TIMEOUT,
               what="the memory alarm to clear after the test")


def fill_over_watermark(url: str, queue: str) -> None:
    """Three 1000-octet messages (over the 2000-octet watermark), published from a short-lived
    connection with confirms so that they are queued when this returns."""
    c = connect(url)
    try:
        ch = c.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        for _ in range(3):
            ch.basic_publish("", queue, b"z" * 1000)
    finally:
        c.close()


def test_memory_alarm_blocks_publishers_then_unblocks(alarm_node, alarm_queue, opener):
    """Queued bodies above memory_high_watermark raise the memory alarm: publishing connections that
    announced the connection.blocked capability get connection.blocked (RabbitMQ's extension, class 10
    method 60) and the node stops reading from them; once the queue is purged the alarm clears and
    connection.unblocked (method 61) follows, and the publish held meanwhile goes through."""
    events: list[tuple[str, str]] = []
    # blocked_connection_timeout: pika would tear the connection down if blocked longer than this;
    # generous enough for the alarm check interval (1 s) on both edges.
    pub = opener(alarm_node.url, blocked_connection_timeout=30)
    pub.add_on_connection_blocked_callback(lambda _c, f: events.append(("blocked", f.method.reason)))
    pub.add_on_connection_unblocked_callback(lambda _c, _f: events.append(("unblocked", "")))
    observer = opener(alarm_node.url).channel()  # never publishes: never paused
    q = observer.queue_declare(alarm_queue).method.queue

    pch = pub.channel()
    for _ in range(3):
        pch.basic_publish("", q, b"x" * 1000)
    wait_until(lambda: message_count(observer, q) == 3, what="3 messages queued")

    def saw(kind):
        pub.process_data_events(time_limit=0.05)
        return any(e[0] == kind for e in events)

    wait_until(lambda: saw("blocked"), timeout=OP_TIMEOUT, what="connection.blocked")
    assert events[0][0] == "blocked" and "memory" in events[0][1], events
    assert pub.is_open

    # the node no longer reads what the blocked publisher sends
    pch.basic_publish("", q, b"held while blocked")
    pump(pub, 1.0)
    assert message_count(observer, q) == 3

    assert observer.queue_purge(q).method.message_count == 3
    wait_until(lambda: saw("unblocked"), timeout=OP_TIMEOUT, what="connection.unblocked")
    assert [e[0] for e in events] == ["blocked", "unblocked"]
    _m, _p, got = get_one(observer, q)
    assert got == b"held while blocked"
    pika_round_trip(pub)


def test_memory_alarm_also_clears_when_messages_are_consumed(alarm_node, alarm_queue, opener):
    """The alarm follows the queued bytes both ways: consuming (not only purging) clears it. A connection
    opened while the alarm is on is told connection.blocked (class 10 method 60, with the reason) right
    after connection.open-ok -- raftmq notifies every connection that announced the capability -- and
    connection.unblocked (method 61) when it clears. (Raw client for that one: the blocked frame arrives
    before pika returns the connection object to add a callback to.)"""
    before = alarm_transitions(alarm_node)
    fill_over_watermark(alarm_node.url, alarm_queue)
    wait_until(lambda: alarm_transitions(alarm_node)[0] > before[0], timeout=OP_TIMEOUT,
               what="the memory alarm")

    with RawClient(alarm_node.host, alarm_node.port) as late:
        assert raw_handshake(late).opened
        blocked = late.expect_method(CONNECTION_BLOCKED, channel=0)
        reason, _ = r.read_shortstr(blocked.payload, 4)
        assert b"memory" in reason, reason

        consumer = opener(alarm_node.url)
        got = consume(consumer, consumer.channel(), alarm_queue, 3, auto_ack=True)
        assert [b for _m, _p, b in got] == [b"z" * 1000] * 3
        late.expect_method(CONNECTION_UNBLOCKED, channel=0, timeout=OP_TIMEOUT)
        late.open_channel(1)  # and it works normally


def test_connection_opened_during_the_alarm_is_notified_even_if_the_alarm_rose_mid_handshake(
        alarm_node, alarm_queue):
    """The alarm goes up while a client is between connection.tune-ok and connection.open (reference
    1.4.2.6 / 1.4.2.7): after open-ok that connection must hear connection.blocked like one opened a
    moment later does (previous test) -- and it must never get a connection.unblocked that no
    connection.blocked preceded. (Regression test: raftmq used to record the alarm on the half-open
    connection and then skip the notification after open-ok; fixed in 8fad103.)"""
    with RawClient(alarm_node.host, alarm_node.port) as c:
        c.send(r.PROTOCOL_HEADER)
        c.expect_method(r.CONNECTION_START, channel=0)
        c.send(r.method_frame(0, r.CONNECTION_START_OK, CLIENT_PROPERTIES + r.shortstr("PLAIN")
                              + r.longstr(GUEST_PLAIN) + r.shortstr("en_US")))
        tune = c.expect_method(r.CONNECTION_TUNE, channel=0)
        channel_max, frame_max, _hb = struct.unpack_from(">HIH", tune.payload, 4)
        c.send(r.method_frame(0, r.CONNECTION_TUNE_OK, struct.pack(">HIH", channel_max, frame_max, 0)))

        before = alarm_transitions(alarm_node)
        fill_over_watermark(alarm_node.url, alarm_queue)
        wait_until(lambda: alarm_transitions(alarm_node)[0] > before[0], timeout=OP_TIMEOUT,
                   what="the memory alarm")

        c.send(r.method_frame(0, r.CONNECTION_OPEN, r.shortstr("/") + r.shortstr("") + b"\x00"))
        c.expect_method(r.CONNECTION_OPEN_OK, channel=0)
        try:
            f = c.read_method(timeout=3)
        except TimeoutError:
            f = None
        assert f is not None and f.method == CONNECTION_BLOCKED, (
            f"no connection.blocked after open-ok during the alarm (next frame: {f})")


def test_disk_alarm_blocks_publishers(raftmq_only, tmp_path_factory, opener):
    """disk_free_limit above the free space of any disk: the disk alarm is on from the start, so a
    connection hears connection.blocked with a disk reason right after open-ok. As in RabbitMQ (a
    connection is "blocking" until it publishes, then "blocked"), the node stops reading from a connection
    once it has published: of three publishes sent one after the other at most the first is enqueued,
    while a connection that does not publish keeps working."""
    node = start_node(tmp_path_factory, "disk-alarm", "disk_free_limit = 1000000000000000000\n")
    try:
        with RawClient(node.host, node.port) as c:
            assert raw_handshake(c).opened
            blocked = c.expect_method(CONNECTION_BLOCKED, channel=0, timeout=OP_TIMEOUT)
            reason, _ = r.read_shortstr(blocked.payload, 4)
            assert b"disk" in reason, reason

        observer = opener(node.url).channel()
        q = observer.queue_declare(uniq("disk")).method.queue
        pub = opener(node.url, blocked_connection_timeout=30)
        pch = pub.channel()
        for i in range(3):
            pch.basic_publish("", q, f"m{i}".encode())
            pump(pub, 0.4)
        pump(pub, 0.6)
        assert message_count(observer, q) <= 1
        assert observer.queue_declare(uniq("still-working"), exclusive=True).method.message_count == 0
    finally:
        # the node first: a client cannot close a connection the node no longer reads from (pika would
        # wait for close-ok until blocked_connection_timeout); a stopping node closes them itself (320)
        node.terminate()
        opener.close_all()


@pytest.mark.cluster
def test_memory_alarm_in_a_cluster(raftmq_only, tmp_path, opener):
    """The memory alarm in a 3-node cluster: queued bodies over memory_high_watermark on the leader block
    its publishers with connection.blocked, as on a single node."""
    with Cluster(3, base_dir=tmp_path / "cluster",
                 extra_config="memory_high_watermark = 2000\ndisk_free_limit = 1") as cluster:
        leader = cluster.leader()
        events: list[str] = []
        pub = opener(leader.url, blocked_connection_timeout=30)
        pub.add_on_connection_blocked_callback(lambda _c, _f: events.append("blocked"))
        ch = pub.channel()
        ch.confirm_delivery()
        q = ch.queue_declare(uniq("cluster-alarm")).method.queue
        for _ in range(3):
            ch.basic_publish("", q, b"c" * 1000)
        wait_until(lambda: (pub.process_data_events(time_limit=0.05), "blocked" in events)[1],
                   timeout=OP_TIMEOUT, what="connection.blocked from the cluster leader")
        opener.close_all()


# ==========================================================================================================
# channel.flow and basic.qos global (shared broker)
# ==========================================================================================================
def test_channel_flow_pauses_and_resumes_deliveries(broker, connections):
    """channel.flow active=false asks the server to stop sending content to the channel's consumers and
    active=true to restart (reference 1.5.2.3); flow-ok echoes the state (1.5.2.4). Basic.Get-Ok is not
    affected ("It does not affect contents returned by Basic.Get-Ok methods").

    RabbitMQ deviation: it does not implement active=false and closes the connection with 540
    not-implemented; that answer is accepted only when the broker under test is RabbitMQ."""
    conn = connections()
    ch = conn.channel()
    q = ch.queue_declare(uniq("flow"), exclusive=True).method.queue
    if broker.kind == "rabbitmq":
        with pytest.raises(pex.ConnectionClosedByBroker) as info:
            ch.flow(False)
        assert info.value.reply_code == 540, info.value
        return
    assert ch.flow(False) is False
    got: list[bytes] = []
    ch.basic_consume(q, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    pub = conn.channel()
    pub.confirm_delivery()
    for i in range(5):
        pub.basic_publish("", q, f"m{i}".encode())
    pump(conn, 0.7)
    assert got == [], "deliveries arrived on a channel paused with channel.flow active=false"
    _m, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"m0"
    assert ch.flow(True) is True
    wait_until(lambda: (conn.process_data_events(time_limit=0.05), len(got) == 4)[1],
               what="4 deliveries after channel.flow active=true")
    assert got == [b"m1", b"m2", b"m3", b"m4"]


@pytest.mark.parametrize("global_qos", [True, False], ids=["global", "per-consumer"])
def test_basic_qos_prefetch_scope(connections, global_qos):
    """basic.qos prefetch-count (reference 1.8.3.1) with two consumers on one channel, nothing acked:
    global=true (RabbitMQ semantics, advertised by its per_consumer_qos capability) shares the limit of 3
    across the channel -- 3 unacked in total; global=false gives each consumer its own limit of 3 -- 6 in
    total. Acking one delivery (multiple=false) lets exactly one more through."""
    conn = connections()
    ch = conn.channel()
    queues = [ch.queue_declare(uniq(f"qos{i}"), exclusive=True).method.queue for i in range(2)]
    pub = conn.channel()
    pub.confirm_delivery()
    for q in queues:
        for i in range(6):
            pub.basic_publish("", q, f"{q}:{i}".encode())
    ch.basic_qos(prefetch_count=3, global_qos=global_qos)
    got: list[tuple[str, int]] = []
    for q in queues:
        ch.basic_consume(q, lambda _c, m, _p, _b: got.append((m.consumer_tag, m.delivery_tag)), auto_ack=False)
    limit = 3 if global_qos else 6
    wait_until(lambda: (conn.process_data_events(time_limit=0.05), len(got) >= limit)[1],
               what=f"{limit} deliveries")
    pump(conn, 0.5)
    assert len(got) == limit, got
    if not global_qos:
        assert sorted(tag for tag, _ in got).count(got[0][0]) == 3  # 3 for each consumer
    ch.basic_ack(got[0][1])
    wait_until(lambda: (conn.process_data_events(time_limit=0.05), len(got) > limit)[1],
               what="one more delivery after an ack")
    pump(conn, 0.5)
    assert len(got) == limit + 1, got


# ==========================================================================================================
# pika's asynchronous adapter (shared broker)
# ==========================================================================================================
def test_select_connection_publish_consume_round_trip_with_confirms(broker):
    """pika.SelectConnection (callbacks on pika's own ioloop): open a channel, confirm.select (RabbitMQ's
    publisher-confirm extension; acks may use multiple=true, reference 1.8.3.13 basic.ack), declare an
    exclusive queue, consume it, publish N messages; every publish is acked and every message delivered
    once, in publish order (general 4.7 content ordering)."""
    n = 50
    bodies = [f"select-{i}".encode() for i in range(n)]
    state = {"acked": set(), "nacked": set(), "delivered": [], "error": None, "closed": False}
    params = pika.URLParameters(broker.url)
    params.connection_attempts = 1
    params.socket_timeout = 5

    def finish_if_done(conn: pika.SelectConnection) -> None:
        if len(state["acked"]) + len(state["nacked"]) == n and len(state["delivered"]) == n and conn.is_open:
            conn.close()

    def on_open(conn: pika.SelectConnection) -> None:
        conn.channel(on_open_callback=lambda ch: on_channel(conn, ch))

    def on_channel(conn: pika.SelectConnection, ch) -> None:
        def on_channel_closed(_ch, reason) -> None:
            if not isinstance(reason, pex.ChannelClosedByClient):  # the close at the end closes it too
                state["error"] = state["error"] or reason

        ch.add_on_close_callback(on_channel_closed)

        def on_confirm(frame) -> None:
            method = frame.method
            target = state["acked"] if isinstance(method, pika.spec.Basic.Ack) else state["nacked"]
            if method.multiple:
                target.update(t for t in range(1, method.delivery_tag + 1)
                              if t not in state["acked"] and t not in state["nacked"])
            else:
                target.add(method.delivery_tag)
            finish_if_done(conn)

        def on_delivery(_ch, method, _props, body) -> None:
            state["delivered"].append(body)
            ch.basic_ack(method.delivery_tag)
            finish_if_done(conn)

        def on_declared(frame) -> None:
            q = frame.method.queue
            ch.basic_consume(q, on_delivery, callback=lambda _f: publish_all(q))

        def publish_all(q: str) -> None:
            for body in bodies:
                ch.basic_publish("", q, body)

        ch.confirm_delivery(on_confirm, callback=lambda _f: ch.queue_declare(
            uniq("select"), exclusive=True, callback=on_declared))

    def on_open_error(_conn, err) -> None:
        state["error"] = err
        conn.ioloop.stop()

    def on_closed(_conn, reason) -> None:
        state["closed"] = True
        if not isinstance(reason, pex.ConnectionClosedByClient):
            state["error"] = state["error"] or reason
        conn.ioloop.stop()

    conn = pika.SelectConnection(params, on_open_callback=on_open, on_open_error_callback=on_open_error,
                                 on_close_callback=on_closed)
    timer = conn.ioloop.call_later(OP_TIMEOUT, conn.ioloop.stop)  # bound the whole exchange
    conn.ioloop.start()
    conn.ioloop.remove_timeout(timer)
    if not state["closed"] and conn.is_open:
        conn.close()
        conn.ioloop.start()  # run until the close completes (on_closed stops the loop)
    assert state["error"] is None, state["error"]
    assert state["closed"], "the round trip did not finish within the time limit"
    assert state["acked"] == set(range(1, n + 1)) and not state["nacked"]
    assert state["delivered"] == bodies


# ==========================================================================================================
# found while writing the permission tests (shared broker; a regression test now)
# ==========================================================================================================
def test_deleting_an_auto_delete_exchange_that_still_has_bindings(connections):
    """exchange.delete (reference 1.6.2.3) of an auto-delete exchange with a queue bound to it: delete-ok,
    the exchange is gone (a passive declare is 404, reference 1.6.2.1.4), the connection stays open.
    (Regression test: raftmq used to answer 541 internal-error -- removing the last binding auto-deleted
    the exchange re-entrantly inside exchange.delete; fixed in 8fad103.)"""
    conn = connections()
    ch = conn.channel()
    q = ch.queue_declare(uniq("ad-q"), exclusive=True).method.queue
    x = uniq("ad-x")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    ch.queue_bind(q, x)
    ch.exchange_delete(x)
    assert conn.is_open
    with pytest.raises(pex.ChannelClosedByBroker) as info:
        conn.channel().exchange_declare(x, "fanout", passive=True)
    assert info.value.reply_code == 404
    ch.basic_publish("", q, b"still usable")
    _m, _p, got = get_one(ch, q)
    assert got == b"still usable"
