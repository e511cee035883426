"""protocol/amqp010/neutral.py: the header a 0-10 delivery carries and the byte credit it takes.

message.set-flow-mode rule byte-accounting (shared/specs/amqp-0-10.txt L6118ff): "The byte count is
decremented by the payload size of each transmitted frame with segment type header or body
appearing within a message.transfer command".  The core charges ``transfer_credit`` (registered by
node/core/formats.py) and the front end sends ``delivery_headers``: these tests check the two agree,
whatever the redelivered flag, for 0-10 and 0-9-1 messages, and that the remembered sizes are the
computed ones.
"""

from __future__ import annotations

import pytest

import raftmq.node.core.formats  # noqa: F401  (registers the property codecs and the credit size)
from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010 import neutral
from raftmq.protocol.amqp010.neutral import delivery_headers, stored, transfer_credit
from raftmq.store.core import model
from raftmq.store.core.message import AMQP010, AMQP091
from raftmq.store.core.model import Message


def _message(properties: bytes, fmt: int, size: int = 100, routing_key: str = "q") -> Message:
    return Message(1, "amq.direct", routing_key, properties, size, False, 0, 0, 0, fmt, 1)


def _sent(message: Message, redelivered: bool) -> int:
    """Header segment payload plus body, as codec.segments_of frames the transfer."""
    transfer = c.MessageTransfer(destination="d", accept_mode=0, acquire_mode=0,
                                 headers=delivery_headers(message, redelivered), body=b"x" * message.size)
    _track, segments = c.segments_of(transfer)
    return sum(len(payload) for kind, payload in segments if kind in (c.SEG_HEADER, c.SEG_BODY))


MESSAGES = {
    "0-10 routing key only": _message(stored(c.DeliveryProperties(routing_key="q"), None), AMQP010),
    "0-10 with properties": _message(stored(c.DeliveryProperties(priority=7, delivery_mode=2, ttl=5000),
                                            c.MessageProperties(content_type="text/plain",
                                                                application_headers={"a": 1, "b": "two"})),
                                     AMQP010, 3000, "a.longer.routing.key"),
    "0-9-1 content type": _message(b"\x80\x00\x0atext/plain", AMQP091, 7),
}


@pytest.mark.parametrize("name", MESSAGES)
@pytest.mark.parametrize("redelivered", [False, True])
def test_credit_is_what_the_transfer_sends(name: str, redelivered: bool) -> None:
    message = MESSAGES[name]
    neutral._HEADER_SIZES.clear()
    assert transfer_credit(message) == _sent(message, redelivered)
    assert transfer_credit(message) == _sent(message, redelivered)  # remembered, same answer


def test_a_publisher_without_message_properties_gets_none_back() -> None:
    """Only what the publisher set, plus the delivery's exchange and routing key: Qpid's test
    message (routing key "q", 8-byte body) takes 19 bytes, the figure Qpid's test_credit_flow_bytes
    works with."""
    message = _message(stored(c.DeliveryProperties(routing_key="q"), None), AMQP010, 8)
    message.exchange = ""
    headers = delivery_headers(message, False)
    assert len(headers) == 1 and isinstance(headers[0], c.DeliveryProperties)
    assert headers[0].priority is None and headers[0].delivery_mode is None
    assert transfer_credit(message) == 19


def test_another_protocols_message_gets_content_length() -> None:
    _dp, mp = delivery_headers(MESSAGES["0-9-1 content type"], False)
    assert mp.content_length == 7 and mp.content_type == "text/plain"


def test_the_core_charges_it() -> None:
    """node/core/formats.py registered it: a consumer with finite byte credit is charged the
    transfer, not the body alone."""
    assert model.transfer_credit is transfer_credit
