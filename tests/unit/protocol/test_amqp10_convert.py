"""protocol/amqp10/convert.py, neutral.py, stored.py and node/amqp10/address.py, without a broker.

A 1.0 message is stored as its sections (format AMQP100, store/core/message.py); other protocols read it
through the neutral properties.  Expected values follow RabbitMQ 4's conversion tables
(rabbitmq.com/docs/conversions, "AMQP 1.0 -> AMQP 0.9.1" and "AMQP 0.9.1 -> AMQP 1.0"), as
docs/amqp10.md and docs/message-mapping.md list them; section numbers are the OASIS AMQP 1.0 spec's.
"""

from __future__ import annotations

import datetime
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raftmq.node.core.formats  # noqa: F401  (registers every codec)
from raftmq.node.amqp10.address import AddressError, Target, parse_source, parse_target, queue_address
from raftmq.protocol.amqp091.properties import BasicProperties, decode_properties, encode_properties
from raftmq.protocol.amqp10 import convert as cv
from raftmq.protocol.amqp10 import neutral as n
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import stored
from raftmq.protocol.amqp10 import types as t
from raftmq.store.core import message as fmt


def _delivered(properties: bytes, body: bytes, redelivered: bool = False) -> list:
    return p.decode_sections(cv.encode_delivery(properties, body, "ex", "rk", redelivered))


def _by_class(sections: list) -> dict:
    return {s.__class__: s for s in sections}


def test_header_and_properties_to_neutral() -> None:
    u = uuid.uuid4()
    m = cv.publish_of(p.encode_sections([
        p.Header(durable=True, priority=7, ttl=5000),
        p.Properties(message_id=u, correlation_id=42, user_id=b"guest", reply_to="/queues/r", to="/queues/q",
                     subject="s", content_type=t.Symbol("text/plain"), content_encoding=t.Symbol("gzip"),
                     creation_time=t.Timestamp(1_700_000_000_999), group_id="g"),
        p.ApplicationProperties({"k": "v", "n": 3}),
        p.MessageAnnotations({"x-opt-a": "b", "not-x": 1}),
        p.Data(b"payload"),
    ]))
    props = fmt.decode(m.properties, fmt.AMQP100)
    assert (props.delivery_mode, props.priority, props.expiration) == (2, 7, "5000")
    assert props.message_id == f"urn:uuid:{u}" and props.correlation_id == "42"
    assert (props.user_id, props.reply_to, props.content_type, props.content_encoding) == (
        "guest", "/queues/r", "text/plain", "gzip")
    assert props.timestamp == 1_700_000_000 and props.app_id == "g"
    assert props.headers == {"k": "v", "n": 3, "x-opt-a": "b"}  # only x- annotations become headers
    assert props.type is None and m.body == b"payload"
    assert (m.to, m.subject, m.persistent, m.priority, m.ttl) == ("/queues/q", "s", True, 7, 5000)


def test_long_and_binary_ids_reach_0_9_1_as_headers() -> None:
    m = cv.publish_of(p.encode_sections([p.Properties(message_id="m" * 300, correlation_id=b"\x01\x02"),
                                         p.Data(b"")]))
    props = decode_properties(fmt.convert(m.properties, fmt.AMQP100, fmt.AMQP091))
    assert props.message_id is None and props.headers["x-message-id"] == "m" * 300
    assert props.headers["x-correlation-id"] == b"\x01\x02"
    # and back to 1.0 from 0-9-1 (a consumer republishing): the ids again, not headers
    back = _by_class(_delivered(fmt.convert(encode_properties(props), fmt.AMQP091, fmt.AMQP100), b""))
    assert back[p.Properties].message_id == "m" * 300 and back[p.Properties].correlation_id == b"\x01\x02"
    assert "x-message-id" not in back[p.MessageAnnotations].value


@pytest.mark.parametrize("body", [p.AmqpValue("text"), p.AmqpValue({"a": [1, 2]}), p.AmqpSequence([1, "x"])])
def test_non_data_bodies_are_kept_as_sections(body) -> None:
    """amqp-value / amqp-sequence: the body is the encoded section (0-9-1 sees type amqp-1.0); back unchanged."""
    m = cv.publish_of(body.encode())
    assert m.body == body.encode()
    assert fmt.decode(m.properties, fmt.AMQP100).type == n.AMQP10_TYPE
    back = _delivered(m.properties, m.body)
    assert back[-1] == body and "x-basic-type" not in back[1].value
    # through 0-9-1 (type amqp-1.0) and back: the body is checked, then sent as the sections it is
    via091 = fmt.convert(fmt.convert(m.properties, fmt.AMQP100, fmt.AMQP091), fmt.AMQP091, fmt.AMQP100)
    assert _delivered(via091, m.body)[-1] == body
    assert _delivered(via091, b"not 1.0 octets")[-1] == p.Data(b"not 1.0 octets")


def test_multiple_data_sections_are_kept() -> None:
    m = cv.publish_of(p.encode_sections([p.Data(b"a"), p.Data(b"b")]))
    assert _delivered(m.properties, m.body)[-2:] == [p.Data(b"a"), p.Data(b"b")]


def test_0_9_1_to_amqp10() -> None:
    u = uuid.uuid4()
    props = BasicProperties(content_type="application/json", delivery_mode=2, priority=5, correlation_id="c",
                            reply_to="r", expiration="60000", message_id=f"urn:uuid:{u}", timestamp=1_700_000_000,
                            type="order", user_id="guest", app_id="shop",
                            headers={"tenant": "acme", "x-trace": "t", "nested": {"a": 1}})
    stored = fmt.convert(encode_properties(props), fmt.AMQP091, fmt.AMQP100)
    header, annotations, properties, application, data = _delivered(stored, b"{}", redelivered=True)
    assert (header.durable, header.priority, header.ttl, header.first_acquirer, header.delivery_count) == (
        True, 5, 60000, False, 1)
    assert annotations.value == {"x-exchange": "ex", "x-routing-key": "rk", "x-basic-type": "order", "x-trace": "t"}
    assert properties.message_id == u and properties.correlation_id == "c" and properties.user_id == b"guest"
    assert properties.creation_time == 1_700_000_000_000 and properties.group_id == "shop"
    assert properties.content_type == "application/json" and properties.reply_to == "r"
    assert application.value == {"tenant": "acme"}  # a table is not converted (3.2.5: simple values only)
    assert data == p.Data(b"{}")


TYPED = [
    p.Header(durable=True, priority=2, ttl=90_000),
    p.DeliveryAnnotations({"x-opt-hop": 1}),
    p.MessageAnnotations({"x-opt-partition": t.Symbol("p1"), 7: "ulong key", "x-opt-list": [1, [2, "three"]]}),
    p.Properties(message_id=t.ULong(12), to="/queues/q", subject="subj", user_id=b"guest",
                 absolute_expiry_time=t.Timestamp(1_900_000_000_123), creation_time=t.Timestamp(1_700_000_000_123),
                 group_id="g", group_sequence=5, reply_to_group_id="rg"),
    p.ApplicationProperties({"u8": t.UByte(200), "i16": t.Short(-3), "sym": t.Symbol("s"), "c": t.Char("é"),
                             "f": t.Float32(1.5), "ts": t.Timestamp(1_600_000_000_321), "id": uuid.UUID(int=7),
                             "d": t.Decimal64(b"\x01" * 8)}),
    p.Data(b"body"),
    p.Footer({"x-opt-sum": 9}),
]


def test_amqp10_to_amqp10_keeps_the_bare_message_octets() -> None:
    """3.2: the bare message is immutable; what 0-9-1 cannot carry (typed application-properties,
    absolute-expiry-time, group-sequence, non-x and ulong-keyed annotations) reaches a 1.0 consumer."""
    m = cv.publish_of(p.encode_sections(TYPED))
    out = cv.encode_delivery(m.properties, m.body, "ex", "rk", False)
    assert p.encode_sections(TYPED[3:5]) in out
    sections = p.decode_sections(out)
    by = _by_class(sections)
    assert p.DeliveryAnnotations not in by and p.Footer not in by  # this hop's, and not kept (docs/amqp10.md)
    assert by[p.MessageAnnotations].value == {"x-exchange": "ex", "x-routing-key": "rk",
                                              "x-opt-partition": "p1", 7: "ulong key", "x-opt-list": [1, [2, "three"]]}
    assert (by[p.Header].durable, by[p.Header].priority, by[p.Header].ttl) == (True, 2, 90_000)
    assert by[p.Data] == p.Data(b"body")


def test_amqp10_to_0_9_1_and_back() -> None:
    """1.0 -> 0-9-1 -> 1.0: what both carry survives (docs/message-mapping.md); typed values become plain."""
    m = cv.publish_of(p.encode_sections(TYPED))
    b091 = decode_properties(fmt.convert(m.properties, fmt.AMQP100, fmt.AMQP091))
    assert (b091.message_id, b091.delivery_mode, b091.priority, b091.expiration, b091.app_id) == (
        "12", 2, 2, "90000", "g")
    assert b091.headers["u8"] == 200 and b091.headers["sym"] == "s" and b091.headers["id"] == str(uuid.UUID(int=7))
    assert b091.headers["ts"] == 1_600_000_000  # a field-table timestamp (seconds)
    assert b091.headers["x-opt-list"] == [1, [2, "three"]]
    back = _by_class(_delivered(fmt.convert(encode_properties(b091), fmt.AMQP091, fmt.AMQP100), b"body"))
    assert back[p.Properties].message_id == "12" and back[p.Properties].group_id == "g"
    assert back[p.ApplicationProperties].value["u8"] == 200
    assert back[p.ApplicationProperties].value["ts"] == t.Timestamp(1_600_000_000_000)
    assert back[p.MessageAnnotations].value["x-opt-list"] == [1, [2, "three"]]
    assert (back[p.Header].durable, back[p.Header].priority, back[p.Header].ttl) == (True, 2, 90_000)


def test_delivery_count_header_is_the_1_0_delivery_count() -> None:
    """A quorum-style redelivery (store/headers.with_delivery_count) is header.delivery-count for 1.0
    (3.2.1: the number of unsuccessful previous delivery attempts); the bare message is untouched."""
    m = cv.publish_of(p.encode_sections(TYPED))
    again = fmt.with_header(m.properties, fmt.AMQP100, "x-delivery-count", 3)
    out = cv.encode_delivery(again, m.body, "ex", "rk", True)
    assert p.encode_sections(TYPED[3:5]) in out
    header = p.decode_sections(out)[0]
    assert (header.delivery_count, header.first_acquirer, header.ttl) == (3, False, 90_000)


def test_dead_lettering_a_1_0_message() -> None:
    """store/headers.add_x_death on format AMQP100: x-death and x-first-death-* are message-annotations
    (x- names; 3.2.5 forbids maps in application-properties), readable back for the next death."""
    from raftmq.store.core.headers import add_x_death
    from raftmq.store.core.model import Message, Queue

    m = cv.publish_of(p.encode_sections(TYPED))
    message = Message(1, "ex", "rk", m.properties, m.body, True, 0, 0, format=fmt.AMQP100)
    queue = Queue.__new__(Queue)
    queue.name = "q1"
    now = 1_700_000_000 * 1_000_000
    once = add_x_death(message, queue, "expired", now)
    message.properties = once
    twice = add_x_death(message, queue, "expired", now)
    headers = fmt.headers_of(twice, fmt.AMQP100)
    assert headers["x-first-death-reason"] == "expired" and headers["x-first-death-queue"] == "q1"
    assert headers["x-death"][0]["count"] == 2 and headers["x-death"][0]["original-expiration"] == "90000"
    assert headers["x-death"][0]["time"] == datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)
    out = cv.encode_delivery(twice, m.body, "ex", "rk", False)
    assert p.encode_sections(TYPED[3:5]) in out  # properties and application-properties as published
    by = _by_class(p.decode_sections(out))
    assert by[p.Header].ttl is None  # expired: the ttl is cleared, as RabbitMQ does
    death = by[p.MessageAnnotations].value["x-death"][0]
    assert death["queue"] == "q1" and death["time"] == t.Timestamp(1_700_000_000_000)
    assert decode_properties(fmt.convert(twice, fmt.AMQP100, fmt.AMQP091)).headers["x-death"][0]["count"] == 2


def test_core_reads_headers_of_1_0_messages() -> None:
    """Headers exchanges and deduplication read application-properties and x- annotations."""
    from raftmq.store.core.dedup import dedup_key
    from raftmq.store.core.headers import message_headers

    m = cv.publish_of(p.encode_sections([p.MessageAnnotations({"x-opt-k": "a"}),
                                         p.ApplicationProperties({"format": "pdf", "x-deduplication-header": "d1",
                                                                  "n": t.UInt(5)}),
                                         p.Data(b"")]))
    assert message_headers(m.properties, fmt.AMQP100) == {"format": "pdf", "x-deduplication-header": "d1",
                                                          "n": 5, "x-opt-k": "a"}
    assert dedup_key(m.properties, fmt.AMQP100) == "d1"


def test_undecodable_stored_bytes() -> None:
    with pytest.raises(ValueError):
        fmt.decode(b"\x00\x00", fmt.AMQP100)
    with pytest.raises(ValueError):
        fmt.decode(stored.pack(0, b"\x00\x53\x70\xc0\x09", b""), fmt.AMQP100)
    assert fmt.headers_of(b"\x09", fmt.AMQP100) == {}
    # a delivery of bytes that do not decode: the message goes out, without its properties
    assert p.decode_sections(cv.encode_delivery(b"junk", b"b", "", "q", False))[-1] == p.Data(b"b")


simple = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.text(max_size=20),
                   st.binary(max_size=20))
names = st.text(min_size=1, max_size=20).filter(lambda k: "\x00" not in k)


@settings(max_examples=200, deadline=None)
@given(app=st.dictionaries(names, simple, max_size=5), body=st.binary(max_size=100), durable=st.booleans(),
       priority=st.integers(0, 9))
def test_round_trip_amqp10_to_amqp10(app, body, durable, priority) -> None:
    """1.0 -> store -> 1.0 gives the properties, application-properties and data body octets as sent."""
    sections = [p.Header(durable=durable, priority=priority), p.ApplicationProperties(app), p.Data(body)]
    m = cv.publish_of(p.encode_sections(sections))
    out = cv.encode_delivery(m.properties, m.body, "", "q", False)
    assert out.endswith(p.encode_sections(sections[1:]))
    header = p.decode_sections(out)[0]
    assert header.durable == durable and header.priority == priority


shorttext = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=10)  # RabbitMQ's shortstr condition
header_values = st.one_of(simple, st.lists(simple, max_size=3), st.dictionaries(names, simple, max_size=3))
neutral_props = st.builds(
    fmt.Properties,
    content_type=st.one_of(st.none(), st.text(st.characters(max_codepoint=126), max_size=10)),
    # x-basic-type is no header in 1.0: the annotation carries 0-9-1's type property (neutral.py)
    headers=st.one_of(st.none(), st.dictionaries(names.filter(lambda k: len(k.encode()) < 256 and k != "x-basic-type"),
                                                 header_values,
                                                 max_size=4)),
    delivery_mode=st.sampled_from([None, 1, 2]), priority=st.one_of(st.none(), st.integers(0, 9)),
    correlation_id=st.one_of(st.none(), shorttext), expiration=st.one_of(st.none(), st.just("1000")),
    message_id=st.one_of(st.none(), shorttext), timestamp=st.one_of(st.none(), st.integers(0, 2 ** 31)),
    user_id=st.one_of(st.none(), shorttext), app_id=st.one_of(st.none(), shorttext))


@settings(max_examples=300, deadline=None)
@given(props=neutral_props)
def test_neutral_round_trip(props) -> None:
    """Neutral -> AMQP100 -> neutral keeps every field 1.0 can hold (x- tables and lists too, as
    annotations); a non-x table or list has no place in application-properties (3.2.5) and is dropped;
    encoding what was decoded gives the same octets."""
    raw = n.FORMAT.encode(props)
    back = n.FORMAT.decode(raw)
    kept = {k: v for k, v in (props.headers or {}).items()
            if (k.startswith("x-") and k.isascii()) or not isinstance(v, (list, dict))}
    for name in ("content_type", "delivery_mode", "correlation_id", "expiration", "message_id", "timestamp",
                 "user_id", "app_id"):
        assert getattr(back, name) == getattr(props, name) or (name == "delivery_mode" and props.delivery_mode
                                                                is None and back.delivery_mode == 1), name
    assert back.priority == (None if props.priority == 4 else props.priority)
    assert (back.headers or {}) == kept
    assert n.FORMAT.encode(back) == raw


section = st.one_of(
    st.builds(lambda d, pr: p.Header(durable=d, priority=pr), st.booleans(), st.integers(0, 9)),
    st.builds(lambda m, s: p.Properties(message_id=m, subject=s), st.one_of(st.none(), st.text(max_size=10)),
              st.one_of(st.none(), st.text(max_size=10))),
    st.builds(lambda a: p.ApplicationProperties(a), st.dictionaries(st.text(min_size=1, max_size=5), simple,
                                                                    max_size=3)),
    st.builds(lambda a: p.MessageAnnotations(a), st.dictionaries(st.text(st.characters(max_codepoint=126), min_size=1, max_size=5).map(
        lambda k: "x-" + k), simple, max_size=3)),
    st.builds(lambda b: p.Data(b), st.binary(max_size=300)),
    st.builds(lambda v: p.AmqpValue(v), simple),
)


@settings(max_examples=300, deadline=None)
@given(sections=st.lists(section, max_size=5), tricky=st.binary(max_size=40))
def test_publish_fast_path_is_the_full_decode(sections, tricky) -> None:
    """The cached fast path gives exactly what the full decode gives, also for bodies that contain the
    data section's own octets (a false candidate) -- and the second time, from the cache."""
    sections = [*sections, p.Data(tricky + b"\x00Su\xa0\x03abc" + tricky)]
    payload = p.encode_sections(sections)
    for _ in range(2):
        assert cv.publish_of(payload) == cv._decoded(payload)


@settings(max_examples=200, deadline=None)
@given(sections=st.lists(section, max_size=6), redelivered=st.booleans())
def test_delivery_cache_is_the_uncached_encoding(sections, redelivered) -> None:
    """encode_delivery from its cache writes what it writes the first time, for every stored form."""
    try:
        m = cv.publish_of(p.encode_sections(sections))
    except Exception:
        return  # e.g. two Header sections decode fine; nothing here is rejected, but be safe
    first = cv.encode_delivery(m.properties, m.body, "ex", "rk", redelivered)
    cv._DELIVERED.clear()
    assert cv.encode_delivery(m.properties, m.body, "ex", "rk", redelivered) == first
    assert cv.encode_delivery(m.properties, m.body, "ex", "rk", redelivered) == first
    p.decode_sections(first)  # well-formed


def test_addresses() -> None:
    assert parse_target("/queues/a%2Fb") == Target("", "a/b")
    assert parse_target("/exchanges/ex/key") == Target("ex", "key")
    assert parse_target("/exchanges/ex") == Target("ex", None)
    assert parse_target("/exchanges/amq.default/q") == Target("", "q")
    assert parse_target("plain") == Target("", "plain")
    assert parse_source("/queues/q1") == "q1" and parse_source("plain") == "plain"
    assert queue_address("a/b") == "/queues/a%2Fb"
    for bad in ("/queues/", "/exchanges//k", "/topics/x", ""):
        with pytest.raises(AddressError):
            parse_target(bad)
    with pytest.raises(AddressError):
        parse_source("/exchanges/x")


@settings(max_examples=200, deadline=None)
@given(handle=st.integers(0, 2 ** 32 - 1), delivery_id=st.integers(0, 2 ** 32 - 1), tag=st.binary(max_size=32),
       settled=st.booleans(), resume=st.booleans())
def test_hand_encoded_transfer(handle, delivery_id, tag, settled, resume) -> None:
    """node/amqp10/session.encode_transfer decodes to the same transfer as the generic encoder's."""
    from raftmq.node.amqp10.session import encode_transfer

    decoded, end = p.decode_described(encode_transfer(handle, delivery_id, tag, settled, resume))
    assert decoded == p.Transfer(handle=handle, delivery_id=delivery_id, delivery_tag=tag, message_format=0,
                                 settled=settled, resume=resume)
@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200), flags=st.integers(0, 3), cut=st.integers(0, 200))
def test_garbage_stored_sections_read_as_no_headers_and_raise_only_value_error(raw, flags, cut) -> None:
    """As the other codecs (tests/unit/protocol/test_neutral.py): a message whose stored properties do
    not decode routes as one without headers on every node, and delivering it raises nothing (stored
    octets come from our own encoders: the bare part is sent as stored, unchecked)."""
    for candidate in (raw, stored.pack(flags, raw[:cut], raw[cut:])):
        assert isinstance(fmt.headers_of(candidate, fmt.AMQP100), dict)
        try:
            fmt.decode(candidate, fmt.AMQP100)
        except ValueError:
            pass
        assert isinstance(cv.encode_delivery(candidate, b"body", "", "q", False), bytes)
    # header and annotations that do not decode: the delivery goes out without them
    assert p.decode_sections(cv.encode_delivery(stored.pack(0, raw, b""), b"body", "", "q", False))[-1] == p.Data(b"body")


def test_amqp10_to_0_10() -> None:
    """1.0 -> 0-10 through the same neutral properties (docs/message-mapping.md): headers with a
    1.0 timestamp become integer seconds (0-10 maps have no timestamp type)."""
    m = cv.publish_of(p.encode_sections(TYPED))
    props = fmt.decode(fmt.convert(m.properties, fmt.AMQP100, fmt.AMQP010), fmt.AMQP010)
    assert (props.delivery_mode, props.priority, props.expiration, props.app_id) == (2, 2, "90000", "g")
    assert props.headers["u8"] == 200 and props.headers["ts"] == 1_600_000_000
    assert props.headers["x-message-id"] == "12"  # 0-10 message-ids are UUIDs


def test_http_api_shows_a_1_0_message_s_properties() -> None:
    """ops/http/resources._properties_view lists a message's neutral properties by their fields."""
    import json

    from raftmq.ops.http.resources import _properties_view
    from raftmq.store.core.model import Message

    m = cv.publish_of(p.encode_sections(TYPED))
    view = _properties_view(Message(1, "", "q", m.properties, m.body, True, 0, 0, format=fmt.AMQP100))
    assert (view["delivery_mode"], view["priority"], view["message_id"], view["app_id"]) == (2, 2, "12", "g")
    assert view["headers"]["u8"] == 200 and view["headers"]["sym"] == "s"
    json.dumps(view, default=str)  # what the API serialises


def test_body_less_message_stays_body_less() -> None:
    """3.2: a bare message with no body section is stored as "the body sections sent" (none) and
    delivered without one -- not with an empty data section; to 0-9-1 it is an empty body typed
    amqp-1.0, and that empty amqp-1.0 body back to 1.0 has no body section either."""
    sent = [p.Properties(message_id="nb", subject="s"), p.ApplicationProperties({"k": 1})]
    m = cv.publish_of(p.encode_sections(sent))
    assert m.body == b""
    delivered = _delivered(m.properties, m.body)
    assert not [s for s in delivered if s.__class__ in (p.Data, p.AmqpValue, p.AmqpSequence)]
    assert _by_class(delivered)[p.Properties].message_id == "nb"
    b091 = decode_properties(fmt.convert(m.properties, fmt.AMQP100, fmt.AMQP091))
    assert b091.type == "amqp-1.0"
    back = _delivered(fmt.convert(encode_properties(b091), fmt.AMQP091, fmt.AMQP100), b"")
    assert not [s for s in back if s.__class__ in (p.Data, p.AmqpValue, p.AmqpSequence)]
    one_empty_data = cv.publish_of(p.encode_sections([p.Data(b"")]))  # an empty data section stays one
    assert [s.value for s in _delivered(one_empty_data.properties, one_empty_data.body)
            if s.__class__ is p.Data] == [b""]


def test_topic_addresses() -> None:
    """topic:// (ActiveMQ/Artemis) is amq.topic with the name as key -- for a source, ActiveMQ's '>'
    is '#'; queue:// is the queue; /exchanges/:x/:key as a source is a subscription, /exchanges/:x
    without a key is no source."""
    from raftmq.node.amqp10.address import parse_topic

    assert parse_target("topic://PRICE.STOCK") == Target("amq.topic", "PRICE.STOCK")
    assert parse_target("queue://q1") == Target("", "q1") and parse_source("queue://q1") == "q1"
    assert parse_topic("topic://PRICE.STOCK.NYSE.*") == Target("amq.topic", "PRICE.STOCK.NYSE.*")
    assert parse_topic("topic://PRICE.>") == Target("amq.topic", "PRICE.#")
    assert parse_topic("/exchanges/amq.topic/a.b") == Target("amq.topic", "a.b")
    assert parse_topic("/queues/q") is None and parse_topic("plain") is None
    for bad in ("topic://", "/exchanges/amq.topic"):
        with pytest.raises(AddressError):
            parse_topic(bad)
