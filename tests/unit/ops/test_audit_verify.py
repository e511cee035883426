"""``raftmq audit verify`` (ops/audit_verify.py, issue 36) on histories written by the real writer.

Each history is written by a real state machine and EventStore (store/disk/event_writer.py), closed,
then edited the way an administrator with LMDB access would: a record rewritten *with a valid seal*
(so the CRC check of issue 29 cannot see it), a record deleted, and a consistent rewrite that also
recomputes the chain records -- which only another node's history exposes.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import lmdb
import msgpack
import pytest

from raftmq.ops import audit_verify as AV
from raftmq.store.applier import StoredMachine
from raftmq.store.core import events as E
from raftmq.store.core.commands import AuditChainOn, ChannelOpen, Get, Publish, QueueDeclare, VhostAdd
from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import EventStore, RetentionPolicy
from raftmq.store.disk.sealed import seal, unseal


def _write(path: Path, policy: RetentionPolicy) -> None:
    """A closed history: queues "kept" (x-audit-retention metadata) and "other", publishes, gets."""
    store = EventStore(str(path), policy)
    machine = StoredMachine()
    machine.event_sink = store.append
    pub = lambda q, body: Publish("c1", None, 1, "/", "", q, False, b"\x00\x00", body, False, 0, None)  # noqa: E731
    batches = [[AuditChainOn(None, None), VhostAdd(None, None, "/"), ChannelOpen("c1", None, 1)],
               [QueueDeclare("c1", None, 1, "/", "kept", False, False, False, False, {E.RETENTION_ARGUMENT: "metadata"}),
                QueueDeclare("c1", None, 1, "/", "other", False, False, False, False, {})]]
    batches += [[pub("kept", b"k%d" % i), pub("other", b"o%d" % i)] for i in range(8)]
    batches += [[Get("c1", 5, 1, "/", "kept", True)], [Get("c1", 6, 1, "/", "other", True)]]
    for i, batch in enumerate(batches):
        machine.apply_batch(1_000_000 + 1000 * i, batch, i + 1)
    assert store.flush()
    store.close()


@pytest.fixture
def histories(tmp_path):
    """Two nodes' histories of the same batches: one keeps everything, one only queue "kept"."""
    full, partial = tmp_path / "n1", tmp_path / "n2"
    _write(full, RetentionPolicy("metadata"))
    _write(partial, RetentionPolicy("none"))
    return full, partial


def _env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path), max_dbs=len(EV.TABLES) + 1)


def _edit(path: Path, table: str, seq: int, change) -> list:
    """Rewrite one u64-keyed record with ``change(record)`` applied, sealed again (a valid CRC)."""
    env = _env(path)
    try:
        db = env.open_db(table.encode())
        key = EV.U64.pack(seq)
        with env.begin(write=True, db=db) as txn:
            record = msgpack.unpackb(unseal(key, txn.get(key)), raw=False)
            change(record)
            txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)))
        return record
    finally:
        env.close()


def _delete(path: Path, table: str, seq: int) -> None:
    env = _env(path)
    try:
        db = env.open_db(table.encode())
        with env.begin(write=True, db=db) as txn:
            assert txn.delete(EV.U64.pack(seq))
    finally:
        env.close()


def _seal_of(path: Path, seq: int) -> bytes:
    """The CRC32C bytes of an event record's seal as stored now."""
    env = _env(path)
    try:
        db = env.open_db(b"events")
        with env.begin(db=db) as txn:
            return bytes(txn.get(EV.U64.pack(seq))[1:5])
    finally:
        env.close()


def _cli(path: Path, against: Path | None = None) -> argparse.Namespace:
    return argparse.Namespace(snapshot=str(path), data_dir=None, against=str(against) if against else None)


def _kept_seq(path: Path, kind: int) -> int:
    return next(r[0] for r in EV.read_events(str(path)) if r[2] == kind)


def test_intact_histories_pass_alone_and_against_each_other(histories, capsys):
    """Both pass alone (the partial one's dropped events are chained through their stored leaves)
    and against each other: one summary line, exit 0."""
    full, partial = histories
    report = AV.verify_history(str(partial), str(full))
    assert report.findings == [] and report.not_kept > 0 and report.compared == report.batches > 10
    assert 0 < report.partial_batches < report.batches  # the batches with dropped events, proved against n1
    assert AV.main(_cli(full, partial)) == AV.EXIT_INTACT
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"intact: {full}: ") and "batches identical" in out[0]


def test_an_edited_event_is_named(histories, capsys):
    """A publish event's routing key rewritten (sealed again): named by seq and table, exit 1."""
    full, _ = histories
    seq = _kept_seq(full, E.PUBLISHED)
    _edit(full, "events", seq, lambda r: r.__setitem__(7, "forged-key"))
    assert EV.verify_history(str(full)) == []  # the CRC check cannot see it: the seal is valid
    assert AV.main(_cli(full)) == AV.EXIT_BAD
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"NOT INTACT: {full}: first bad event: seq {seq} (events): the record is not the one written")
    assert "forged-key" in first


def test_a_deleted_event_is_named(histories, capsys):
    full, _ = histories
    seq = _kept_seq(full, E.ROUTED)
    _delete(full, "events", seq)
    assert AV.main(_cli(full)) == AV.EXIT_BAD
    assert capsys.readouterr().out.splitlines()[0].endswith(
        f"first bad event: seq {seq} (events): missing: the chain says this node kept it (deleted)")


def test_a_deleted_batch_with_its_chain_record_is_found(histories):
    """A whole batch gone, events and chain record: the chain does not continue across the hole."""
    full, _ = histories
    chain = list(EV.read_table(str(full), E.CHAIN_TABLE))
    first, last = chain[4][0], chain[4][1]
    for seq in range(first, last + 1):
        _delete(full, "events", seq)
    _delete(full, E.CHAIN_TABLE, first)
    findings = AV.verify_history(str(full)).findings
    assert findings[0].seq == first and "missing" in findings[0].what


def test_a_consistent_rewrite_passes_alone_but_not_against_another_node(histories, capsys):
    """The event edited, its seal hint and its batch's head recomputed, and every later batch's previous
    and head too: the history alone is consistent; against the other node the event is named with
    the field that differs."""
    full, partial = histories
    seq = _kept_seq(partial, E.ROUTED)  # an event both nodes kept (routed to "kept")
    _edit(full, "events", seq, lambda r: r.__setitem__(8, 999_999))
    events = {r[0]: r for r in EV.read_events(str(full))}  # every event kept on this node
    seals = {seq: _seal_of(full, seq) for seq in events}
    head = None
    for batch in list(EV.read_table(str(full), E.CHAIN_TABLE)):
        first, last = batch[0], batch[1]
        if last < seq:
            continue

        def rechain(r, first=first, last=last):
            nonlocal head
            if head is not None:
                r[3] = head
            r[5] = b"".join(seals[s] for s in range(first, last + 1))
            stream = b"".join(E.chain_packed(E.chained_fields(events[s])) for s in range(first, last + 1))
            r[4] = head = E.chain_next(r[3], stream)
        _edit(full, E.CHAIN_TABLE, first, rechain)
    assert AV.verify_history(str(full)).findings == []
    assert AV.main(_cli(full, partial)) == AV.EXIT_BAD
    first_line = capsys.readouterr().out.splitlines()[0]
    assert f"first bad event: seq {seq} (events): differs than in {partial}: size: 999999 here" in first_line


def test_a_data_directory_is_read_through_its_events_folder(tmp_path, capsys):
    """--data-dir DIR reads DIR/events; --against accepts a data directory too."""
    for node in ("a", "b"):
        _write(tmp_path / node / "events", RetentionPolicy("metadata"))
    args = argparse.Namespace(snapshot=None, data_dir=str(tmp_path / "a"), against=str(tmp_path / "b"))
    assert AV.main(args) == AV.EXIT_INTACT
    assert capsys.readouterr().out.startswith(f"intact: {tmp_path / 'a' / 'events'}")
    shutil.rmtree(tmp_path / "b" / "events")
    assert AV.main(args) == AV.EXIT_USAGE


def test_an_event_changed_with_its_seal_hint_is_caught_by_its_batch_head(histories):
    """The event and its seal hint in the chain record rewritten together, the head left: the
    batch's events no longer give its head, and the finding names the batch's first seq in the
    chain table."""
    full, _ = histories
    seq = _kept_seq(full, E.ROUTED)
    _edit(full, "events", seq, lambda r: r.__setitem__(9, "forged-detail"))
    seal_now = _seal_of(full, seq)
    batch = next(b for b in EV.read_table(str(full), E.CHAIN_TABLE) if b[0] <= seq <= b[1])

    def new_hint(r):
        k = (seq - r[0]) * 4  # every event of this history is kept
        r[5] = r[5][:k] + seal_now + r[5][k + 4:]
    _edit(full, E.CHAIN_TABLE, batch[0], new_hint)
    findings = AV.verify_history(str(full)).findings
    assert [(f.seq, f.table) for f in findings] == [(batch[0], E.CHAIN_TABLE)]
    assert f"the events of seqs {batch[0]}..{batch[1]} do not give the batch's head" in findings[0].what
