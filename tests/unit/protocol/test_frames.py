"""Frame layer (general spec 4.2.3) and content (4.2.6): split reads, frame-end, frame_max, properties."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pika import spec as pika_spec

from raftmq.protocol.amqp091 import methods as m
from raftmq.protocol.amqp091.errors import AMQPError, FrameError
from raftmq.protocol.amqp091.fieldtable import Timestamp
from raftmq.protocol.amqp091.frames import (
    FRAME_PUBLISH,
    HEARTBEAT_FRAME,
    FrameReader,
    encode_content,
    encode_delivery,
    encode_method_frame,
    frames_at,
)
from raftmq.protocol.amqp091.properties import (
    BasicProperties,
    decode_content_header,
    decode_properties,
    encode_properties,
    peek_properties,
)


def test_heartbeat_frame_is_type_8_on_channel_0():
    assert HEARTBEAT_FRAME == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    assert FrameReader().feed(HEARTBEAT_FRAME) == [(8, 0, b"")]


@given(st.lists(st.binary(max_size=300), max_size=10), st.data())
@settings(max_examples=300)
def test_frames_survive_any_read_boundaries(payloads, data):
    stream = b"".join(struct.pack(">BHI", 3, i + 1, len(p)) + p + b"\xce" for i, p in enumerate(payloads))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader(4096)
    frames = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        frames += reader.feed(stream[a:b])
    assert [(f.channel, f.payload) for f in frames] == [(i + 1, p) for i, p in enumerate(payloads)]


def test_bad_frame_end_is_a_frame_error():
    """General spec 4.2.3: a frame-end that is not %xCE is a fatal FRAME_ERROR (501)."""
    with pytest.raises(FrameError) as info:
        FrameReader().feed(struct.pack(">BHI", 1, 0, 1) + b"x" + b"\x00")
    assert info.value.reply_code == 501


def test_oversize_frame_fails_before_its_payload_arrives():
    reader = FrameReader(4096)
    with pytest.raises(FrameError):
        reader.feed(struct.pack(">BHI", 3, 1, 4096 - 7))  # one byte over frame_max with the overhead
    assert reader.feed(b"more") == []  # a failed reader stays failed


def test_frame_exactly_frame_max_is_accepted():
    payload = b"x" * (4096 - 8)
    assert FrameReader(4096).feed(struct.pack(">BHI", 3, 1, len(payload)) + payload + b"\xce")[0].payload == payload


def test_unknown_frame_type_is_a_frame_error():
    with pytest.raises(FrameError):
        FrameReader().feed(struct.pack(">BHI", 4, 0, 0) + b"\xce")


@given(st.binary(max_size=300))
@settings(max_examples=1000)
def test_fuzz_reader(garbage):
    try:
        FrameReader(4096).feed(garbage)
    except AMQPError as exc:
        assert exc.reply_code == 501


property_values = st.builds(
    BasicProperties,
    content_type=st.none() | st.text(max_size=20),
    headers=st.none() | st.dictionaries(st.text(max_size=10), st.integers(-5, 5) | st.text(max_size=5), max_size=3),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 255),
    correlation_id=st.none() | st.text(max_size=20),
    expiration=st.none() | st.integers(0, 10**9).map(str),
    timestamp=st.none() | st.integers(0, 2**40),
    app_id=st.none() | st.text(max_size=20),
    cluster_id=st.none() | st.text(max_size=20),
)


@given(property_values)
@settings(max_examples=500)
def test_properties_round_trip_and_peek(props):
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert peek_properties(raw) == (props.delivery_mode, props.priority, props.expiration)


@given(property_values)
@settings(max_examples=300)
def test_pika_reads_our_properties(props):
    raw = encode_properties(props)
    theirs = pika_spec.BasicProperties()
    theirs.decode(raw, 0)
    assert theirs.delivery_mode == props.delivery_mode
    assert theirs.expiration == props.expiration
    assert (theirs.headers or None) == (props.headers or None)
    assert b"".join(theirs.encode()) == raw


def test_content_is_split_to_frame_max():
    body = bytes(range(256)) * 40  # 10240 bytes
    props = encode_properties(BasicProperties(delivery_mode=2, headers={"x": Timestamp(5)}))
    wire = encode_content(7, m.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="e", routing_key="r"),
                          props, body, 4096)
    frames = FrameReader(4096).feed(wire)
    assert [f.type for f in frames] == [1, 2, 3, 3, 3]
    assert all(f.channel == 7 for f in frames)
    assert all(len(f.payload) <= 4096 - 8 for f in frames)
    class_id, size, got_props = decode_content_header(frames[1].payload)
    assert (class_id, size, got_props) == (60, len(body), props)
    assert b"".join(f.payload for f in frames[2:]) == body


def test_empty_body_has_no_body_frame():
    wire = encode_content(1, m.BasicGetOk(delivery_tag=1), b"\x00\x00", b"", 4096)
    assert [f.type for f in FrameReader().feed(wire)] == [1, 2]


def test_method_frame_layout():
    wire = encode_method_frame(3, m.BasicAck(delivery_tag=9, multiple=True))
    assert wire == struct.pack(">BHI", 1, 3, 13) + struct.pack(">HHQB", 60, 80, 9, 1) + b"\xce"


@pytest.mark.parametrize("raw", [
    b"\x00",  # flags cut short
    b"\x80\x00\x05ab",  # content-type overruns
    b"\x20\x00\x00\x00\x00\x09",  # headers table overruns
    b"\x00\x02",  # reserved flag bit 1
])
def test_malformed_properties(raw):
    with pytest.raises(AMQPError):
        peek_properties(raw)


@given(st.binary(max_size=60))
@settings(max_examples=1000)
def test_fuzz_properties(garbage):
    for parse in (peek_properties, decode_properties):
        try:
            parse(garbage)
        except AMQPError as exc:
            assert exc.reply_code in (501, 502)


_names = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)


@settings(max_examples=200, deadline=None)
@given(channel=st.integers(1, 65535), consumer_tag=_names, delivery_tag=st.integers(1, 2**64 - 1),
       redelivered=st.booleans(), exchange=_names, routing_key=_names, properties=st.binary(max_size=50),
       body=st.binary(max_size=3000), frame_max=st.sampled_from([0, 4096, 131072]))
def test_encode_delivery_is_basic_deliver_with_content(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                                       routing_key, properties, body, frame_max):
    """The consumer hot path's encoder writes exactly what the generic one writes (reference 1.8.3.9
    basic.deliver; general 2.3.5 frame layout, bodies split to fit frame-max)."""
    method = m.BasicDeliver(consumer_tag=consumer_tag, delivery_tag=delivery_tag, redelivered=redelivered,
                            exchange=exchange, routing_key=routing_key)
    assert encode_delivery(channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties,
                           body, frame_max) == encode_content(channel, method, properties, body, frame_max)


def test_a_frame_fed_byte_by_byte_is_one_frame_and_an_oversize_header_fails_as_soon_as_it_is_whole():
    payload = bytes(range(200))
    wire = struct.pack(">BHI", 3, 7, len(payload)) + payload + b"\xce" + HEARTBEAT_FRAME
    reader = FrameReader(4096)
    frames = []
    for i in range(len(wire)):
        frames += reader.feed(wire[i:i + 1])
    assert frames == [(3, 7, payload), (8, 0, b"")]
    assert all(type(f.payload) is bytes for f in frames)
    split = FrameReader(4096)
    assert split.feed(struct.pack(">BHI", 3, 1, 5000)[:4]) == []
    with pytest.raises(FrameError):  # the rest of the header names 5,000 bytes: refused at once
        split.feed(struct.pack(">BHI", 3, 1, 5000)[4:])


@given(st.binary(max_size=40))
@settings(max_examples=500)
def test_peek_answers_alike_the_first_time_and_from_memory(properties):
    """Small property blocks are remembered; a malformed one must fail every time, not once."""
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(peek_properties(properties))
        except AMQPError as exc:
            outcomes.append((type(exc), exc.reply_code))
    assert outcomes[0] == outcomes[1]


def test_payloads_are_bytes_whatever_the_reader_is_fed():
    wire = struct.pack(">BHI", 3, 1, 3) + b"abc" + b"\xce"
    for fed in (bytearray(wire), memoryview(wire)):
        assert [type(f.payload) for f in FrameReader(4096).feed(fed)] == [bytes]


# -- whole publishes (FrameReader(whole_publishes=True)) ---------------------------------------------------
def publish_bytes(channel: int, exchange: bytes, routing_key: bytes, bits: int, props: bytes, body: bytes,
                  class_id: int = 60, body_size: int | None = None, body_channel: int | None = None) -> bytes:
    method = struct.pack(">HHH", 60, 40, 0) + bytes((len(exchange),)) + exchange + bytes((len(routing_key),)) \
        + routing_key + bytes((bits,))
    header = struct.pack(">HHQ", class_id, 0, len(body) if body_size is None else body_size) + props
    out = struct.pack(">BHI", 1, channel, len(method)) + method + b"\xce"
    out += struct.pack(">BHI", 2, channel, len(header)) + header + b"\xce"
    if body:
        out += struct.pack(">BHI", 3, channel if body_channel is None else body_channel, len(body)) + body + b"\xce"
    return out


def expand(items) -> list[tuple]:
    """Whole publishes back into their three frames, everything as plain tuples."""
    out = []
    for item in items:
        if item[0] == FRAME_PUBLISH:
            out += [tuple(f) for f in frames_at(item.source, item.offset, 3)]
        else:
            out.append(tuple(item))
    return out


publish_parts = st.tuples(
    st.integers(1, 3),                                                 # channel
    st.sampled_from([b"", b"amq.direct", b"\xff\xfe"]),               # exchange (one not UTF-8)
    st.binary(max_size=12),                                            # routing key (maybe not UTF-8)
    st.integers(0, 3),                                                 # mandatory / immediate bits
    st.sampled_from([b"\x00\x00", b"\x10\x00\x02", b"\x00"]),         # properties (one too short)
    st.binary(max_size=40),                                            # body (empty: no body frame)
    st.sampled_from([60, 50]),                                         # class id
    st.sampled_from([None, 0, 1]),                                     # body size: right, 0, or 1
    st.sampled_from([None, 9]),                                        # body on another channel
)


@given(st.lists(st.one_of(publish_parts, st.just("heartbeat")), max_size=8), st.data())
@settings(max_examples=400)
def test_whole_publishes_are_the_same_frames_in_one_item(parts, data):
    """With whole_publishes, a publish whose three frames are all in one read and well formed comes
    out as one WholePublish carrying its parsed fields; everything else comes out as the same frames
    as without it, whatever the read boundaries."""
    stream = b"".join(HEARTBEAT_FRAME if part == "heartbeat" else publish_bytes(*part) for part in parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    plain, whole = FrameReader(4096), FrameReader(4096, whole_publishes=True)
    plain_items, whole_items = [], []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        plain_items += plain.feed(stream[a:b])
        whole_items += whole.feed(stream[a:b])
    assert expand(whole_items) == [tuple(f) for f in plain_items]
    for item in whole_items:
        if item[0] != FRAME_PUBLISH:
            continue
        method, header, body = frames_at(item.source, item.offset, 3)
        decoded = m.decode_method(method.payload)
        class_id, body_size, props = decode_content_header(header.payload)
        assert (item.channel, item.exchange, item.routing_key, item.bits & 1, item.bits & 2 != 0) == (
            method.channel, decoded.exchange, decoded.routing_key, decoded.mandatory, decoded.immediate)
        assert header.channel == body.channel == item.channel
        assert (class_id, body_size, props, item.properties, item.body) == (
            60, len(body.payload), item.properties, props, body.payload)
        assert item.body


def test_a_publish_cut_by_the_read_boundary_comes_as_frames():
    one = publish_bytes(1, b"", b"q", 0, b"\x00\x00", b"hello")
    reader = FrameReader(4096, whole_publishes=True)
    first = reader.feed(one + one[:-3])
    assert [item[0] for item in first] == [FRAME_PUBLISH, 1, 2]
    assert [item[0] for item in reader.feed(one[-3:])] == [3]
