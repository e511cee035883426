"""The wire protocol over a plain socket, with frames built by hand (tests/integration/rawamqp.py).

Malformed or out-of-order input must end in the reply code the 0-9-1 spec prescribes and must never
take the node down: after every bad-input test a fresh pika connection does a publish/get round trip.

Where RabbitMQ 3.x (the reference these tests are checked against) answers with another code than the
spec prescribes, the test says so and accepts RabbitMQ's answer only when the broker under test *is*
RabbitMQ (``RABBITMQ_DEVIATIONS``); raftmq is held to the spec. Where the spec itself allows two answers,
both are accepted for every broker.
"""

from __future__ import annotations

import struct
import time

import pytest

from tests.integration import rawamqp as r
from tests.integration.helpers import round_trip, uniq
from tests.integration.rawamqp import RawClient

# Known RabbitMQ 3.x answers that differ from the 0-9-1 text; allowed only when kind == "rabbitmq".
RABBITMQ_DEVIATIONS = {
    # general 4.2.7: invalid heartbeat frame -> 501; RabbitMQ: 505 UNEXPECTED_FRAME.
    "heartbeat-on-channel": {505},
    # general 4.2.6.1: content frame on channel 0 -> 504; RabbitMQ: 505 UNEXPECTED_FRAME.
    "content-on-channel-0": {505},
    # unknown class/method: RabbitMQ drops the TCP connection without a connection.close (None here).
    "unknown-method": {None},
}


@pytest.fixture
def raw(broker):
    clients: list[RawClient] = []

    def open_client(timeout: float = 5.0) -> RawClient:
        c = RawClient(broker.host, broker.port, timeout=timeout)
        clients.append(c)
        return c

    yield open_client
    for c in clients:
        c.close()


def assert_broker_survived(broker) -> None:
    """The node did not crash: it still runs, answers the header, and serves a real client."""
    assert broker.is_alive(), "broker process died or stopped answering"
    round_trip(broker.url)


def allowed(broker, spec_codes: set[int], deviation: str | None = None) -> set[int | None]:
    codes: set[int | None] = set(spec_codes)
    if deviation and broker.kind == "rabbitmq":
        codes |= RABBITMQ_DEVIATIONS[deviation]
    return codes


def close_code_after(client: RawClient, data: bytes) -> r.Close | None:
    """Send ``data`` (the server may already be closing), return the connection.close it answers with, or
    None when it ends the socket without one. After close-ok the server must end the socket."""
    try:
        client.send(data)
    except OSError:
        pass
    close = client.close_or_eof(timeout=8)
    if close is not None:
        # reference 1.4.2.10: close-ok lets the server release the connection and close the socket
        # (general 4.10.2 lets it pause a few seconds first; RabbitMQ takes ~3 s after a frame error)
        try:
            rest = client.read_all_until_eof(timeout=6)
        except TimeoutError:
            pytest.fail("server did not close the socket after connection.close / close-ok")
        assert rest.replace(r.heartbeat_frame(0), b"") == b"", "server kept sending after connection.close"
    return close


def opened(raw, **handshake) -> RawClient:
    c = raw()
    c.handshake(**handshake)
    c.open_channel(1)
    return c


# -- handshake --------------------------------------------------------------------------------------------
def test_handshake_start_tune_open_and_clean_close(raw, broker):
    """reference 1.4.2.1 connection.start: version 0-9, PLAIN among the mechanisms, en_US among the
    locales; tune proposes frame-max >= frame-min-size (4096, reference 1.2); a connection.close from the
    client is answered with close-ok (reference 1.4.2.10)."""
    c = raw()
    c.handshake()
    assert c.version == (0, 9)
    assert b"PLAIN" in c.mechanisms.split()
    assert b"en_US" in c.locales.split()
    # RabbitMQ-style capabilities that clients (pika, aio-pika, kombu) look for
    for cap in (b"capabilities", b"publisher_confirms", b"consumer_cancel_notify", b"basic.nack"):
        assert cap in c.server_properties
    assert c.frame_max == 0 or c.frame_max >= 4096
    c.open_channel(1)
    c.send(r.channel_close(1))
    c.expect_method(r.CHANNEL_CLOSE_OK, channel=1)
    c.open_channel(1)  # a closed channel number can be opened again
    c.send(r.connection_close())
    c.expect_method(r.CONNECTION_CLOSE_OK, channel=0)
    # close-ok tells the client "it is safe to ... close the socket": the client closes it


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x01\x00\x00",   # AMQP 1.0
    b"AMQP\x00\x00\x09\x02",   # a 0-9 revision that does not exist
    b"AMQP\x03\x01\x00\x00",   # another protocol id
    b"GET / HTTP/1.1\r\n\r\n",  # not AMQP at all
], ids=["1.0", "0-9-2", "proto-3", "http"])
def test_wrong_protocol_header_gets_the_0_9_1_header_and_a_close(raw, broker, header):
    """general 4.2.2 / reference 1.4.2.1: "If the server cannot support the protocol specified in the
    protocol header, it MUST respond with a valid protocol header and then close the socket connection." """
    if broker.kind == "raftmq" and header[:5] in (b"AMQP\x00", b"AMQP\x03") and header[5:6] == b"\x01":
        pytest.skip("raftmq speaks AMQP 1.0 (and its SASL layer) on this port: test_amqp10_raw.py")
    c = raw()
    c.send(header)
    assert c.read_all_until_eof(timeout=5) == r.PROTOCOL_HEADER
    assert_broker_survived(broker)


# -- frame errors (connection exceptions) ----------------------------------------------------------------
@pytest.mark.parametrize("garbage", [
    r.frame(1, 1, struct.pack(">HH", 50, 10) + b"\x00" * 10, end=b"\x00"),  # a method frame, bad frame-end
    b"\x01\x00\x01\x00\x00\x00\x05hello\xff",                               # 5 octets then 0xff
    r.frame(8, 0, b"", end=b"\xcf"),                                          # a heartbeat, bad frame-end
    b"this is not an AMQP frame at all\r\n",                                  # ASCII: unknown frame type 't'
], ids=["method-bad-end", "bytes-bad-end", "heartbeat-bad-end", "ascii"])
def test_garbage_after_handshake_is_frame_error_501(raw, broker, garbage):
    """general 4.2.3: a frame-end other than %xCE (or an undefined frame type) is a fatal frame error: the
    connection ends with 501 frame-error (reference 1.2). (4.2.3 also lets a peer just close the socket;
    RabbitMQ and raftmq send connection.close 501, which is what this test requires.)"""
    c = opened(raw)
    close = close_code_after(c, garbage)
    assert close is not None, "server dropped the connection without connection.close"
    assert close.reply_code == 501, close
    assert close.reply_text.startswith("FRAME_ERROR")
    assert_broker_survived(broker)


@pytest.mark.parametrize(("channel", "method"), [
    (1, (999, 10)),   # unknown class
    (1, (60, 999)),   # known class (basic), unknown method
    (0, (4242, 1)),   # unknown class on channel 0
], ids=["unknown-class", "unknown-method", "unknown-class-channel-0"])
def test_unknown_class_or_method_is_540_or_503(raw, broker, channel, method):
    """A method id the spec does not define: 540 not-implemented ("functionality that is not implemented")
    or 503 command-invalid (reference 1.2) -- the spec names no single code, both are accepted.
    RabbitMQ deviation: it ends the TCP connection without a connection.close."""
    c = opened(raw)
    close = close_code_after(c, r.method_frame(channel, method, b"\x00" * 8))
    code = close.reply_code if close else None
    assert code in allowed(broker, {540, 503}, "unknown-method"), close
    assert_broker_survived(broker)


@pytest.mark.parametrize("frames", [
    [r.body_frame(1, b"hello")],
    [r.content_header_frame(1, 5), r.body_frame(1, b"hello")],
    [r.basic_publish(1, "", "q"), r.queue_declare(1, "x")],
    [r.basic_publish(1, "", "q"), r.body_frame(1, b"hello")],
], ids=["body-without-publish", "header-without-publish", "publish-then-method", "publish-then-body"])
def test_content_frames_out_of_order_are_505(raw, broker, frames):
    """general 4.2.6: "A peer that receives an incomplete or badly-formatted content MUST raise a connection
    exception with reply code 505 (unexpected frame). This includes missing content headers..." A body or
    header with no publish before it, or a publish not followed by its header, is such content."""
    c = opened(raw)
    close = close_code_after(c, b"".join(frames))
    assert close is not None and close.reply_code == 505, close
    assert close.reply_text.startswith("UNEXPECTED_FRAME")
    assert_broker_survived(broker)


def test_content_header_with_wrong_class_is_501_or_505(raw, broker):
    """A content header whose class-id is not the publish method's class: general 4.2.6.1 says 501
    frame-error, general 4.2.6 lists "wrong class IDs in content headers" under 505 unexpected-frame; the
    spec contradicts itself, so both are accepted (RabbitMQ answers 505)."""
    c = opened(raw)
    close = close_code_after(c, r.basic_publish(1, "", "q") + r.content_header_frame(1, 5, class_id=50)
                             + r.body_frame(1, b"hello"))
    assert close is not None and close.reply_code in {501, 505}, close
    assert_broker_survived(broker)


@pytest.mark.parametrize("what", ["method", "body"])
def test_frame_larger_than_negotiated_frame_max_is_501(raw, broker, what):
    """general 4.2.3: "A peer MUST NOT send frames larger than the agreed-upon size. A peer that receives an
    oversized frame MUST signal a connection exception with reply code 501 (frame error)." frame_max counts
    the whole frame, header and frame-end included (reference 1.4.2.5.2)."""
    c = opened(raw, frame_max=4096)
    assert c.frame_max == 4096
    if what == "method":
        # a queue.declare padded with a large arguments table: 9000-octet payload
        payload = struct.pack(">HHH", 50, 10, 0) + r.shortstr("big") + b"\x00" + r.longstr(b"\x00" * 8980)
        data = r.frame(r.FRAME_METHOD, 1, payload)
    else:
        data = r.basic_publish(1, "", "q") + r.content_header_frame(1, 9000) + r.body_frame(1, b"x" * 9000)
    assert len(data) > 4096
    close = close_code_after(c, data)
    assert close is not None and close.reply_code == 501, close
    assert_broker_survived(broker)


def test_method_on_a_channel_that_is_not_open_is_504(raw, broker):
    """reference 1.2 channel-error (504): "The client attempted to work with a channel that had not been
    correctly opened." """
    c = raw()
    c.handshake()
    close = close_code_after(c, r.queue_declare(5, "never-opened"))
    assert close is not None and close.reply_code == 504, close
    assert (close.class_id, close.method_id) == r.QUEUE_DECLARE
    assert_broker_survived(broker)


def test_opening_an_open_channel_is_504(raw, broker):
    """reference 1.5.2.1 (channel.open): "The client MUST NOT use this method on an already-opened channel."
    On failure: channel-error (504)."""
    c = opened(raw)
    close = close_code_after(c, r.channel_open(1))
    assert close is not None and close.reply_code == 504, close
    assert (close.class_id, close.method_id) == r.CHANNEL_OPEN
    assert_broker_survived(broker)


def test_connection_method_on_a_non_zero_channel_is_503(raw, broker):
    """general 4.2.3: "The channel number MUST be zero for all heartbeat frames, and for method, header and
    body frames that refer to the Connection class. A peer that receives a non-zero channel number for one
    of these frames MUST signal a connection exception with reply code 503 (command invalid)." """
    c = opened(raw)
    close = close_code_after(c, r.method_frame(1, r.CONNECTION_CLOSE_OK))
    assert close is not None and close.reply_code == 503, close
    assert_broker_survived(broker)


def test_heartbeat_on_a_non_zero_channel_is_501(raw, broker):
    """general 4.2.7: "Heartbeat frames MUST have a channel number of zero. A peer that receives an invalid
    heartbeat frame MUST raise a connection exception with reply code 501 (frame error)."
    RabbitMQ deviation: it answers 505 unexpected-frame."""
    c = opened(raw)
    close = close_code_after(c, r.heartbeat_frame(1))
    assert close is not None and close.reply_code in allowed(broker, {501}, "heartbeat-on-channel"), close
    assert_broker_survived(broker)


def test_content_header_on_channel_zero_is_504(raw, broker):
    """general 4.2.6.1: "The channel number in content frames MUST NOT be zero. A peer that receives a zero
    channel number in a content frame MUST signal a connection exception with reply code 504."
    RabbitMQ deviation: it answers 505 unexpected-frame."""
    c = opened(raw)
    close = close_code_after(c, r.content_header_frame(0, 5) + r.body_frame(0, b"hello"))
    assert close is not None and close.reply_code in allowed(broker, {504}, "content-on-channel-0"), close
    assert_broker_survived(broker)


def test_reusing_a_consumer_tag_on_a_channel_is_530(raw, broker):
    """basic.consume consumer-tag (0-9-1 rule): "The client MUST NOT specify a tag that refers to an existing
    consumer." On failure: not-allowed (530), a connection error."""
    c = opened(raw)
    q = uniq("raw-q")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    c.send(r.basic_consume(1, q, "dup-tag"))
    ok = c.expect_method(r.BASIC_CONSUME_OK, channel=1)
    assert r.read_shortstr(ok.payload, 4)[0] == b"dup-tag"
    close = close_code_after(c, r.basic_consume(1, q, "dup-tag"))
    assert close is not None and close.reply_code == 530, close
    assert_broker_survived(broker)


# -- content framing done right ----------------------------------------------------------------------------
def test_body_split_over_several_frames_is_reassembled(raw, broker):
    """general 4.2.6.2: "A peer MUST handle a content body that is split into multiple frames by storing
    these frames as a single set"; basic.get-ok returns the whole body with its body size."""
    c = opened(raw)
    q = uniq("raw-split")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    parts = [b"hello ", b"", b"split ", b"world"]
    body = b"".join(parts)
    c.send(r.basic_publish(1, "", q) + r.content_header_frame(1, len(body))
           + b"".join(r.body_frame(1, p) for p in parts if p))
    c.send(r.basic_get(1, q))
    c.expect_method(r.BASIC_GET_OK, channel=1)
    header = c.read_frame()
    assert header.type == r.FRAME_HEADER and header.channel == 1
    class_id, weight, size = struct.unpack_from(">HHQ", header.payload)
    assert (class_id, weight, size) == (60, 0, len(body))
    got = b""
    while len(got) < size:
        f = c.read_frame()
        assert f.type == r.FRAME_BODY and f.channel == 1
        got += f.payload
    assert got == body


# -- many publishes in one read (the front end's one-step path for publish + header + one body) --------------
def publishes(channel: int, queue: str, bodies: list[bytes], **bits) -> bytes:
    return b"".join(r.basic_publish(channel, "", queue, **bits) + r.content_header_frame(channel, len(b))
                    + r.body_frame(channel, b) for b in bodies)


def get_bodies(c: RawClient, queue: str, count: int) -> list[bytes]:
    got = []
    for _ in range(count):
        c.send(r.basic_get(1, queue))
        c.expect_method(r.BASIC_GET_OK, channel=1)
        header = c.read_frame()
        size = struct.unpack_from(">HHQ", header.payload)[2]
        got.append(c.read_frame().payload if size else b"")
    return got


def test_a_read_of_many_publishes_keeps_order_confirms_and_returns(raw, broker):
    """Publishes arriving together, routable and mandatory-unroutable mixed, in confirm mode: every
    unroutable mandatory one comes back as basic.return 312 (reference 1.8.3.8) before its ack, every
    publish is acked once, in order (confirm delivery tags count publishes from 1), and the routable
    ones are queued in publish order."""
    c = opened(raw)
    q = uniq("raw-batch")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    c.send(r.method_frame(1, r.CONFIRM_SELECT, b"\x00"))
    c.expect_method(r.CONFIRM_SELECT_OK, channel=1)
    data, expected, returned = b"", [], []
    for i in range(60):
        body = f"m{i}".encode()
        if i % 7 == 3:
            data += (r.basic_publish(1, "", uniq("nowhere"), mandatory=True) + r.content_header_frame(1, len(body))
                     + r.body_frame(1, body))
            returned.append(body)
        else:
            data += publishes(1, q, [body], mandatory=i % 2 == 0)
            expected.append(body)
    c.send(data)
    acked, got_returns = 0, []
    while acked < 60:
        f = c.read_method()
        if f.method == r.BASIC_RETURN:
            assert struct.unpack_from(">H", f.payload, 4)[0] == 312
            c.read_frame()  # header
            got_returns.append(c.read_frame().payload)
        else:
            assert f.method == r.BASIC_ACK, f
            tag, multiple = struct.unpack_from(">QB", f.payload, 4)
            assert tag > acked and (multiple or tag == acked + 1)
            acked = tag
    assert got_returns == returned
    assert get_bodies(c, q, len(expected)) == expected


def test_publish_with_immediate_in_a_batch_is_540(raw, broker):
    """immediate=true is not implemented (RabbitMQ 3 refuses it the same way): connection.close 540
    naming basic.publish, even when it comes in one read with ordinary publishes."""
    c = opened(raw)
    q = uniq("raw-imm")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    close = close_code_after(c, publishes(1, q, [b"a"]) + publishes(1, q, [b"b"], immediate=True))
    assert close is not None and close.reply_code == 540, close
    assert (close.class_id, close.method_id) == r.BASIC_PUBLISH
    assert_broker_survived(broker)


@pytest.mark.parametrize(("frames", "codes", "rabbitmq_checks"), [
    # a zero-size content has no body frame (general 4.2.6.2): an empty body frame after it is unexpected
    ([r.content_header_frame(1, 0), r.body_frame(1, b"")], {505}, True),
    # a body frame larger than the header's body size: badly formatted content (general 4.2.6), which
    # the spec calls 505 there and 501 for frame sizes; both are accepted.  RabbitMQ does not check it.
    ([r.content_header_frame(1, 3), r.body_frame(1, b"hello")], {501, 505}, False),
    # a body frame shorter than the body size, then a new method: the content is incomplete
    ([r.content_header_frame(1, 9), r.body_frame(1, b"hello"), r.basic_publish(1, "", "q")], {505}, True),
], ids=["empty-body-frame-after-size-0", "body-longer-than-size", "body-cut-short"])
def test_content_whose_size_disagrees_with_its_body_is_refused(raw, broker, frames, codes, rabbitmq_checks):
    """general 4.2.6: incomplete or badly formatted content is a connection exception; taken in one
    read with a good publish before it, the answer is the same as frame by frame."""
    if broker.kind == "rabbitmq" and not rabbitmq_checks:
        pytest.skip("RabbitMQ does not check this")
    c = opened(raw)
    q = uniq("raw-size")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    close = close_code_after(c, publishes(1, q, [b"fine"]) + r.basic_publish(1, "", q) + b"".join(frames))
    assert close is not None and close.reply_code in codes, close
    assert_broker_survived(broker)


def test_publish_with_a_routing_key_that_is_not_utf8_is_502(raw, broker):
    """general 4.2.5.3: short strings "can carry up to 255 octets of UTF-8 data"; one that is not UTF-8 is
    a 502 syntax-error (reference 1.2), also when the publish arrives with its content in one read.
    RabbitMQ deviation: it takes the octets as they are."""
    if broker.kind == "rabbitmq":
        pytest.skip("RabbitMQ accepts routing keys that are not UTF-8")
    c = opened(raw)
    close = close_code_after(c, r.basic_publish(1, "", b"\xff\xfe") + r.content_header_frame(1, 1)
                             + r.body_frame(1, b"x"))
    assert close is not None and close.reply_code == 502, close
    assert_broker_survived(broker)


def test_publish_to_a_missing_exchange_in_a_batch_closes_only_the_channel_404(raw, broker):
    """reference 1.8.3.7 (basic.publish exchange): "The server MUST ... raise a channel exception with
    reply code 404 (not found)" when the exchange does not exist; the publishes after it on that channel
    are ignored until close-ok, and the connection stays open."""
    c = opened(raw)
    q = uniq("raw-404")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    bad = r.basic_publish(1, uniq("no-such-exchange"), q) + r.content_header_frame(1, 1) + r.body_frame(1, b"x")
    c.send(publishes(1, q, [b"before"]) + bad + publishes(1, q, [b"after"]))
    close = c.expect_method(r.CHANNEL_CLOSE, channel=1)
    code, pos = struct.unpack_from(">H", close.payload, 4)[0], 6
    text, pos = r.read_shortstr(close.payload, pos)
    assert code == 404 and struct.unpack_from(">HH", close.payload, pos) == r.BASIC_PUBLISH, text
    c.send(r.method_frame(1, r.CHANNEL_CLOSE_OK))
    c.open_channel(1)
    assert get_bodies(c, q, 1) == [b"before"]
    c.send(r.basic_get(1, q))
    c.expect_method(r.BASIC_GET_EMPTY, channel=1)


def test_server_respects_the_negotiated_frame_max(raw, broker):
    """general 4.2.3: "A peer MUST NOT send frames larger than the agreed-upon size": with frame_max 4096
    every frame of a 20000-octet delivery is at most 4096 octets, header and frame-end included."""
    c = opened(raw, frame_max=4096)
    q = uniq("raw-fmax")
    c.send(r.queue_declare(1, q, exclusive=True))
    c.expect_method(r.QUEUE_DECLARE_OK, channel=1)
    body = bytes(range(256)) * 78 + b"tail"
    chunk = 4096 - 8
    frames = [r.body_frame(1, body[i:i + chunk]) for i in range(0, len(body), chunk)]
    c.send(r.basic_publish(1, "", q) + r.content_header_frame(1, len(body)) + b"".join(frames))
    c.send(r.basic_get(1, q))
    ok = c.expect_method(r.BASIC_GET_OK, channel=1)
    assert ok.size <= 4096
    header = c.read_frame()
    assert header.type == r.FRAME_HEADER and header.size <= 4096
    got, sizes = b"", []
    while len(got) < len(body):
        f = c.read_frame()
        assert f.type == r.FRAME_BODY
        sizes.append(f.size)
        got += f.payload
    assert got == body
    assert max(sizes) <= 4096 and len(sizes) >= len(body) // (4096 - 8)


def test_server_sends_heartbeats_and_drops_a_silent_peer(raw, broker):
    """general 4.2.7: after tune-ok the server sends heartbeats when it has nothing else to send, and "If a
    peer detects no incoming traffic ... for two heartbeat intervals or longer, it should close the
    connection". With heartbeat=1 and a client that stays silent, both happen within a few seconds."""
    c = raw(timeout=10)
    c.handshake(heartbeat=1)
    start = time.monotonic()
    f = c.read_frame(timeout=4)
    assert (f.type, f.channel, f.payload) == (r.FRAME_HEARTBEAT, 0, b"")
    # stay silent: the server should give up on us (RabbitMQ does after ~2 intervals)
    try:
        c.read_all_until_eof(timeout=10)
    except TimeoutError:
        pytest.fail("server kept a connection open whose peer sent nothing for 10 heartbeat intervals")
    assert time.monotonic() - start < 10
    assert_broker_survived(broker)
