"""AMQP 1.0 type system (part 1): every encoding both ways, and the decoder's bounds.

Spec: 1.2 (format codes: fixed, variable, compound, array categories), 1.6.1-1.6.24 (the primitive types
and their encodings), 1.6.23 (maps: even count, no duplicate keys).  Decoding is bounded by the bytes
present: counts and sizes are checked against the octets that back them before any element is decoded,
arrays of zero-width elements are capped, nesting is capped; every malformed input is a DecodeError
whose condition is amqp:decode-error (2.8.15).
"""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import DecodeError
from raftmq.protocol.amqp10.spec_table import parse

U32 = struct.Struct(">I")


# -- every encoding of the table (1.6) ------------------------------------------------------------------
# (encoding name, wire octets after the constructor, decoded value)
SAMPLES = [
    ("null", b"", None),
    ("true", b"", True),
    ("false", b"", False),
    ("boolean", b"\x01", True),
    ("boolean", b"\x00", False),
    ("ubyte", b"\xff", 255),
    ("ushort", b"\xff\xfe", 0xFFFE),
    ("uint", b"\xff\xff\xff\xff", 0xFFFFFFFF),
    ("smalluint", b"\x07", 7),
    ("uint0", b"", 0),
    ("ulong", b"\xff" * 8, (1 << 64) - 1),
    ("smallulong", b"\x10", 16),
    ("ulong0", b"", 0),
    ("byte", b"\x80", -128),
    ("short", b"\x80\x00", -32768),
    ("int", b"\xff\xff\xff\xfe", -2),
    ("smallint", b"\xfe", -2),
    ("long", b"\x80" + b"\x00" * 7, -(1 << 63)),
    ("smalllong", b"\x7f", 127),
    ("float", struct.pack(">f", 1.5), 1.5),
    ("double", struct.pack(">d", -2.25), -2.25),
    ("decimal32", b"\x22\x50\x00\x01", t.Decimal32(b"\x22\x50\x00\x01")),
    ("decimal64", bytes(range(8)), t.Decimal64(bytes(range(8)))),
    ("decimal128", bytes(range(16)), t.Decimal128(bytes(range(16)))),
    ("char", b"\x00\x01\xf6\x00", t.Char("\U0001f600")),
    ("timestamp", struct.pack(">q", 1311704463521), t.Timestamp(1311704463521)),  # 1.6.17's example
    ("uuid", bytes(range(16)), uuid.UUID(bytes=bytes(range(16)))),
    ("vbin8", b"\x02ab", b"ab"),
    ("vbin32", b"\x00\x00\x00\x02ab", b"ab"),
    ("str8-utf8", b"\x03h\xc3\xa9", "hé"),
    ("str32-utf8", b"\x00\x00\x00\x01x", "x"),
    ("sym8", b"\x03abc", t.Symbol("abc")),
    ("sym32", b"\x00\x00\x00\x03abc", t.Symbol("abc")),
    ("list0", b"", []),
    ("list8", b"\x03\x02\x40\x41", [None, True]),
    ("list32", U32.pack(6) + U32.pack(2) + b"\x40\x41", [None, True]),
    ("map8", b"\x05\x02\xa3\x01k\x41", {t.Symbol("k"): True}),
    ("map32", U32.pack(8) + U32.pack(2) + b"\xa3\x01k\x41", {t.Symbol("k"): True}),
    ("array8", b"\x04\x02\x50\x01\x02", t.Array("ubyte", [1, 2])),
    ("array32", U32.pack(7) + U32.pack(2) + b"\x50\x01\x02", t.Array("ubyte", [1, 2])),
]


def test_every_encoding_of_the_table_has_a_sample():
    """1.6: each encoding listed (39 of them) is exercised below."""
    assert {name for name, _, _ in SAMPLES} == set(t.CODE)


@pytest.mark.parametrize(("name", "data", "value"), SAMPLES, ids=[f"{s[0]}-{i}" for i, s in enumerate(SAMPLES)])
def test_each_encoding_decodes(name, data, value):
    """1.2: a constructor (the format code) followed by the data its category defines."""
    encoded = bytes((t.CODE[name],)) + data
    decoded, end = t.decode_value(encoded)
    assert end == len(encoded)
    assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize(("name", "data", "value"), SAMPLES, ids=[f"{s[0]}-{i}" for i, s in enumerate(SAMPLES)])
def test_each_encoding_truncated_is_a_decode_error(name, data, value):
    """Any prefix of a value is truncated: DecodeError (amqp:decode-error), never IndexError/struct.error."""
    encoded = bytes((t.CODE[name],)) + data
    for cut in range(1, len(encoded)):
        with pytest.raises(DecodeError) as info:
            t.decode(encoded[:cut])
        assert info.value.condition == "amqp:decode-error"


@pytest.mark.parametrize(("type_name", "value", "expected"), [
    ("uint", 0, b"\x43"), ("uint", 255, b"\x52\xff"), ("uint", 256, b"\x70\x00\x00\x01\x00"),
    ("ulong", 0, b"\x44"), ("ulong", 0x12, b"\x53\x12"), ("ulong", 1 << 40, b"\x80" + (1 << 40).to_bytes(8, "big")),
    ("int", -1, b"\x54\xff"), ("int", 1000, b"\x71\x00\x00\x03\xe8"),
    ("long", 5, b"\x55\x05"), ("long", -129, b"\x81" + (-129).to_bytes(8, "big", signed=True)),
    ("boolean", True, b"\x41"), ("boolean", False, b"\x42"),
    ("string", "a" * 255, b"\xa1\xff" + b"a" * 255), ("string", "a" * 256, b"\xb1\x00\x00\x01\x00" + b"a" * 256),
    ("symbol", "amqp:accepted:list", b"\xa3\x12amqp:accepted:list"),
    ("binary", b"", b"\xa0\x00"), ("list", [], b"\x45"), ("map", {}, b"\xc1\x01\x00"),
    ("null", None, b"\x40"), ("string", None, b"\x40"),
])
def test_encode_as_picks_the_smallest_encoding(type_name, value, expected):
    """1.6.5/1.6.6/1.6.9/1.6.10: uint0, smalluint, smallulong, smallint, smalllong; 8-bit sizes when they fit."""
    assert t.encode_as(type_name, value) == expected


def test_inferred_types():
    """The Python mapping of the module docstring, encoding side."""
    assert t.encode_value(1) == b"\x55\x01"  # int -> long
    assert t.encode_value(1 << 63)[0] == 0x80  # beyond long -> ulong
    assert t.encode_value(1.0)[0] == 0x82  # float -> double
    assert t.encode_value(t.Float32(1.0))[0] == 0x72
    assert t.encode_value(t.UInt(7)) == b"\x52\x07"
    assert t.encode_value(t.UByte(7)) == b"\x50\x07"
    assert t.encode_value(t.Short(7)) == b"\x61\x00\x07"
    assert t.encode_value(t.ULong(7)) == b"\x53\x07"
    assert t.encode_value(t.Symbol("s")) == b"\xa3\x01s"
    assert t.encode_value("s") == b"\xa1\x01s"
    assert t.encode_value(t.Described(0x24, [])) == b"\x00\x53\x24\x45"  # 1.5: numeric descriptors are ulong
    assert t.encode_value(t.Described(t.Symbol("amqp:accepted:list"), [])).startswith(b"\x00\xa3\x12")
    with pytest.raises(ValueError):
        t.encode_value(object())
    with pytest.raises(ValueError):
        t.encode_as("ubyte", 256)
    with pytest.raises(ValueError):
        t.encode_as("uint", True)


def test_described_and_arrays_round_trip():
    """1.2 described format codes; 1.6.24 arrays, also of described elements sharing one descriptor."""
    values = [
        t.Described(t.Symbol("com.example:url"), "http://x"),
        t.Described(0x10, t.Described(0x11, [1])),
        t.Array("symbol", [t.Symbol("a"), t.Symbol("b" * 300)]),
        t.Array("string", ["a", "b"]),
        t.Array("binary", [b"", b"x"]),
        t.Array("uint", [0, 1, 1 << 31]),
        t.Array("ulong", [0, 1 << 63]),
        t.Array("boolean", [True, False]),
        t.Array("double", [1.5]),
        t.Array("timestamp", [t.Timestamp(1)]),
        t.Array("uuid", [uuid.UUID(int=5)]),
        t.Array("char", [t.Char("x")]),
        t.Array("decimal64", [t.Decimal64(b"\x01" * 8)]),
        t.Array("null", [None, None]),
        t.Array("list", [[1, "a"], []]),
        t.Array("map", [{"a": 1}, {}]),
        t.Array("array", [t.Array("int", [1, 2]), t.Array("int", [])]),
        t.Array("list", [[0x24]], descriptor=t.Symbol("d")),
        t.Array("int", list(range(300))),
        t.Array("symbol", []),
    ]
    for value in values:
        assert t.decode(t.encode_value(value)) == value, value


def test_array_encoding_uses_one_constructor():
    """1.6.24 / 1.2.4: size, count, one element constructor, then the elements' data."""
    assert t.encode_value(t.Array("symbol", [t.Symbol("a"), t.Symbol("bc")])) == b"\xe0\x07\x02\xa3\x01a\x02bc"


# -- malformed input: DecodeError --------------------------------------------------------------------------
@pytest.mark.parametrize("data", [
    b"", b"\x01", b"\x4f\x00", b"\xff", b"\x9f",  # no value; unknown and reserved ext-type codes (1.2 BNF)
    b"\x56\x02",  # boolean octet other than 0x00/0x01
    b"\x73\x00\x11\x00\x00",  # char beyond U+10FFFF
    b"\x73\x00\x00\xd8\x00",  # char: a surrogate is not a Unicode scalar value
    b"\xa1\x02\xc3\x28",  # invalid UTF-8 string (1.6.20)
    b"\xa3\x01\xe9",  # non-ASCII symbol (1.6.21)
    b"\xc1\x02\x01\x40",  # map with an odd count (1.6.23)
    b"\xc0\x03\x01\x40\x40",  # list8 size 3 holds one item and a stray octet: size mismatch
    b"\xc0\x01\x00\x40",  # an empty list8 followed by an octet that belongs to no value
    b"\xe0\x01\x00",  # array with no element constructor
    b"\xe0\x02\x01\x00",  # array of described elements with no descriptor/format code
    b"\xe0\x02\x01\x01",  # unknown array element code
    b"\x00",  # described: no descriptor
    b"\x00\x53\x10",  # described: no value
])
def test_malformed_values_are_decode_errors(data):
    with pytest.raises(DecodeError):
        t.decode(data)


def test_duplicate_map_keys_are_invalid():
    """1.6.23: "A map in which there exist two identical key values is invalid"."""
    data = b"\xc1\x07\x04\x54\x01\x40\x54\x01\x41"
    with pytest.raises(DecodeError, match="twice"):
        t.decode(data)


def test_unhashable_map_keys_are_refused():
    """Module docstring, Maps: a map keyed by a list, map or array is refused (a DecodeError, not TypeError)."""
    for key in (b"\x45", b"\xc1\x01\x00", b"\xe0\x02\x00\x40", b"\x00\x53\x01\x45"):
        body = b"\x02" + key + b"\x40"
        with pytest.raises(DecodeError, match="not hashable"):
            t.decode(bytes((0xc1, len(body))) + body)


def test_nested_sizes_must_fit_the_enclosing_value():
    """1.2.3: a value inside a list may not reach past the list's own size."""
    inner = b"\xa1\x05hello"
    data = b"\xc0" + bytes((1 + 3,)) + b"\x01" + inner  # list size covers only 3 of the string's 7 octets
    with pytest.raises(DecodeError):
        t.decode(data + b"\x00" * 10)


# -- bounds: counts, sizes, depth ---------------------------------------------------------------------------
ZERO_WIDTH_CODES = sorted(code for code, e in t.ENCODING.items() if e.category == "fixed" and e.width == 0)


def test_the_zero_width_encodings():
    """null, true, false, uint0, ulong0, list0: the element types that take no octets in an array."""
    assert sorted(t.ENCODING[c].name for c in ZERO_WIDTH_CODES) == ["false", "list0", "null", "true", "uint0",
                                                                     "ulong0"]


@pytest.mark.parametrize("code", ZERO_WIDTH_CODES)
def test_zero_width_arrays_are_capped(code):
    """No octet backs a zero-width element: at most MAX_ZERO_WIDTH_ELEMENTS, refused at once beyond."""
    ok = b"\xf0" + U32.pack(5) + U32.pack(t.MAX_ZERO_WIDTH_ELEMENTS) + bytes((code,))
    value = t.decode(ok)
    assert len(value.items) == t.MAX_ZERO_WIDTH_ELEMENTS
    huge = b"\xf0" + U32.pack(5) + U32.pack(0xFFFFFFFF) + bytes((code,))
    outcome, elapsed, peak = bounded(t.decode, huge)
    assert isinstance(outcome, DecodeError) and "zero-width" in str(outcome)
    assert elapsed < TIME_BOUND and peak < 64 * 1024


def test_zero_width_budget_is_shared_by_nested_arrays():
    """A per-array cap would multiply: a list of small arrays of 255 empty lists each must not pass."""
    one = b"\xe0\x02\xff\x45"  # array8 of 255 list0 elements, 4 octets
    n = 60
    body = bytes((n,)) + one * n
    data = b"\xc0" + bytes((len(body),)) + body
    outcome, elapsed, peak = bounded(t.decode, data)
    assert isinstance(outcome, DecodeError) and "zero-width" in str(outcome)
    assert peak < 256 * 1024


@pytest.mark.parametrize(("code", "what"), [(0xd0, "list32"), (0xd1, "map32"), (0xf0, "array32")])
def test_huge_counts_are_refused_before_decoding(code, what):
    """A count the remaining octets cannot satisfy at one octet (or the element width) per item."""
    tail = b"\x50" if code == 0xf0 else b""
    data = bytes((code,)) + U32.pack(4 + len(tail) + 4) + U32.pack(0xFFFFFFFE) + tail + b"\x40" * 4
    outcome, elapsed, peak = bounded(t.decode, data)
    assert isinstance(outcome, DecodeError), outcome
    assert "declares" in str(outcome)
    assert elapsed < TIME_BOUND and peak < 64 * 1024


@pytest.mark.parametrize("code", [0xb0, 0xb1, 0xb3, 0xd0, 0xd1, 0xf0])
def test_huge_sizes_are_refused_before_allocating(code):
    """1.2.2-1.2.4: a 32-bit size beyond the octets present is refused; nothing of that size is allocated."""
    data = bytes((code,)) + U32.pack(0xFFFFFFF0) + b"\x00" * 16
    outcome, elapsed, peak = bounded(t.decode, data)
    assert isinstance(outcome, DecodeError), outcome
    assert elapsed < TIME_BOUND and peak < 64 * 1024


def nested_lists(depth: int) -> bytes:
    encoded = b"\x45"
    for _ in range(depth):
        encoded = b"\xd0" + U32.pack(len(encoded) + 4) + U32.pack(1) + encoded
    return encoded


def test_nesting_up_to_the_limit_decodes_and_beyond_is_refused():
    value = t.decode(nested_lists(t.MAX_DEPTH))
    depth = 0
    while value:
        value, depth = value[0], depth + 1
    assert depth == t.MAX_DEPTH
    with pytest.raises(DecodeError, match="nested"):
        t.decode(nested_lists(t.MAX_DEPTH + 1))


def test_deep_described_chains_and_huge_depths_are_decode_errors_not_recursion_errors():
    """0x00 0x00 0x00 ...: a descriptor that is itself described, 100,000 deep."""
    for data in (b"\x00" * 100_000 + b"\x40\x40", nested_lists(5000)):
        outcome, elapsed, _peak = bounded(t.decode, data)
        assert isinstance(outcome, DecodeError), repr(outcome)
        assert elapsed < TIME_BOUND


# -- property tests ---------------------------------------------------------------------------------------
TIME_BOUND = 0.5  # seconds for a few KB: decoding takes microseconds to milliseconds
ALLOC_FACTOR = 100  # bytes of Python objects per input octet (worst case ~64, module docstring)
ALLOC_CONSTANT = 256 * 1024


def bounded(fn, *args):
    """Run ``fn(*args)``: (result or exception, CPU seconds of this thread, peak bytes allocated).

    CPU time, not wall time: the bound is about the decoder's work, and a loaded machine (the suite
    on two xdist workers beside other processes) stretched a 0.2 s decode past 0.5 s of wall time."""
    import time
    import tracemalloc
    tracemalloc.start()
    started = time.thread_time()
    try:
        outcome = fn(*args)
    except Exception as exc:  # noqa: BLE001 - returned for the caller to judge
        outcome = exc
    elapsed = time.thread_time() - started
    _size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return outcome, elapsed, peak


symbols = st.text(alphabet=st.characters(max_codepoint=127), max_size=20).map(t.Symbol)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
    st.floats(allow_nan=False), st.text(max_size=40), symbols, st.binary(max_size=40), st.uuids(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1).map(t.Timestamp),
    st.characters(exclude_categories=("Cs",)).map(t.Char),  # a char is a Unicode scalar value
    st.binary(min_size=4, max_size=4).map(t.Decimal32),
)
keys = st.one_of(st.text(max_size=10), symbols, st.integers(min_value=-1000, max_value=1000))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(keys, inner, max_size=6),
        st.tuples(st.one_of(symbols, st.integers(min_value=0, max_value=(1 << 64) - 1)), inner).map(
            lambda pair: t.Described(*pair)),
        st.lists(symbols, max_size=5).map(lambda items: t.Array("symbol", items)),
        st.lists(st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1), max_size=5).map(
            lambda items: t.Array("int", items)),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_round_trip_of_generated_values(value):
    """encode_value then decode gives an equal value, consuming every octet."""
    encoded = t.encode_value(value)
    decoded = t.decode(encoded)
    assert decoded == value


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_only_raise_decode_error_quickly_and_in_little_memory(data):
    outcome, elapsed, peak = bounded(t.decode_value, data)
    assert not isinstance(outcome, Exception) or isinstance(outcome, DecodeError), repr(outcome)
    assert elapsed < TIME_BOUND
    assert peak < ALLOC_FACTOR * len(data) + ALLOC_CONSTANT, (peak, len(data))


@settings(max_examples=400, deadline=None)
@given(values, st.lists(st.tuples(st.integers(min_value=0, max_value=10_000), st.integers(0, 255)),
                        min_size=1, max_size=4), st.integers(min_value=0, max_value=3))
def test_mutated_encodings_only_raise_decode_error(value, flips, cut):
    """Valid encodings with octets flipped and truncated: the interesting half of the input space."""
    data = bytearray(t.encode_value(value))
    for index, octet in flips:
        data[index % len(data)] = octet
    data = bytes(data[:len(data) - cut] if cut < len(data) else data)
    outcome, elapsed, peak = bounded(t.decode_value, data)
    assert not isinstance(outcome, Exception) or isinstance(outcome, DecodeError), repr(outcome)
    assert elapsed < TIME_BOUND
    assert peak < ALLOC_FACTOR * len(data) + ALLOC_CONSTANT, (peak, len(data))


def test_the_table_is_consistent():
    """spec_table.parse checks codes, types and defaults; one encoding per code of 1.6."""
    spec = parse()
    assert len(spec.encodings) == 39
    assert {e.type for e in spec.encodings.values()} == set(t.ENCODERS)


@pytest.mark.parametrize(("what", "data"), [
    ("list32 of 20,000 list0", b"\xd0" + U32.pack(20_004) + U32.pack(20_000) + b"\x45" * 20_000),
    ("array32 of 10,000 one-character symbols",
     b"\xf0" + U32.pack(20_005) + U32.pack(10_000) + b"\xa3" + b"\x01a" * 10_000),
    ("array32 of 20,000 empty symbols", b"\xf0" + U32.pack(20_005) + U32.pack(20_000) + b"\xa3" + b"\x00" * 20_000),
    ("list32 of 6,000 described nulls", b"\xd0" + U32.pack(18_004) + U32.pack(6_000) + b"\x00\x40\x40" * 6_000),
    ("array32 of 6,000 array8 of null", b"\xf0" + U32.pack(18_005) + U32.pack(6_000) + b"\xe0" + b"\x02\x00\x40" * 6_000),
])
def test_worst_case_allocation_per_octet(what, data):
    """The densest inputs we know (module docstring: ~64 octets of Python objects per input octet at most)."""
    outcome, elapsed, peak = bounded(t.decode, data)
    assert not isinstance(outcome, Exception), outcome
    assert peak < 70 * len(data), (what, peak / len(data))
    assert elapsed < TIME_BOUND
