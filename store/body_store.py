"""Message bodies on disk, one node-local LMDB environment, keyed by the deterministic message id.

Why a store of its own (issue 18, docs/design.md "Message bodies on disk"): the state machine keeps
only what routing, ordering, TTL, priority and delivery need, and a body is read back from here
when it is delivered.  The id is ``StateMachine.next_msg_id`` at publish, the same on every replica,
so every node stores the same body under the same key without any coordination, and a follower can
ask another member for a body by that id (``store/body_fetch.py``).

The store is *not* the durable copy in a cluster: the Raft journal is.  Writes are LMDB commits
with ``sync=False`` (no fsync per batch); ``Bodies.checkpoint`` syncs once before a snapshot lets
the journal be compacted, so that every body the snapshot refers to is on disk before the journal
record that carried it is deleted.

Layout: one named database ``bodies``, key u64 big-endian message id (ids grow, so a consumer
reading a queue in order reads keys in order), value the body bytes as published.  Bodies are
stored raw: LMDB puts a value above ~2 KiB on overflow pages of its own, which is what makes a
4 KiB body cost two 4 KiB pages (measured in bench/bodies.py).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

import lmdb

_KEY = struct.Struct(">Q")


def body_key(msg_id: int) -> bytes:
    return _KEY.pack(msg_id)


class BodyStore:
    """put/get/delete of bodies by message id; many at a time, one LMDB transaction each call."""

    def __init__(self, path: str, map_size: int = 1 << 40) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        # readahead=False: bodies are read one key (a few pages) at a time; the OS's read-ahead of
        # a store larger than memory would fill the page cache with bodies nobody asked for.
        self.env = lmdb.open(path, map_size=map_size, max_dbs=2, sync=False, metasync=False,
                             readahead=False, max_readers=64)
        self.db = self.env.open_db(b"bodies")

    def close(self) -> None:
        self.env.close()

    def sync(self) -> None:
        """fsync what was committed (before a snapshot lets the journal drop these bodies)."""
        self.env.sync(True)

    def put_many(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Store bodies; an id already present is overwritten (a journal replay re-puts the same
        body under the same id).  Returns the number written."""
        n = 0
        with self.env.begin(write=True, db=self.db) as txn:
            for msg_id, body in items:
                txn.put(_KEY.pack(msg_id), body)
                n += 1
        return n

    def delete_many(self, ids: Iterable[int]) -> int:
        """Delete bodies; an id that is absent is ignored.  Returns the number deleted."""
        n = 0
        with self.env.begin(write=True, db=self.db) as txn:
            for msg_id in ids:
                n += txn.delete(_KEY.pack(msg_id))
        return n

    def commit(self, puts: Iterable[tuple[int, bytes]], deletes: Iterable[int]) -> None:
        """Puts then deletes in one transaction (one batch of write-behind)."""
        with self.env.begin(write=True, db=self.db) as txn:
            for msg_id, body in puts:
                txn.put(_KEY.pack(msg_id), body)
            for msg_id in deletes:
                txn.delete(_KEY.pack(msg_id))

    def get(self, msg_id: int) -> bytes | None:
        with self.env.begin(db=self.db) as txn:
            return txn.get(_KEY.pack(msg_id))

    def get_many(self, ids: Iterable[int]) -> dict[int, bytes]:
        """The bodies of ``ids`` that are here, read in key order in one transaction."""
        found: dict[int, bytes] = {}
        with self.env.begin(db=self.db) as txn:
            get = txn.get
            for msg_id in sorted(ids):
                body = get(_KEY.pack(msg_id))
                if body is not None:
                    found[msg_id] = body
        return found

    def missing(self, ids: Iterable[int]) -> list[int]:
        """Which of ``ids`` are not stored here (a follower after installing a snapshot)."""
        out = []
        with self.env.begin(db=self.db) as txn:
            cursor = txn.cursor()
            for msg_id in sorted(ids):
                if not cursor.set_key(_KEY.pack(msg_id)):
                    out.append(msg_id)
        return out

    def __len__(self) -> int:
        with self.env.begin(db=self.db) as txn:
            return txn.stat(self.db)["entries"]

    def ids(self) -> list[int]:
        with self.env.begin(db=self.db) as txn:
            return [_KEY.unpack(k)[0] for k in txn.cursor().iternext(keys=True, values=False)]

    def disk_bytes(self) -> int:
        """Bytes of pages in use (the file may be larger: LMDB reuses freed pages, never shrinks)."""
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]
