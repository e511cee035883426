"""AMQP 1.0 framing: protocol headers (2.2, 5.3.1), the frame layout (2.3.1), AMQP frames (2.3.2), SASL
frames (5.3.1) and the FrameReader's bounds (2.7.1 max-frame-size: "A peer that receives an oversized
frame MUST close the connection with the framing-error error-code"; 2.8.19 MIN-MAX-FRAME-SIZE).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp10 import frames as f
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10.errors import DecodeError, FramingError

from .test_amqp10_types import ALLOC_CONSTANT, ALLOC_FACTOR, TIME_BOUND, bounded

HEADER = struct.Struct(">IBBH")


def test_protocol_headers():
    """2.2: "AMQP" %d0 1 0 0; 5.3.1: "AMQP" %d3 1 0 0 for SASL; 5.2.1: %d2 for TLS."""
    assert f.AMQP_HEADER == b"AMQP\x00\x01\x00\x00"
    assert f.SASL_HEADER == b"AMQP\x03\x01\x00\x00"
    assert f.parse_protocol_header(f.AMQP_HEADER).name == "amqp"
    assert f.parse_protocol_header(f.SASL_HEADER).name == "sasl"
    assert f.parse_protocol_header(f.TLS_HEADER).name == "tls"
    assert f.parse_protocol_header(b"AMQP\x00\x00\x09\x01").name is None  # 0-9-1: not ours to speak here
    assert f.parse_protocol_header(b"AMQP\x00\x00\x09\x01").encode() == b"AMQP\x00\x00\x09\x01"
    with pytest.raises(FramingError):
        f.parse_protocol_header(b"HTTP/1.1")


def test_frame_layout():
    """2.3.1: SIZE (whole frame), DOFF 2 (no extended header), TYPE 0x00, channel; 2.3.2 body."""
    begin = p.Begin(remote_channel=0, next_outgoing_id=1, incoming_window=10, outgoing_window=10)
    frame = f.encode_frame(begin, channel=7)
    size, doff, frame_type, channel = HEADER.unpack_from(frame)
    assert (size, doff, frame_type, channel) == (len(frame), 2, 0, 7)
    assert frame[8:] == begin.encode()


def test_reader_byte_by_byte():
    """Frames split anywhere are reassembled; several in one read come out in order."""
    open_ = p.Open(container_id="c", max_frame_size=1 << 16)
    transfer = p.Transfer(handle=0, delivery_id=0, delivery_tag=b"\x00", message_format=0, settled=True)
    payload = p.encode_sections([p.Properties(to="q"), p.Data(b"x" * 100)])
    data = f.encode_frame(open_) + f.encode_frame(transfer, 3, payload) + f.encode_frame(None, 0)
    reader = f.FrameReader(4096)
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i:i + 1])
    assert got == [f.Frame(0, 0, open_), f.Frame(0, 3, transfer, payload), f.Frame(0, 0, None)]
    assert reader.buffered == 0
    again = f.FrameReader(4096).feed(data)
    assert again == got
    assert p.decode_sections(got[1].payload)[1] == p.Data(b"x" * 100)


def test_extended_header_is_skipped():
    """2.3: the extended header is an extension point; DOFF 4 puts the body 16 octets in."""
    body = p.Close().encode()
    frame = HEADER.pack(16 + len(body), 4, 0, 0) + b"\xee" * 8 + body
    assert f.FrameReader().feed(frame) == [f.Frame(0, 0, p.Close())]


def test_empty_frame_is_a_heartbeat():
    """2.3.2 / 2.4.5: an AMQP frame with no body keeps the idle timeout alive."""
    assert f.FrameReader().feed(b"\x00\x00\x00\x08\x02\x00\x00\x00") == [f.Frame(0, 0, None)]


@pytest.mark.parametrize(("header", "match"), [
    (HEADER.pack(7, 2, 0, 0), "smaller than the frame header"),  # 2.3.1: size < 8 is malformed
    (HEADER.pack(8, 1, 0, 0), "data offset 1"),  # 2.3.1: DOFF < 2 is malformed
    (HEADER.pack(12, 4, 0, 0), "beyond the frame"),  # DOFF points past SIZE
    (HEADER.pack(8, 2, 0x02, 0), "unknown frame type"),
    (HEADER.pack(513, 2, 0, 0), "exceeds the maximum frame size 512"),  # 2.8.19 before open
    (HEADER.pack(0xFFFFFFFF, 2, 0, 0), "exceeds"),  # refused from the header alone
])
def test_malformed_headers_are_framing_errors(header, match):
    reader = f.FrameReader()
    with pytest.raises(FramingError, match=match) as info:
        reader.feed(header)
    assert info.value.condition == "amqp:connection:framing-error"
    assert reader.feed(f.encode_frame(p.Close())) == []  # a failed reader stays failed
    assert reader.buffered == 0


def test_oversized_frame_is_refused_before_its_body_arrives():
    """2.7.1: frames larger than the negotiated max-frame-size: framing-error, nothing buffered."""
    reader = f.FrameReader(max_frame_size=1024)
    outcome, elapsed, peak = bounded(reader.feed, HEADER.pack(1 << 30, 2, 0, 0))
    assert isinstance(outcome, FramingError)
    assert peak < 64 * 1024 and elapsed < TIME_BOUND
    ok = f.FrameReader(max_frame_size=1024)
    transfer = p.Transfer(handle=0, delivery_id=0, delivery_tag=b"t", message_format=0)
    frame = f.encode_frame(transfer, 1, b"x" * (1024 - 8 - len(transfer.encode())))
    assert len(frame) == 1024 and len(ok.feed(frame)) == 1
    with pytest.raises(FramingError):
        ok.feed(f.encode_frame(transfer, 1, b"x" * (1025 - 8 - len(transfer.encode()))))


def test_sasl_frames():
    """5.3.1: SASL frames (type 0x01) carry one SASL body, at most MIN-MAX-FRAME-SIZE octets; channel ignored;
    an empty SASL frame is an irrecoverable error."""
    init = p.SaslInit(mechanism="PLAIN", initial_response=b"\x00guest\x00guest", hostname="localhost")
    frame = f.encode_frame(init, channel=9, frame_type=f.TYPE_SASL)
    assert f.FrameReader(1 << 20).feed(frame) == [f.Frame(1, 0, init)]
    big = f.encode_frame(p.SaslResponse(response=b"x" * 600), frame_type=f.TYPE_SASL)
    with pytest.raises(FramingError, match="512"):
        f.FrameReader(1 << 20).feed(big)
    with pytest.raises(DecodeError, match="empty SASL"):
        f.FrameReader().feed(HEADER.pack(8, 2, 1, 0))
    with pytest.raises(DecodeError, match="expected a sasl-frame"):
        f.FrameReader().feed(f.encode_frame(p.Close(), frame_type=f.TYPE_SASL))
    with pytest.raises(DecodeError, match="expected a frame"):
        f.FrameReader().feed(f.encode_frame(init))


def test_payload_only_after_a_transfer():
    """2.3.2: the payload's presence is defined by the performative: only transfer carries one."""
    with pytest.raises(DecodeError, match="after the close"):
        f.FrameReader().feed(f.encode_frame(p.Close(), payload=b"junk"))


def test_zero_width_budget_is_shared_by_the_frames_of_one_read():
    """Many tiny frames each holding an array of 1,024 empty lists must not multiply the cap."""
    state = b"\x00\x53\x77" + b"\xf0" + struct.pack(">II", 5, 1000) + b"\x45"  # 1,000 empty lists
    items = b"\x43" + b"\x40" * 6 + state  # transfer: handle 0, six nulls, state
    body = b"\x00\x53\x14\xc0" + bytes((len(items) + 1, 8)) + items
    assert f.FrameReader(1 << 20).feed(HEADER.pack(8 + len(body), 2, 0, 0) + body)  # one alone decodes
    frame = HEADER.pack(8 + len(body), 2, 0, 0) + body
    with pytest.raises(DecodeError, match="zero-width"):
        f.FrameReader(1 << 20).feed(frame * 50)


def test_encode_frame_raw_matches_encode_frame():
    close = p.Close(error=p.Error(condition="amqp:connection:forced"))
    assert f.encode_frame_raw(close.encode(), 2) == f.encode_frame(close, 2)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000), st.integers(min_value=1, max_value=64))
def test_reader_on_arbitrary_bytes(data, chunk):
    """Arbitrary octets fed in chunks: frames or FramingError/DecodeError, fast, in bounded memory."""
    def run():
        reader = f.FrameReader(1024)
        out = []
        for i in range(0, len(data), chunk):
            out += reader.feed(data[i:i + chunk])
        return out
    outcome, elapsed, peak = bounded(run)
    assert not isinstance(outcome, Exception) or isinstance(outcome, (FramingError, DecodeError)), repr(outcome)
    assert elapsed < TIME_BOUND
    assert peak < ALLOC_FACTOR * len(data) + ALLOC_CONSTANT


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=500), st.integers(min_value=0, max_value=3))
def test_reader_on_frames_with_arbitrary_bodies(body, frame_type):
    """Well-formed headers around arbitrary bodies: the body decoder's errors are DecodeErrors."""
    frame = HEADER.pack(8 + len(body), 2, frame_type, 0) + body
    outcome, elapsed, _peak = bounded(f.FrameReader(1024).feed, frame)
    assert not isinstance(outcome, Exception) or isinstance(outcome, (FramingError, DecodeError)), repr(outcome)
    assert elapsed < TIME_BOUND
