"""AMQP 1.0 composite and restricted described types generated from one table.

Spec: 1.3.2 and 1.4 (a composite is a described list of its fields, trailing nulls may be omitted, a
multiple field is an array, multiple+mandatory needs at least one value), 1.3.4 (defaults apply when no
value is encoded), 1.5 (numeric descriptors are ulong), 2.7 (performatives), 2.8.14 (error), 3.2
(message sections), 3.4 (delivery states), 3.5.3/3.5.4 (source, target), 5.3.3 (SASL frames).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import DecodeError, InvalidField

SPEC = t.SPEC
COMPOSITES = [name for name, d in SPEC.described.items() if d.composite]
SECTIONS = [name for name, d in SPEC.described.items() if not d.composite]


def test_the_table_holds_every_type_the_brief_lists():
    """2.7.1-2.7.9, 5.3.3.1-5.3.3.5, 2.8.14, 3.5.3-3.5.4, 3.4.1-3.4.5, 3.2.1-3.2.9: with their codes."""
    expected = {
        "open": 0x10, "begin": 0x11, "attach": 0x12, "flow": 0x13, "transfer": 0x14, "disposition": 0x15,
        "detach": 0x16, "end": 0x17, "close": 0x18, "error": 0x1d,
        "received": 0x23, "accepted": 0x24, "rejected": 0x25, "released": 0x26, "modified": 0x27,
        "source": 0x28, "target": 0x29,
        "sasl-mechanisms": 0x40, "sasl-init": 0x41, "sasl-challenge": 0x42, "sasl-response": 0x43,
        "sasl-outcome": 0x44,
        "header": 0x70, "delivery-annotations": 0x71, "message-annotations": 0x72, "properties": 0x73,
        "application-properties": 0x74, "data": 0x75, "amqp-sequence": 0x76, "amqp-value": 0x77, "footer": 0x78,
    }
    for name, code in expected.items():
        cls = p.BY_NAME[name]
        assert code == cls.CODE and p.BY_CODE[code] is cls
        assert cls.SYMBOL.startswith(f"amqp:{name}:")
    assert [f.name for f in p.Attach.FIELDS] == [
        "name", "handle", "role", "snd-settle-mode", "rcv-settle-mode", "source", "target", "unsettled",
        "incomplete-unsettled", "initial-delivery-count", "max-message-size", "offered-capabilities",
        "desired-capabilities", "properties"]
    assert [f.name for f in p.Transfer.FIELDS] == [
        "handle", "delivery-id", "delivery-tag", "message-format", "settled", "more", "rcv-settle-mode", "state",
        "resume", "aborted", "batchable"]


# -- a value for every field, from the table ---------------------------------------------------------------
def sample(field) -> object:
    """A non-default value of the field's type."""
    requires = {"source": p.Source(address="q"), "target": p.Target(address="q"),
                "delivery-state": p.Received(section_number=1, section_offset=2), "outcome": p.Released(),
                "address": "/queues/q", "message-id": t.ULong(7)}
    if field.source == "*":
        return requires.get(field.requires, "any")
    if field.source in SPEC.described:
        return p.Error(condition=t.Symbol("amqp:not-found"), description="x")
    by_type = {
        "boolean": True, "ubyte": 1, "ushort": 9, "uint": 300, "ulong": 1 << 40, "string": "text",
        "symbol": t.Symbol("sym"), "binary": b"\x01\x02", "timestamp": t.Timestamp(1311704463521),
        "map": {"k": [1, "v"]},
    }
    if field.type in ("fields", "node-properties", "filter-set"):
        value: object = {t.Symbol("key"): "v"}
    elif field.type == "sasl-code":
        value = 1
    else:
        value = by_type[field.source]
    if value == field.default:
        value = not value if isinstance(value, bool) else value + 1
    return [t.Symbol("a"), t.Symbol("b")] if field.multiple else value


def full(name: str):
    cls = p.BY_NAME[name]
    return cls(**{f.attr: sample(f) for f in cls.FIELDS})


@pytest.mark.parametrize("name", COMPOSITES)
def test_every_composite_round_trips_with_every_field_set(name):
    """1.4: a described list, one item per field, in the table's order."""
    obj = full(name)
    encoded = obj.encode()
    assert encoded[:3] == bytes((0x00, 0x53, obj.CODE))  # 1.5: ulong descriptor, as smallulong
    decoded, end = p.decode_described(encoded)
    assert end == len(encoded)
    assert decoded == obj
    listed = t.decode(encoded).value
    assert len(listed) == len(obj.FIELDS)


@pytest.mark.parametrize("name", COMPOSITES)
def test_every_composite_round_trips_with_only_its_mandatory_fields(name):
    """1.4: trailing null elements MAY be omitted; missing fields take their defaults (1.3.4)."""
    cls = p.BY_NAME[name]
    obj = cls(**{f.attr: sample(f) for f in cls.FIELDS if f.mandatory})
    encoded = obj.encode()
    listed = t.decode(encoded).value
    last_mandatory = max((i + 1 for i, f in enumerate(cls.FIELDS) if f.mandatory), default=0)
    assert len(listed) == last_mandatory  # nothing after the last mandatory field is sent
    decoded, _ = p.decode_described(encoded)
    assert decoded == obj
    for f in cls.FIELDS:
        if not f.mandatory:
            assert getattr(decoded, f.attr) == f.default


SECTION_VALUES = {
    "delivery-annotations": {t.Symbol("x-opt-a"): 1, 5: "by ulong key"},
    "message-annotations": {t.Symbol("x-opt-routing-key"): "rk"},
    "application-properties": {"colour": "red", "n": 3},
    "data": b"\x00payload",
    "amqp-sequence": [1, "two", None],
    "amqp-value": {"any": [t.Symbol("value")]},
    "footer": {t.Symbol("x-hash"): b"\x01"},
}


def test_every_restricted_section_has_a_sample():
    assert set(SECTION_VALUES) == set(SECTIONS)


@pytest.mark.parametrize("name", SECTIONS)
def test_every_section_round_trips(name):
    """3.2.2-3.2.9: each section is a described value of its restricted type."""
    obj = p.BY_NAME[name](SECTION_VALUES[name])
    decoded, end = p.decode_described(obj.encode(), provides="section")
    assert decoded == obj and end == len(obj.encode())


def test_annotation_and_fields_keys_are_sent_as_symbols():
    """2.8.13: fields keys are symbols; 3.2.10: annotations keys are symbols or ulongs."""
    encoded = p.MessageAnnotations({"x-opt-a": 1, 7: 2}).encode()
    assert t.decode(encoded).value == {t.Symbol("x-opt-a"): 1, 7: 2}
    assert type(next(iter(t.decode(encoded).value))) is t.Symbol
    assert b"\xa3\x07x-opt-a" in encoded and b"\x53\x07" in encoded
    assert b"\xa3\x07product" in p.Open(container_id="c", properties={"product": "raftmq"}).encode()


def test_known_encodings():
    """Octets written out by hand from 1.4, 1.5 and the type encodings of 1.6."""
    assert p.Accepted().encode() == b"\x00\x53\x24\x45"  # 3.4.2 with no fields: list0
    assert p.Header(durable=True).encode() == b"\x00\x53\x70\xc0\x02\x01\x41"
    assert p.Open(container_id="c").encode() == b"\x00\x53\x10\xc0\x04\x01\xa1\x01c"
    assert p.Data(b"hi").encode() == b"\x00\x53\x75\xa0\x02hi"
    assert p.AmqpValue(None).encode() == b"\x00\x53\x77\x40"
    # begin: remote-channel null, next-outgoing-id 0 (uint0), windows 2048 and 5 (smalluint)
    assert p.Begin(next_outgoing_id=0, incoming_window=2048, outgoing_window=5).encode() == \
        b"\x00\x53\x11\xc0\x0a\x04\x40\x43\x70\x00\x00\x08\x00\x52\x05"
    # a field equal to its default is sent as null (attach rcv-settle-mode first = 0)
    attach = p.Attach(name="l", handle=0, role=False, rcv_settle_mode=0, snd_settle_mode=1)
    assert t.decode(attach.encode()).value == ["l", 0, False, 1]


def test_defaults_from_the_table():
    """2.7.1, 2.7.3, 3.2.1, 3.5.3: defaults as the spec gives them."""
    assert p.Open(container_id="c").max_frame_size == 4294967295
    assert p.Open(container_id="c").channel_max == 65535
    assert p.Attach().snd_settle_mode == p.CHOICES["sender-settle-mode"]["mixed"] == 2
    assert p.Attach().rcv_settle_mode == p.CHOICES["receiver-settle-mode"]["first"] == 0
    assert p.Header().priority == 4
    assert p.Source().expiry_policy == "session-end" and p.Source().durable == 0
    assert p.Transfer().settled is None  # 2.7.5: no default, unset on a continuation means "as before"


def test_decoding_fills_defaults_for_nulls():
    """1.3.4: a null or omitted field takes its default."""
    encoded = b"\x00\x53\x10\xc0\x06\x03\xa1\x01c\x40\x40"  # container-id, hostname null, max-frame-size null
    decoded, _ = p.decode_described(encoded)
    assert decoded.max_frame_size == 4294967295 and decoded.hostname is None


def test_multiple_fields_accept_a_single_value_and_an_array():
    """1.4: "A single element of the type specified in the field description is always permitted"."""
    single = b"\x00\x53\x40\xc0\x08\x01\xa3\x05PLAIN"
    decoded, _ = p.decode_described(single)
    assert decoded == p.SaslMechanisms(sasl_server_mechanisms=[t.Symbol("PLAIN")])
    array = p.SaslMechanisms(sasl_server_mechanisms=["PLAIN", "ANONYMOUS"]).encode()
    assert b"\xe0" in array
    assert p.decode_described(array)[0].sasl_server_mechanisms == ["PLAIN", "ANONYMOUS"]


@pytest.mark.parametrize(("encoded", "message"), [
    (b"\x00\x53\x10\x45", "container-id is mandatory"),  # open with no container-id (2.7.1 mandatory)
    (b"\x00\x53\x12\xc0\x06\x03\xa1\x01l\x43\x40", "role is mandatory"),  # attach without role
    (b"\x00\x53\x12\xc0\x07\x03\xa1\x01l\x54\xff\x41", "handle: -1 is out of range for uint"),  # handle -1 (smallint)
    (b"\x00\x53\x12\xc0\x09\x03\xa1\x01l\x70\x00\x00\x00", None),  # truncated uint: decode error
    (b"\x00\x53\x12\xc0\x06\x03\xa1\x01l\x43\x52", None),  # a smalluint with no data: truncated
    (b"\x00\x53\x12\xc0\x07\x03\xa1\x01l\x43\x52\x01", "role: expected boolean"),
    (b"\x00\x53\x40\xc0\x04\x01\xe0\x02\x00\xa3", None),  # sasl-mechanisms: truncated array
    (b"\x00\x53\x40\xc0\x05\x01\xe0\x02\x00\xa3", "mandatory but an empty array"),  # 1.4 multiple+mandatory
    (b"\x00\x53\x17\xc0\x03\x02\x40\x40", "has 1 fields, 2 were sent"),  # end with two fields
    (b"\x00\x53\x17\xa1\x01x", "described list"),  # end's value not a list
    (b"\x00\x53\x17\xc0\x05\x01\x00\x53\x18\x45", "error: expected error"),  # end.error holds a close
    (b"\x00\x53\x75\xa1\x01x", "data: expected binary"),  # 3.2.6 data of a string
])
def test_invalid_composites(encoded, message):
    with pytest.raises(DecodeError) as info:
        p.decode_described(encoded)
    if message is not None:
        assert message in str(info.value)
        assert isinstance(info.value, InvalidField) or "described list" in message or "fields" in message


def test_invalid_field_condition():
    """2.8.15 amqp:invalid-field for a decodable frame whose field breaks its definition."""
    with pytest.raises(InvalidField) as info:
        p.decode_described(b"\x00\x53\x10\x45")
    assert info.value.condition == "amqp:invalid-field"


def test_symbolic_descriptors_and_unknown_descriptors():
    """1.5: a composite may be sent with its symbolic descriptor; unknown ones stay Described."""
    encoded = b"\x00\xa3\x12amqp:accepted:list\x45"
    assert p.decode_described(encoded)[0] == p.Accepted()
    unknown = b"\x00\xa3\x0dcom.example:x\x45"
    assert p.decode_described(unknown)[0] == t.Described(t.Symbol("com.example:x"), [])
    with pytest.raises(DecodeError, match="expected a frame"):
        p.decode_described(unknown, provides="frame")
    with pytest.raises(DecodeError, match="expected a sasl-frame"):
        p.decode_described(p.Open(container_id="c").encode(), provides="sasl-frame")


def test_nested_composites_in_star_fields_become_classes():
    """2.7.3 source/target and 2.7.5 state (type "*", requires=...) decode to their classes."""
    transfer = p.Transfer(handle=0, delivery_id=3, delivery_tag=b"t", message_format=0,
                          state=p.Rejected(error=p.Error(condition="amqp:not-allowed", info={"a": 1})))
    decoded, _ = p.decode_described(transfer.encode())
    assert isinstance(decoded.state, p.Rejected) and decoded.state.error.info == {"a": 1}
    assert decoded == transfer


def test_message_sections_decode_in_order():
    """3.2: header, delivery-annotations, message-annotations, properties, application-properties, body,
    footer."""
    sections = [p.Header(durable=True, priority=9), p.DeliveryAnnotations({"x-d": 1}),
                p.MessageAnnotations({"x-opt-a": 2}),
                p.Properties(message_id="m1", to="/queues/q", creation_time=t.Timestamp(5), group_sequence=2),
                p.ApplicationProperties({"k": "v"}), p.Data(b"one"), p.Data(b"two"), p.Footer({"x-f": 3})]
    assert p.decode_sections(p.encode_sections(sections)) == sections
    with pytest.raises(DecodeError, match="expected a section"):
        p.decode_sections(p.Accepted().encode())


def test_encoding_errors_are_value_errors_with_the_field_name():
    with pytest.raises(ValueError, match="attach.handle"):
        p.Attach(name="l", handle=-1, role=False).encode()
    with pytest.raises(TypeError):
        p.Open(no_such_field=1)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(COMPOSITES), st.binary(max_size=200))
def test_arbitrary_bodies_only_raise_decode_error(name, junk):
    """A described list of any octets under a known descriptor: DecodeError or a valid object."""
    prefix = bytes((0x00, 0x53, p.BY_NAME[name].CODE))
    for data in (prefix + junk, prefix + b"\xc0" + bytes((len(junk),)) + junk[:255]):
        try:
            p.decode_described(data)
        except DecodeError:
            pass


# -- generated round trips: any values of the fields' types, from the table ------------------------------------
_SCALARS = {
    "boolean": st.booleans(),
    "ubyte": st.integers(0, 0xFF), "ushort": st.integers(0, 0xFFFF), "uint": st.integers(0, 0xFFFFFFFF),
    "ulong": st.integers(0, (1 << 64) - 1),
    "string": st.text(max_size=20),
    "symbol": st.text(alphabet=st.characters(max_codepoint=127), max_size=20).map(t.Symbol),
    "binary": st.binary(max_size=40),
    "timestamp": st.integers(-(1 << 63), (1 << 63) - 1).map(t.Timestamp),
}
_ANY = st.one_of(st.none(), st.integers(-1000, 1000), st.text(max_size=10), st.binary(max_size=10))
_FIELDS_MAP = st.dictionaries(_SCALARS["symbol"], _ANY, max_size=4)
_ERRORS = st.builds(lambda c, d, i: p.Error(condition=c, description=d, info=i),
                    _SCALARS["symbol"], st.none() | st.text(max_size=10), st.none() | _FIELDS_MAP)
_BY_REQUIRES = {
    "source": st.builds(lambda a, d: p.Source(address=a, dynamic=d), st.none() | st.text(max_size=10), st.booleans()),
    "target": st.builds(lambda a: p.Target(address=a), st.none() | st.text(max_size=10)),
    "delivery-state": st.sampled_from([p.Accepted(), p.Released(), p.Rejected(), p.Modified(delivery_failed=True),
                                       p.Received(section_number=0, section_offset=5)]),
    "outcome": st.sampled_from([p.Accepted(), p.Released(), p.Rejected()]),
    "txn-id": st.binary(min_size=1, max_size=32),  # 4.5.4: up to 32 octets of binary
}


def field_strategy(field):
    if field.source == "*":
        one = _BY_REQUIRES.get(field.requires, _ANY)
    elif field.source in SPEC.described:
        one = _ERRORS
    elif field.type in ("fields", "node-properties", "filter-set"):
        one = _FIELDS_MAP
    elif field.source == "map":
        one = st.dictionaries(st.text(max_size=5), _ANY, max_size=4)
    else:
        one = _SCALARS[field.source]
    if field.multiple:
        one = st.lists(one, min_size=1 if field.mandatory else 0, max_size=4)
    if field.mandatory:
        return one
    if field.default is not None:  # a null field decodes as its default: generate the default instead
        return st.just(field.default) | one
    return st.none() | one


def composite_strategy(name):
    cls = p.BY_NAME[name]
    return st.fixed_dictionaries({f.attr: field_strategy(f) for f in cls.FIELDS}).map(lambda kw: cls(**kw))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(COMPOSITES).flatmap(composite_strategy))
def test_generated_composites_round_trip(obj):
    """1.4 for any field values the table allows: encode then decode gives an equal object."""
    encoded = obj.encode()
    decoded, end = p.decode_described(encoded)
    assert end == len(encoded) and decoded == obj
    assert decoded.encode() == encoded  # and the same octets again
