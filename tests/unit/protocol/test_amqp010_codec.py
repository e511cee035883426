"""AMQP 0-10 codec: every control, command and struct round-trips; bad input is a framing error.

Encoding rules under test: spec 3.x (struct packing flags, least significant bit first), 5.7
(controls: class-code, control-code, 2 octets of packing flags), 5.8 (commands: plus the
session.header struct), 4.4 (segments of message.transfer).
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010 import types as t
from raftmq.protocol.amqp010.errors import FramingError
from raftmq.protocol.amqp010.frames import Assembly, FrameReader, encode_assembly

text8 = st.text(max_size=30).filter(lambda s: len(s.encode()) <= 255)
scalar = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text(max_size=20)
          | st.binary(max_size=20) | st.floats(allow_nan=False) | st.uuids())
map_values = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(text8, inner, max_size=3), max_leaves=10)
ranges = st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), max_size=4)

BASE_VALUES = {
    "uint8": st.integers(0, 255), "uint16": st.integers(0, 65535), "uint32": st.integers(0, 2**32 - 1),
    "uint64": st.integers(0, 2**64 - 1), "int64": st.integers(-(2**63), 2**63 - 1),
    "sequence-no": st.integers(0, 2**32 - 1), "datetime": st.integers(0, 2**63),
    "str8": text8, "str16": st.text(max_size=60), "vbin8": st.binary(max_size=40), "vbin16": st.binary(max_size=60),
    "vbin32": st.binary(max_size=60), "map": st.dictionaries(text8, map_values, max_size=4), "uuid": st.uuids(),
    "sequence-set": ranges, "bit": st.booleans(),
}


def value_for(field: c.FieldCodec):
    base = c.SPEC.base_type(field.type)
    if base in c.STRUCTS:
        return struct_values(c.STRUCTS[base])
    if base == "array":
        element = field._element(field.type)
        if element in BASE_VALUES:
            return st.lists(BASE_VALUES[element], max_size=3)
        return st.just([])
    if base == "struct32":
        return st.sampled_from(sorted(c.STRUCTS_BY_CODE)).flatmap(lambda code: struct_values(c.STRUCTS_BY_CODE[code]))
    return BASE_VALUES[base]


def fields_of(cls):
    return st.fixed_dictionaries({}, optional={f.attr: value_for(f) for f in cls.FIELDS})


def struct_values(cls):
    return fields_of(cls).map(lambda kw: cls(**kw))


methods = st.sampled_from(sorted([*c.CONTROLS.values(), *c.COMMANDS.values()], key=lambda k: k.NAME)).flatmap(
    lambda cls: fields_of(cls).map(lambda kw: cls(**kw)))


def roundtrip(method, frame_size=0xFFFF):
    track, segments = c.segments_of(method)
    assemblies = FrameReader(frame_size).feed(encode_assembly(7, track, segments, frame_size))
    assert len(assemblies) == 1
    return c.decode_assembly(assemblies[0])


@given(methods, st.booleans())
@settings(max_examples=1500, deadline=None)
def test_every_control_and_command_round_trips(method, sync):
    if isinstance(method, c.Command):
        method.sync = sync
    decoded = roundtrip(method)
    assert decoded == method
    if isinstance(method, c.Command):
        assert decoded.sync == sync


@given(fields_of(c.DeliveryProperties), fields_of(c.MessageProperties), st.binary(max_size=3000),
       st.integers(64, 600))
@settings(max_examples=200, deadline=None)
def test_message_transfer_with_header_and_body_over_small_frames(dp, mp, body, frame_size):
    """4.4.1: a transfer is one assembly: command, header (struct32 entries) and body segments."""
    m = c.MessageTransfer(destination="amq.direct", accept_mode=0, acquire_mode=0,
                          headers=[c.DeliveryProperties(**dp), c.MessageProperties(**mp)], body=body)
    decoded = roundtrip(m, frame_size)
    assert decoded.headers == m.headers and decoded.body == body


def test_packing_flags_and_session_header_layout():
    """5.8: class-code, command-code, session.header (size 1, flags: sync), 2 octets of packing flags."""
    payload = c.QueueDeclare(queue="q", durable=True, sync=True).encode_segment()
    # queue is field 0, durable (a bit) field 3: flags 0b1001, least significant bit first.
    assert payload == bytes((0x08, 0x01, 0x01, 0x01)) + (0b1001).to_bytes(2, "little") + b"\x01q"
    assert c.ConnectionHeartbeat().encode_segment() == b"\x01\x0a\x00\x00"


def test_struct_codes_and_missing_required_fields():
    assert c.DeliveryProperties.CODE == 0x0401 and c.MessageProperties.CODE == 0x0403
    assert c.QueueQueryResult.CODE == 0x0801 and c.ExchangeBoundResult.CODE == 0x0702
    assert c.MessageAccept().missing() == ["transfers"]
    assert c.MessageTransfer(accept_mode=0, acquire_mode=1).missing() == []


def test_fragment_properties_bits_default_to_set():
    assert c.FragmentProperties().first is True and c.FragmentProperties().last is True


def test_uuid_and_nested_map_in_message_properties():
    mp = c.MessageProperties(message_id=uuid.uuid4(), application_headers={"n": {"l": [1, "x", None]}})
    m = c.MessageTransfer(accept_mode=1, acquire_mode=0, headers=[mp], body=b"")
    assert roundtrip(m).headers == [mp]


@pytest.mark.parametrize("segments,track", [
    ([(0, b"\x01")], 0),  # too short for its codes
    ([(0, b"\x01\x99\x00\x00")], 0),  # unknown control
    ([(1, b"\x08\x01\x01\x00")], 1),  # packing flags missing
    ([(0, b"\x01\x07\x01\x00\x05ab")], 0),  # str8 overruns
    ([(2, b"")], 1),  # an assembly starting with a header segment
    ([(0, b"\x01\x0a\x00\x00")], 1),  # a control on the command track
    ([(1, b"\x08\x01\x01\x00\x00\x00"), (3, b"x")], 1),  # queue.declare carries no body
    ([(0, b"\x01\x0a\x00\x00\xff")], 0),  # trailing octets
    ([(0, b"\x01\x0a\xff\xff")], 0),  # reserved packing flags
])
def test_malformed_assemblies_are_framing_errors(segments, track):
    with pytest.raises(FramingError):
        c.decode_assembly(Assembly(0, track, segments))


def test_unknown_command_is_reported_for_an_execution_exception():
    with pytest.raises(c.UnknownCommand) as info:
        c.decode_assembly(Assembly(0, 1, [(1, b"\x08\x63\x01\x00\x00\x00")]))
    assert (info.value.class_code, info.value.code) == (0x08, 0x63)


@given(st.integers(0, 1), st.binary(max_size=80), st.lists(st.tuples(st.integers(1, 3), st.binary(max_size=30)),
                                                             max_size=2))
@settings(max_examples=2000, deadline=None)
def test_fuzz_decode_assembly(track, first, rest):
    try:
        c.decode_assembly(Assembly(0, track, [(track, first), *rest]))
    except (FramingError, c.UnknownCommand):
        pass


@given(st.sampled_from(sorted(t.TYPE_BY_CODE.values())), st.binary(max_size=40))
@settings(max_examples=1500, deadline=None)
def test_fuzz_every_type_decoder(name, garbage):
    try:
        t.decode(name, garbage, 0)
    except FramingError:
        pass
