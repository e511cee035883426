"""A delivery that needs no acknowledgement is marked in its ``delivered`` event (issue 36,
store/core/events.py NO_ACK): detail ``no-ack:<tag>`` (``no-ack:`` for basic.get), so that an audit of
a queue's contents knows the message left the queue there -- no ``acked`` event follows it.  AMQP
0-9-1 section 1.8.3.3 (basic.consume no-ack) and 1.8.3.10 (basic.get no-ack)."""

from __future__ import annotations

from raftmq.store.core.commands import Consume, Get
from raftmq.store.core.events import NO_ACK
from raftmq.store.disk import history as EV
from tests.unit.store.test_event_writer import Driver, store  # noqa: F401 - the fixture


def delivered(s) -> list[tuple[str, str]]:
    return [(EV.KIND_NAMES[r[2]], r[9]) for r in s.records() if r[2] in (EV.DELIVERED, EV.ACKED)]


def test_no_ack_deliveries_are_marked_and_acknowledged_ones_are_not(store):  # noqa: F811
    s = store()
    d = Driver(s)
    d.declare("q")
    for i in range(4):
        d.publish("q", b"m%d" % i)
    d.apply(Get("c1", None, 1, "/", "q", True))   # basic.get, no-ack
    d.apply(Get("c1", None, 1, "/", "q", False))  # basic.get, acknowledged later (or not)
    d.apply(Consume("c1", None, 1, "/", "q", "fast", True, False, {}))  # the other two, no-ack
    assert s.flush()
    assert delivered(s) == [("delivered", NO_ACK), ("delivered", ""), ("delivered", NO_ACK + "fast"),
                            ("delivered", NO_ACK + "fast")]
