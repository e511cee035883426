"""Filters on a receiver's source (AMQP 1.0 3.5.3 filter sets, issue 37) with real proton receivers.

Each filter kind selects exactly the matching messages of a mixed queue and leaves the others queued
for an unfiltered consumer: JMS selectors (``apache.org:selector-filter:string``, the AMQP filter
registry), RabbitMQ 4.1's ``amqp:properties-filter`` / ``amqp:application-properties-filter`` and
4.2's ``amqp:sql-filter``.  The attach reply lists the filters in use (3.5.3), leaves out the ones we
do not support, and a selector that does not parse refuses the attach with ``amqp:invalid-field``.
"""

from __future__ import annotations

import pika
import pytest

proton = pytest.importorskip("proton")
from proton import Described, Message, symbol  # noqa: E402
from proton.reactor import Filter, Selector  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

from tests.integration.helpers import uniq, wait_until  # noqa: E402

TIMEOUT = 10
QUIET = 0.5  # seconds a receiver waits to show that nothing more comes


@pytest.fixture(autouse=True)
def _raftmq_only(broker) -> None:
    if broker.kind != "raftmq":
        pytest.skip("RabbitMQ 3.10's 1.0 plugin is not enabled in the reference peer")


def _count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


MIXED = [  # (body, subject, application-properties, priority)
    ("r1", "fruit", {"colour": "red", "weight": 10}, 4),
    ("g1", "veg", {"colour": "green", "weight": 2500}, 7),
    ("b1", "fruit.apple", {"colour": "blue", "weight": 300}, 4),
    ("g2", "fruit", {"colour": "green", "weight": 50}, 1),
    ("n1", "none", {"weight": 5}, 4),
    ("r2", "veg.leek", {"colour": "red", "weight": 3000}, 9),
]


def _fill(amqp, queue: str) -> None:
    sender = amqp.create_sender(f"/queues/{queue}")
    for body, subject, props, priority in MIXED:
        sender.send(Message(body=body, subject=subject, properties=props, priority=priority, durable=True))
    sender.close()


def _take(receiver, n: int) -> list[str]:
    """Exactly ``n`` messages (accepted), then none for QUIET seconds."""
    got = []
    for _ in range(n):
        got.append(receiver.receive(timeout=TIMEOUT).body)
        receiver.accept()
    with pytest.raises(proton.Timeout):
        receiver.receive(timeout=QUIET)
    return got


def _rest(amqp, queue: str, n: int) -> list[str]:
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=20)
    got = _take(receiver, n)
    receiver.close()
    return got


def _described(descriptor: str, value) -> Filter:
    return Filter({symbol("f"): Described(symbol(descriptor), value)})


def _reply_filter(receiver) -> dict:
    """The filter set of the attach reply's source (proton's Data: rewound, then read)."""
    data = receiver.link.remote_source.filter
    data.rewind()
    return data.get_object() if data.next() else {}


def test_selector_selects_matching_and_leaves_the_rest(ch, amqp) -> None:
    """JMS 3.8.1 selector on application-properties: only the green ones; the others stay, in order,
    for an unfiltered receiver; the reply's source filter echoes the selector (3.5.3)."""
    queue = uniq("sel")
    ch.queue_declare(queue)
    _fill(amqp, queue)
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=20, options=Selector("colour = 'green'"))
    echoed = _reply_filter(receiver)
    assert [str(d.descriptor) for d in echoed.values()] == ["apache.org:selector-filter:string"]
    assert _take(receiver, 2) == ["g1", "g2"]
    receiver.close()
    assert _count(ch, queue) == 4
    assert _rest(amqp, queue, 4) == ["r1", "b1", "n1", "r2"]


def test_selector_headers_arithmetic_between_like(ch, amqp) -> None:
    """JMS header names mapped to 1.0 fields (JMSPriority -> header priority, JMSType -> subject),
    arithmetic, BETWEEN, LIKE, IN and IS NULL, three-valued: n1 has no colour, so ``colour <> 'x'`` is
    unknown for it."""
    queue = uniq("sel")
    ch.queue_declare(queue)
    _fill(amqp, queue)
    selector = ("JMSPriority >= 4 AND weight / 10 BETWEEN 1 AND 300 AND JMSType LIKE 'f%' "
                "AND colour IN ('red', 'blue') AND colour IS NOT NULL AND colour <> 'x'")
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=20, options=Selector(selector))
    assert _take(receiver, 2) == ["r1", "b1"]
    receiver.close()
    assert _rest(amqp, queue, 4) == ["g1", "g2", "n1", "r2"]


def test_complementary_selectors_share_a_queue(ch, amqp, broker) -> None:
    """Two receivers with complementary selectors on one queue each get exactly their half; a message
    neither matches (no colour: unknown for both) stays queued."""
    queue = uniq("sel")
    ch.queue_declare(queue)
    other = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=TIMEOUT)
    try:
        red = amqp.create_receiver(f"/queues/{queue}", credit=20, options=Selector("colour = 'red'"))
        rest = other.create_receiver(f"/queues/{queue}", credit=20, options=Selector("NOT colour = 'red'"))
        _fill(amqp, queue)
        assert _take(red, 2) == ["r1", "r2"]
        assert _take(rest, 3) == ["g1", "b1", "g2"]
        red.close()
        rest.close()
    finally:
        other.close()
    assert _count(ch, queue) == 1
    assert _rest(amqp, queue, 1) == ["n1"]


def test_properties_filter(ch, amqp) -> None:
    """amqp:properties-filter (AMQP Filter Expressions 4.2.4, RabbitMQ 4.1): subject with a prefix
    match (``&p:``); everything else stays."""
    queue = uniq("prop")
    ch.queue_declare(queue)
    _fill(amqp, queue)
    receiver = amqp.create_receiver(
        f"/queues/{queue}", credit=20,
        options=_described("amqp:properties-filter", {symbol("subject"): "&p:fruit"}))
    assert [str(d.descriptor) for d in _reply_filter(receiver).values()] == ["amqp:properties-filter"]
    assert _take(receiver, 3) == ["r1", "b1", "g2"]
    receiver.close()
    assert _rest(amqp, queue, 3) == ["g1", "n1", "r2"]


def test_application_properties_filter(ch, amqp) -> None:
    """amqp:application-properties-filter (4.2.5): every entry must match, numbers by value."""
    queue = uniq("aprop")
    ch.queue_declare(queue)
    _fill(amqp, queue)
    receiver = amqp.create_receiver(
        f"/queues/{queue}", credit=20,
        options=_described("amqp:application-properties-filter", {"colour": "red", "weight": 3000}))
    assert _take(receiver, 1) == ["r2"]
    receiver.close()
    assert _rest(amqp, queue, 5) == ["r1", "g1", "b1", "g2", "n1"]


def test_sql_filter(ch, amqp) -> None:
    """amqp:sql-filter (RabbitMQ 4.2; Filter Expressions section 6): section-qualified fields
    (``properties.subject``, ``h.priority``), unqualified names are application properties."""
    queue = uniq("sql")
    ch.queue_declare(queue)
    _fill(amqp, queue)
    receiver = amqp.create_receiver(
        f"/queues/{queue}", credit=20,
        options=_described("amqp:sql-filter", "properties.subject LIKE 'veg%' AND h.priority > 8 "
                                              "OR a.weight % 2 = 1"))
    assert _take(receiver, 2) == ["n1", "r2"]
    receiver.close()
    assert _rest(amqp, queue, 4) == ["r1", "g1", "b1", "g2"]


def test_selector_on_messages_published_with_0_9_1(ch, amqp) -> None:
    """A 0-9-1 message is seen as a 1.0 consumer gets it: headers are application-properties,
    priority the header priority."""
    queue = uniq("sel091")
    ch.queue_declare(queue)
    for i, colour in enumerate(["red", "green", "red"]):
        ch.basic_publish("", queue, f"p{i}".encode(),
                              pika.BasicProperties(headers={"colour": colour}, priority=i))
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=20,
                                    options=Selector("colour = 'red' AND JMSPriority = 2"))
    got = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert bytes(got.body) == b"p2"
    with pytest.raises(proton.Timeout):
        receiver.receive(timeout=QUIET)
    receiver.close()
    assert _count(ch, queue) == 2


def test_unsupported_filter_left_out_of_the_reply(ch, amqp) -> None:
    """3.5.3: a filter we do not apply is not in the reply's source; the receiver gets every message."""
    queue = uniq("unsup")
    ch.queue_declare(queue)
    _fill(amqp, queue)
    receiver = amqp.create_receiver(
        f"/queues/{queue}", credit=20,
        options=_described("apache.org:legacy-amqp-direct-binding:string", "key"))
    assert _reply_filter(receiver) == {}
    assert _take(receiver, 6) == [m[0] for m in MIXED]
    receiver.close()


@pytest.mark.parametrize("selector", ["colour = ", "colour LIKE 5", "colour = 'x", "a.b = 1 AND (", "colour ! 3"])
def test_malformed_selector_refused(amqp, ch, selector: str) -> None:
    """A selector that does not parse: the attach is refused with amqp:invalid-field and the reason."""
    queue = uniq("bad")
    ch.queue_declare(queue)
    with pytest.raises(LinkDetached) as info:
        amqp.create_receiver(f"/queues/{queue}", options=Selector(selector))
    assert "amqp:invalid-field" in str(info.value)
    assert "position" in str(info.value) or "character" in str(info.value)


def test_deep_match_past_the_scan_bound(ch, amqp) -> None:
    """A match behind more non-matching messages than one dispatch examines (store/core/delivery.py
    SCAN_LIMIT): the scan goes on in later applies (TICK), the match arrives, the rest stays."""
    from raftmq.store.core.delivery import SCAN_LIMIT

    queue = uniq("deep")
    ch.queue_declare(queue)
    filler = 2 * SCAN_LIMIT + 100
    for i in range(filler):
        ch.basic_publish("", queue, b"x", pika.BasicProperties(headers={"n": i}))
    ch.basic_publish("", queue, b"wanted", pika.BasicProperties(headers={"n": -1}))
    wait_until(lambda: _count(ch, queue) == filler + 1, what="all published")
    receiver = amqp.create_receiver(f"/queues/{queue}", credit=5, options=Selector("n < 0"))
    got = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert bytes(got.body) == b"wanted"
    receiver.close()
    assert _count(ch, queue) == filler
