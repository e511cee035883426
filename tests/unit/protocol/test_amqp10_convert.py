"""protocol/amqp10/convert.py and node/amqp10/address.py: the 1.0 <-> core mapping, without a broker.

The expected values are RabbitMQ 4's conversion tables (rabbitmq.com/docs/conversions, "AMQP 1.0 ->
AMQP 0.9.1" and "AMQP 0.9.1 -> AMQP 1.0"), as docs/amqp10.md lists them.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.node.amqp10.address import AddressError, Target, parse_source, parse_target, queue_address
from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties
from raftmq.protocol.amqp10 import convert as cv
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t


def _wire(sections) -> list:
    """Sections as a client sends them: encoded, then decoded by our codec."""
    return p.decode_sections(p.encode_sections(sections))


def test_header_and_properties_to_core() -> None:
    u = uuid.uuid4()
    m = cv.to_core(_wire([
        p.Header(durable=True, priority=7, ttl=5000),
        p.Properties(message_id=u, correlation_id=42, user_id=b"guest", reply_to="/queues/r", to="/queues/q",
                     subject="s", content_type=t.Symbol("text/plain"), content_encoding=t.Symbol("gzip"),
                     creation_time=t.Timestamp(1_700_000_000_999), group_id="g"),
        p.ApplicationProperties({"k": "v", "n": 3}),
        p.MessageAnnotations({"x-opt-a": "b", "not-x": 1}),
        p.Data(b"payload"),
    ]))
    props = m.properties
    assert (props.delivery_mode, props.priority, props.expiration) == (2, 7, "5000")
    assert props.message_id == f"urn:uuid:{u}" and props.correlation_id == "42"
    assert (props.user_id, props.reply_to, props.content_type, props.content_encoding) == (
        "guest", "/queues/r", "text/plain", "gzip")
    assert props.timestamp == 1_700_000_000 and props.app_id == "g"
    assert props.headers == {"k": "v", "n": 3, "x-opt-a": "b"}  # only x- annotations become headers
    assert props.type is None and m.body == b"payload"
    assert (m.to, m.subject, m.persistent, m.ttl) == ("/queues/q", "s", True, 5000)


def test_long_and_binary_ids_go_to_headers() -> None:
    m = cv.to_core(_wire([p.Properties(message_id="m" * 300, correlation_id=b"\x01\x02"), p.Data(b"")]))
    assert m.properties.message_id is None and m.properties.headers["x-message-id"] == "m" * 300
    assert m.properties.headers["x-correlation-id"] == b"\x01\x02"


@pytest.mark.parametrize("body", [p.AmqpValue("text"), p.AmqpValue({"a": [1, 2]}), p.AmqpSequence([1, "x"])])
def test_non_data_bodies_are_kept_as_sections(body) -> None:
    """amqp-value / amqp-sequence: the 0-9-1 body is the encoded section, type amqp-1.0; back unchanged."""
    m = cv.to_core(_wire([body]))
    assert m.properties.type == cv.AMQP10_TYPE and m.body == body.encode()
    back = p.decode_sections(cv.encode(cv.from_core(m.encoded_properties(), m.body, "", "q", 0, False)))
    assert back[-1] == body
    assert "x-basic-type" not in back[1].value


def test_multiple_data_sections_are_kept() -> None:
    m = cv.to_core(_wire([p.Data(b"a"), p.Data(b"b")]))
    assert m.properties.type == cv.AMQP10_TYPE
    back = p.decode_sections(cv.encode(cv.from_core(m.encoded_properties(), m.body, "", "q", 0, False)))
    assert back[-2:] == [p.Data(b"a"), p.Data(b"b")]


def test_core_to_amqp10() -> None:
    u = uuid.uuid4()
    props = BasicProperties(content_type="application/json", delivery_mode=2, priority=5, correlation_id="c",
                            reply_to="r", expiration="60000", message_id=f"urn:uuid:{u}", timestamp=1_700_000_000,
                            type="order", user_id="guest", app_id="shop",
                            headers={"tenant": "acme", "x-trace": "t", "nested": {"a": 1}})
    header, annotations, properties, application, data = p.decode_sections(cv.encode(
        cv.from_core(encode_properties(props), b"{}", "ex", "rk", 1, True)))
    assert (header.durable, header.priority, header.ttl, header.first_acquirer, header.delivery_count) == (
        True, 5, 60000, False, 1)
    assert annotations.value == {"x-exchange": "ex", "x-routing-key": "rk", "x-basic-type": "order", "x-trace": "t"}
    assert properties.message_id == u and properties.correlation_id == "c" and properties.user_id == b"guest"
    assert properties.creation_time == 1_700_000_000_000 and properties.group_id == "shop"
    assert properties.content_type == "application/json" and properties.reply_to == "r"
    assert application.value == {"tenant": "acme"}  # a table is not converted (3.2.5: simple values only)
    assert data == p.Data(b"{}")


simple = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.text(max_size=20),
                   st.binary(max_size=20))


@settings(max_examples=200, deadline=None)
@given(app=st.dictionaries(st.text(min_size=1, max_size=20).filter(lambda k: not k.startswith("x-") and "\x00" not in k), simple,
                           max_size=5),
       body=st.binary(max_size=100), durable=st.booleans(), priority=st.integers(0, 9))
def test_round_trip_through_the_core(app, body, durable, priority) -> None:
    """1.0 -> core -> 1.0 keeps application-properties (keys: shortstr, RabbitMQ's condition), a data body,
    durable and priority."""
    sections = _wire([p.Header(durable=durable, priority=priority), p.ApplicationProperties(app), p.Data(body)])
    m = cv.to_core(sections)
    back = p.decode_sections(cv.encode(cv.from_core(m.encoded_properties(), m.body, "", "q", 0, False)))
    by_class = {s.__class__: s for s in back}
    assert by_class[p.Data].value == body
    assert (by_class.get(p.ApplicationProperties) or p.ApplicationProperties({})).value == app
    assert by_class[p.Header].durable == durable and by_class[p.Header].priority == priority


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


@pytest.mark.parametrize("body", [b"", b"x" * 255, b"y" * 256, b"z" * 70000])
@pytest.mark.parametrize("redelivered", [False, True])
def test_encode_delivery_is_from_core_encoded(body, redelivered) -> None:
    """The cached fast path writes exactly what from_core + encode write (data bodies of every size class)."""
    props = encode_properties(BasicProperties(content_type="t", headers={"a": 1, "x-b": "c"}, delivery_mode=2))
    for _ in range(2):  # the second time from the cache
        assert cv.encode_delivery(props, body, "ex", "rk", redelivered) == cv.encode(
            cv.from_core(props, body, "ex", "rk", 1 if redelivered else 0, redelivered))
    m = cv.to_core(_wire([p.AmqpValue({"k": [1]})]))
    assert cv.encode_delivery(m.encoded_properties(), m.body, "", "q", False) == cv.encode(
        cv.from_core(m.encoded_properties(), m.body, "", "q", 0, False))


section = st.one_of(
    st.builds(lambda d, pr: p.Header(durable=d, priority=pr), st.booleans(), st.integers(0, 9)),
    st.builds(lambda m, s: p.Properties(message_id=m, subject=s), st.one_of(st.none(), st.text(max_size=10)),
              st.one_of(st.none(), st.text(max_size=10))),
    st.builds(lambda a: p.ApplicationProperties(a), st.dictionaries(st.text(min_size=1, max_size=5), simple,
                                                                    max_size=3)),
    st.builds(lambda b: p.Data(b), st.binary(max_size=300)),
    st.builds(lambda v: p.AmqpValue(v), simple),
)


@settings(max_examples=300, deadline=None)
@given(sections=st.lists(section, max_size=5), tricky=st.binary(max_size=40))
def test_message_of_is_to_core(sections, tricky) -> None:
    """The cached fast path gives exactly what the full decode gives, also for bodies that contain the
    data section's own octets (a false candidate) -- and the second time, from the cache."""
    sections = [*sections, p.Data(tricky + b"\\x00Su\\xa0\\x03abc" + tricky)]
    payload = p.encode_sections(sections)
    for _ in range(2):
        fast, slow = cv.message_of(payload), cv.to_core(p.decode_sections(payload))
        assert (fast.properties, fast.body, fast.to, fast.subject) == (slow.properties, slow.body, slow.to,
                                                                         slow.subject)
        assert fast.encoded_properties() == slow.encoded_properties()


@settings(max_examples=200, deadline=None)
@given(handle=st.integers(0, 2 ** 32 - 1), delivery_id=st.integers(0, 2 ** 32 - 1), tag=st.binary(max_size=32),
       settled=st.booleans(), resume=st.booleans())
def test_hand_encoded_transfer(handle, delivery_id, tag, settled, resume) -> None:
    """node/amqp10/session.encode_transfer decodes to the same transfer as the generic encoder's."""
    from raftmq.node.amqp10.session import encode_transfer

    decoded, end = p.decode_described(encode_transfer(handle, delivery_id, tag, settled, resume))
    assert decoded == p.Transfer(handle=handle, delivery_id=delivery_id, delivery_tag=tag, message_format=0,
                                 settled=settled, resume=resume)
