"""The audit history writer (store/disk/event_writer.py) fed by a real state machine (no node)."""

from __future__ import annotations

import pytest

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import AuditChainOn, ChannelOpen, Publish, QueueDeclare, VhostAdd
from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import COMPACT_CHUNK, EventStore, RetentionPolicy


class Driver:
    """A state machine whose events go to an EventStore, with a leader-like clock."""

    def __init__(self, store: EventStore) -> None:
        self.machine = StoredMachine()
        self.machine.event_sink = store.append
        store.body_of = self.machine.own_bodies.get  # as the node wires its body store
        self.store = store
        self.now = 1_000_000
        self.index = 0
        # As a node with a history: the chain on from the first entry (issue 36, AuditChainOn).
        self.apply(AuditChainOn(None, None), VhostAdd(None, None, "/"), ChannelOpen("c1", None, 1))

    def apply(self, *commands, advance_us: int = 1000) -> list:
        self.now += advance_us
        self.index += 1
        return self.machine.apply_batch(self.now, list(commands), self.index)

    def declare(self, name: str, **args) -> None:
        self.apply(QueueDeclare("c1", None, 1, "/", name, False, False, False, False, args))

    def publish(self, queue: str, body: bytes, advance_us: int = 1000) -> None:
        self.apply(Publish("c1", None, 1, "/", "", queue, False, b"\x00\x00", body, False, 0, None),
                   advance_us=advance_us)


@pytest.fixture
def store(tmp_path):
    stores = []

    def make(policy="metadata", **kw) -> EventStore:
        s = EventStore(str(tmp_path / f"events{len(stores)}"), policy, **kw)
        stores.append(s)
        return s

    yield make
    for s in stores:
        s.close()


def kinds(s: EventStore) -> list[str]:
    return [EV.KIND_NAMES[r[2]] for r in s.records()]


def test_events_carry_the_raft_index_and_meta_records_it(store):
    s = store()
    d = Driver(s)
    d.declare("q")
    d.publish("q", b"x")
    assert s.flush()
    records = s.records()
    assert [r[0] for r in records] == list(range(1, len(records) + 1))  # dense, in order
    assert records[-1][10] == d.index  # the ROUTED event came from the last batch
    assert s.info().raft_index == d.index
    assert kinds(s)[-2:] == ["published", "routed"]


def test_retention_queue_argument_overrides_the_vhost_and_the_node(store):
    s = store(RetentionPolicy("none", {"/": "none"}))
    d = Driver(s)
    d.declare("kept", **{"x-audit-retention": "body"})
    d.declare("dropped")
    d.publish("kept", b"secret")
    d.publish("dropped", b"other")
    assert s.flush()
    # The publish events themselves follow the vhost (none); the routed event follows the queue.
    message_kinds = [k for k in kinds(s) if k in ("published", "routed")]
    assert message_kinds == ["routed"]
    messages = list(s.records("messages"))
    assert [(m[4], m[8]) for m in messages] == [("kept", b"secret")]  # only the kept queue's, with body
    queues = {q[1]: q[6] for q in s.records("queues")}
    assert queues == {"kept": "body", "dropped": "none"}  # catalog events are always kept


def test_a_restarted_store_skips_replayed_events_and_records_gaps(store, tmp_path):
    s = store()
    d = Driver(s)
    d.declare("q")
    assert s.flush()
    last = s.last_seq
    s.append(7, [[last, 1, EV.ACKED, "/", "q", 1, "", "q", 0, "", None]])  # a replay: skipped
    s.append(8, [[last + 5, 2, EV.QUEUE_DELETED, "/", "q", None, "", "", 0, "", ()]])  # after a snapshot install
    assert s.flush()
    info = s.info()
    assert info.last_seq == last + 5 and info.gaps == [[last + 1, last + 4]]
    assert info.events == last + 1


def test_age_limit_trims_the_oldest_events_and_their_messages(store):
    s = store(max_age=1.0)
    d = Driver(s)
    d.declare("q")
    for _ in range(COMPACT_CHUNK + 500):
        d.publish("q", b"old", advance_us=10)
    d.publish("q", b"new", advance_us=5_000_000)  # five seconds later
    assert s.flush()
    removed = s.compact()
    info = s.info()
    remaining = s.records()
    newest = remaining[-1][1]
    assert removed > COMPACT_CHUNK  # more than one trimming transaction
    assert all(r[1] >= newest - 1_000_000 for r in remaining)
    assert info.first_seq == remaining[0][0]
    assert [m[0] for m in s.records("messages")] == [remaining[-1][5]]  # the young message only


def test_size_limit_trims_until_under_it(store):
    s = store(max_bytes=256 * 1024)
    d = Driver(s)
    d.declare("q")
    for _ in range(4000):
        d.publish("q", b"y" * 10)
    assert s.flush()
    before = s.live_bytes()
    assert before > 256 * 1024
    s.compact()
    assert s.live_bytes() <= 256 * 1024
    assert s.info().first_seq > 1


def test_snapshot_is_a_compact_consistent_copy(store, tmp_path):
    s = store()
    d = Driver(s)
    d.declare("q")
    for _ in range(50):
        d.publish("q", b"z")
    assert s.flush()
    info = s.snapshot(str(tmp_path / "snap"))
    assert info.raft_index == d.index and info.last_seq == s.last_seq
    assert list(EV.read_events(str(tmp_path / "snap"))) == s.records()
    with pytest.raises(ValueError, match="must be empty"):
        s.snapshot(str(tmp_path / "snap"))


def test_bad_retention_is_refused():
    with pytest.raises(ValueError, match="audit retention"):
        RetentionPolicy("everything")
