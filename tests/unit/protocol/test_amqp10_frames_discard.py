"""FrameReader.frames: frames decoded one at a time, and frames of discarded channels dropped unread.

Spec: /work/shared/specs/amqp-1-0.txt 2.5.4/2.5.5 (a session that sent an end with an error discards
incoming frames until the peer's end: DISCARDING), 2.4.6 (after a close, only the peer's close matters),
1.2 (a described type's descriptor is a ulong or a symbol: smallulong 0x53, ulong 0x80, sym8 0xa3, sym32 0xb3).
"""

from __future__ import annotations

import struct

import pytest

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10.errors import Amqp10Error
from raftmq.protocol.amqp10.frames import ALL_CHANNELS, FrameReader, encode_frame

GARBAGE = bytes([0x00, 0x53, 0x14]) + b"\xff" * 32  # a "transfer" whose fields are no AMQP type


def raw_frame(body: bytes, channel: int) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 0, channel) + body


def test_garbage_on_a_discarded_channel_is_not_decoded() -> None:
    """The same undecodable frame is a decode error on a live channel and dropped on a discarded one."""
    data = raw_frame(GARBAGE, 3) + encode_frame(p.End(), 3) + encode_frame(p.Flow(incoming_window=1,
                                                                                    next_outgoing_id=0,
                                                                                    outgoing_window=1), 2)
    frames = list(FrameReader(4096).frames(data, {3}))
    assert [(f.channel, type(f.performative)) for f in frames] == [(3, p.End), (2, p.Flow)]
    with pytest.raises(Amqp10Error):
        list(FrameReader(4096).frames(data))


@pytest.mark.parametrize("descriptor", [
    b"\x00\x53\x17",  # smallulong
    b"\x00\x80" + (0x17).to_bytes(8, "big"),  # ulong
    b"\x00\xa3\x0damqp:end:list",  # sym8
    b"\x00\xb3" + (13).to_bytes(4, "big") + b"amqp:end:list",  # sym32
])
def test_an_end_is_kept_whatever_its_descriptor_encoding(descriptor: bytes) -> None:
    """An end on a discarded channel is recognised from its descriptor in each of its 1.2 encodings."""
    body = descriptor + b"\x45"  # list0: an end with no error
    frames = list(FrameReader(4096).frames(raw_frame(body, 5), {5}))
    assert len(frames) == 1 and isinstance(frames[0].performative, p.End)


def test_after_a_close_only_a_close_is_read() -> None:
    """ALL_CHANNELS: every frame is dropped unread except ends and the peer's close."""
    data = raw_frame(GARBAGE, 0) + encode_frame(p.Close(), 0)
    frames = list(FrameReader(4096).frames(data, ALL_CHANNELS))
    assert [type(f.performative) for f in frames] == [p.Close]


def test_frames_are_decoded_as_they_are_taken() -> None:
    """What the caller does with one frame (add its channel to the discarded set) applies to the next."""
    data = encode_frame(p.End(), 1) + raw_frame(GARBAGE, 1) + encode_frame(p.End(), 1)
    discard: set[int] = set()
    seen = []
    for frame in FrameReader(4096).frames(data, discard):
        seen.append(type(frame.performative))
        discard.add(frame.channel)
    assert seen == [p.End, p.End]


def test_a_partial_frame_stays_buffered_across_calls() -> None:
    """The bytes of an unfinished frame are kept for the next call, after complete ones were taken."""
    whole = encode_frame(p.End(), 0) + encode_frame(p.Close(), 0)
    reader = FrameReader(4096)
    first = list(reader.frames(whole[:-2]))
    assert [type(f.performative) for f in first] == [p.End] and reader.buffered == len(whole) - 2 - 12
    second = list(reader.frames(whole[-2:]))
    assert [type(f.performative) for f in second] == [p.Close] and reader.buffered == 0
