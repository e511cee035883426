"""The event chain (issue 36, store/core/events.py ``chain_packed``/``chain_next``, StateMachine.chain_head).

Determinism: machines fed the same batches reach the same head after every batch, whether or not
they record events (a node's retention decides what it keeps, never what is chained), and a machine
that installs a state snapshot midway continues the chain to the same heads.  The writer's chain
records (store/disk/event_writer.py) hold the kept events' seal CRCs and recompute from the events kept.
"""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core import events as E
from raftmq.store.core.commands import (
    AuditChainOn,
    ChannelOpen,
    Get,
    Publish,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    VhostAdd,
)
from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import EventStore, RetentionPolicy
from raftmq.store.disk.snapshot import import_model, read_snapshot, write_snapshot


def _batches() -> list[list]:
    """Declares, publishes (routed and unroutable), gets, a purge and a delete of a non-empty queue:
    the fast paths (publish, route, release_deleted) and the definition events."""
    pub = lambda q, body: Publish("c1", None, 1, "/", "", q, False, b"\x00\x00", body, False, 0, None)  # noqa: E731
    batches: list[list] = [[AuditChainOn(None, None), VhostAdd(None, None, "/"), ChannelOpen("c1", None, 1)]]
    batches.append([QueueDeclare("c1", None, 1, "/", name, False, False, False, False, {}) for name in "abc"])
    for i in range(6):
        batches.append([pub("a", b"m%d" % i), pub("b", b"n%d" % i), pub("nowhere", b"x")])
    batches.append([Get("c1", 7, 1, "/", "a", True), Get("c1", 8, 1, "/", "a", True)])
    batches.append([QueuePurge("c1", 9, 1, "/", "a")])
    batches.append([QueueDelete("c1", 10, 1, "/", "b", False, False)])
    batches.append([pub("c", b"last")])
    return batches


def _run(machine: StoredMachine, batches: list[list], start: int = 0) -> list[bytes]:
    heads = []
    for i, batch in enumerate(batches, start):
        machine.apply_batch(1_000_000 + 1000 * i, batch, i + 1)
        heads.append(machine.chain_head)
    return heads


def test_same_batches_same_heads_whether_or_not_events_are_recorded():
    """Two machines, one recording events (a history) and one not (audit_retention none): the same
    head after every batch, moved by every batch with events and only by those."""
    recorded: list = []
    with_history, without = StoredMachine(), StoredMachine()
    with_history.event_sink = lambda _index, events: recorded.extend(events)
    assert without.records_events is False
    batches = _batches()
    heads_a, heads_b = _run(with_history, batches), _run(without, batches)
    assert heads_a == heads_b
    assert with_history.event_seq == without.event_seq == len(recorded) > 20
    assert len(set(heads_a)) == len(heads_a) and E.CHAIN_ZERO not in heads_a  # each batch has events
    with_history.apply_batch(2_000_000, [ChannelOpen("c1", None, 2)], len(batches) + 1)
    assert with_history.chain_head == heads_a[-1]  # a batch without events leaves the head
    # The head chains the recorded events' packed fields, batch by batch (each batch has its own time).
    head, by_batch = E.CHAIN_ZERO, {}
    for event in recorded:
        by_batch.setdefault(event[1], []).append(E.chain_packed(E.chained_fields(event)))
    for stream in by_batch.values():
        head = E.chain_next(head, b"".join(stream))
    assert head == heads_a[-1]


def test_a_machine_installing_a_snapshot_continues_the_chain(tmp_path):
    """A machine that installs a snapshot taken after batch k (the head travels in it, MODEL_FIELDS)
    and applies the rest reaches the same heads as the one that applied everything."""
    batches = _batches()
    full = StoredMachine()
    heads = _run(full, batches)
    donor = StoredMachine()
    k = 5
    _run(donor, batches[:k])
    write_snapshot(str(tmp_path / "snap"), donor, b"meta")
    installed = StoredMachine()
    import_model(installed, read_snapshot(str(tmp_path / "snap"))[1])
    assert installed.chain_head == heads[k - 1] != E.CHAIN_ZERO
    assert _run(installed, batches[k:], start=k) == heads[k:]


def _raw_events(path) -> dict[int, bytes]:
    env = EV.open_history(str(path))
    try:
        with env.begin() as txn:
            db = EV.open_tables(env, create=False, txn=txn)["events"]
            return {EV.U64.unpack(k)[0]: bytes(v) for k, v in txn.cursor(db=db)}
    finally:
        env.close()


def test_the_writer_chains_every_event_and_lists_those_it_drops(tmp_path):
    """Retention keeps queue "a" only: every batch still has its chain record (dropped seqs listed),
    with the seal CRC of each kept event's record as the hint, the heads equal the machine's, and a
    batch whose events were all kept gives its head from them."""
    store = EventStore(str(tmp_path / "events"), RetentionPolicy("none", {}))
    machine = StoredMachine()
    machine.event_sink = store.append
    batches = _batches()
    batches[1] = [QueueDeclare("c1", None, 1, "/", "a", False, False, False, False,
                               {E.RETENTION_ARGUMENT: "metadata"}), *batches[1][1:]]
    heads = _run(machine, batches)
    assert store.flush()
    chain = store.records(E.CHAIN_TABLE)
    events = {r[0]: r for r in store.records()}
    store.close()
    assert chain[-1][4] == heads[-1] and chain[0][3] == E.CHAIN_ZERO
    assert [c[4] for c in chain] == [h for i, h in enumerate(heads) if i == 0 or h != heads[i - 1]]
    dropped = [seq for record in chain for seq in record[6]]
    assert dropped and len(events) + len(dropped) == machine.event_seq
    whole = 0
    raw = _raw_events(tmp_path / "events")
    for first, last, index, previous, head, seals, not_kept in chain:
        kept = [seq for seq in range(first, last + 1) if seq not in not_kept]
        assert kept == [seq for seq in range(first, last + 1) if seq in events]
        assert seals == b"".join(raw[seq][1:5] for seq in kept)  # each kept record's seal CRC, as written
        assert all(events[seq][10] == index for seq in kept)
        if not not_kept:
            whole += 1
            stream = b"".join(E.chain_packed(E.chained_fields(events[seq])) for seq in kept)
            assert E.chain_next(previous, stream) == head
    assert whole > 0
    assert EV.history_info(str(tmp_path / "events")).last_seq == machine.event_seq


def test_no_chain_until_the_cluster_turns_it_on_then_every_replica_chains_from_that_entry():
    """A cluster without an audit history does not chain (the head stays zero, no cost); the
    AuditChainOn entry starts the chain at the same point on every replica, recording or not."""
    batches = [[c for c in b if not isinstance(c, AuditChainOn)] for b in _batches()]
    plain = StoredMachine()
    _run(plain, batches)
    assert plain.chain_head == E.CHAIN_ZERO and plain.chain_on is False
    late = batches[:4] + [[AuditChainOn(None, None)]] + batches[4:]
    recorded: list = []
    a, b = StoredMachine(), StoredMachine()
    a.event_sink = lambda _index, events: recorded.extend(events)
    heads_a, heads_b = _run(a, late), _run(b, late)
    assert heads_a == heads_b and heads_a[3] == E.CHAIN_ZERO and heads_a[-1] != E.CHAIN_ZERO
