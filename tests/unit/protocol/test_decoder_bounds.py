"""Decoders bounded by the bytes present (issue 17): counts, sizes and nesting depth.

0-10 (spec 3.x, L3471ff map, L3525ff list, L3566ff array): a map, list or array carries a byte size
and an element count.  The count is only trusted once the bytes present can back it: every element
takes at least its type's minimum width, and the zero-width types void (L2652) and bit (L2654),
which no byte backs, are capped at ``MAX_ZERO_WIDTH_ELEMENTS``.  Nesting (maps, lists, arrays,
struct32 values) is capped at ``MAX_DEPTH``.  Every violation is a FramingError (close 501).

0-9-1 (general 4.2.5.5): field tables and arrays carry byte sizes only and every value takes at
least its type octet, so their loops are bounded by the bytes; nesting is capped at MAX_NESTING.

The property tests assert time and allocation bounds with tracemalloc: whatever count or size a
small input declares, decoding it allocates little and ends fast.
"""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010 import types as t
from raftmq.protocol.amqp010.errors import FramingError
from raftmq.protocol.amqp010.frames import (
    FIRST_FRAME,
    FIRST_SEG,
    LAST_FRAME,
    LAST_SEG,
    SEG_COMMAND,
    Assembly,
    FrameReader,
)
from raftmq.protocol.amqp091.errors import AMQPError, AMQPSyntaxError
from raftmq.protocol.amqp091.fieldtable import MAX_NESTING, decode_table, encode_table

U32 = struct.Struct(">I")
ZERO_WIDTH = sorted(name for name, w in t.MIN_WIDTH.items() if w == 0 and t.CODE_OF[name] is not None)
TIME_BOUND = 0.5  # seconds: decoding a few hundred octets takes microseconds; the old loop took minutes
ALLOC_BOUND = 1 << 20  # bytes of peak allocation while decoding a small input


def array_of(code: int, count: int, data: bytes = b"") -> bytes:
    body = bytes((code,)) + U32.pack(count) + data
    return U32.pack(len(body)) + body


def map_with(entries: list[tuple[bytes, int, bytes]], count: int | None = None) -> bytes:
    """A 0-10 map of (key, type code, encoded value), its count declared as ``count`` if given."""
    parts = b"".join(bytes((len(k),)) + k + bytes((code,)) + v for k, code, v in entries)
    body = U32.pack(len(entries) if count is None else count) + parts
    return U32.pack(len(body)) + body


def nested_maps(depth: int) -> bytes:
    """``depth`` maps each holding the next one under key "k" (built iteratively: no recursion)."""
    encoded = map_with([])
    for _ in range(depth):
        encoded = map_with([(b"k", t.CODE_OF["map"], encoded)])
    return encoded


def struct32_with_headers(headers_map: bytes) -> bytes:
    """A struct32 message.message-properties whose application-headers field is ``headers_map``."""
    encoded = c.encode_struct32(c.MessageProperties(application_headers={}))
    empty = t.encode_map({})
    assert encoded.endswith(empty)
    body = encoded[4:-len(empty)] + headers_map
    return U32.pack(len(body)) + body


def bounded(fn, *args):
    """Run ``fn(*args)``; (result or exception, seconds, peak bytes allocated)."""
    tracemalloc.start()
    started = time.thread_time()  # CPU time: the bound is the decoder's work, not the machine's load
    try:
        outcome = fn(*args)
    except Exception as exc:  # noqa: BLE001 - returned for the caller to judge
        outcome = exc
    elapsed = time.thread_time() - started
    _size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return outcome, elapsed, peak


# -- 0-10 counts ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ZERO_WIDTH)
def test_zero_width_array_with_a_huge_count_is_refused_at_once(name):
    """Issue 17 item 1: 2^32-1 void/bit elements in 9 octets looped for minutes and took tens of GB."""
    assert name in ("void", "bit")
    outcome, elapsed, peak = bounded(t.decode, "array", array_of(t.CODE_OF[name], 0xFFFFFFFF), 0)
    assert isinstance(outcome, FramingError), outcome
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


@pytest.mark.parametrize("name", ZERO_WIDTH)
def test_zero_width_arrays_up_to_the_cap_still_decode(name):
    value, end = t.decode("array", array_of(t.CODE_OF[name], t.MAX_ZERO_WIDTH_ELEMENTS), 0)
    assert len(value) == t.MAX_ZERO_WIDTH_ELEMENTS and end == 9  # size, type code, count
    with pytest.raises(FramingError, match="zero-width"):
        t.decode("array", array_of(t.CODE_OF[name], t.MAX_ZERO_WIDTH_ELEMENTS + 1), 0)


@pytest.mark.parametrize("name", ["uint64", "str8", "vbin32", "map", "uuid", "boolean"])
def test_array_count_beyond_its_bytes_is_refused_before_decoding(name):
    one = t.ENCODERS[name]({"a": 1} if name == "map" else t.decode(name, b"\x00" * 32, 0)[0])
    good = array_of(t.CODE_OF[name], 2, one * 2)
    assert len(t.decode("array", good, 0)[0]) == 2
    with pytest.raises(FramingError, match="declares"):
        t.decode("array", array_of(t.CODE_OF[name], 1_000_000, one * 2), 0)


def test_map_and_list_counts_beyond_their_bytes_are_refused():
    void = t.CODE_OF["void"]
    assert t.decode("map", map_with([(b"a", void, b"")]), 0)[0] == {"a": None}
    with pytest.raises(FramingError, match="declares"):
        t.decode("map", map_with([(b"a", void, b"")], count=0xFFFFFFFF), 0)
    body = U32.pack(0xFFFFFFFF) + bytes((void,)) * 3
    with pytest.raises(FramingError, match="declares"):
        t.decode("list", U32.pack(len(body)) + body, 0)


# -- 0-10 nesting ---------------------------------------------------------------------------------------------
def test_nesting_up_to_the_limit_decodes_and_beyond_it_is_a_framing_error():
    value, _ = t.decode("map", nested_maps(t.MAX_DEPTH), 0)
    depth = 0
    while value:
        value, depth = value["k"], depth + 1
    assert depth == t.MAX_DEPTH
    with pytest.raises(FramingError, match="nested"):
        t.decode("map", nested_maps(t.MAX_DEPTH + 1), 0)


def test_a_map_nested_3000_deep_is_a_framing_error_not_a_recursion_error():
    """Issue 17 item 7: 3,000 nested maps raised RecursionError (a 320 close and a traceback)."""
    outcome, elapsed, _peak = bounded(t.decode, "map", nested_maps(3000), 0)
    assert isinstance(outcome, FramingError), repr(outcome)
    assert elapsed < TIME_BOUND


def test_lists_and_arrays_count_toward_the_depth():
    encoded = t.encode_list([])
    for i in range(3000):
        if i % 2:
            body = U32.pack(1) + bytes((t.CODE_OF["list"],)) + encoded
        else:
            body = bytes((t.CODE_OF["list"],)) + U32.pack(1) + encoded  # an array of one list
            body = U32.pack(len(body)) + body
            body = U32.pack(1) + bytes((t.CODE_OF["array"],)) + body
        encoded = U32.pack(len(body)) + body
    with pytest.raises(FramingError, match="nested"):
        t.decode("list", encoded, 0)


def test_maps_nested_through_struct32_values_count_toward_the_depth():
    """map -> struct32 message-properties -> application-headers map -> struct32 ...: the struct's
    own field decoders must carry the depth on, or the cycle recurses without bound."""
    encoded = t.encode_map({})
    for _ in range(1500):
        encoded = map_with([(b"s", t.CODE_OF["struct32"], struct32_with_headers(encoded))])
    with pytest.raises(FramingError, match="nested"):
        t.decode("map", encoded, 0)
    shallow = map_with([(b"s", t.CODE_OF["struct32"], struct32_with_headers(t.encode_map({"x": 1})))])
    value, _ = t.decode("map", shallow, 0)
    assert value["s"].application_headers == {"x": 1}


def test_start_ok_with_deep_client_properties_is_a_framing_error():
    """The whole control path (decode_assembly) ends in FramingError, the 501 close of the front end."""
    control = c.ConnectionStartOk(client_properties={}, mechanism="PLAIN", response=b"\0a\0b", locale="en_US")
    payload = control.encode_segment()
    empty = t.encode_map({})
    assert payload[4:4 + len(empty)] == empty
    deep = payload[:4] + nested_maps(3000) + payload[4 + len(empty):]
    with pytest.raises(FramingError):
        c.decode_assembly(Assembly(0, 0, [(0, deep)]))


# -- 0-10 property tests with size and time bounds -------------------------------------------------------------
counts = st.one_of(st.integers(0, 16), st.integers(0, 0xFFFFFFFF), st.just(0xFFFFFFFF))
codes = st.sampled_from(sorted(t.TYPE_BY_CODE))


@given(kind=st.sampled_from(["array", "map", "list"]), code=codes, count=counts, tail=st.binary(max_size=64))
@settings(max_examples=1500, deadline=None)
def test_any_declared_count_decodes_fast_and_small(kind, code, count, tail):
    """Whatever count a small map, list or array declares, decoding allocates < 1 MiB in < 0.5 s."""
    if kind == "array":
        data = array_of(code, count, tail)
    else:
        body = U32.pack(count) + tail
        data = U32.pack(len(body)) + body
    outcome, elapsed, peak = bounded(t.decode, kind, data, 0)
    assert not isinstance(outcome, Exception) or isinstance(outcome, FramingError), repr(outcome)
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


@given(payload=st.binary(max_size=120), code=codes, count=counts, at=st.integers(0, 120))
@settings(max_examples=1000, deadline=None)
def test_start_ok_with_a_crafted_count_anywhere_decodes_fast_and_small(payload, code, count, at):
    """A start-ok (decoded before the password is checked) with an array header and a huge count
    spliced in at a random place: a FramingError or a value, fast and small."""
    base = c.ConnectionStartOk(client_properties={"a": [1, 2], "b": {"c": None}}, mechanism="PLAIN",
                               response=b"\0guest\0guest", locale="en_US").encode_segment()
    at = min(at, len(base))
    data = base[:at] + bytes((t.CODE_OF["array"],)) + array_of(code, count) + payload + base[at:]
    outcome, elapsed, peak = bounded(c.decode_assembly, Assembly(0, 0, [(0, data)]))
    assert not isinstance(outcome, Exception) or isinstance(outcome, (FramingError, c.UnknownCommand)), repr(
        outcome)
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


# -- 0-10 pending assemblies ----------------------------------------------------------------------------------
HEADER = struct.Struct(">BBHxBH4x")


def frame(flags: int, seg_type: int, track: int, channel: int, payload: bytes) -> bytes:
    return HEADER.pack(flags, seg_type, 12 + len(payload), track, channel) + payload


def test_unfinished_assemblies_of_all_channels_share_one_budget():
    """Issue 17 item 2: unfinished assemblies on many channels were each bounded, their sum was not."""
    reader = FrameReader(max_pending_bytes=64 * 1024)
    first = frame(FIRST_SEG | FIRST_FRAME, SEG_COMMAND, 1, 0, b"x" * 4000)
    fed = 0
    with pytest.raises(FramingError, match="unfinished"):
        for channel in range(1000):
            reader.feed(frame(FIRST_SEG | FIRST_FRAME, SEG_COMMAND, 1, channel, b"x" * 4000))
            fed += len(first)
    assert fed <= 64 * 1024 < fed + len(first)


def test_finished_assemblies_give_their_budget_back():
    reader = FrameReader(max_pending_bytes=10_000)
    for i in range(100):  # 100 x 3 KB through a 10 KB budget: each assembly ends before the next
        out = reader.feed(frame(FIRST_SEG | FIRST_FRAME, SEG_COMMAND, 1, i % 3, b"y" * 1500)
                          + frame(LAST_SEG | LAST_FRAME, SEG_COMMAND, 1, i % 3, b"z" * 1500))
        assert len(out) == 1
    assert reader.pending_bytes == 0


# -- 0-9-1 field tables ---------------------------------------------------------------------------------------
def test_field_table_nested_3000_deep_is_a_syntax_error():
    encoded = encode_table({})
    for _ in range(3000):
        inner = b"\x01kF" + encoded
        encoded = struct.pack(">I", len(inner)) + inner
    outcome, elapsed, _peak = bounded(decode_table, encoded, 0)
    assert isinstance(outcome, AMQPSyntaxError), repr(outcome)
    assert elapsed < TIME_BOUND
    shallow = encode_table({})
    for _ in range(MAX_NESTING):
        inner = b"\x01kF" + shallow
        shallow = struct.pack(">I", len(inner)) + inner
    assert decode_table(shallow, 0)[0]


@given(prefix=st.binary(max_size=40), size=st.integers(0, 0xFFFFFFFF), code=st.sampled_from(list(b"SxAFV")),
       tail=st.binary(max_size=60))
@settings(max_examples=1000, deadline=None)
def test_field_table_sizes_are_backed_by_bytes(prefix, size, code, tail):
    """0-9-1 tables, arrays, long strings and byte arrays declare byte sizes: any declared size in a
    small input decodes (or fails with an AMQP error) fast and with little allocated."""
    value = bytes((code,)) + U32.pack(size) + tail
    body = b"\x01k" + value
    table = U32.pack(len(body)) + body
    for data in (table, prefix + table, U32.pack(size) + body):
        outcome, elapsed, peak = bounded(decode_table, data, 0)
        assert not isinstance(outcome, Exception) or isinstance(outcome, AMQPError), repr(outcome)
        assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


frame_specs = st.lists(st.tuples(st.integers(0, 15), st.integers(0, 3), st.integers(0, 1), st.integers(0, 7),
                                 st.integers(0, 3000)), max_size=60)


@given(frame_specs, st.integers(4096, 32768))
@settings(max_examples=500, deadline=None)
def test_pending_bytes_never_pass_the_budget_and_match_what_is_held(specs, budget):
    """Random frames (any flags, segment types, tracks, 8 channels): the reader either raises a
    FramingError or holds at most ``budget`` octets of frames, and its count equals what its unfinished
    assemblies hold (so a finished assembly gives back exactly what it took)."""
    reader = FrameReader(max_pending_bytes=budget)
    for flags, seg_type, track, channel, size in specs:
        try:
            reader.feed(frame(flags, seg_type, track, channel, b"p" * size))
        except FramingError:
            return
        held = sum(sum(len(p) for p in partial.parts) + sum(len(s[1]) for s in partial.segments)
                   for partial in reader._partial.values())
        frames_held = sum(partial.charged for partial in reader._partial.values())
        assert reader.pending_bytes == frames_held <= budget
        assert held <= frames_held
