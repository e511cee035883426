"""Filtered consumers in the state machine (issue 37): store/core/delivery.py dispatch_selective.

A consumer whose subscription carries a filter (store/filters, ``FILTER_ARGUMENT``) is given the first
ready message in queue order its filter matches; messages it does not match stay for other consumers;
the scan of one dispatch is bounded (``SCAN_LIMIT``) and a TICK goes on; a message requeued below a
consumer's cursor is looked at again; a snapshot carries the filter and replicas stay identical.
Messages are 0-9-1 ones here: the filter sees their headers as application-properties, as a 1.0
consumer would (store/core/filters/view.py).
"""

from __future__ import annotations

import pytest

import raftmq.node.core.formats  # noqa: F401  (registers the codecs and the 1.0 filter view)
from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties
from raftmq.store.applier import StoredMachine
from raftmq.store.core import delivery
from raftmq.store.core.commands import ERR, OK, OUT_DELIVER, OUT_REPLY, Nack, Op, Tick, VhostAdd, make
from raftmq.store.core.filters import FILTER_ARGUMENT
from raftmq.store.disk.snapshot import digest, export_model, import_model

C = "conn-1"
NOW = 1_700_000_000_000_000


class Driver:
    def __init__(self) -> None:
        self.m = StoredMachine()
        self.token = 0
        self.m.apply_batch(NOW, [VhostAdd(None, None, "/")])
        self.call(Op.CHANNEL_OPEN)
        self.call(Op.QUEUE_DECLARE, "/", "q", False, False, False, False, {})

    def call(self, op: Op, *args, ch: int = 1):
        self.token += 1
        outputs = self.m.apply_batch(NOW, [make(op, C, self.token, ch, *args)])
        reply = next(o[3] for o in outputs if o[1] == OUT_REPLY and o[2] == self.token)
        return reply, outputs

    def publish(self, body: bytes, **headers) -> list:
        props = encode_properties(BasicProperties(headers=headers or None))
        return self.call(Op.PUBLISH, "/", "", "q", False, props, body, False, 0, None)[1]

    def consume(self, tag: str, spec=None, ch: int = 1) -> list:
        args = {FILTER_ARGUMENT: spec} if spec is not None else {}
        reply, outputs = self.call(Op.CONSUME, "/", "q", tag, False, False, args, ch=ch)
        assert reply[0] == OK, reply
        return outputs

    @property
    def queue(self):
        return self.m.vhosts["/"].queues["q"]


def delivered(outputs, tag: str | None = None) -> list[int]:
    """Message ids delivered (to ``tag``), in order."""
    return [o[4][3].id for o in outputs if o[1] == OUT_DELIVER and (tag is None or o[3] == tag)]


def test_filtered_consumer_takes_matching_messages_others_stay():
    """The filtered consumer gets exactly the matching messages, in queue order; the rest stay ready,
    in order, for an unfiltered consumer."""
    d = Driver()
    d.consume("green", [["selector", "colour = 'green'"]])
    got = []
    for i, colour in enumerate(["red", "green", "blue", "green", "red"]):
        got += delivered(d.publish(b"%d" % i, colour=colour), "green")
    assert got == [2, 4]  # message ids: the second and fourth published
    assert len(d.queue.ready) == 3
    outputs = d.consume("all")
    assert delivered(outputs, "all") == [1, 3, 5]
    assert delivered(d.publish(b"x", colour="green"), "green") == [6]
    assert delivered(d.publish(b"y", colour="red"), "all") == [7]


def test_backlog_is_scanned_when_the_filtered_consumer_arrives():
    d = Driver()
    for i in range(10):
        d.publish(b"%d" % i, n=i)
    outputs = d.consume("odd", [["sql", "a.n % 2 = 1"], ["application-properties", {"n": 7}]])
    assert delivered(outputs) == [8]  # n=7: both filters must accept
    assert len(d.queue.ready) == 9


def test_requeued_message_below_the_cursor_is_seen_again():
    """Nack requeue puts a message back at its place, below the consumer's cursor: rewound."""
    d = Driver()
    d.call(Op.QOS, 1, False)
    d.consume("m", [["selector", "n >= 0"]])
    first = delivered(d.publish(b"a", n=1))
    assert first == [1]
    d.publish(b"b", n=2)  # waits: prefetch 1
    queue = d.queue
    _, outputs = d.call(Op.NACK, [[queue.qid, 1]], True)
    # Message 1 comes back first (its place is before message 2), redelivered.
    deliveries = [o for o in outputs if o[1] == OUT_DELIVER]
    assert [o[4][3].id for o in deliveries] == [1] and deliveries[0][4][2] is True


def test_scan_is_bounded_per_dispatch_and_a_tick_goes_on(monkeypatch):
    """No dispatch examines more than SCAN_LIMIT entries; the queue waits in ``rescan``, the machine
    asks for a TICK at once (next_deadline), and the TICK continues the scan."""
    monkeypatch.setattr(delivery, "SCAN_LIMIT", 5)
    d = Driver()
    for i in range(12):
        d.publish(b"x", n=i)
    outputs = d.consume("last", [["selector", "n = 11"]])
    assert delivered(outputs) == []
    assert d.m.rescan == {d.queue.qid: d.queue}
    assert d.queue.selective[0].scan_cursor == 5
    assert d.m.next_expiry_due() and d.m.next_deadline() == d.m._now
    assert delivered(d.m.apply_batch(NOW + 1, [Tick(None, None)])) == []
    outputs = d.m.apply_batch(NOW + 2, [Tick(None, None)])
    assert delivered(outputs) == [12]
    assert not d.m.rescan and len(d.queue.ready) == 11


def test_invalid_filter_is_refused_and_no_consumer_is_made():
    d = Driver()
    reply, _ = d.call(Op.CONSUME, "/", "q", "bad", False, False, {FILTER_ARGUMENT: [["selector", "a ="]]})
    assert reply[0] == ERR and reply[1] == 406 and "expected an operand" in reply[2]
    assert d.queue.consumers == [] and d.queue.selective == []


def test_cancel_removes_the_filtered_consumer():
    d = Driver()
    d.consume("f", [["selector", "TRUE"]])
    d.call(Op.CANCEL, "f")
    assert d.queue.selective == [] and d.queue.consumers == []
    d.publish(b"x", n=1)
    assert len(d.queue.ready) == 1


@pytest.mark.parametrize("after", [0, 3])
def test_snapshot_carries_the_filter_and_replicas_agree(after):
    """A follower that installs a snapshot holds the same (recompiled) filter and cursor, and both
    dispatch the following entries alike (the digest covers the filter and its cursor)."""
    d = Driver()
    d.consume("f", [["selector", "n > 2"]])
    for i in range(after):
        d.publish(b"x", n=i)
    follower = StoredMachine()
    import_model(follower, export_model(d.m))
    assert digest(follower) == digest(d.m)
    consumer = follower.vhosts["/"].queues["q"].selective[0]
    assert consumer.filter.spec == [["selector", "n > 2"]]
    props = encode_properties(BasicProperties(headers={"n": 5}))
    command = make(Op.PUBLISH, C, None, 1, "/", "", "q", False, props, b"y", False, 0, None)
    one, two = d.m.apply_batch(NOW, [command]), follower.apply_batch(NOW, [command])
    assert delivered(one) == delivered(two) == [after + 1]
    assert digest(follower) == digest(d.m)


def test_nack_without_requeue_of_a_filtered_delivery():
    d = Driver()
    d.consume("f", [["selector", "n = 1"]])
    d.publish(b"x", n=1)
    d.m.apply_batch(NOW, [Nack(C, None, 1, [[d.queue.qid, 1]], False)])
    assert len(d.queue.ready) == 0 and d.queue.unacked_count == 0


def test_filtered_browser_sees_matching_messages_and_takes_none():
    """A browse subscription (acquire-mode not-acquired, what 1.0 distribution-mode copy uses) with a
    filter: it is shown only the matching messages and every message stays queued."""
    from raftmq.store.core.commands import OUT_TRANSFER
    from raftmq.store.core.sessions import UNLIMITED

    d = Driver()
    for i, colour in enumerate(["red", "green", "red"]):
        d.publish(b"%d" % i, colour=colour)
    d.call(Op.SESSION_ATTACH, "/", "guest", b"browser", False, ch=2)
    seen = []
    for command_id, (op, *args) in enumerate([
            (Op.MESSAGE_SUBSCRIBE, "/", "q", "b", True, False, {FILTER_ARGUMENT: [["selector", "colour = 'red'"]]},
             True),
            (Op.MESSAGE_FLOW, "b", 1, UNLIMITED), (Op.MESSAGE_FLOW, "b", 0, 10)]):
        _, outputs = d.call(Op.SESSION_COMMAND, command_id, make(op, C, None, 2, *args), ch=2)
        seen += [o[4][4].id for o in outputs if o[1] == OUT_TRANSFER]
    assert seen == [1, 3]
    assert len(d.queue.ready) == 3 and d.queue.selective == []
    outputs = d.consume("plain")
    assert delivered(outputs, "plain") == [1, 2, 3]


def test_filtered_consumers_whose_filters_overlap_take_turns():
    """Two filtered consumers that both match take one message each in turn, within a dispatch and
    across dispatches (the one served moves to the end), as unfiltered consumers do."""
    d = Driver()
    for i in range(4):
        d.publish(b"%d" % i, n=i)
    d.call(Op.CHANNEL_OPEN, ch=2)
    outputs = d.consume("a", [["selector", "n >= 0"]])
    assert delivered(outputs, "a") == [1, 2, 3, 4]  # alone: the whole backlog
    d.call(Op.CANCEL, "a")  # its four stay unacked on channel 1
    d.consume("b", [["selector", "n >= 0"]], ch=2)
    d.consume("c", [["selector", "n >= 0"]], ch=2)
    got = []
    for i in range(4, 8):
        got += [(o[3], o[4][3].id) for o in d.publish(b"%d" % i, n=i) if o[1] == OUT_DELIVER]
    assert got == [("b", 5), ("c", 6), ("b", 7), ("c", 8)]
    _, outputs = d.call(Op.NACK, [[d.queue.qid, seq] for seq in (1, 2, 3, 4)], True)
    assert [(o[3], o[4][3].id) for o in outputs if o[1] == OUT_DELIVER] == [
        ("b", 1), ("c", 2), ("b", 3), ("c", 4)]


@pytest.mark.parametrize("fmt", [1, 2, 3, 4])
def test_snapshots_written_before_filters_load(fmt):
    """Snapshot fixtures of every format hold a consumer: it loads unfiltered, with no cursor, and its
    queue with no filtered consumers (Consumer.__setstate__, Queue.__setstate__); the machine then
    takes a filtered consumer as usual."""
    from pathlib import Path

    from raftmq.store.disk.snapshot import read_snapshot

    path = Path(__file__).parent / "fixtures" / f"snapshot-format-{fmt}.lmdb"
    _meta, model = read_snapshot(str(path))
    m = StoredMachine()
    import_model(m, model)
    consumers = [c for chs in m.channels.values() for ch in chs.values() for c in ch.consumers.values()]
    assert consumers and all(c.filter is None and c.scan_cursor == 0 for c in consumers)
    queues = [q for v in m.vhosts.values() for q in v.queues.values()]
    assert all(q.selective == [] for q in queues) and m.rescan == {}
    digest(m)  # renders
