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

**Segments.**  Bodies are written many at a time (``Bodies`` writes behind, oldest first), and one
write becomes one LMDB value, a *segment*: ``count`` (u32), the ids (u64 each, ascending), then
``count + 1`` offsets (u32) and the bodies back to back.  Stored one per value, a 4 KiB body took
two 4 KiB pages (LMDB puts a value above ~2 KiB on overflow pages of its own): 8 KiB of disk writes
per body, which on a three-node cluster sharing one disk cut confirmed publishes by a third once a
backlog went to disk (docs/benchmarks.md).  In a segment it takes its own size.

* Segments cover disjoint id ranges.  The node keeps, per segment, its ids (an ``array('Q')``) and
  which are still live (a ``bytearray``): 9 bytes per stored body, and a body is found by two
  bisections and read with one LMDB get, zero-copy, slicing only its bytes.
* A body whose id falls inside an existing segment's range (a journal replay re-putting a body
  the segment dropped, a body fetched after a snapshot install) goes to a second database,
  ``loose``, one value per body, as before.
* A deleted body is marked dead (the marks of a segment are stored too, in ``dead``, so a
  reopened store has the same bodies); a segment with none live is deleted, and one whose live bytes
  fell under a quarter of it is rewritten with the live ones (``compact``, at each checkpoint),
  so a few long-lived messages do not pin whole segments.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable

import lmdb

log = logging.getLogger(__name__)

#: Bytes written (not fsynced) after which a background fdatasync of the store starts.  Writes
#: are not synced one by one (the journal is the durable copy); a checkpoint syncs before a
#: snapshot.  With nothing synced in between, a checkpoint flushed everything written since the
#: last one, hundreds of MB with a growing backlog, on the event loop (0.4-0.7 s, measured with
#: bench/backlog.py at 2 GB).  Flushing in the background as the bytes come leaves it the last few.
BACKGROUND_FLUSH_BYTES = 32 << 20

_KEY = struct.Struct(">Q")
_COUNT = struct.Struct("<I")
_OFFSET = struct.Struct("<I")
#: A segment written by write-behind is cut at this size (the last body may pass it).
SEGMENT_BYTES = 8 << 20
#: ``compact`` rewrites a segment whose live bytes are below this fraction of its bodies.
COMPACT_BELOW = 0.25


def body_key(msg_id: int) -> bytes:
    return _KEY.pack(msg_id)


class _Segment:
    """What the node keeps in memory of one stored segment."""

    __slots__ = ("key", "ids", "alive", "live", "live_bytes", "bytes", "sizes")

    def __init__(self, key: int, ids: array, sizes: array) -> None:
        self.key = key
        self.ids = ids
        self.sizes = sizes  # body sizes, for live_bytes (4 bytes per body)
        self.alive = bytearray(b"\x01") * len(ids)
        self.live = len(ids)
        self.bytes = self.live_bytes = sum(sizes)

    @property
    def first(self) -> int:
        return self.ids[0]

    @property
    def last(self) -> int:
        return self.ids[-1]

    def position(self, msg_id: int) -> int:
        """Index of ``msg_id`` among this segment's live ids, or -1."""
        ids = self.ids
        i = bisect_left(ids, msg_id)
        return i if i < len(ids) and ids[i] == msg_id and self.alive[i] else -1


def _encode(items: list[tuple[int, bytes]]) -> tuple[bytes, bytes]:
    """(header, segment): the segment starts with its header, also kept apart (``heads``) so that
    opening the store reads headers only -- reading a segment's first bytes maps the whole value."""
    count = len(items)
    offsets = array("I", [0]) * (count + 1)
    total = 0
    for i, (_msg_id, body) in enumerate(items):
        total += len(body)
        offsets[i + 1] = total
    ids = array("Q", [msg_id for msg_id, _ in items])
    header = _COUNT.pack(count) + ids.tobytes() + offsets.tobytes()
    return header, b"".join([header, *(body for _, body in items)])


def _decode_header(value) -> tuple[array, array]:
    """(ids, offsets) of a stored segment."""
    (count,) = _COUNT.unpack_from(value, 0)
    ids = array("Q")
    ids.frombytes(bytes(value[4:4 + 8 * count]))
    offsets = array("I")
    offsets.frombytes(bytes(value[4 + 8 * count:4 + 12 * count + 4]))
    return ids, offsets


def _body_at(value, count: int, pos: int) -> bytes:
    base = 4 + 12 * count + 4
    start = _OFFSET.unpack_from(value, 4 + 8 * count + 4 * pos)[0]
    end = _OFFSET.unpack_from(value, 4 + 8 * count + 4 * pos + 4)[0]
    return bytes(value[base + start:base + end])


class BodyStore:
    """put/get/delete of bodies by message id; many at a time, one LMDB transaction each call.

    Safe to call from two threads (the event loop writes; the Raft thread reads for members that
    fetch bodies): the in-memory segment index is guarded by a lock."""

    def __init__(self, path: str, map_size: int = 1 << 40,
                 background_flush_bytes: int = BACKGROUND_FLUSH_BYTES) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        # readahead=False: bodies are read a few pages at a time; the OS's read-ahead of a store
        # larger than memory would fill the page cache with bodies nobody asked for.
        self.env = lmdb.open(path, map_size=map_size, max_dbs=4, sync=False, metasync=False,
                             readahead=False, max_readers=64)
        self.segments_db = self.env.open_db(b"segments")
        self.heads_db = self.env.open_db(b"heads")  # segment key -> its header (see _encode)
        self.loose_db = self.env.open_db(b"loose")
        self.dead_db = self.env.open_db(b"dead")  # segment key -> its alive bytearray, once one died
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []  # by first id; ranges disjoint
        self._firsts: list[int] = []
        self._next_key = 1
        self._loose = 0
        self._load_index()
        # Background flushes (see BACKGROUND_FLUSH_BYTES): fdatasync through a descriptor of our
        # own.  It flushes the file whichever descriptor wrote it, and touches no LMDB state, so
        # a thread may run it while the loop commits.
        self._flush_bytes = background_flush_bytes
        self._unflushed = 0
        self._flushing: threading.Thread | None = None
        self._data_fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
        self.background_flushes = 0

    def _load_index(self) -> None:
        with self.env.begin(db=self.heads_db, buffers=True) as txn:
            for key, value in txn.cursor():
                ids, offsets = _decode_header(value)
                sizes = array("I", [offsets[i + 1] - offsets[i] for i in range(len(ids))])
                self._segments.append(_Segment(_KEY.unpack(bytes(key))[0], ids, sizes))
            by_key = {segment.key: segment for segment in self._segments}
            for key, marks in txn.cursor(db=self.dead_db):
                segment = by_key.get(_KEY.unpack(bytes(key))[0])
                if segment is not None and len(marks) == len(segment.ids):
                    segment.alive = bytearray(marks)
                    segment.live = sum(segment.alive)
                    segment.live_bytes = sum(size for size, alive in zip(segment.sizes, segment.alive, strict=True)
                                             if alive)
        self._segments.sort(key=lambda s: s.first)
        self._firsts = [s.first for s in self._segments]
        self._next_key = 1 + max((s.key for s in self._segments), default=0)
        with self.env.begin(db=self.loose_db) as txn:
            self._loose = txn.stat(self.loose_db)["entries"]

    def close(self) -> None:
        if self._flushing is not None:
            self._flushing.join()
        os.close(self._data_fd)
        self.env.close()

    def sync(self) -> None:
        """fsync what was committed (before a snapshot lets the journal drop these bodies)."""
        self.env.sync(True)
        self._unflushed = 0

    def _written(self, nbytes: int) -> None:
        """Count bytes committed; past ``background_flush_bytes``, start a flush (one at a time)."""
        self._unflushed += nbytes
        if not self._flush_bytes or self._unflushed < self._flush_bytes:
            return
        if self._flushing is not None and self._flushing.is_alive():
            return
        self._unflushed = 0
        self.background_flushes += 1
        self._flushing = threading.Thread(target=self._flush_in_background, name="body-store-flush", daemon=True)
        self._flushing.start()

    def _flush_in_background(self) -> None:
        try:
            os.fdatasync(self._data_fd)
        except OSError as exc:  # the checkpoint's sync will meet it too, and stop the node
            log.warning("background flush of the body store failed: %s", exc)

    # ------------------------------------------------------------------ index

    def _segment_of(self, msg_id: int) -> _Segment | None:
        """The segment whose id range holds ``msg_id`` (live or not), if any."""
        i = bisect_right(self._firsts, msg_id) - 1
        if i >= 0:
            segment = self._segments[i]
            if msg_id <= segment.last:
                return segment
        return None

    def _insert(self, segment: _Segment) -> None:
        i = bisect_left(self._firsts, segment.first)
        self._segments.insert(i, segment)
        self._firsts.insert(i, segment.first)

    def _remove(self, segment: _Segment) -> None:
        i = bisect_left(self._firsts, segment.first)
        del self._segments[i]
        del self._firsts[i]

    # ------------------------------------------------------------------ writes

    def put_many(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Store bodies; one already stored is kept as it is (a journal replay re-puts the same
        body under the same id).  Returns the number written."""
        return self.commit(items, ())

    def commit(self, puts: Iterable[tuple[int, bytes]], deletes: Iterable[int]) -> int:
        """Puts then deletes in one transaction (one batch of write-behind); the puts written."""
        written = nbytes = 0
        with self._lock, self.env.begin(write=True) as txn:
            runs, loose, stale = self._plan(sorted(puts, key=lambda item: item[0]), txn)
            self._delete(stale, txn)  # replaced: the loose copy below is the one found
            for run in runs:
                key = self._next_key
                self._next_key += 1
                header, segment = _encode(run)
                txn.put(_KEY.pack(key), segment, db=self.segments_db)
                txn.put(_KEY.pack(key), header, db=self.heads_db)
                sizes = array("I", [len(body) for _, body in run])
                self._insert(_Segment(key, array("Q", [msg_id for msg_id, _ in run]), sizes))
                written += len(run)
                nbytes += len(segment)
            for msg_id, body in loose:
                txn.put(_KEY.pack(msg_id), body, db=self.loose_db)
                self._loose += 1
                written += 1
                nbytes += len(body)
            self._delete(deletes, txn)
        self._written(nbytes)
        return written

    def _plan(self, items: list[tuple[int, bytes]], txn) -> tuple[list[list[tuple[int, bytes]]], list, list[int]]:
        """Split sorted puts into new segments (runs between existing segments, cut at
        SEGMENT_BYTES), loose bodies (ids inside an existing segment's range) and the stored ids
        they replace.

        A put of an id already stored with the same body is dropped (a journal replay re-puts
        what it had).  With another body it replaces it: the model is what the last apply made
        of that id.  (A chaos run with full-cluster restarts found a node whose store kept, under
        an id, the body of another message that the node had applied under it before a restart,
        while every model agreed on the right one.  The cause was in Raft: the node had applied
        entries the cluster never committed, raft/replica.py ``_SyncObj__onMessageReceived``.)"""
        runs: list[list[tuple[int, bytes]]] = []
        loose: list[tuple[int, bytes]] = []
        stale: list[int] = []
        values: dict[int, object] = {}
        run: list[tuple[int, bytes]] = []
        run_gap = -1  # index of the existing segment after which the run lies
        run_bytes = 0
        previous = None
        for msg_id, body in items:
            if msg_id == previous:
                continue
            previous = msg_id
            gap = bisect_right(self._firsts, msg_id) - 1
            if gap >= 0 and msg_id <= self._segments[gap].last:  # inside a segment's range
                segment = self._segments[gap]
                pos = segment.position(msg_id)
                if pos >= 0:
                    value = values.get(segment.key)
                    if value is None:
                        value = values[segment.key] = txn.get(_KEY.pack(segment.key), db=self.segments_db)
                    if _body_at(value, len(segment.ids), pos) == body:
                        continue
                    stale.append(msg_id)
                else:
                    held = txn.get(_KEY.pack(msg_id), db=self.loose_db)
                    if held == body:
                        continue
                    if held is not None:
                        stale.append(msg_id)
                loose.append((msg_id, body))
                continue
            held = txn.get(_KEY.pack(msg_id), db=self.loose_db)
            if held is not None:
                if held != body:
                    stale.append(msg_id)
                    loose.append((msg_id, body))
                continue
            if run and (gap != run_gap or run_bytes >= SEGMENT_BYTES):
                runs.append(run)
                run, run_bytes = [], 0
            run.append((msg_id, body))
            run_gap = gap
            run_bytes += len(body)
        if run:
            runs.append(run)
        return runs, loose, stale

    def delete_many(self, ids: Iterable[int]) -> int:
        """Delete bodies; an id that is absent is ignored.  Returns the number deleted."""
        with self._lock, self.env.begin(write=True) as txn:
            return self._delete(ids, txn)

    def _delete(self, ids: Iterable[int], txn) -> int:
        deleted = 0
        emptied: list[_Segment] = []
        touched: dict[int, _Segment] = {}
        for msg_id in ids:
            segment = self._segment_of(msg_id)
            if segment is not None:
                pos = segment.position(msg_id)
                if pos >= 0:
                    segment.alive[pos] = 0
                    segment.live -= 1
                    segment.live_bytes -= segment.sizes[pos]
                    touched[segment.key] = segment
                    deleted += 1
                    if not segment.live:
                        emptied.append(segment)
                    continue
            if self._loose and txn.delete(_KEY.pack(msg_id), db=self.loose_db):
                self._loose -= 1
                deleted += 1
        for segment in emptied:
            if segment.live == 0 and segment in self._segments:
                txn.delete(_KEY.pack(segment.key), db=self.segments_db)
                txn.delete(_KEY.pack(segment.key), db=self.heads_db)
                txn.delete(_KEY.pack(segment.key), db=self.dead_db)
                self._remove(segment)
                touched.pop(segment.key, None)
        for key, segment in touched.items():
            txn.put(_KEY.pack(key), bytes(segment.alive), db=self.dead_db)
        return deleted

    def compact(self, below: float = COMPACT_BELOW) -> int:
        """Rewrite every segment whose live bytes are under ``below`` of its bodies with its live
        bodies only (same key, same range).  Returns how many were rewritten."""
        rewritten = 0
        with self._lock, self.env.begin(write=True, buffers=True) as txn:
            for segment in list(self._segments):
                if segment.live == 0 or segment.live_bytes >= below * segment.bytes:
                    continue
                key = _KEY.pack(segment.key)
                value = txn.get(key, db=self.segments_db)
                count = len(segment.ids)
                keep = [(segment.ids[i], _body_at(value, count, i)) for i in range(count) if segment.alive[i]]
                header, value = _encode(keep)
                txn.put(key, value, db=self.segments_db)
                txn.put(key, header, db=self.heads_db)
                txn.delete(key, db=self.dead_db)
                fresh = _Segment(segment.key, array("Q", [msg_id for msg_id, _ in keep]),
                                 array("I", [len(body) for _, body in keep]))
                i = bisect_left(self._firsts, segment.first)
                self._segments[i] = fresh
                self._firsts[i] = fresh.first
                rewritten += 1
        return rewritten

    # ------------------------------------------------------------------ reads

    def get(self, msg_id: int) -> bytes | None:
        return self.get_many((msg_id,)).get(msg_id)

    def get_many(self, ids: Iterable[int]) -> dict[int, bytes]:
        """The bodies of ``ids`` that are here, read in one transaction."""
        found: dict[int, bytes] = {}
        with self._lock, self.env.begin(buffers=True) as txn:
            values: dict[int, object] = {}
            for msg_id in sorted(ids):
                segment = self._segment_of(msg_id)
                if segment is not None:
                    pos = segment.position(msg_id)
                    if pos >= 0:
                        value = values.get(segment.key)
                        if value is None:
                            value = values[segment.key] = txn.get(_KEY.pack(segment.key), db=self.segments_db)
                        found[msg_id] = _body_at(value, len(segment.ids), pos)
                        continue
                if self._loose:
                    body = txn.get(_KEY.pack(msg_id), db=self.loose_db)
                    if body is not None:
                        found[msg_id] = bytes(body)
        return found

    def missing(self, ids: Iterable[int]) -> list[int]:
        """Which of ``ids`` are not stored here (a follower after installing a snapshot)."""
        with self._lock, self.env.begin(db=self.loose_db) as txn:
            out = []
            for msg_id in sorted(ids):
                segment = self._segment_of(msg_id)
                if segment is not None and segment.position(msg_id) >= 0:
                    continue
                if self._loose and txn.get(_KEY.pack(msg_id)) is not None:
                    continue
                out.append(msg_id)
            return out

    def __len__(self) -> int:
        with self._lock:
            return sum(s.live for s in self._segments) + self._loose

    def ids(self) -> list[int]:
        """Every stored id, ascending."""
        with self._lock, self.env.begin(db=self.loose_db) as txn:
            out = [msg_id for s in self._segments for msg_id, alive in zip(s.ids, s.alive, strict=True) if alive]
            out.extend(_KEY.unpack(k)[0] for k in txn.cursor().iternext(keys=True, values=False))
        out.sort()
        return out

    def disk_bytes(self) -> int:
        """Bytes of pages in use (the file may be larger: LMDB reuses freed pages, never shrinks)."""
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]
