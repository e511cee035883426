"""A durable Raft journal for pysyncobj, in LMDB.

pysyncobj's own ``FileJournal`` writes through an mmap and never flushes it, so a power cut (and,
with unlucky timing, a full-cluster kill -9) can lose entries a majority acknowledged.  This journal
keeps the entries in memory for pysyncobj (which reads them constantly) and mirrors every change into
an LMDB environment.  Changes are buffered and written in one transaction by :meth:`flush`, which
fsyncs; :class:`raft.replica.Replica` calls it before any message leaves the node, so that

* a follower's acknowledgement of AppendEntries is sent only after the entries are on disk, and
* a vote or a leader's AppendEntries reflects a term and votedFor already on disk (Raft §5.1, §5.2).

The term and vote are additionally written synchronously in :meth:`setCurrentTerm`, as the Raft paper
requires them to be durable before anything reflecting them is sent.

Layout: ``entries`` table, key u64 Raft index -> ``u64 term + command``; ``meta`` table,
``term`` / ``vote`` / ``commit`` / ``first``.
"""

from __future__ import annotations

import os
import struct

import lmdb
import msgpack
from pysyncobj.journal import Journal

_U64 = struct.Struct(">Q")


class LmdbJournal(Journal):
    def __init__(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self._env = lmdb.open(path, map_size=1 << 38, max_dbs=4, sync=True, metasync=True, subdir=True)
        self._entries_db = self._env.open_db(b"entries")
        self._meta_db = self._env.open_db(b"meta")
        self._entries: list[tuple[bytes, int, int]] = []
        self._meta: dict[str, object] = {}
        self._pending: list[tuple] = []  # ("put", idx, term, cmd) | ("del_from", idx) | ("del_to", idx) | ("clear",)
        self._meta_dirty = False
        with self._env.begin() as txn:
            for key, value in txn.cursor(db=self._meta_db):
                self._meta[key.decode()] = msgpack.unpackb(value)
            for key, value in txn.cursor(db=self._entries_db):
                (idx,) = _U64.unpack(key)
                (term,) = _U64.unpack_from(value, 0)
                self._entries.append((bytes(value[8:]), idx, term))
        self.flushes = 0

    # ------------------------------------------------------------------ pysyncobj's interface

    def add(self, command: bytes, idx: int, term: int) -> None:
        self._entries.append((command, idx, term))
        self._pending.append(("put", idx, term, command))

    def clear(self) -> None:
        self._entries = []
        self._pending.append(("clear",))

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop the entries from list position ``entryFrom`` on (a conflicting suffix)."""
        if entryFrom >= len(self._entries):
            return
        first_idx = self._entries[entryFrom][1]
        del self._entries[entryFrom:]
        self._pending.append(("del_from", first_idx))

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        """Drop the entries before list position ``entryTo`` (compacted into a snapshot)."""
        if entryTo <= 0:
            return
        if entryTo >= len(self._entries):
            last_idx = self._entries[-1][1] + 1 if self._entries else 0
        else:
            last_idx = self._entries[entryTo][1]
        self._entries = self._entries[entryTo:]
        self._pending.append(("del_to", last_idx))
        # Compaction is not urgent for safety, but do not let it pile up in memory.

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self.flush()
        self._env.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        # The commit index is only a hint for replay after restart (entries up to it are known
        # committed); it is written with the next flush, never on its own.
        self._meta["commit"] = raftCommitIndex
        self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta.get("commit", 1))

    def setCurrentTerm(self, term: int, votedForNodeId) -> None:  # noqa: N802, N803
        self._meta["term"] = term
        self._meta["vote"] = votedForNodeId
        self._meta_dirty = True
        self.flush()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("term", 0))

    def getVotedForNodeId(self):  # noqa: N802
        return self._meta.get("vote")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_dirty:
            self.flush()

    # ------------------------------------------------------------------ durability

    @property
    def dirty(self) -> bool:
        return bool(self._pending) or self._meta_dirty

    def flush(self) -> None:
        """Write every buffered change in one transaction and fsync (LMDB ``sync=True``)."""
        if not self._pending and not self._meta_dirty:
            return
        pending, self._pending = self._pending, []
        with self._env.begin(write=True) as txn:
            for op in pending:
                kind = op[0]
                if kind == "put":
                    _, idx, term, command = op
                    txn.put(_U64.pack(idx), _U64.pack(term) + command, db=self._entries_db)
                elif kind == "del_from":
                    self._delete_range(txn, op[1], None)
                elif kind == "del_to":
                    self._delete_range(txn, None, op[1])
                else:
                    txn.drop(self._entries_db, delete=False)
            if self._meta_dirty:
                for key, value in self._meta.items():
                    txn.put(key.encode(), msgpack.packb(value), db=self._meta_db)
                self._meta_dirty = False
        self.flushes += 1

    def _delete_range(self, txn, start: int | None, stop: int | None) -> None:
        cursor = txn.cursor(db=self._entries_db)
        if not (cursor.set_range(_U64.pack(start)) if start is not None else cursor.first()):
            return
        while True:
            key = cursor.key()
            if not key or (stop is not None and _U64.unpack(key)[0] >= stop):
                return
            cursor.delete()  # moves to the next record
