"""A node restarting from a snapshot keeps the journal entries that follow it."""

from __future__ import annotations

import time

import msgpack

from raftmq.ops.local.node import free_port
from raftmq.raft.journal import AppendJournal
from raftmq.raft.replica import INSTALL, Replica
from raftmq.store.applier import SnapshotFiles
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.snapshot import write_snapshot

NO_OP = b"\x01"  # pysyncobj applies these without calling us


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


def test_a_journal_not_yet_compacted_to_the_snapshot_keeps_the_entries_after_it(tmp_path):
    """The snapshot file is renamed into place before the journal is compacted to it.  A node
    killed in between must not lose the entries after the snapshot at restart: they may be
    committed (Raft counted this node's copy), and pysyncobj would clear the whole journal."""
    address = free_address()
    data = tmp_path / "raft"
    journal = AppendJournal(str(data / "journal"))
    entries = [(NO_OP, i, 1) for i in range(1, 11)]
    for entry in entries:
        journal.add(*entry)
    journal.flush()
    meta = msgpack.packb([list(entries[5]), list(entries[4]), [address]], use_bin_type=True)
    write_snapshot(str(data / "snapshot.lmdb"), StateMachine(), meta)  # at index 6, journal still from 1
    journal._destroy()

    items: list[tuple] = []
    replica = Replica(address, [], str(data), "secret", sink=items.append,
                      snapshot_format=SnapshotFiles())
    try:
        deadline = time.monotonic() + 10
        while not items and time.monotonic() < deadline:  # pysyncobj loads the snapshot at its first tick
            time.sleep(0.01)
        assert items[0][:2] == (INSTALL, 6)
        indexes = [replica.journal[i][1] for i in range(len(replica.journal))]
        assert indexes[:6] == [5, 6, 7, 8, 9, 10]  # head dropped up to the snapshot, the rest kept
    finally:
        replica.destroy()
