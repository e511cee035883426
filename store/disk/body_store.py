"""Message bodies on disk, one node-local LMDB environment, keyed by the deterministic message id.

Why a store of its own (issue 18, docs/design.md "Message bodies on disk"): the state machine keeps
only what routing, ordering, TTL, priority and delivery need, and a body is read back from here
when it is delivered.  The id is ``StateMachine.next_msg_id`` at publish, the same on every replica,
so every node stores the same body under the same key without any coordination, and a follower can
ask another member for a body by that id (``store/disk/body_fetch.py``).

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

**Checksums** (issue 29, docs/design.md "Damaged bodies").  Every stored body carries a CRC32C
(``store/integrity.checksum``) computed once when it is written: a segment's header holds one per
body and ends with the CRC32C of the header itself; a loose value is the body's CRC32C (4 bytes)
then the body; a segment's dead marks end with their own CRC32C.  Opening the store verifies every
header (a damaged ``heads`` copy is replaced by the segment's own copy when that one is intact) and
every set of marks; every read of a body (``get_many``, the replay's compare in ``_plan``,
``compact``, serving a peer, the scrubber) verifies its bytes against the CRC from the verified
header.  A body that fails is never returned: it is reported (``damaged``) so that the caller
replaces it from a peer (``repair``) or refuses to deliver it.  An LMDB error on a read path
(``lmdb.Error``: a damaged B-tree page) is treated the same way: what could not be read is damaged.

A store written before checksums (no ``format`` key in the ``meta`` database) is upgraded once,
when opened: each segment is rewritten with the CRC32C of the bytes it holds (one transaction per
segment, recognisable by its magic, so an upgrade cut short resumes), then the loose values and
dead marks, and the format key, in one transaction.  Damage that happened before the upgrade
cannot be told from data: those bodies are trusted once.
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

from raftmq.integrity import Damage, checksum

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
_CRC = struct.Struct("<I")
#: The first bytes of a segment written with checksums (a segment of the first format starts with
#: its count, which could never be this large: 0x02475342 bodies need more than 8 MiB of header).
MAGIC = b"BSG\x02"
FORMAT = b"2"
_FORMAT_KEY = b"format"
#: A segment written by write-behind is cut at this size (the last body may pass it).
SEGMENT_BYTES = 8 << 20
#: ``compact`` rewrites a segment whose live bytes are below this fraction of its bodies.
COMPACT_BELOW = 0.25


#: A key or value as LMDB returns it: bytes, or a memoryview in a ``buffers=True`` transaction.
Stored = bytes | memoryview
#: A body with its id and CRC32C, as a segment or loose value is written from.
_Item = tuple[int, bytes, int]


def body_key(msg_id: int) -> bytes:
    return _KEY.pack(msg_id)


class _Segment:
    """What the node keeps in memory of one stored segment."""

    __slots__ = ("key", "ids", "alive", "live", "live_bytes", "bytes", "sizes", "crcs")

    def __init__(self, key: int, ids: array, sizes: array, crcs: array) -> None:
        self.key = key
        self.ids = ids
        self.sizes = sizes  # body sizes, for live_bytes (4 bytes per body)
        self.crcs = crcs  # each body's CRC32C, from the verified header (4 bytes per body)
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


def _encode(items: list[tuple[int, bytes, int]]) -> tuple[bytes, bytes]:
    """(header, segment) of ``(id, body, crc)`` items: the segment starts with its header, also kept
    apart (``heads``) so that opening the store reads headers only -- reading a segment's first
    bytes maps the whole value.  The header: MAGIC, count (u32), the ids (u64), count + 1 offsets
    (u32), the bodies' CRC32Cs (u32), then the CRC32C of all that (u32)."""
    count = len(items)
    offsets = array("I", [0]) * (count + 1)
    total = 0
    for i, item in enumerate(items):
        total += len(item[1])
        offsets[i + 1] = total
    ids = array("Q", [item[0] for item in items])
    crcs = array("I", [item[2] for item in items])
    header = b"".join([MAGIC, _COUNT.pack(count), ids.tobytes(), offsets.tobytes(), crcs.tobytes()])
    header += _CRC.pack(checksum(header))
    return header, b"".join([header, *(item[1] for item in items)])


def _key_of(key: Stored) -> int | None:
    """The id or segment number of a stored key; None for a damaged key (not 8 bytes)."""
    return _KEY.unpack(bytes(key))[0] if len(key) == 8 else None


def _header_size(count: int) -> int:
    return 16 * count + 16


class HeaderError(ValueError):
    """A segment header that does not verify (damaged, truncated, or of the first format)."""


def _decode_header(value: Stored) -> tuple[array, array, array]:
    """(ids, offsets, crcs) of a verified segment header (``value`` may be the whole segment).
    Raises HeaderError if it does not verify."""
    if len(value) < 16 or bytes(value[:4]) != MAGIC:
        raise HeaderError("no segment header (bad magic)")
    (count,) = _COUNT.unpack_from(value, 4)
    size = _header_size(count)
    if size > len(value):
        raise HeaderError(f"header of {count} bodies is longer than its {len(value)} bytes")
    (crc,) = _CRC.unpack_from(value, size - 4)
    if checksum(value[:size - 4]) != crc:
        raise HeaderError("header checksum mismatch")
    ids = array("Q")
    ids.frombytes(bytes(value[8:8 + 8 * count]))
    offsets = array("I")
    offsets.frombytes(bytes(value[8 + 8 * count:12 + 12 * count]))
    crcs = array("I")
    crcs.frombytes(bytes(value[12 + 12 * count:12 + 16 * count]))
    if offsets[0] != 0 or any(offsets[i] > offsets[i + 1] for i in range(count)):
        raise HeaderError("offsets out of order")
    return ids, offsets, crcs


def _body_at(value: Stored, count: int, pos: int) -> bytes:
    """The bytes of body ``pos`` as the segment value's own offsets say (not verified: the caller
    checks them against the body's CRC32C, which also catches damaged offsets)."""
    base = _header_size(count)
    start = _OFFSET.unpack_from(value, 8 + 8 * count + 4 * pos)[0]
    end = _OFFSET.unpack_from(value, 12 + 8 * count + 4 * pos)[0]
    return bytes(value[base + start:base + end])


def _loose_value(body: bytes, crc: int) -> bytes:
    return _CRC.pack(crc) + body


def _loose_body(value: Stored | None) -> bytes | None:
    """The body of a loose value if it verifies, else None."""
    if value is None or len(value) < 4:
        return None
    body = bytes(value[4:])
    return body if checksum(body) == _CRC.unpack_from(value, 0)[0] else None


def _marks_value(alive: bytearray) -> bytes:
    return bytes(alive) + _CRC.pack(checksum(alive))


def _marks(value: Stored | None, count: int) -> bytearray | None:
    """A segment's verified dead marks, None if they do not verify."""
    if value is None or len(value) != count + 4:
        return None
    marks = bytearray(value[:count])
    return marks if checksum(marks) == _CRC.unpack_from(value, count)[0] else None


def _decode_legacy_header(value: Stored) -> tuple[array, array]:
    """(ids, offsets) of a segment of the first format (no checksums)."""
    (count,) = _COUNT.unpack_from(value, 0)
    ids = array("Q")
    ids.frombytes(bytes(value[4:4 + 8 * count]))
    offsets = array("I")
    offsets.frombytes(bytes(value[4 + 8 * count:4 + 12 * count + 4]))
    return ids, offsets


class BodyStore:
    """put/get/delete of bodies by message id; many at a time, one LMDB transaction each call.

    Safe to call from two threads (the event loop writes; the Raft thread reads for members that
    fetch bodies; the scrubber's thread reads without the lock, in transactions of its own): the
    in-memory segment index is guarded by a lock.

    Damage (a body or header that does not verify, see the module docstring) is counted in
    ``damaged_total`` once per body; ``damaged`` holds the ids found damaged and not replaced
    since; ``damage`` lists what opening the store found."""

    def __init__(self, path: str, map_size: int = 1 << 40,
                 background_flush_bytes: int = BACKGROUND_FLUSH_BYTES) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        # readahead=False: bodies are read a few pages at a time; the OS's read-ahead of a store
        # larger than memory would fill the page cache with bodies nobody asked for.
        self.env_map_size = map_size
        self.env = lmdb.open(path, map_size=map_size, max_dbs=5, sync=False, metasync=False,
                             readahead=False, max_readers=64)
        self.segments_db = self.env.open_db(b"segments")
        self.heads_db = self.env.open_db(b"heads")  # segment key -> its header (see _encode)
        self.loose_db = self.env.open_db(b"loose")
        self.dead_db = self.env.open_db(b"dead")  # segment key -> its alive bytearray, once one died
        self.meta_db = self.env.open_db(b"meta")  # b"format" -> FORMAT
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []  # by first id; ranges disjoint
        self._firsts: list[int] = []
        self._next_key = 1
        self._loose = 0
        self.damage: list[Damage] = []  # what opening the store found
        self.damaged: set[int] = set()  # ids found damaged, not replaced since
        self.damaged_total = 0  # bodies found damaged (each once until replaced)
        self.upgraded = 0  # segments given checksums when a store of the first format was opened
        self.rebuilt = False  # LMDB's own pages were damaged: the store was copied (``_rebuild``)
        unreadable = self._walk()
        if unreadable:
            self._rebuild(unreadable)
        self._upgrade()
        self._load_index()
        # Background flushes (see BACKGROUND_FLUSH_BYTES): fdatasync through a descriptor of our
        # own.  It flushes the file whichever descriptor wrote it, and touches no LMDB state, so
        # a thread may run it while the loop commits.
        self._flush_bytes = background_flush_bytes
        self._unflushed = 0
        self._flushing: threading.Thread | None = None
        self._data_fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
        self.background_flushes = 0

    # ------------------------------------------------------------------ opening

    def _dbs(self) -> dict[bytes, lmdb._Database]:
        return {b"segments": self.segments_db, b"heads": self.heads_db, b"loose": self.loose_db,
                b"dead": self.dead_db, b"meta": self.meta_db}

    def _walk(self) -> str:
        """Read every key of every table (and the small values: headers, marks, meta), in order:
        what LMDB's B-tree pages hold.  A damaged page makes LMDB fail (or find nonsense) there;
        writing through it would fail too, or worse.  Returns what failed, "" if nothing did."""
        try:
            with self.env.begin(buffers=True) as txn:
                for name, db in self._dbs().items():
                    cursor = txn.cursor(db=db)
                    # The small values are read too (their pages are walked); the large ones not.
                    keys: Iterable[memoryview] = (
                        (key for key, _value in cursor.iternext(keys=True, values=True))
                        if name in (b"heads", b"dead", b"meta") else cursor.iternext(keys=True, values=False))
                    for key in keys:
                        if name != b"meta" and len(key) != 8:
                            return f"a key of {len(key)} bytes in {name.decode()}"
        except lmdb.Error as exc:
            return f"{exc}"
        return ""

    def _rebuild(self, why: str) -> None:
        """LMDB's own pages are damaged: copy every value that can still be read into a fresh
        environment and put it in place of the old one (kept beside it as ``data.mdb.damaged``).
        What could not be read is missing afterwards: a cluster node fetches the bodies its
        snapshot needs from the members at start (``Bodies.after_install``), as after any
        snapshot install; the values copied are verified as always when read."""
        self._found("LMDB pages", f"{why}; copying what can be read into a new store")
        fresh_dir = os.path.join(self.path, "rebuild")
        os.makedirs(fresh_dir, exist_ok=True)
        for file_name in ("data.mdb", "lock.mdb"):
            if os.path.exists(os.path.join(fresh_dir, file_name)):
                os.unlink(os.path.join(fresh_dir, file_name))
        fresh = lmdb.open(fresh_dir, map_size=self.env.info()["map_size"], max_dbs=5, sync=False)
        copied = lost = 0
        for name, db in self._dbs().items():
            target = fresh.open_db(name)
            keys: list[bytes] = []
            try:
                with self.env.begin(db=db) as txn:
                    for key in txn.cursor().iternext(keys=True, values=False):
                        keys.append(bytes(key))
            except lmdb.Error:
                pass  # the keys after a damaged page are lost with it (segments: probed below)
            if name in (b"segments", b"heads", b"dead") and keys:
                # Segment keys are 1, 2, 3...: those on a damaged leaf can still be found by a get
                # (it fails for the damaged leaf's keys only).
                known = set(keys)
                # (Up to a bound: a damaged key may read as any number.)
                top = min(max(_key_of(k) or 0 for k in keys), 4 * len(keys) + 1024)
                keys.extend(_KEY.pack(k) for k in range(1, top + 64) if _KEY.pack(k) not in known)
                keys.sort()
            for key in keys:
                if name != b"meta" and len(key) != 8:
                    lost += 1
                    continue
                try:
                    with self.env.begin(db=db) as txn:
                        value = txn.get(key)
                except lmdb.Error:
                    lost += 1
                    continue
                if value is not None:
                    with fresh.begin(write=True, db=target) as txn:
                        txn.put(key, value)
                    copied += 1
        fresh.sync(True)
        fresh.close()
        self.env.close()
        os.replace(os.path.join(self.path, "data.mdb"), os.path.join(self.path, "data.mdb.damaged"))
        os.replace(os.path.join(fresh_dir, "data.mdb"), os.path.join(self.path, "data.mdb"))
        for file_name in ("lock.mdb",):
            for where in (fresh_dir, self.path):
                if os.path.exists(os.path.join(where, file_name)):
                    os.unlink(os.path.join(where, file_name))
        os.rmdir(fresh_dir)
        self.env = lmdb.open(self.path, map_size=self.env_map_size, max_dbs=5, sync=False, metasync=False,
                             readahead=False, max_readers=64)
        self.segments_db = self.env.open_db(b"segments")
        self.heads_db = self.env.open_db(b"heads")
        self.loose_db = self.env.open_db(b"loose")
        self.dead_db = self.env.open_db(b"dead")
        self.meta_db = self.env.open_db(b"meta")
        self.rebuilt = True
        log.error("body store %s rebuilt: %d values copied, %d unreadable (the damaged file is kept as "
                  "data.mdb.damaged)", self.path, copied, lost)

    def _upgrade(self) -> None:
        """Give a store of the first format (no checksums) its checksums, once (module docstring)."""
        with self.env.begin(db=self.meta_db) as txn:
            if txn.get(_FORMAT_KEY) == FORMAT:
                return
        with self.env.begin(db=self.heads_db) as txn:
            keys = [bytes(key) for key in txn.cursor().iternext(keys=True, values=False)]
        for key in keys:
            with self.env.begin(write=True) as txn:
                value = txn.get(key, db=self.segments_db)
                if value is None or value[:4] == MAGIC:
                    continue  # upgraded before an interrupted upgrade stopped
                ids, offsets = _decode_legacy_header(value)
                base = 4 + 12 * len(ids) + 4
                items = []
                for i, msg_id in enumerate(ids):
                    body = value[base + offsets[i]:base + offsets[i + 1]]
                    items.append((msg_id, body, checksum(body)))
                header, segment = _encode(items)
                txn.put(key, segment, db=self.segments_db)
                txn.put(key, header, db=self.heads_db)
                self.upgraded += 1
        with self.env.begin(write=True) as txn:
            loose = list(txn.cursor(db=self.loose_db))
            for key, body in loose:
                txn.put(key, _loose_value(body, checksum(body)), db=self.loose_db)
            for key, marks in list(txn.cursor(db=self.dead_db)):
                txn.put(key, _marks_value(bytearray(marks)), db=self.dead_db)
            txn.put(_FORMAT_KEY, FORMAT, db=self.meta_db)
        if keys or loose:
            log.warning("body store %s was written without checksums: %d segments and %d loose bodies "
                        "given checksums of the bytes they hold (not verifiable before)", self.path,
                        self.upgraded, len(loose))

    def _found(self, where: str, what: str) -> None:
        damage = Damage("bodies", os.path.join(self.path, "data.mdb"), where, what)
        self.damage.append(damage)
        log.error("body store damaged: %s", damage)

    def _load_index(self) -> None:
        unusable: list[bytes] = []
        repaired: list[tuple[bytes, bytes]] = []
        try:
            with self.env.begin(buffers=True) as txn:
                for raw_key, value in txn.cursor(db=self.heads_db):
                    key = bytes(raw_key)
                    if _key_of(key) is None:
                        self._found(f"header key {key.hex()}", "not a segment key; dropped")
                        unusable.append(key)
                        continue
                    try:
                        ids, offsets, crcs = _decode_header(value)
                    except (HeaderError, struct.error) as exc:
                        # The segment starts with the same header: intact there, it replaces this one.
                        try:
                            segment_value = txn.get(key, db=self.segments_db)
                            if segment_value is None:
                                raise HeaderError("no segment") from exc
                            ids, offsets, crcs = _decode_header(segment_value)
                        except (HeaderError, struct.error, lmdb.Error) as again:
                            self._found(f"segment {_KEY.unpack(key)[0]}",
                                        f"header: {exc}; the segment's copy: {again}; segment dropped")
                            unusable.append(key)
                            continue
                        self._found(f"segment {_KEY.unpack(key)[0]}", f"header: {exc}; replaced by the segment's copy")
                        repaired.append((key, bytes(segment_value[:_header_size(len(ids))])))
                    sizes = array("I", [offsets[i + 1] - offsets[i] for i in range(len(ids))])
                    self._segments.append(_Segment(_KEY.unpack(key)[0], ids, sizes, crcs))
                by_key = {segment.key: segment for segment in self._segments}
                for raw_key, value in txn.cursor(db=self.dead_db):
                    segment_key = _key_of(raw_key)
                    segment = by_key.get(segment_key) if segment_key is not None else None
                    if segment is None:
                        continue
                    marks = _marks(value, len(segment.ids))
                    if marks is None:
                        # Kept live (a restart's sweep deletes what no message needs), except the
                        # ids with a loose copy: that one replaced the segment's (``_plan``).
                        self._found(f"dead marks of segment {segment.key}", "checksum mismatch; "
                                    "all kept live but those replaced by a loose copy")
                        marks = bytearray(b"\x01") * len(segment.ids)
                        for i, msg_id in enumerate(segment.ids):
                            if txn.get(_KEY.pack(msg_id), db=self.loose_db) is not None:
                                marks[i] = 0
                    segment.alive = marks
                    segment.live = sum(marks)
                    segment.live_bytes = sum(size for size, alive in zip(segment.sizes, marks, strict=True) if alive)
                self._next_key = 1 + max((_key_of(k) or 0 for k in
                                          txn.cursor(db=self.segments_db).iternext(keys=True, values=False)),
                                         default=0)
        except lmdb.Error as exc:
            self._found("index", f"LMDB error reading the headers: {exc}")
        self._segments.sort(key=lambda s: s.first)
        # Two segments whose ranges overlap cannot both be right (a damaged header that verified?
        # never expected): keep the first.
        kept: list[_Segment] = []
        for segment in self._segments:
            if kept and segment.first <= kept[-1].last:
                self._found(f"segment {segment.key}", "id range overlaps another segment's; dropped")
                unusable.append(_KEY.pack(segment.key))
                continue
            kept.append(segment)
        self._segments = kept
        self._firsts = [s.first for s in self._segments]
        self._next_key = max(self._next_key, 1 + max((s.key for s in self._segments), default=0))
        if unusable or repaired:
            with self.env.begin(write=True) as txn:
                for key, header in repaired:
                    txn.put(key, header, db=self.heads_db)
                for key in unusable:
                    for db in (self.segments_db, self.heads_db, self.dead_db):
                        txn.delete(key, db=db)
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

    def _damaged(self, ids: Iterable[int]) -> list[int]:
        """Record ids found damaged (lock held); returns those not known before."""
        new = [msg_id for msg_id in ids if msg_id not in self.damaged]
        if new:
            self.damaged.update(new)
            self.damaged_total += len(new)
            shown = ", ".join(map(str, new[:10])) + (", ..." if len(new) > 10 else "")
            log.error("body store %s: %d message bodies damaged (checksum mismatch or unreadable): %s",
                      self.path, len(new), shown)
        return new

    # ------------------------------------------------------------------ writes

    def put_many(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Store bodies; one already stored is kept as it is (a journal replay re-puts the same
        body under the same id).  Returns the number written."""
        return self.commit(items, ())

    def commit(self, puts: Iterable[tuple[int, bytes]], deletes: Iterable[int]) -> int:
        """Puts then deletes in one transaction (one batch of write-behind); the puts written."""
        with self._lock:
            items = sorted(puts, key=lambda item: item[0])
            # The compares read in a transaction of their own: a read that fails on a damaged page
            # leaves that transaction unusable, which must not be the one that writes.
            with self.env.begin(buffers=True) as reading:
                runs, loose, stale = self._plan(items, reading)
            written, nbytes = self._write(runs, loose, stale, deletes)
        self._written(nbytes)
        return written

    def _write(self, runs: list[list[_Item]], loose: list[_Item], stale: list[int],
               deletes: Iterable[int]) -> tuple[int, int]:
        """The writes of one commit (lock held), in one transaction: (bodies written, bytes)."""
        written = nbytes = 0
        with self.env.begin(write=True) as txn:
            self._delete(stale, txn)  # replaced: the loose copy below is the one found
            for run in runs:
                key = self._next_key
                self._next_key += 1
                header, segment = _encode(run)
                txn.put(_KEY.pack(key), segment, db=self.segments_db)
                txn.put(_KEY.pack(key), header, db=self.heads_db)
                self._insert(_Segment(key, array("Q", [item[0] for item in run]),
                                      array("I", [len(item[1]) for item in run]),
                                      array("I", [item[2] for item in run])))
                written += len(run)
                nbytes += len(segment)
            for msg_id, body, crc in loose:
                txn.put(_KEY.pack(msg_id), _loose_value(body, crc), db=self.loose_db)
                self._loose += 1
                written += 1
                nbytes += len(body)
            if self.damaged:
                for run in runs:
                    self.damaged.difference_update(item[0] for item in run)
                self.damaged.difference_update(item[0] for item in loose)
            self._delete(deletes, txn)
        return written, nbytes

    def _plan(self, items: list[tuple[int, bytes]],
              txn: lmdb.Transaction) -> tuple[list[list[_Item]], list[_Item], list[int]]:
        """Split sorted puts into new segments (runs between existing segments, cut at
        SEGMENT_BYTES), loose bodies (ids inside an existing segment's range) and the stored ids
        they replace; each item gets its body's CRC32C (computed here, once per body).

        A put of an id already stored with the same body, intact (its bytes and checksum), is
        dropped (a journal replay re-puts what it had): a damaged stored copy is replaced, so a
        replay repairs it too.  With another body it replaces it: the model is what the last apply made
        of that id.  (A chaos run with full-cluster restarts found a node whose store kept, under
        an id, the body of another message that the node had applied under it before a restart,
        while every model agreed on the right one.  The cause was in Raft: the node had applied
        entries the cluster never committed, raft/replica.py ``_SyncObj__onMessageReceived``.)"""
        runs: list[list[_Item]] = []
        loose: list[_Item] = []
        stale: list[int] = []
        values: dict[int, Stored | None] = {}
        run: list[_Item] = []
        run_gap = -1  # index of the existing segment after which the run lies
        run_bytes = 0
        previous = None
        for msg_id, body in items:
            if msg_id == previous:
                continue
            previous = msg_id
            crc = checksum(body)
            gap = bisect_right(self._firsts, msg_id) - 1
            if gap >= 0 and msg_id <= self._segments[gap].last:  # inside a segment's range
                segment = self._segments[gap]
                pos = segment.position(msg_id)
                if pos >= 0:
                    if segment.crcs[pos] == crc:
                        try:
                            value = values.get(segment.key)
                            if value is None:
                                value = values[segment.key] = txn.get(_KEY.pack(segment.key), db=self.segments_db)
                            if value is not None and _body_at(value, len(segment.ids), pos) == body:
                                continue
                        except (struct.error, lmdb.Error):
                            pass  # unreadable: replaced below
                    stale.append(msg_id)
                else:
                    held = self._loose_held(msg_id, txn)
                    if held is not None and held[4:] == body and _CRC.unpack_from(held, 0)[0] == crc:
                        continue
                    if held is not None:
                        stale.append(msg_id)
                loose.append((msg_id, body, crc))
                continue
            held = self._loose_held(msg_id, txn)
            if held is not None:
                if held[4:] != body or _CRC.unpack_from(held, 0)[0] != crc:
                    stale.append(msg_id)
                    loose.append((msg_id, body, crc))
                continue
            if run and (gap != run_gap or run_bytes >= SEGMENT_BYTES):
                runs.append(run)
                run, run_bytes = [], 0
            run.append((msg_id, body, crc))
            run_gap = gap
            run_bytes += len(body)
        if run:
            runs.append(run)
        return runs, loose, stale

    def _loose_held(self, msg_id: int, txn: lmdb.Transaction) -> Stored | None:
        """The loose value stored under ``msg_id`` (b"" if unreadable: replaced), or None."""
        if not self._loose:
            return None
        try:
            held = txn.get(_KEY.pack(msg_id), db=self.loose_db)
        except lmdb.Error:
            return b""
        if held is not None and len(held) < 4:
            return b"\0\0\0\0\0"  # too short to be a value: compares unequal, replaced
        return held

    def delete_many(self, ids: Iterable[int]) -> int:
        """Delete bodies; an id that is absent is ignored.  Returns the number deleted."""
        with self._lock, self.env.begin(write=True) as txn:
            return self._delete(ids, txn)

    def _delete(self, ids: Iterable[int], txn: lmdb.Transaction) -> int:
        deleted = 0
        emptied: list[_Segment] = []
        touched: dict[int, _Segment] = {}
        damaged = self.damaged
        for msg_id in ids:
            if damaged:
                damaged.discard(msg_id)
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
            txn.put(_KEY.pack(key), _marks_value(segment.alive), db=self.dead_db)
        return deleted

    def compact(self, below: float = COMPACT_BELOW) -> int:
        """Rewrite every segment whose live bytes are under ``below`` of its bodies with its live
        bodies only (same key, same range).  Returns how many were rewritten.

        Each body is verified as it is copied.  A damaged one is copied as it is, with the
        checksum it was written with, so that the damage stays visible (and is repaired when read)
        instead of being sealed under a fresh checksum."""
        rewritten = 0
        with self._lock, self.env.begin(write=True, buffers=True) as txn:
            for segment in list(self._segments):
                if segment.live == 0 or segment.live_bytes >= below * segment.bytes:
                    continue
                key = _KEY.pack(segment.key)
                count = len(segment.ids)
                bad: list[int] = []
                keep = []
                try:
                    value = txn.get(key, db=self.segments_db)
                except lmdb.Error:
                    value = None
                for i in range(count):
                    if not segment.alive[i]:
                        continue
                    crc = segment.crcs[i]
                    try:
                        body = _body_at(value, count, i) if value is not None else b""
                    except struct.error:
                        body = b""
                    if checksum(body) != crc:
                        bad.append(segment.ids[i])
                    keep.append((segment.ids[i], body, crc))
                self._damaged(bad)
                header, rewritten_value = _encode(keep)
                txn.put(key, rewritten_value, db=self.segments_db)
                txn.put(key, header, db=self.heads_db)
                txn.delete(key, db=self.dead_db)
                fresh = _Segment(segment.key, array("Q", [item[0] for item in keep]),
                                 array("I", [len(item[1]) for item in keep]),
                                 array("I", [item[2] for item in keep]))
                i = bisect_left(self._firsts, segment.first)
                self._segments[i] = fresh
                self._firsts[i] = fresh.first
                rewritten += 1
        return rewritten

    def repair(self, items: Iterable[tuple[int, bytes]]) -> list[int]:
        """Replace damaged bodies with intact copies (fetched from a peer and verified by the
        caller): only ids still stored here and still known damaged are written (one deleted or
        replaced meanwhile stays as it is).  Returns the ids replaced."""
        with self._lock:
            stored = []
            with self.env.begin(buffers=True) as reading:
                for msg_id, body in items:
                    if msg_id not in self.damaged:
                        continue  # replaced meanwhile (by a read's repair, the scrubber, a replay)
                    segment = self._segment_of(msg_id)
                    if (segment is not None and segment.position(msg_id) >= 0) or \
                            self._loose_held(msg_id, reading) is not None:
                        stored.append((msg_id, body))
                stored.sort(key=lambda item: item[0])
                runs, loose, stale = self._plan(stored, reading)
            assert not runs, "a stored id is inside a segment or loose"
            self._write(runs, loose, stale, ())
        return [msg_id for msg_id, _ in stored]

    # ------------------------------------------------------------------ reads

    def get(self, msg_id: int) -> bytes | None:
        return self.get_many((msg_id,)).get(msg_id)

    def get_many(self, ids: Iterable[int], damaged: list[int] | None = None) -> dict[int, bytes]:
        """The intact bodies of ``ids`` that are here, read in one transaction and verified.  Ids
        stored here whose body does not verify (or could not be read) are not returned: they go
        to ``damaged`` (and ``self.damaged``)."""
        found: dict[int, bytes] = {}
        bad: list[int] = []
        with self._lock, self.env.begin(buffers=True) as txn:
            values: dict[int, Stored | None] = {}
            for msg_id in sorted(ids):
                segment = self._segment_of(msg_id)
                if segment is not None:
                    pos = segment.position(msg_id)
                    if pos >= 0:
                        try:
                            value = values.get(segment.key)
                            if value is None:
                                value = values[segment.key] = txn.get(_KEY.pack(segment.key), db=self.segments_db)
                            body = _body_at(value, len(segment.ids), pos) if value is not None else None
                        except (lmdb.Error, struct.error):
                            bad.append(msg_id)
                            continue
                        if body is not None and checksum(body) == segment.crcs[pos]:  # (None: the value is gone)
                            found[msg_id] = body
                            if self.damaged:
                                self.damaged.discard(msg_id)
                        else:
                            bad.append(msg_id)
                        continue
                if self._loose:
                    try:
                        value = txn.get(_KEY.pack(msg_id), db=self.loose_db)
                    except lmdb.Error:
                        bad.append(msg_id)
                        continue
                    if value is not None:
                        loose_body = _loose_body(value)
                        if loose_body is None:
                            bad.append(msg_id)
                        else:
                            found[msg_id] = loose_body
            if bad:
                self._damaged(bad)
        if bad and damaged is not None:
            damaged.extend(bad)
        return found

    def expected_crc(self, msg_id: int) -> int | None:
        """The CRC32C ``msg_id``'s body was written with, when a verified header says it (a body in a
        segment); None otherwise.  A copy fetched from a peer is checked against it too."""
        with self._lock:
            segment = self._segment_of(msg_id)
            if segment is not None:
                pos = segment.position(msg_id)
                if pos >= 0:
                    return segment.crcs[pos]
        return None

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
            out.extend(_KEY.unpack(k)[0] for k in txn.cursor().iternext(keys=True, values=False) if len(k) == 8)
        out.sort()
        return out

    def disk_bytes(self) -> int:
        """Bytes of pages in use (the file may be larger: LMDB reuses freed pages, never shrinks)."""
        info, stat = self.env.info(), self.env.stat()
        return (info["last_pgno"] + 1) * stat["psize"]

    # ------------------------------------------------------------------ scrubbing

    def scrub_slice(self, position: tuple[int, int], max_bytes: int) -> tuple[tuple[int, int], int, list[int]]:
        """Verify up to ``max_bytes`` of stored bodies from ``position`` on, in a read transaction of
        its own, without the store's lock (the scrubber's thread: the loop keeps reading and
        writing meanwhile).  ``position`` is ``(0, next id)`` in the segments, then ``(1, next id)``
        in the loose bodies; ``(0, 0)`` starts a pass.  Returns the next position ((0, 0) after a
        whole pass), the bytes read, and the ids found damaged (recorded as ``get_many`` does;
        those deleted or replaced meanwhile are left out)."""
        table, next_id = position
        read = 0
        bad: list[int] = []
        with self.env.begin(buffers=True) as txn:
            if table == 0:
                with self._lock:
                    segment = self._segment_of(next_id)
                    if segment is None:
                        i = bisect_left(self._firsts, next_id)
                        segment = self._segments[i] if i < len(self._segments) else None
                    if segment is not None:
                        key, alive = segment.key, bytes(segment.alive)
                if segment is None:
                    return (1, 0), 0, []
                try:
                    head = txn.get(_KEY.pack(key), db=self.heads_db)
                    value = txn.get(_KEY.pack(key), db=self.segments_db)
                    if head is None or value is None:
                        return (0, next_id), 0, []  # rewritten or deleted since: look again
                    ids, offsets, crcs = _decode_header(head)
                    if len(ids) != len(alive):
                        return (0, next_id), 0, []  # compacted since
                    start = bisect_left(ids, next_id)
                    i = start
                    base = _header_size(len(ids))
                    while i < len(ids) and read < max_bytes:
                        if alive[i]:
                            body = value[base + offsets[i]:base + offsets[i + 1]]
                            read += len(body)
                            if checksum(body) != crcs[i]:
                                bad.append(ids[i])
                        i += 1
                    next_position = (0, ids[i]) if i < len(ids) else (0, ids[-1] + 1)
                except (HeaderError, struct.error, lmdb.Error):
                    bad.extend(msg_id for msg_id, a in zip(segment.ids, alive, strict=True) if a)
                    next_position = (0, segment.last + 1)
            else:
                try:
                    cursor = txn.cursor(db=self.loose_db)
                    next_position = (0, 0)
                    if cursor.set_range(_KEY.pack(next_id)):
                        for loose_key, value in cursor:
                            msg_id = _key_of(loose_key)
                            if msg_id is None:
                                continue
                            if read >= max_bytes:
                                next_position = (1, msg_id)
                                break
                            read += len(value)
                            if _loose_body(value) is None:
                                bad.append(msg_id)
                except lmdb.Error as exc:
                    log.error("body store %s: loose bodies unreadable: %s", self.path, exc)
                    next_position = (0, 0)
        if bad:
            # Read again through the read path, under the lock, against the current index: a body
            # deleted or replaced since this transaction began is not reported.
            self.get_many(bad)
            with self._lock:
                bad = [msg_id for msg_id in bad if msg_id in self.damaged]
        return next_position, read, bad


def verify_body_store(path: str) -> list[Damage]:
    """Check a stopped node's body store (``raftmq verify --data-dir DIR``): every segment header
    (in ``heads`` and the segment's own copy), every live body against its checksum, every set of
    dead marks, every loose body, and that LMDB can read each table through.  Opened read-only,
    without LMDB's lock file.  An absent store is not damaged (the node never stored a body); one
    of the first format (no checksums) cannot be verified and is reported as such."""
    data = os.path.join(path, "data.mdb")
    if not os.path.exists(data):
        return []
    found: list[Damage] = []

    def damage(where: str, what: str) -> None:
        found.append(Damage("bodies", data, where, what))

    try:
        env = lmdb.open(path, readonly=True, lock=False, max_dbs=5, readahead=False, create=False)
    except lmdb.Error as exc:
        return [Damage("bodies", data, "environment", f"cannot be opened: {exc}")]
    try:
        dbs: dict[bytes, lmdb._Database | None] = {}
        for name in (b"segments", b"heads", b"loose", b"dead", b"meta"):
            try:
                dbs[name] = env.open_db(name, create=False)
            except lmdb.NotFoundError:
                dbs[name] = None
        txn: lmdb.Transaction  # of bytes, then of memoryviews (buffers=True)
        with env.begin() as txn:
            meta = dbs[b"meta"]
            if meta is None or txn.get(_FORMAT_KEY, db=meta) != FORMAT:
                if dbs[b"heads"] is not None and txn.stat(dbs[b"heads"])["entries"]:
                    damage("format", "written before checksums: bodies cannot be verified "
                           "(they are given checksums when the node starts)")
                return found
        marks: dict[bytes, bytes] = {}
        if dbs[b"dead"] is not None:
            try:
                with env.begin(db=dbs[b"dead"]) as txn:
                    marks = {bytes(key): bytes(value) for key, value in txn.cursor()}
            except lmdb.Error as exc:
                damage("dead marks", f"LMDB error while reading: {exc}")
        if dbs[b"heads"] is not None:
            try:
                with env.begin(buffers=True) as txn:
                    for raw_key, head in txn.cursor(db=dbs[b"heads"]):
                        key = bytes(raw_key)
                        where = f"segment {_key_of(key)}"
                        if _key_of(key) is None:
                            damage(f"header key {key.hex()}", "not a segment key")
                            continue
                        value = txn.get(key, db=dbs[b"segments"]) if dbs[b"segments"] is not None else None
                        try:
                            ids, offsets, crcs = _decode_header(head)
                        except (HeaderError, struct.error) as exc:
                            damage(where, f"header: {exc}")
                            try:
                                ids, offsets, crcs = _decode_header(value if value is not None else b"")
                            except (HeaderError, struct.error) as again:
                                damage(where, f"the segment's copy of its header: {again}")
                                continue
                        alive = b"\x01" * len(ids)
                        if key in marks:
                            checked = _marks(marks[key], len(ids))
                            if checked is None:
                                damage(f"dead marks of {where}", "checksum mismatch")
                            else:
                                alive = bytes(checked)
                        if value is None:
                            damage(where, "segment missing")
                            continue
                        try:
                            _decode_header(value)
                        except (HeaderError, struct.error) as exc:
                            damage(where, f"the segment's copy of its header: {exc}")
                        size = _header_size(len(ids))
                        for i, msg_id in enumerate(ids):
                            if not alive[i]:
                                continue
                            body = value[size + offsets[i]:size + offsets[i + 1]]
                            if len(body) != offsets[i + 1] - offsets[i]:
                                damage(f"{where}, message {msg_id}", f"truncated: {len(body)} of "
                                       f"{offsets[i + 1] - offsets[i]} bytes")
                            elif checksum(body) != crcs[i]:
                                damage(f"{where}, message {msg_id}", "checksum mismatch")
            except lmdb.Error as exc:
                damage("segments", f"LMDB error while reading: {exc}")
        if dbs[b"segments"] is not None:
            try:
                with env.begin(db=dbs[b"segments"]) as txn:
                    for _ in txn.cursor().iternext(keys=True, values=False):
                        pass
            except lmdb.Error as exc:
                damage("segments", f"LMDB error while reading the keys: {exc}")
        if dbs[b"loose"] is not None:
            try:
                with env.begin(db=dbs[b"loose"], buffers=True) as txn:
                    for loose_key, value in txn.cursor():
                        if _key_of(loose_key) is None:
                            damage(f"loose key {bytes(loose_key).hex()}", "not a message id")
                        elif _loose_body(value) is None:
                            damage(f"loose message {_key_of(loose_key)}", "checksum mismatch")
            except lmdb.Error as exc:
                damage("loose bodies", f"LMDB error while reading: {exc}")
    except lmdb.Error as exc:
        damage("environment", f"LMDB error while reading: {exc}")
    finally:
        env.close()
    return found
