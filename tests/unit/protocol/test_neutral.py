"""The property codecs behind the core's neutral message (store/core/message.py, protocol/*/neutral.py)."""

from __future__ import annotations

import datetime
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010.neutral import stored, structs
from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties
from raftmq.store.core.message import AMQP010, AMQP091, Properties, codec, convert, headers_of, with_headers

FULL_091 = BasicProperties(content_type="text/plain", content_encoding="utf-8", headers={"a": 1, "b": "x"},
                           delivery_mode=2, priority=4, correlation_id="c", reply_to="ex/key", expiration="5000",
                           message_id=str(uuid.UUID(int=7)), timestamp=1_700_000_000, type="t", user_id="guest",
                           app_id="app", cluster_id="cl")


def test_a_format_converted_to_itself_is_the_same_bytes():
    raw = encode_properties(FULL_091)
    assert convert(raw, AMQP091, AMQP091) is raw


def test_0_9_1_bytes_read_back_field_for_field_and_re_encode_identically():
    raw = encode_properties(FULL_091)
    props = codec(AMQP091).decode(raw)
    assert (props.content_type, props.headers, props.reply_to, props.expiration) == (
        "text/plain", {"a": 1, "b": "x"}, "ex/key", "5000")
    assert props.annotations == {"cluster-id": "cl"}
    assert codec(AMQP091).encode(props) == raw


def test_0_9_1_to_0_10_and_back_keeps_every_field_0_10_has():
    """type and cluster-id have no 0-10 field: they are the only ones lost (docs/message-mapping.md)."""
    there = convert(encode_properties(FULL_091), AMQP091, AMQP010)
    dp, mp = structs(there)
    assert (dp.delivery_mode, dp.priority, dp.ttl, dp.timestamp) == (2, 4, 5000, 1_700_000_000)
    assert (mp.message_id, mp.correlation_id, mp.reply_to.exchange, mp.reply_to.routing_key) == (
        uuid.UUID(int=7), b"c", "ex", "key")
    back = codec(AMQP010).decode(there)
    assert (back.content_type, back.content_encoding, back.delivery_mode, back.priority, back.correlation_id,
            back.reply_to, back.expiration, back.message_id, back.timestamp, back.user_id, back.app_id) == (
        "text/plain", "utf-8", 2, 4, "c", "ex/key", "5000", str(uuid.UUID(int=7)), 1_700_000_000, "guest", "app")
    assert back.headers == {"a": 1, "b": "x", "x-amqp-cluster-id": "cl"}


def test_annotations_become_x_headers_in_protocols_without_them():
    props = Properties(headers={"h": 1}, annotations={"x-opt-key": "v", "subject": "s"})
    raw = codec(AMQP091).encode(props)
    assert codec(AMQP091).decode(raw).headers == {"h": 1, "x-opt-key": "v", "x-amqp-subject": "s"}


def test_headers_are_rewritten_in_the_messages_own_format():
    raw = stored(c.DeliveryProperties(priority=3), c.MessageProperties(application_headers={"k": "v"},
                                                                        content_type="a/b"))
    rewritten = with_headers(raw, AMQP010, {"k": "v", "x-death": [{"count": 1}]})
    dp, mp = structs(rewritten)
    assert dp.priority == 3 and mp.content_type == "a/b"
    assert mp.application_headers == {"k": "v", "x-death": [{"count": 1}]}


def test_a_timestamp_header_is_a_timestamp_in_0_9_1_and_seconds_in_0_10():
    when = datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)
    raw091 = codec(AMQP091).encode(Properties(headers={"t": when}))
    assert headers_of(raw091, AMQP091)["t"] == 1_700_000_000
    assert b"T" in raw091  # the field table's timestamp type, as RabbitMQ writes x-death's time
    raw010 = codec(AMQP010).encode(Properties(headers={"t": when}))
    assert headers_of(raw010, AMQP010) == {"t": 1_700_000_000}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_properties_read_as_no_headers_and_never_raise_anything_else(raw):
    """A message whose properties do not decode routes as one without headers, on every node."""
    for number in (AMQP091, AMQP010):
        assert isinstance(headers_of(raw, number), dict)
        try:
            codec(number).decode(raw)
        except ValueError:
            pass
