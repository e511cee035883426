"""apply returns effects and does no I/O; the applier carries them out (store/core/effects.py,
store/applier.py)."""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import OUT_REPLY, ChannelOpen, Publish, QueueDeclare, QueueDelete, VhostAdd
from raftmq.store.core.effects import DELETE_PREFIX, PUT, PUT_WITH_BODY
from raftmq.store.disk.durable import DurableStore

NOW = 1_700_000_000_000_000
C = "conn-1"


def _declare_and_publish() -> list[list]:
    return [VhostAdd(None, None, "/"),
            ChannelOpen(C, 1, 1),
            QueueDeclare(C, 2, 1, "/", "durable-q", False, True, False, False, {}),
            Publish(C, 3, 1, "/", "", "durable-q", False, b"\x00\x00", b"kept", True, 0, None)]


def test_apply_records_persistence_and_writes_nothing_until_carried_out(tmp_path):
    store = DurableStore(str(tmp_path / "state"))
    machine = StoredMachine(store)
    effects = machine.apply(NOW, _declare_and_publish())
    assert [out[3][0] for out in effects.outputs if out[1] == OUT_REPLY] == [0, 0, 0]
    tables = [op[1] for op in effects.persistence if op[0] in (PUT, PUT_WITH_BODY)]
    assert {"vhosts", "queues", "messages", "entries"} <= set(tables)
    assert effects.sync_needed  # a persistent message in a durable queue: the confirm waits for fsync
    assert DurableStore(str(tmp_path / "other")).load().queues == []  # (a fresh store is empty)
    assert store.load().queues == []  # apply wrote nothing
    # The model holds no body: the message record gets it from the node's bodies (the puts).
    assert effects.body_puts == [(1, b"kept")]
    machine.applier.carry_out(effects)
    assert [q[1] for q in store.load().queues] == ["durable-q"]
    assert store.load().messages[1][3] == b"kept"


def test_deleting_a_queue_drops_its_entries_in_the_same_commit(tmp_path):
    store = DurableStore(str(tmp_path / "state"))
    machine = StoredMachine(store)
    effects = machine.apply(NOW, _declare_and_publish())
    machine.applier.carry_out(effects)
    qid = machine.vhosts["/"].queues["durable-q"].qid
    effects = machine.apply(NOW, [QueueDelete(C, 4, 1, "/", "durable-q", False, False)])
    assert any(op[0] == DELETE_PREFIX and op[1] == "entries" for op in effects.persistence)
    machine.applier.carry_out(effects)
    loaded = store.load()
    assert loaded.queues == [] and not [e for e in loaded.entries if e[0] == qid]


def test_a_machine_without_a_store_records_no_persistence_and_no_events():
    """A cluster node: its durable state is the Raft journal; it builds nothing it would drop."""
    machine = StoredMachine()
    effects = machine.apply(NOW, _declare_and_publish(), index=5)
    assert effects.persistence == [] and not effects.sync_needed and effects.events == []
    assert effects.index == 5 and machine.applied_index == 5


def test_events_are_effects_too():
    machine = StoredMachine()
    received = []
    machine.event_sink = lambda index, events: received.append((index, len(events)))
    effects = machine.apply(NOW, _declare_and_publish(), index=9)
    assert effects.events and received == []  # recorded, not yet written
    machine.applier.carry_out(effects)
    assert received == [(9, len(effects.events))]
