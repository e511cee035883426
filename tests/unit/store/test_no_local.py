"""Qpid's ``no-local`` queue argument in the state machine (issue 32; store/core/queue_args.py NO_LOCAL,
store/core/delivery.py Delivery.local_to).

AMQP 0-10's message.subscribe has no no-local (only the file and stream classes' consume do: "the
server will not send messages to the connection that published them"); Qpid's brokers offer it as a
queue argument, and their conformance tests (qpid_tests/broker_0_10/message.py test_no_local*)
expect a message published on the connection that holds the queue -- exclusive owner or exclusive
subscriber -- not to be enqueued at all.  Driven here in process with 0-9-1-style commands: the core
is the same for every protocol (the 0-10 path, owner = a session, is in
tests/integration/test_amqp010_qpid_rules.py).
"""

from __future__ import annotations

import pickle

import pytest

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    ChannelOpen,
    Consume,
    Publish,
    QueueDeclare,
    VhostAdd,
)
from raftmq.store.core.model import Queue
from raftmq.store.core.queue_args import parse_queue_arguments

NOW = 1_700_000_000_000_000
A, B = "n1.a.1", "n1.b.2"  # two connections


def _machine() -> StoredMachine:
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/"), ChannelOpen(A, None, 1), ChannelOpen(B, None, 1)])
    return m


def _publish(m: StoredMachine, conn: str, queue: str, body: bytes) -> None:
    m.apply_batch(NOW, [Publish(conn, None, 1, "/", "", queue, False, b"", body, False, 0, None)])


def _ready(m: StoredMachine, queue: str) -> int:
    return len(m.vhosts["/"].queues[queue].ready)


def test_exclusive_owner_does_not_get_what_its_connection_publishes() -> None:
    """The queue's exclusive owner's connection publishes: dropped; another connection: queued."""
    m = _machine()
    m.apply_batch(NOW, [QueueDeclare(A, None, 1, "/", "q", False, False, True, True, {"no-local": True})])
    _publish(m, A, "q", b"local")
    assert _ready(m, "q") == 0
    _publish(m, B, "q", b"foreign")
    assert _ready(m, "q") == 1


def test_an_exclusive_subscriber_makes_its_connection_local() -> None:
    """A shared no-local queue: nothing is local until a connection subscribes exclusively; then
    what that connection publishes is dropped and the other's still queued (Qpid's
    test_no_local_exclusive_subscribe)."""
    m = _machine()
    m.apply_batch(NOW, [QueueDeclare(A, None, 1, "/", "q", False, False, False, False, {"no-local": "true"})])
    _publish(m, A, "q", b"before")
    assert _ready(m, "q") == 1
    m.apply_batch(NOW, [Consume(A, None, 1, "/", "q", "c", False, True, {})])
    before = _ready(m, "q") + len(m.channels[A][1].unacked)
    _publish(m, A, "q", b"local")
    _publish(m, B, "q", b"foreign")
    assert _ready(m, "q") + len(m.channels[A][1].unacked) == before + 1


def test_without_the_argument_nothing_is_dropped() -> None:
    m = _machine()
    m.apply_batch(NOW, [QueueDeclare(A, None, 1, "/", "q", False, False, True, True, {})])
    _publish(m, A, "q", b"mine")
    assert _ready(m, "q") == 1


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), ("true", True), (b"True", True), ("1", True), (1, True),
    (False, False), ("false", False), (0, False), ("maybe", False), (None, False),
])
def test_the_argument_reads_as_qpid_reads_it(value, expected) -> None:
    """Qpid reads no-local as a boolean (true, non-zero, "true"/"1"); nothing is refused, so a
    queue stored with any value still loads."""
    assert parse_queue_arguments({"no-local": value}, "q", "/").no_local is expected


def test_a_queue_from_an_older_snapshot_has_no_no_local() -> None:
    """A queue pickled before the field existed unpickles with no_local False (Queue.__setstate__)."""
    queue = Queue(1, "/", "q", False, None, False, {})
    state = queue.__reduce_ex__(2)
    slots = dict(state[2][1]) if isinstance(state[2], tuple) else dict(state[2])
    slots.pop("no_local")
    older = Queue.__new__(Queue)
    older.__setstate__((None, slots))
    assert older.no_local is False
    assert pickle.loads(pickle.dumps(queue)).no_local is False
