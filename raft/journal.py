"""A durable Raft journal for pysyncobj: an append-only file, fdatasync'ed before anything is sent.

pysyncobj's own ``FileJournal`` writes through an mmap and never flushes it, so a power cut (and,
with unlucky timing, a full-cluster kill -9) can lose entries a majority acknowledged.  This journal
keeps the entries in memory for pysyncobj (which reads them constantly) and mirrors every change to
disk.  Appends are buffered and written by :meth:`flush`, which ends with one ``fdatasync``;
:class:`raft.replica.Replica` calls it before any message leaves the node, so that

* a follower's acknowledgement of AppendEntries is sent only after the entries are on disk, and
* a vote or a leader's AppendEntries reflects a term and vote already on disk (Raft §5.1, §5.2).

The term and vote are written synchronously in :meth:`setCurrentTerm` (a small file replaced
atomically and fsynced), as Raft requires them durable before anything reflecting them is sent.

Why a plain file and not LMDB: the fsync is on the commit path of every batch, on every node.
An LMDB commit with ``sync=True`` flushes data pages and then the meta page (two device flushes);
an append plus ``fdatasync`` is one.  Measured on the 3-node benchmark, the journal flush was the
largest single cost of the Raft thread.

Record layout (little-endian): ``u32 length of (idx, term, command)``, ``u32 crc32`` of the same,
``u64 idx``, ``u64 term``, ``command``.  A torn or corrupt tail (a crash in the middle of a write,
which was therefore never acknowledged) is cut off at load.

Committed entries are not all kept in memory: past the newest ``KEEP_RESIDENT`` committed ones,
an entry keeps only its index and term, and its command is read back from its segment when
pysyncobj asks (a follower far behind, a restart's replay).  Otherwise every entry since the last
snapshot -- up to ``snapshot_bytes``, 256 MiB, per node -- stayed in memory, bodies included, next to
the same bodies in the state machine.

The records go into segment files (``seg-<n>.log``, a new one once the last holds
``segment_bytes``), so that compaction after a snapshot deletes whole segments and records the
new first index in the meta file, instead of rewriting the entries it keeps.  The rewrite ran in
pysyncobj's tick thread: keeping 25 MB of 4 KB messages took 0.22 s, and a longer tail would stall
heartbeats past the election timeout.  Offsets are global, as if the segments were one file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
import time
import zlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pysyncobj.journal import Journal
from pysyncobj.syncobj import _COMMAND_TYPE

from raftmq.integrity import Damage

from .journal_files import JournalMeta, MetaFile, MetaUnreadable, RepairMeta, SyncedMark, _fsync_dir

log = logging.getLogger(__name__)


def _stop_node(what: str, exc: OSError) -> None:
    """A journal write failed (disk full, EIO): stop the process at once, loudly.

    The failed flush has already taken the records off its buffer, so carrying on would let the
    next flush report them durable and this node acknowledge entries it does not have (pysyncobj
    logs the exception and retries the tick forever: measured, the leader kept failing and its
    publishers waited without an answer). Raft tolerates a node that stops; on restart the journal
    is read back (a torn tail cut off) and the node catches up from the leader. This runs in
    pysyncobj's thread, where SystemExit would end only that thread: ``os._exit``. Clients see
    their connections end and fail over.
    """
    log.critical("Raft journal: %s failed: %r; stopping the node (exit status 70)", what, exc)
    logging.shutdown()
    os._exit(70)

SEGMENT_BYTES = 64 << 20
# Committed entries that stay in memory (whole): a follower just behind is sent these without a
# read.  An entry is a batch, usually a few KiB; at most 1 MiB.
KEEP_RESIDENT = 64
HEAD_RESIDENT = 2
_MEMBERSHIP = bytes([_COMMAND_TYPE.MEMBERSHIP])
_HEAD = struct.Struct("<II")  # length, crc32
_IDX_TERM = struct.Struct("<QQ")


@dataclass
class _Segment:
    number: int
    base: int  # global offset of its first byte
    size: int  # bytes written to it

    def path(self, directory: str) -> str:
        return os.path.join(directory, f"seg-{self.number:012d}.log")


class _LazyRun(Sequence):
    """Entries ``start``..``stop`` of a journal, read when looked at.

    pysyncobj slices its log from an index to the end (on every AppendEntries a follower gets,
    and for a follower that is behind); materialising a long run of entries read from disk each
    time would cost more than the memory it saves.
    """

    def __init__(self, journal: AppendJournal, start: int, stop: int) -> None:
        self._journal, self._start, self._stop = journal, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, item):
        if isinstance(item, slice):
            return [self._journal[self._start + i] for i in range(*item.indices(len(self)))]
        if item < 0:
            item += len(self)
        if not 0 <= item < len(self):
            raise IndexError(item)
        return self._journal[self._start + item]


class EntryDamaged(RuntimeError):
    """An entry read back from its segment failed its checksum (a running node's disk)."""


@dataclass
class ScanResult:
    """What :func:`scan` found in a journal directory (nothing is changed on disk)."""

    entries: list[tuple[bytes | None, int, int]] = field(default_factory=list)  # (command or None when evicted, index, term)
    offsets: list[int] = field(default_factory=list)
    segments: list[_Segment] = field(default_factory=list)  # kept, sizes cut to their intact records
    evicted: int = 0
    numbers: list[int] = field(default_factory=list)  # segment files found
    cut: tuple[int, int] | None = None  # (segment number, offset) where the journal stops
    unlink: list[int] = field(default_factory=list)  # segments after the cut (or compacted away)
    damage: list[str] = field(default_factory=list)  # why this is damage, not a torn tail
    claimed: int = 0  # the highest index this node may have acknowledged (mark, records past a cut)
    claimed_term: int = 0  # the term of that entry


def _records(data: bytes):
    """(offset, idx, term, body) of each intact record from the start, then (offset, None, ...)
    at the first bad one (or the end)."""
    pos = 0
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size:pos + _HEAD.size + length]
        if length < _IDX_TERM.size or len(body) < length or zlib.crc32(body) != crc:
            break
        idx, term = _IDX_TERM.unpack_from(body, 0)
        yield pos, idx, term, body
        pos += _HEAD.size + length
    yield pos, None, None, None


def scan(directory: str, first_index: int, mark: SyncedMark | None, *, keep_commands: bool = True) -> ScanResult:
    """Read a journal's segments in order and tell a torn tail from damage.

    Entries from ``first_index`` on (below it: compacted, whatever segment holds them) must run
    without a gap.  The journal stops at the first bad record or break.  That stop is a torn
    tail when it lies beyond the synced mark (a crash tears only unsynced writes); it is damage
    when it lies inside what was fsynced, when a segment is shorter than the mark says, when the
    journal ends before the mark's index, when it starts after ``first_index`` (its head segment
    is gone), or when a later segment still holds intact records past the stop.
    """
    result = ScanResult()
    numbers = sorted(int(name[4:-4]) for name in os.listdir(directory)
                     if name.startswith("seg-") and name.endswith(".log"))
    result.numbers = numbers
    synced = mark.mark if mark is not None else None
    if mark is not None and mark.damaged:
        result.damage.append("the synced mark (journal.synced) is damaged: how far the journal was "
                             "fsynced is unknown")
    base, previous, ended = 0, None, False
    entries, offsets = result.entries, result.offsets
    for number in numbers:
        path = _Segment(number, base, 0).path(directory)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            continue  # a compacted segment being deleted meanwhile
        if ended:
            result.unlink.append(number)
            for _pos, idx, term, _body in _records(data):
                if idx is not None and idx > max(previous or 0, result.claimed):
                    result.claimed, result.claimed_term = idx, term
            continue
        if synced is not None and number == synced.segment and len(data) < synced.size:
            result.damage.append(f"segment {number} holds {len(data)} bytes, {synced.size} were fsynced")
        live = False
        stop = len(data)
        for pos, idx, term, body in _records(data):
            if idx is None:
                stop = pos
                break
            if idx < first_index:
                continue
            if previous is not None and idx != previous + 1:
                stop = pos
                break
            if previous is None and first_index and idx != first_index:
                result.damage.append(f"the journal starts at entry {idx}, not at its first index "
                                     f"{first_index}: its head is missing")
            previous = idx
            live = True
            entries.append((body[_IDX_TERM.size:] if keep_commands else None, idx, term))
            offsets.append(base + pos)
            # Only the newest KEEP_RESIDENT (and the head) stay in memory, as after _evict: a
            # restart read up to the whole journal (1 GiB with a large backlog,
            # Replica.compaction_floor) and held it until it was committed.
            old = len(entries) - 1 - KEEP_RESIDENT
            if old >= HEAD_RESIDENT and keep_commands:
                _command, old_idx, old_term = entries[old]
                entries[old] = (None, old_idx, old_term)
                result.evicted = old + 1
        if stop != len(data):
            ended = True
            result.cut = (number, stop)
            if synced is not None and (number < synced.segment or (number == synced.segment and stop < synced.size)):
                result.damage.append(f"segment {number}: a bad record at offset {stop}, inside what was "
                                     f"fsynced ({synced.size} bytes of segment {synced.segment})")
            if stop == 0 and result.segments:
                result.unlink.append(number)  # nothing in it continues the journal
                continue
        elif not live and not entries and number != numbers[-1]:
            result.unlink.append(number)  # wholly before first_index: compacted away
            continue
        result.segments.append(_Segment(number, base, stop))
        base += stop
    last = entries[-1][1] if entries else 0
    if synced is not None and synced.index:
        if synced.segment not in numbers:
            result.damage.append(f"segment {synced.segment}, fsynced up to entry {synced.index}, is missing")
        elif last < synced.index and not result.damage:
            result.damage.append(f"the journal ends at entry {last}; entries up to {synced.index} were fsynced")
    if first_index and not entries and synced is not None and synced.index >= first_index:
        result.damage.append(f"no entry from the first index {first_index} on is left")
    if result.claimed > last and not result.damage:
        result.damage.append(f"intact entries up to {result.claimed} follow the stop at entry {last}")
    candidates = [(result.claimed, result.claimed_term), (last, entries[-1][2] if entries else 0)]
    if synced is not None:
        candidates.append((synced.index, synced.term))
    result.claimed, result.claimed_term = max(candidates)
    return result


class AppendJournal(Journal):
    def __init__(self, path: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.segment_bytes = segment_bytes
        self._meta_file = MetaFile(path)
        self._mark = SyncedMark(path)
        self.damage: str | None = None  # what _load found damaged (None: intact, or a torn tail)
        self.on_read_damage: Callable[[Damage], None] | None = None  # an evicted entry read back damaged
        self._entries: list[tuple[bytes | None, int, int]] = []  # command None: evicted (on disk only)
        self._offsets: list[int] = []  # global offset of each entry's record
        self._segments: list[_Segment] = []
        self._meta: JournalMeta = {}
        self._buffer: list[bytes] = []
        self._buffered = 0  # bytes in _buffer
        self._truncate = False  # the files hold records past _end that the next flush cuts off
        self._meta_dirty = False
        self.flushes = 0
        self.copies_skipped = 0  # entries the leader sent again that were already here
        self.reaper: threading.Thread | None = None  # deleting compacted segments
        # Positions HEAD_RESIDENT.._evicted-1 hold no command in memory.  The first two entries
        # always do: pysyncobj reads log[0] on every lookup (for its index) and log[1] often.
        self._evicted = 0
        self._readers: dict[int, int] = {}  # segment number -> fd for reading evicted entries
        self.reads = 0  # evicted entries read back
        try:
            self._meta = self._meta_file.load()
        except MetaUnreadable as exc:
            # Term and vote lost: the term is recovered from the log (pysyncobj takes the larger of
            # the two), the vote is not -- so this node votes for no one until repaired, which is
            # what keeps it from voting twice in a term it cannot remember.
            self._meta = {}
            self._meta_lost = str(exc)
        else:
            self._meta_lost = ""
        self._end = self._load()
        self._fd = os.open(self._segments[-1].path(path), os.O_RDWR | os.O_CREAT, 0o600)

    def _load(self) -> int:
        """Read the segments (:func:`scan`); cut a torn tail, or move damage aside (issue 29).

        A bad record or a break in the run of indexes *after* the synced mark is a torn tail --
        written but never fsynced, so never acknowledged -- and is cut off as before.  Anything
        else that :func:`scan` calls damage (a bad record inside what was fsynced, a segment
        shorter than what was fsynced, a missing segment) means entries this node may have
        acknowledged are gone: the segments from the damaged one on are kept aside in
        ``damaged-<n>/`` (for a person to look at), the verified entries before the damage are
        kept, and the journal records a pending *repair* in its meta: the node takes part in no
        election until it has caught up with a leader past ``repair_until``
        (:class:`raft.replica.Replica`, Protocol-Aware Recovery's rule, FAST 2018).
        """
        legacy = os.path.join(self.path, "journal.log")  # the single file of earlier versions
        if os.path.exists(legacy):
            os.replace(legacy, _Segment(0, 0, 0).path(self.path))
            _fsync_dir(self.path)
        result = scan(self.path, int(self._meta.get("first_index", 0)), self._mark)
        if self._meta_lost:
            result.damage.insert(0, f"term and vote unreadable ({self._meta_lost})")
        self._entries, self._offsets, self._evicted = result.entries, result.offsets, result.evicted
        self._segments = result.segments
        changed = False
        if result.damage:
            changed = self._set_aside(result)
        else:
            for number in result.unlink:
                os.unlink(_Segment(number, 0, 0).path(self.path))
                changed = True
            if result.cut is not None and result.cut[0] not in result.unlink:
                number, pos = result.cut
                os.truncate(_Segment(number, 0, 0).path(self.path), pos)  # a torn tail, never acknowledged
                changed = True
        if changed:
            _fsync_dir(self.path)
        if not self._segments:
            numbers = result.numbers
            self._segments.append(_Segment(numbers[-1] + 1 if numbers else 0, 0, 0))
            open(self._segments[0].path(self.path), "ab").close()
            _fsync_dir(self.path)
        if result.damage:
            until, until_term = self._claim((result.claimed, result.claimed_term))
            reason = "; ".join(result.damage)
            self.damage = reason
            self._meta["repair"] = {"until": until, "until_term": until_term, "reason": reason}
            log.error("raft journal damaged: %s.  Entries up to %d may have been acknowledged and are "
                      "not all here: this node takes part in no election until it has them from a leader",
                      reason, until)
            self._write_meta()
        last = self._segments[-1]
        self._mark.record(last.number, last.size, *(self._entries[-1][1:] if self._entries else (0, 0)), sync=True)
        return sum(segment.size for segment in self._segments)

    def _set_aside(self, result: ScanResult) -> bool:
        """Keep the damaged segment (a copy) and every later one (moved) in ``damaged-<n>/``; the
        damaged segment keeps its verified prefix in place.  Segments before it that were
        compacted away are deleted as usual."""
        n = 1 + sum(1 for name in os.listdir(self.path) if name.startswith("damaged-"))
        aside = os.path.join(self.path, f"damaged-{n}")
        os.makedirs(aside, exist_ok=True)
        cut = result.cut
        for number in result.numbers:
            path = _Segment(number, 0, 0).path(self.path)
            kept = os.path.join(aside, os.path.basename(path))
            if cut is not None and number >= cut[0]:
                if number in result.unlink:
                    os.replace(path, kept)
                else:  # the segment the journal stops in: its verified prefix stays
                    shutil.copy2(path, kept)
                    os.truncate(path, cut[1])
            elif number in result.unlink:
                os.unlink(path)
        _fsync_dir(aside)
        log.error("raft journal: the damaged segments are kept in %s", aside)
        return True

    # ------------------------------------------------------------------ pysyncobj's interface

    def add(self, command: bytes, idx: int, term: int) -> None:
        entries = self._entries
        if entries and idx <= entries[-1][1]:
            # The leader re-sends an entry this follower kept (see deleteEntriesFrom).
            pos = idx - entries[0][1]
            if pos >= 0 and entries[pos][1] == idx:
                if entries[pos][2] == term:
                    self.copies_skipped += 1
                    return  # the same entry (same index and term): nothing to write
                log.warning("raft journal: entry %d of term %d conflicts with the leader's (term %d); "
                            "dropping %d entries from it", idx, entries[pos][2], term, len(entries) - pos)
                self._cut(pos)
        body = _IDX_TERM.pack(idx, term) + command
        record = _HEAD.pack(len(body), zlib.crc32(body)) + body
        self._entries.append((command, idx, term))
        self._offsets.append(self._end + self._buffered)
        self._buffer.append(record)
        self._buffered += len(record)

    def clear(self) -> None:
        """Drop every entry (pysyncobj, before installing a snapshot): a fresh, empty segment."""
        if self.reaper is not None:
            # first_index goes back to 0 below: segments still being reaped must be gone first,
            # or a crash could leave their old indexes in front of the new entries.
            self.reaper.join()
        self._entries = []
        self._offsets = []
        self._buffer = []
        self._buffered = 0
        self._truncate = False
        self._evicted = 0
        self._close_readers(self._segments)
        os.close(self._fd)
        fresh = _Segment(self._segments[-1].number + 1, 0, 0)
        self._mark.record(fresh.number, 0, 0, 0, sync=True)  # nothing is claimed any more
        for segment in self._segments:
            os.unlink(segment.path(self.path))
        self._segments = [fresh]
        self._fd = os.open(fresh.path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        _fsync_dir(self.path)
        # Before any new entry can be flushed: entries after a clear may have any index.
        self._meta["first_index"] = 0
        self._write_meta()
        self._end = 0

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 - pysyncobj's name
        """Drop the entries from list position ``entryFrom`` on -- unless none of them can conflict.

        Raft (§5.3) deletes a follower's entry only when a new one conflicts with it (same index,
        other term).  pysyncobj instead deletes the whole suffix after ``prevLogIdx`` on every
        AppendEntries that overlaps the follower's log and re-adds the entries the message carries.
        When the message carries fewer entries than the follower holds (a resend after a reset
        that crossed later messages, or a size-limited batch), entries this follower had already
        acknowledged vanish from it -- while the leader keeps counting them toward a majority, so
        a full-cluster restart at that moment can elect a node without them and undo a commit.

        So the suffix is kept when its last entry is of the current term: only the current leader
        creates entries of its term and it never removes them, so by the Log Matching Property
        every entry held here is the leader's own and none can conflict; the re-sent copies are
        recognised and skipped in :meth:`add` (which still cuts at a real conflict).  A suffix
        holding a membership change is cut as pysyncobj expects, because pysyncobj has already
        rolled those changes back before calling this.
        """
        entries = self._entries
        if entryFrom >= len(entries):
            return
        if entries[-1][2] == self.getCurrentTerm() and not any(
                self[pos][0][:1] == _MEMBERSHIP for pos in range(entryFrom, len(entries))):
            return
        self._cut(entryFrom)

    def _cut(self, entryFrom: int) -> None:
        """Remove list positions ``entryFrom``.. now; the file follows at the next flush.

        The file is not touched here: the next flush truncates and appends in one go, under the
        same fdatasync.  Until then the old suffix is still on disk, which is safe: nothing about
        the new suffix has been acknowledged.
        """
        dropped = len(self._entries) - entryFrom
        if dropped <= 0:
            return
        unflushed = len(self._buffer)
        self._evicted = min(self._evicted, entryFrom)
        del self._entries[entryFrom:]
        cut = self._offsets[entryFrom]
        del self._offsets[entryFrom:]
        if dropped <= unflushed:
            for record in self._buffer[unflushed - dropped:]:
                self._buffered -= len(record)
            del self._buffer[unflushed - dropped:]
        else:
            self._buffer = []
            self._buffered = 0
            self._end = cut
            self._truncate = True

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        """Drop the entries before list position ``entryTo`` (they are in a snapshot now).

        The new first index goes into the meta file (replaced atomically, fsynced); segments that
        hold only dropped entries are deleted.  Nothing that is kept is rewritten.
        """
        entries = self._entries
        if entryTo <= 0 or not entries:
            return
        started = time.monotonic()
        self.flush()  # (usually nothing: the tick flushes before anything is sent)
        if entryTo < len(entries):
            first_index, cut = entries[entryTo][1], self._offsets[entryTo]
        else:
            first_index, cut = entries[-1][1] + 1, self._end
        self._meta["first_index"] = first_index
        self._write_meta()
        dead = [seg for seg in self._segments[:-1] if seg.base + seg.size <= cut]
        if dead:
            self._close_readers(dead)
            del self._segments[:len(dead)]
            # Unlinking a 64 MiB file takes ~16 ms: not in the tick thread.  Nothing depends on
            # it -- a dead segment left by a crash holds only indexes below first_index, skipped
            # and deleted at load -- and its number is never used again (numbers only grow).
            self.reaper = threading.Thread(target=self._unlink, args=([seg.path(self.path) for seg in dead],),
                                           name="journal-reaper", daemon=True)
            self.reaper.start()
        del entries[:entryTo]
        del self._offsets[:entryTo]
        self._evicted = max(0, self._evicted - entryTo)
        for pos in range(min(HEAD_RESIDENT, self._evicted, len(entries))):
            entries[pos] = self._read(pos)  # the new head: back in memory
        log.info("raft journal compacted to index %d: %d entries dropped (%d segment files), %d kept "
                 "(%d bytes) in %.3f s", first_index, entryTo, len(dead), len(entries), self.size_bytes,
                 time.monotonic() - started)

    def _unlink(self, paths: list[str]) -> None:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            _fsync_dir(self.path)

    def __getitem__(self, item):
        entries = self._entries
        if item.__class__ is int:
            if item < 0:
                item += len(entries)
                if item < 0:
                    raise IndexError(item)
            if HEAD_RESIDENT <= item < self._evicted:
                return self._read(item)
            return entries[item]
        start, stop, step = item.indices(len(entries))
        if start >= self._evicted or stop <= HEAD_RESIDENT or self._evicted <= HEAD_RESIDENT:
            return entries[item]
        if step != 1 or stop - start <= KEEP_RESIDENT:
            return [self[i] for i in range(start, stop, step)]
        return _LazyRun(self, start, stop)

    def _read(self, pos: int) -> tuple[bytes, int, int]:
        """An evicted entry, from its record on disk (flushed before it was evicted)."""
        offset = self._offsets[pos]
        segments = self._segments
        segment = segments[bisect_right([seg.base for seg in segments], offset) - 1]
        fd = self._readers.get(segment.number)
        if fd is None:
            fd = self._readers[segment.number] = os.open(segment.path(self.path), os.O_RDONLY)
        local = offset - segment.base
        length, crc = _HEAD.unpack(os.pread(fd, _HEAD.size, local))
        body = os.pread(fd, length, local + _HEAD.size)
        idx, term = _IDX_TERM.unpack_from(body, 0)
        if zlib.crc32(body) != crc or idx != self._entries[pos][1]:
            damage = Damage("journal", segment.path(self.path), f"offset {local}",
                            f"the record of entry {self._entries[pos][1]} fails its checksum")
            if self.on_read_damage is not None:
                self.on_read_damage(damage)  # Replica: a snapshot past it, so no one needs it
            raise EntryDamaged(str(damage))
        self.reads += 1
        return body[_IDX_TERM.size:], idx, term

    def _evict(self, commit_index: int) -> None:
        """Drop the commands of flushed, committed entries but the newest KEEP_RESIDENT."""
        entries = self._entries
        if not entries:
            return
        limit = min(commit_index - entries[0][1] + 1 - KEEP_RESIDENT, len(entries) - len(self._buffer))
        pos = max(self._evicted, HEAD_RESIDENT)
        while pos < limit:
            _command, idx, term = entries[pos]
            entries[pos] = (None, idx, term)
            pos += 1
        self._evicted = max(self._evicted, pos)

    def _close_readers(self, segments: list[_Segment]) -> None:
        for segment in segments:
            fd = self._readers.pop(segment.number, None)
            if fd is not None:
                os.close(fd)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Bytes of the records of the entries held, flushed or not: what the journal holds on
        disk since the last compaction (committed entries past the newest KEEP_RESIDENT are not in
        memory)."""
        start = self._offsets[0] if self._offsets else self._end
        return self._end + self._buffered - start

    def _destroy(self) -> None:
        self.flush()
        os.close(self._fd)
        self._mark.close()
        self._close_readers(self._segments)
        if self.reaper is not None:
            self.reaper.join(5.0)

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        # Only a hint for replay after a restart: written with the next term change or once a second.
        self._meta["commit"] = raftCommitIndex
        self._meta_dirty = True
        self._evict(raftCommitIndex)

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        """The commit hint, but never past the last entry held (a journal cut by damage or a lost
        snapshot: pysyncobj would try to apply entries it does not have)."""
        commit = int(self._meta.get("commit", 1))
        return min(commit, self._entries[-1][1]) if self._entries else commit

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        self._meta["term"] = term
        self._meta["vote"] = votedForNodeId
        self._write_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("term", 0))

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        return self._meta.get("vote")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._meta_dirty:
            self._write_meta()

    # ------------------------------------------------------------------ durability

    @property
    def dirty(self) -> bool:
        return bool(self._buffer) or self._truncate

    def flush(self) -> None:
        """Append the buffered records and fdatasync: one device flush for all of them."""
        if not self._buffer and not self._truncate:
            return
        try:
            self._flush()
        except OSError as exc:
            _stop_node("flush", exc)

    def _flush(self) -> None:
        if self._truncate:
            self._truncate_segments()
            self._truncate = False
        last = self._segments[-1]
        if self._buffer and last.size >= self.segment_bytes:
            last = self._roll()
        data = b"".join(self._buffer)
        self._buffer = []
        self._buffered = 0
        local = self._end - last.base
        written = os.pwrite(self._fd, data, local)
        while written < len(data):  # pwrite may write less; finish it
            written += os.pwrite(self._fd, data[written:], local + written)
        self._end += len(data)
        last.size += len(data)
        os.fdatasync(self._fd)
        self.flushes += 1
        self._mark.record(last.number, last.size, *(self._entries[-1][1:] if self._entries else (0, 0)))

    def _roll(self) -> _Segment:
        """Start a new segment; its directory entry is durable before any record in it is."""
        segment = _Segment(self._segments[-1].number + 1, self._end, 0)
        fd = os.open(segment.path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        _fsync_dir(self.path)
        os.close(self._fd)
        self._fd = fd
        self._segments.append(segment)
        return segment

    def _truncate_segments(self) -> None:
        """Cut the files at ``_end`` (a cut suffix): later segments are deleted, and that is
        durable before anything new is written (a deleted segment that came back after a crash
        could otherwise continue the new records' indexes with the old ones)."""
        cut = self._end
        kept = len(self._entries) - len(self._buffer)  # the entries before the cut
        doomed = [seg for seg in self._segments[1:] if seg.base >= cut]
        holder = self._segments[-1 - len(doomed)]  # the segment the journal will end in
        # The mark goes down first, durably: a crash after the cut must not read as damage.
        self._mark.record(holder.number, cut - holder.base, *(self._entries[kept - 1][1:] if kept > 0 else (0, 0)),
                          sync=True)
        if doomed:
            self._close_readers(doomed)
            os.close(self._fd)
            for segment in doomed:
                os.unlink(segment.path(self.path))
            del self._segments[-len(doomed):]
            _fsync_dir(self.path)
            self._fd = os.open(self._segments[-1].path(self.path), os.O_RDWR)
        last = self._segments[-1]
        os.ftruncate(self._fd, cut - last.base)
        last.size = cut - last.base

    def _write_meta(self) -> None:
        try:
            self._replace_meta()
        except OSError as exc:
            _stop_node("writing the meta file", exc)

    def _replace_meta(self) -> None:
        self._meta_file.write(self._meta)
        self._meta_dirty = False

    # ------------------------------------------------------------------ repair (issue 29)

    @property
    def repair(self) -> RepairMeta | None:
        """{"until": index, "reason": text} while this node's log is missing entries it may have
        acknowledged (kept in the meta file, so a restart before the repair keeps it)."""
        repair = self._meta.get("repair")
        return repair.copy() if repair else None

    def scrub_targets(self) -> list[tuple[str, int]]:
        """(path, bytes fsynced) of every segment, oldest first, for the scrubber (raft/scrub.py;
        called from its thread: a copy of the list, and the newest segment only up to the mark)."""
        mark = self._mark.mark
        out = []
        for segment in list(self._segments):
            size = segment.size
            if mark is not None and segment.number == mark.segment:
                size = min(size, mark.size)
            elif mark is not None and segment.number > mark.segment:
                continue  # nothing in it is fsynced yet
            out.append((segment.path(self.path), size))
        return out

    def _claim(self, *found: tuple[int, int]) -> tuple[int, int]:
        """(index, term) of the newest entry this node may have acknowledged: what it found, the
        synced mark, a repair already pending.  The commit hint only raises the index; its term is
        then unknown and the current term stands in (it is at least the entry's: stricter)."""
        mark = self._mark.mark
        claims = list(found) + [(mark.index, mark.term)] if mark is not None else list(found)
        pending = self._meta.get("repair")
        if pending:
            claims.append((int(pending.get("until", 0)), int(pending.get("until_term", self.getCurrentTerm()))))
        index, term = max(claims)
        commit = int(self._meta.get("commit", 0))
        if commit > index:
            index, term = commit, max(term, self.getCurrentTerm())
        return index, term

    def lost_base(self, reason: str) -> None:
        """The snapshot this journal was compacted to is gone (damaged): set every segment aside and
        start empty, with a pending repair up to the last entry held (see Replica)."""
        until, until_term = self._claim(self._entries[-1][1:] if self._entries else (0, 0))
        n = 1 + sum(1 for name in os.listdir(self.path) if name.startswith("damaged-"))
        aside = os.path.join(self.path, f"damaged-{n}")
        os.makedirs(aside, exist_ok=True)
        self._close_readers(self._segments)
        os.close(self._fd)
        fresh = _Segment(self._segments[-1].number + 1, 0, 0)
        self._mark.record(fresh.number, 0, 0, sync=True)
        for segment in self._segments:
            os.replace(segment.path(self.path), os.path.join(aside, os.path.basename(segment.path(self.path))))
        self._segments = [fresh]
        self._fd = os.open(fresh.path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        _fsync_dir(aside)
        _fsync_dir(self.path)
        self._entries, self._offsets, self._buffer = [], [], []
        self._buffered, self._evicted, self._end, self._truncate = 0, 0, 0, False
        self.damage = reason if self.damage is None else f"{self.damage}; {reason}"
        self._meta["first_index"] = 0
        self._meta["commit"] = 0
        self._meta["repair"] = {"until": until, "until_term": until_term, "reason": self.damage}
        self._write_meta()
        log.error("raft journal: %s; its %d segments are kept in %s, entries up to %d must come from a leader",
                  reason, len(os.listdir(aside)), aside, until)

    def repaired(self) -> None:
        """The node has caught up with a leader past ``repair['until']``: it may vote again."""
        if self._meta.pop("repair", None) is not None:
            self.damage = None
            self._write_meta()


def verify_journal(directory: str) -> list[Damage]:
    """Check a stopped node's journal without changing it (``raftmq verify``): both meta copies,
    the synced mark, and every record of every segment, by the rules of :func:`scan`."""
    found: list[Damage] = []
    meta_file = MetaFile(directory)
    try:
        meta = meta_file.load(mend=False)
    except MetaUnreadable as exc:
        found.append(Damage("journal-meta", directory, "journal.meta, journal.meta.copy", f"both damaged: {exc}"))
        meta = {}
    else:
        found.extend(Damage("journal-meta", directory, problem.split(":")[0], problem.split(": ", 1)[-1])
                     for problem in meta_file.problems)
    repair = meta.get("repair")
    if repair:
        found.append(Damage("journal", directory, "meta", f"repair pending until entry {repair.get('until')}: "
                            f"{repair.get('reason')}"))
    mark = SyncedMark(directory, readonly=True)
    try:
        result = scan(directory, int(meta.get("first_index", 0)), mark, keep_commands=False)
    finally:
        mark.close()
    where = f"segment {result.cut[0]}, offset {result.cut[1]}" if result.cut is not None else "segments"
    found.extend(Damage("journal", directory, where, what) for what in result.damage)
    return found
