"""Reading another process's body store, read-only (issue 34: a queue group's bodies read by the
node's main process, node/group_bodies.py).

A queue group's worker owns its body store (``<data>/groups/g<N>/bodies``, store/disk/body_store.py)
and, on a single node, its durable store (``.../state``, whose message records hold the persistent
bodies).  The main process, which holds every client connection, reads from them the bodies of
deliveries the worker sent without one (a consumer that holds its message until it settles it,
beyond what the worker carries over the link), when it writes them -- as one group reads its own.
LMDB lets several processes read an environment one process writes: each read is one short read
transaction of its own (a reader slot in the lock file, so the writer never reuses pages under it),
and sees the last commit.

**Nothing is trusted that is not verified.**  The reader keeps no copy of the writer's index: for each
segment it reads, it decodes and verifies the header stored at the head of the segment value itself
(its CRC32C) and the segment's dead marks (their CRC32C), in the same transaction as the bodies,
then checks each body against the CRC32C its verified header records (a loose body against its own;
a durable record against its seal).  What does not verify is returned as damaged, never as a body.
Its only memory of the store is where segments lie (first and last id per segment key, from the
``heads`` table), a guide to which segment to read: refreshed with the segments written since
(keys only grow) when an id is not found, and harmless when stale (a segment compacted or deleted
since is read and found not to hold the id, which is then looked for as a loose body).

The precedence is the writer's (``BodyStore.get_many``): a live position in a segment, else a loose
body; on a single node, else the durable store's message record.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable

import lmdb

from raftmq.integrity import checksum

from ..core.persistence import U64
from .body_store import _KEY, HeaderError, _body_at, _decode_header, _loose_body, _marks
from .durable import TABLES, _unpack
from .sealed import BadRecord, unseal

log = logging.getLogger(__name__)

_COUNT_AT = struct.Struct("<I")
_ID = struct.Struct("=Q")
_DAMAGED = ("damaged",)  # a segment that could not be read or verified (``_segment``)
_MADV_DONTNEED = 4  # (Linux)


def _madvise() -> Callable[[int, int, int], int] | None:
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _mapping_of(path: str) -> list[tuple[int, int]]:
    """The address ranges at which this process maps the file ``path`` (/proc/self/maps)."""
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if line.rstrip().endswith(path):
                    start, end = line.split()[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:
        pass
    return ranges  # an id in a segment header (an ``array("Q")``'s bytes: native order)


class BodyReader:
    """Verified reads of the body store at ``path`` (and, on a single node, of the message records
    of the durable store at ``durable_path``) that another process writes.  Opened lazily: the
    writer creates the environments at its start."""

    def __init__(self, path: str, durable_path: str | None = None) -> None:
        self.path = path
        self.durable_path = durable_path
        self._env: lmdb.Environment | None = None
        self._dbs: dict[str, lmdb._Database] = {}
        self._durable: lmdb.Environment | None = None
        self._messages: lmdb._Database | None = None
        self._firsts: list[int] = []  # segment first ids, sorted
        self._ranges: list[tuple[int, int, int]] = []  # (first, last, key), as _firsts
        self._max_key = 0  # the largest segment key seen in ``heads``
        self.reads = 0  # bodies read
        self._expected: dict[int, int] = {}  # damaged id -> the CRC32C its verified header records
        self.refreshes = 0  # times the segment ranges were read again
        # LMDB maps a whole segment value (8 MiB) into this process when one of its bodies is read:
        # those pages of the worker's file would stay in this process's VmRSS until the kernel
        # reclaims them (measured: 8.4 MiB mapped for one 64 KiB body).  ``drop_pages`` drops them
        # from this process's page tables (MADV_DONTNEED on a read-only shared file mapping: the
        # page cache keeps them, a later read maps them again; 6-75 µs a call measured).
        self._map: list[tuple[int, int]] = []
        self._madvise = _madvise()
        self.mapped = False  # read since the last ``drop_pages``

    # ------------------------------------------------------------------ opening

    def _open(self) -> bool:
        if self._env is not None:
            return True
        if not os.path.exists(os.path.join(self.path, "data.mdb")):
            return False
        # readonly with the lock file: a reader slot per transaction, so the writer keeps the pages
        # this process reads (lock=False would let it reuse them under a read).
        env = lmdb.open(self.path, readonly=True, create=False, max_dbs=5, readahead=False, map_size=1 << 40)
        try:
            dbs = {name: env.open_db(name.encode(), create=False) for name in ("segments", "heads", "loose", "dead")}
        except lmdb.Error:
            env.close()
            raise
        self._env, self._dbs = env, dbs
        self._map = _mapping_of(os.path.realpath(os.path.join(self.path, "data.mdb")))
        return True

    def _open_durable(self) -> bool:
        if self._durable is not None:
            return True
        if self.durable_path is None or not os.path.exists(os.path.join(self.durable_path, "data.mdb")):
            return False
        env = lmdb.open(self.durable_path, readonly=True, create=False, max_dbs=len(TABLES) + 4,
                        map_size=1 << 40)
        try:
            self._messages = env.open_db(b"messages", create=False)
        except lmdb.Error:
            env.close()
            raise
        self._durable = env
        return True

    def drop_pages(self) -> None:
        """Drop the store's pages from this process's page tables (see ``__init__``): the caller
        does it after its reads, at most every few tens of milliseconds (a call costs 6-75 µs)."""
        self.mapped = False
        if self._madvise is not None:
            for start, end in self._map:
                self._madvise(start, end - start, _MADV_DONTNEED)

    def expected_crc(self, msg_id: int) -> int | None:
        """The CRC32C a body found damaged was written with, when a verified header said it: an
        intact copy fetched from a member is checked against it too (``body_fetch.fetch_intact``)."""
        return self._expected.pop(msg_id, None)

    def close(self) -> None:
        for env in (self._env, self._durable):
            if env is not None:
                env.close()
        self._env = self._durable = None

    # ------------------------------------------------------------------ where segments lie

    def _refresh(self, txn: lmdb.Transaction) -> bool:
        """Add the segments written since the last look (keys only grow, ``BodyStore._write``);
        whether there were any."""
        self.refreshes += 1
        cursor = txn.cursor(db=self._dbs["heads"])
        found = cursor.set_range(_KEY.pack(self._max_key + 1))
        added = False
        while found:
            key = bytes(cursor.key())
            value = cursor.value()
            if len(key) == 8:
                number = _KEY.unpack(key)[0]
                self._max_key = max(self._max_key, number)
                # first and last id only: a guide, verified when the segment itself is read
                if len(value) >= 16:
                    (count,) = _COUNT_AT.unpack_from(value, 4)
                    if count and len(value) >= 8 + 8 * count:
                        first = _ID.unpack_from(value, 8)[0]
                        last = _ID.unpack_from(value, 8 + 8 * (count - 1))[0]
                        self._ranges.append((first, last, number))
                        added = True
            found = cursor.next()
        if added:
            self._ranges.sort()
            self._firsts = [r[0] for r in self._ranges]
        return added

    def _segment_key(self, msg_id: int) -> int | None:
        i = bisect_right(self._firsts, msg_id) - 1
        if i >= 0:
            first, last, key = self._ranges[i]
            if msg_id <= last:
                return key
        return None

    # ------------------------------------------------------------------ reads

    def get_many(self, ids: Iterable[int], damaged: list[int] | None = None) -> dict[int, bytes]:
        """The intact bodies of ``ids`` found, each verified; ids whose stored body does not verify
        (or could not be read) go to ``damaged``, ids not found anywhere are left out.

        Where: the segments known, then (an id not found) the segments written since, then on a
        single node the durable store's records, and last the segments' ranges read again whole
        (one deleted since may have hidden a newer one that starts before it)."""
        missed = sorted(set(ids))
        found: dict[int, bytes] = {}
        bad: list[int] = []
        try:
            if missed and self._open():
                assert self._env is not None
                with self._env.begin(buffers=True) as txn:
                    missed = self._read(txn, missed, found, bad)
                    if missed and self._refresh(txn):
                        missed = self._read(txn, missed, found, bad)
            if missed and self._open_durable():
                missed = self._read_durable(missed, found, bad)
            if missed and self._env is not None:
                with self._env.begin(buffers=True) as txn:
                    self._ranges, self._firsts, self._max_key = [], [], 0
                    self._refresh(txn)
                    self._read(txn, missed, found, bad)
        except lmdb.Error as exc:  # a damaged page on the way (opening, a walk): what is not read is damaged
            log.error("body store %s read by the main process: LMDB error: %s", self.path, exc)
            bad.extend(msg_id for msg_id in missed if msg_id not in found and msg_id not in bad)
        self.reads += len(found)
        if found:
            self.mapped = True
        if bad:
            log.error("body store %s read by the main process: %d message bodies damaged: %s", self.path,
                      len(bad), ", ".join(map(str, bad[:10])))
            if damaged is not None:
                damaged.extend(bad)
        return found

    def _read(self, txn: lmdb.Transaction, wanted: list[int], found: dict[int, bytes],
              bad: list[int]) -> list[int]:
        """Read ``wanted`` (sorted) into ``found`` or ``bad``; returns the ids found nowhere."""
        segments, dead, loose = self._dbs["segments"], self._dbs["dead"], self._dbs["loose"]
        # per segment key: (value, ids, crcs, marks), None when absent, _DAMAGED when its header fails
        opened: dict[int, tuple | None] = {}
        missed: list[int] = []
        for msg_id in wanted:
            key = self._segment_key(msg_id)
            segment = None
            if key is not None:
                if key in opened:
                    segment = opened[key]
                else:
                    segment = opened[key] = self._segment(txn, key, segments, dead)
                if segment is not None and segment is not _DAMAGED:
                    value, seg_ids, crcs, marks = segment
                    pos = bisect_left(seg_ids, msg_id)
                    if pos < len(seg_ids) and seg_ids[pos] == msg_id and (marks is None or marks[pos]):
                        try:
                            body = _body_at(value, len(seg_ids), pos)
                        except struct.error:
                            bad.append(msg_id)
                            continue
                        if checksum(body) == crcs[pos]:
                            found[msg_id] = body
                        else:
                            bad.append(msg_id)
                            self._expected[msg_id] = crcs[pos]
                        continue
            try:
                value = txn.get(_KEY.pack(msg_id), db=loose)
            except lmdb.Error:
                bad.append(msg_id)
                continue
            if value is None:
                # (in the range of a segment that does not verify: one of its bodies, unreadable)
                (bad if segment is _DAMAGED else missed).append(msg_id)
                continue
            loose_body = _loose_body(value)
            if loose_body is None:
                bad.append(msg_id)
            else:
                found[msg_id] = loose_body
        return missed

    def _segment(self, txn: lmdb.Transaction, key: int, segments: lmdb._Database,
                 dead: lmdb._Database) -> tuple | None:
        """A segment's value with its verified header and dead marks; None: deleted; ``_DAMAGED``: its
        value is missing under a header, or does not verify (its ids not found loose are then
        reported damaged, as the writer reports them)."""
        try:
            value = txn.get(_KEY.pack(key), db=segments)
            if value is None:
                # deleted (its header too), or lost under a header the writer still indexes (a
                # store rebuilt from what could be read): its bodies are damaged for the writer too
                return _DAMAGED if txn.get(_KEY.pack(key), db=self._dbs["heads"]) is not None else None
            ids, _offsets, crcs = _decode_header(value)
            raw_marks = txn.get(_KEY.pack(key), db=dead)
        except (lmdb.Error, HeaderError, struct.error) as exc:
            log.error("body store %s: segment %d unreadable from the main process: %s", self.path, key, exc)
            return _DAMAGED
        marks = None
        if raw_marks is not None:
            marks = _marks(raw_marks, len(ids))
            if marks is None:  # damaged marks: the writer keeps them all live but loose copies
                marks = bytearray(b"\x01") * len(ids)
                for i, msg_id in enumerate(ids):
                    if txn.get(_KEY.pack(msg_id), db=self._dbs["loose"]) is not None:
                        marks[i] = 0
        return value, ids, crcs, marks

    def _read_durable(self, ids: list[int], found: dict[int, bytes], bad: list[int]) -> list[int]:
        """A single node's persistent bodies: the durable store's message records, each verified by
        its seal (store/disk/sealed.py), as ``DurableStore.message_bodies`` reads them."""
        assert self._durable is not None
        missed = []
        with self._durable.begin(db=self._messages) as txn:
            for msg_id in ids:
                key = U64.pack(msg_id)
                try:
                    raw = txn.get(key)
                except lmdb.Error:
                    bad.append(msg_id)
                    continue
                if raw is None:
                    missed.append(msg_id)
                    continue
                try:
                    found[msg_id] = _unpack(unseal(key, raw))[3]
                except BadRecord:
                    bad.append(msg_id)
        return missed

