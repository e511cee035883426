"""AMQP 1.0 message bodies walked over, never decoded; the decoder's element budget (issue 31 item 1).

Spec (/work/shared/specs, AMQP 1.0): part 1, 1.2 -- every encoding's constructor says its width, or
carries a size (variable, compound and array categories), so the end of a value is found without
looking inside it; 1.6.22-1.6.24 (list, map, array: size and count); part 3, 3.2 (a message is a
sequence of sections; 3.2.6-3.2.8 data, amqp-sequence, amqp-value are the body); 2.8.15 decode-error.

Checked here:
- ``skip.skip_value`` ends where ``types.decode_value`` ends for every value the encoder makes, and for
  a list of 8 Mi empty lists it takes microseconds and allocates nothing per element;
- ``stored.spans`` decodes header/annotations/properties/application-properties and walks the body,
  delivery-annotations and footer (``section`` None), checking each walked section's value type;
- ``convert.publish_of`` stores an 8 MiB amqp-value of empty lists without building its elements
  (bounded time and memory), body octets as sent;
- the element budget: lists, maps and arrays are charged their declared counts; past it a DecodeError
  before the elements are built; a frame's budget is per frame in ``FrameReader``; message sections
  share one;
- a hypothesis fuzz (random, garbage, nested encodings, counts no octet backs) of the section walk and
  the budgeted decoder: nothing but DecodeError escapes, and every example is bounded in time.
"""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp10 import convert as cv
from raftmq.protocol.amqp10 import frames as f
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import stored
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import DecodeError
from raftmq.protocol.amqp10.skip import skip_value
from tests.unit.protocol.test_amqp10_types import bounded

U32 = struct.Struct(">I")
HEADER = struct.Struct(">IBBH")
MiB = 1 << 20


def list32_of_empty_lists(n: int) -> bytes:
    return b"\xd0" + U32.pack(n + 4) + U32.pack(n) + b"\x45" * n


def amqp_value(encoded: bytes) -> bytes:
    return b"\x00\x53\x77" + encoded


# -- the skip walk (1.2) -------------------------------------------------------------------------------------------
VALUES = [
    None, True, False, 0, 7, -1, 1 << 40, (1 << 64) - 1, 1.5, "", "héllo", b"", b"x" * 300, "s" * 300,
    t.Symbol("sym"), t.Timestamp(5), t.UByte(3), t.Float32(2.0), t.Char("é"), [], [1, "a", [None, []]],
    {"k": 1, "m": {"x": [1, 2]}}, {t.Symbol("x-a"): b"b"}, t.Array("int", [1, 2, 3]),
    t.Array("symbol", ["a", "bb"]), t.Array("list", [[1], []]), t.Array("null", [None] * 10),
    t.Described(t.ULong(0x70), [True]), t.Described(t.Symbol("d:x"), {"a": 1}), list(range(300)),
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_skip_ends_where_decode_ends(value):
    """1.2: a value's end follows from its constructor and size alone -- the walk and the decoder agree."""
    enc = t.encode_value(value) + b"\x40"  # something after it: the walk must stop at the value's end
    _decoded, end = t.decode_value(enc, 0, len(enc))
    assert skip_value(enc, 0, len(enc)) == end == len(enc) - 1


def test_skip_of_eight_million_empty_lists_builds_nothing():
    """The attack of issue 31 item 1: an 8 Mi-element list is one size field to the walk."""
    enc = list32_of_empty_lists(8 * MiB)
    end, elapsed, peak = bounded(skip_value, enc, 0, len(enc))
    assert end == len(enc)
    assert elapsed < 0.05 and peak < 4096, (elapsed, peak)


@pytest.mark.parametrize(("data", "what"), [
    (b"", "expected"),
    (b"\x01", "unknown format code"),
    (b"\xa1\x05ab", "overruns"),
    (b"\xb0\xff\xff\xff\xff", "overruns"),
    (b"\xc0\x03\x05\x45\x45", "more than its"),  # 5 items in 2 octets
    (b"\xd0" + U32.pack(2), "needs"),  # list32 header cut short
    (b"\xd0" + U32.pack(1) + U32.pack(0), "smaller than its count"),
    (b"\xe0\x01\x05", "no element constructor"),
    (b"\xe0\x02\x05\x01", "unknown array element"),
    (b"\xf0" + U32.pack(5) + U32.pack(0xFFFFFFFF) + b"\x45", "zero-width"),
    (b"\xe0\x02\x05\x71", "more than its"),  # 5 ints in 0 octets
    (b"\x00" * 70, "nested more than"),
    (b"\x81\x00\x00", "needs"),
])
def test_skip_refuses_what_its_octets_do_not_back(data, what):
    """1.2 / 1.6.22-24: sizes must fit the enclosing octets, counts must be backed, codes known."""
    with pytest.raises(DecodeError, match=what):
        skip_value(data, 0, len(data))


# -- sections: decoded or walked (3.2) -----------------------------------------------------------------------------
def test_spans_decode_the_properties_and_walk_the_body():
    """3.2: header, message-annotations, properties, application-properties decoded; delivery-annotations,
    the body sections and the footer walked over (section None), with their octets' spans."""
    sections = [p.Header(durable=True), p.DeliveryAnnotations({t.Symbol("x-d"): 1}),
                p.MessageAnnotations({t.Symbol("x-a"): "v"}), p.Properties(to="/queues/q"),
                p.ApplicationProperties({"k": 2}), p.AmqpValue([[]] * 1000), p.Footer({t.Symbol("x-f"): 3})]
    payload = p.encode_sections(sections)
    spans = stored.spans(payload, 1000)
    assert [s.cls for s in spans] == [s.__class__ for s in sections]
    for span, section in zip(spans, sections, strict=True):
        assert payload[span.start:span.end] == section.encode()
        if span.cls in stored.WALKED:
            assert span.section is None
        else:
            assert span.section.encode() == section.encode()
    assert spans[0].start == 0 and spans[-1].end == len(payload)


@pytest.mark.parametrize(("section", "what"), [
    (b"\x00\x53\x75\x45", "format code 0x45"),  # data holding a list
    (b"\x00\x53\x76\xa1\x01a", "format code 0xa1"),  # amqp-sequence holding a string
    (b"\x00\x53\x77", "has no value"),
    (b"\x00\x53\x77\xd0" + U32.pack(100) + U32.pack(1), "overruns"),
    (b"\x00\x53\x10\xc0\x01\x00", "expected a section"),  # open is a frame, not a section
    (b"\x00\xc0\x01\x00\x45", "descriptor"),
    (b"\x53\x75", "described value"),
])
def test_spans_refuse_broken_sections(section, what):
    """3.2.5-3.2.8: a walked section's value has its section's type and fits the message."""
    with pytest.raises(DecodeError, match=what):
        stored.spans(section)


def test_publish_of_an_8_mib_amqp_value_of_empty_lists_is_bounded():
    """Issue 31 item 1: publishing keeps the body's octets; building 8 Mi lists took 581 MB and seconds."""
    body = amqp_value(list32_of_empty_lists(8 * MiB))
    payload = p.Properties(to="/queues/q").encode() + body
    published, elapsed, peak = bounded(cv.publish_of, payload)
    assert published.body == body and published.to == "/queues/q"
    assert stored.unpack(published.properties)[0] == stored.BODY_SECTIONS
    assert elapsed < 0.5, elapsed
    assert peak < 3 * len(payload), peak  # the body's copy, not ~70 octets per element


def test_publish_of_a_data_section_stores_its_octets():
    """3.2.6: one data section is stored as its octets (vbin8 and vbin32)."""
    for octets in (b"abc", b"z" * 1000):
        payload = p.Header(durable=True).encode() + p.Data(octets).encode()
        assert cv._decoded(payload).body == octets
        assert cv.publish_of(payload).body == octets


def test_delivery_of_unchecked_body_walks_its_sections():
    """A 0-9-1 message typed amqp-1.0 whose body is 1.0 sections: delivered as its body sections, walked."""
    body = amqp_value(list32_of_empty_lists(MiB))
    props = stored.pack(stored.BODY_UNCHECKED, b"", b"")
    out, elapsed, peak = bounded(cv.encode_delivery, props, body, "", "q", False)
    assert out.endswith(body)
    assert peak < 4 * len(body), peak


# -- the element budget --------------------------------------------------------------------------------------------
def test_budget_charges_declared_items_of_lists_maps_and_arrays():
    """Every compound is charged its count when entered: nested lists add up; maps count keys and values."""
    value = [[1, 2], {"a": 1}, t.Array("int", [1, 2, 3])]
    enc = t.encode_value(value)
    need = 3 + 2 + 2 + 3
    assert t.decode(enc, need) == t.decode(enc)
    with pytest.raises(DecodeError, match="element budget"):
        t.decode(enc, need - 1)


def test_budget_refuses_a_huge_list_before_building_it():
    """A list of 130k empty lists (the attach flood of issue 31) costs one check past the budget."""
    enc = list32_of_empty_lists(130_000)
    outcome, elapsed, peak = bounded(t.decode, enc, 4096)
    assert isinstance(outcome, DecodeError) and "element budget" in str(outcome)
    assert elapsed < 0.01 and peak < 16 * 1024, (elapsed, peak)


def attach_frame(properties: dict) -> bytes:
    return f.encode_frame(p.Attach(name="l", handle=0, role=False, properties=properties), 1)


def test_frame_reader_budget_is_per_frame():
    """Each frame's performative has its own budget: many legitimate frames in one read all decode;
    one frame past the budget is amqp:decode-error before its elements are built."""
    small = attach_frame({t.Symbol(f"k{i}"): i for i in range(100)})  # 200 elements
    assert len(f.FrameReader(1 << 20, 256).feed(small * 50)) == 50
    big = attach_frame({t.Symbol(f"k{i}"): i for i in range(200)})  # 400 elements
    with pytest.raises(DecodeError, match="element budget") as info:
        f.FrameReader(1 << 20, 256).feed(big)
    assert info.value.condition == "amqp:decode-error"


def test_frame_of_130k_element_list_is_refused_at_once():
    """Issue 31 item 1: 128 KiB attach frames of 130k-element lists stalled others 8-15 s."""
    lst = list32_of_empty_lists(130_000)
    # name, handle, role, nine nulls (snd-settle-mode ... offered-capabilities), desired-capabilities
    items = b"\xa1\x01l" + b"\x43" + b"\x42" + b"\x40" * 9 + lst
    body = b"\x00\x53\x12\xd0" + U32.pack(len(items) + 4) + U32.pack(13) + items
    frame = HEADER.pack(8 + len(body), 2, 0, 0) + body
    outcome, elapsed, peak = bounded(f.FrameReader(1 << 20).feed, frame)
    assert isinstance(outcome, DecodeError) and "element budget" in str(outcome), outcome
    assert elapsed < 0.05 and peak < 4 * len(frame), (elapsed, peak)  # the reader's copies


def test_message_sections_share_one_budget():
    """The budget is for the message: its application-properties and annotations together."""
    payload = (p.MessageAnnotations({t.Symbol(f"x-{i}"): i for i in range(30)}).encode()
               + p.ApplicationProperties({f"k{i}": i for i in range(30)}).encode() + p.Data(b"x").encode())
    assert cv._decoded(payload, 120).body == b"x"
    with pytest.raises(DecodeError, match="element budget"):
        cv._decoded(payload, 119)
    with pytest.raises(DecodeError, match="element budget"):
        p.decode_sections(payload, 119)


# -- fuzz ----------------------------------------------------------------------------------------------------------
SECTION_PREFIXES = [b"\x00\x53" + bytes((c,)) for c in range(0x70, 0x79)] + [b"\x00\xa3\x10amqp:value:*****"]
ATOMS = [b"\x45", b"\x40", b"\x41", b"\x43", b"\x52\x07", b"\xa1\x02ab", b"\xa3\x01s", b"\x71\x00\x00\x00\x01",
         b"\xa0\x00", b"\xc1\x01\x00", b"\xe0\x02\x05\x40", b"\xf0" + U32.pack(5) + U32.pack(1 << 30) + b"\x45"]


def _compound(inner: list[bytes], code: int, claimed: int | None) -> bytes:
    body = b"".join(inner)
    count = len(inner) if claimed is None else claimed
    if code == 0xC0:
        return bytes((0xC0, (len(body) + 1) & 0xFF, count & 0xFF)) + body
    return bytes((code,)) + U32.pack(len(body) + 4) + U32.pack(count) + body


values = st.recursive(
    st.sampled_from(ATOMS) | st.binary(max_size=12),
    lambda children: st.builds(_compound, st.lists(children, max_size=6), st.sampled_from([0xC0, 0xD0, 0xD1]),
                               st.none() | st.integers(0, (1 << 32) - 1)),
    max_leaves=40,
)
sections = st.lists(st.tuples(st.sampled_from(SECTION_PREFIXES), values), max_size=6).map(
    lambda xs: b"".join(a + b for a, b in xs))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sections, st.integers(0, 5), st.binary(max_size=8), st.integers(1, 2000))
def test_fuzz_section_walk_and_budgeted_decode(payload, cut, junk, elements):
    """Random, garbage and nested encodings, counts no octet backs: the section walk, publish and the
    budgeted decoder raise nothing but DecodeError, each example in bounded time."""
    data = payload[:len(payload) - cut] + junk if cut else payload
    started = time.perf_counter()
    for fn in (lambda: stored.spans(data, elements), lambda: cv.publish_of(data, elements),
               lambda: p.decode_sections(data, elements), lambda: t.decode(data, elements),
               lambda: skip_value(data, 0, len(data))):
        try:
            fn()
        except DecodeError:
            pass
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("body", [
    [p.AmqpValue(b"x" * 300)], [p.AmqpValue({"a": [1]})], [p.AmqpSequence([1, 2])], [p.Data(b"a"), p.Data(b"b")],
    [], [p.Data(b"a"), p.Footer({t.Symbol("x-f"): 1})],
], ids=repr)
def test_bodies_of_sections_use_the_cached_template_and_match_the_full_walk(body):
    """A body that is not one trailing data section (proton's default amqp-value): publish_of walks the
    message once and looks the kept sections' template up; the result equals the section-by-section
    :func:`convert._decoded`, the first time (template made) and the second (template reused)."""
    payload = p.encode_sections([p.Header(durable=True), p.Properties(message_id="m"),
                                 p.ApplicationProperties({"k": 1}), *body])
    for _ in range(2):
        assert cv.publish_of(payload) == cv._decoded(payload)
