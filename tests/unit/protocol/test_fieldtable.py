"""Field tables: round trips, the errata type codes real clients send, and malformed input."""

from __future__ import annotations

import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pika import data as pika_data

from raftmq.protocol.amqp091.errors import AMQPError, AMQPSyntaxError, FrameError
from raftmq.protocol.amqp091.fieldtable import LongBytes, Timestamp, decode_table, encode_table

keys = st.text(max_size=20).filter(lambda k: len(k.encode()) <= 255)
scalars = (
    st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=50)
    | st.binary(max_size=50)
    | st.none()
    | st.integers(min_value=0, max_value=(1 << 63) - 1).map(Timestamp)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=20,
)
tables = st.dictionaries(keys, values, max_size=8)

# pika's codec has no float encoder, decodes 'd' as an integer and timestamps as datetimes: the
# interop checks use the values it supports.
pika_scalars = (
    st.booleans() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1) | st.text(max_size=50)
    | st.binary(max_size=50) | st.none()
)
pika_tables = st.dictionaries(keys, st.recursive(
    pika_scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=20), max_size=8)


@given(tables)
@settings(max_examples=300)
def test_round_trip(table):
    encoded = encode_table(table)
    decoded, end = decode_table(encoded, 0)
    assert end == len(encoded)
    assert decoded == table
    assert encode_table(decoded) == encoded


@given(pika_tables)
@settings(max_examples=200)
def test_pika_decodes_what_we_encode(table):
    """Interop: pika's own decoder reads our encoding back to the same values."""
    encoded = encode_table(table)
    decoded, end = pika_data.decode_table(encoded, 0)
    assert end == len(encoded)
    assert decoded == table


def test_we_decode_what_pika_encodes():
    table = {"s": "text", "i": 7, "big": 1 << 40, "t": True, "n": None,
             "nested": {"a": [1, "two", {"three": 3}]}, "dec": decimal.Decimal("1.25")}
    pieces: list[bytes] = []
    pika_data.encode_table(pieces, table)
    decoded, _ = decode_table(b"".join(pieces), 0)
    assert decoded == table


def _entry(key: bytes, code: bytes, raw: bytes) -> bytes:
    return bytes((len(key),)) + key + code + raw


def _table(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("code,raw,expected", [
    (b"b", struct.pack(">b", -5), -5),
    (b"B", struct.pack(">B", 250), 250),
    (b"s", struct.pack(">h", -300), -300),  # errata: 's' is a signed 16-bit integer
    (b"u", struct.pack(">H", 65000), 65000),
    (b"I", struct.pack(">i", -70000), -70000),
    (b"i", struct.pack(">I", 4_000_000_000), 4_000_000_000),
    (b"l", struct.pack(">q", -(1 << 40)), -(1 << 40)),
    (b"L", struct.pack(">Q", 1 << 63), 1 << 63),
    (b"f", struct.pack(">f", 0.5), 0.5),
    (b"d", struct.pack(">d", 2.25), 2.25),
    (b"D", struct.pack(">Bi", 2, 12345), decimal.Decimal("123.45")),
    (b"S", struct.pack(">I", 3) + b"abc", "abc"),
    (b"x", struct.pack(">I", 2) + b"\x00\xff", b"\x00\xff"),
    (b"T", struct.pack(">Q", 1700000000), Timestamp(1700000000)),
    (b"V", b"", None),
    (b"t", b"\x01", True),
    (b"A", struct.pack(">I", 5) + b"I" + struct.pack(">i", 9), [9]),
])
def test_every_type_code_decodes(code, raw, expected):
    decoded, _ = decode_table(_table(_entry(b"k", code, raw)), 0)
    assert decoded == {"k": expected}


def test_non_utf8_long_string_keeps_its_type():
    encoded = _table(_entry(b"k", b"S", struct.pack(">I", 2) + b"\xff\xfe"))
    decoded, _ = decode_table(encoded, 0)
    assert isinstance(decoded["k"], LongBytes)
    assert encode_table(decoded) == encoded


def test_unknown_type_code_is_a_syntax_error():
    with pytest.raises(AMQPSyntaxError) as info:
        decode_table(_table(_entry(b"k", b"Q", b"\x00")), 0)
    assert info.value.reply_code == 502


@pytest.mark.parametrize("encoded", [
    b"\x00\x00",  # length cut short
    struct.pack(">I", 100) + b"\x01k",  # table longer than the buffer
    _table(_entry(b"k", b"S", struct.pack(">I", 50) + b"abc")),  # string overruns the table
    _table(_entry(b"k", b"I", b"\x00\x01")),  # integer cut short
])
def test_truncated_tables_are_frame_errors(encoded):
    with pytest.raises(FrameError) as info:
        decode_table(encoded, 0)
    assert info.value.reply_code == 501


@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_garbage_never_escapes_as_anything_but_amqp_errors(garbage):
    try:
        decode_table(garbage, 0)
    except AMQPError:
        pass


def test_deep_nesting_is_refused():
    encoded = encode_table({})
    for _ in range(100):
        inner = b"\x01kF" + encoded
        encoded = struct.pack(">I", len(inner)) + inner
    with pytest.raises(AMQPSyntaxError):
        decode_table(encoded, 0)
