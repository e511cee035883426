"""AMQP 0-10 framing (spec 4.4): assemblies survive any split, malformed frames are framing errors."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp010.errors import FramingError
from raftmq.protocol.amqp010.frames import FrameReader, encode_assembly

segments = st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=300)), min_size=1, max_size=4)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1), segments), min_size=1, max_size=6),
       st.integers(20, 200), st.data())
@settings(max_examples=300)
def test_assemblies_survive_any_frame_size_and_read_split(assemblies, frame_size, data):
    stream = b"".join(encode_assembly(ch, tr, segs, frame_size) for ch, tr, segs in assemblies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    reader = FrameReader(frame_size)
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += reader.feed(stream[a:b])
    assert [(a.channel, a.track, a.segments) for a in got] == assemblies


def test_controls_interleave_with_the_frames_of_a_command():
    """4.4.2: controls on track 0 may arrive between the frames of a command on track 1."""
    command = encode_assembly(1, 1, [(1, b"c" * 30), (3, b"b" * 30)], 24)
    control = encode_assembly(1, 0, [(0, b"ctl")], 24)
    first_frame_len = struct.unpack(">H", command[2:4])[0]
    stream = command[:first_frame_len] + control + command[first_frame_len:]
    got = FrameReader(24).feed(stream)
    assert [(a.track, a.segments) for a in got] == [(0, [(0, b"ctl")]), (1, [(1, b"c" * 30), (3, b"b" * 30)])]


def frame(flags=0x0F, seg_type=1, size=None, track=1, channel=0, payload=b"x", tail=b"\x00" * 4, byte4=0):
    size = 12 + len(payload) if size is None else size
    return struct.pack(">BBHBBH", flags, seg_type, size, byte4, track, channel) + tail + payload


@pytest.mark.parametrize("raw,why", [
    (frame(flags=0x4F), "frame format version is not 00"),
    (frame(size=11), "size smaller than the header"),
    (frame(seg_type=4), "unknown segment type"),
    (frame(track=0x11), "reserved track bits"),
    (frame(tail=b"\x00\x00\x00\x01"), "reserved octets"),
    (frame(byte4=1), "reserved octet 4"),
    (frame(flags=0x05), "continuation frame with nothing before it"),
    (frame(flags=0x0A) + frame(flags=0x0A), "a second assembly before the first ended"),
])
def test_malformed_frames_are_framing_errors(raw, why):
    with pytest.raises(FramingError) as info:
        FrameReader().feed(raw)
    assert info.value.close_code == 501, why


def test_oversize_frame_is_refused_before_its_payload_arrives():
    reader = FrameReader(max_frame_size=100)
    with pytest.raises(FramingError):
        reader.feed(frame(size=101, payload=b"")[:12])
    assert reader.feed(b"anything") == []


@given(st.binary(max_size=200))
@settings(max_examples=1000)
def test_fuzz_reader_raises_only_framing_errors(garbage):
    try:
        FrameReader().feed(garbage)
    except FramingError:
        pass
