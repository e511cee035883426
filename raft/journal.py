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
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib

from pysyncobj.journal import Journal
from pysyncobj.syncobj import _COMMAND_TYPE

log = logging.getLogger(__name__)

_MEMBERSHIP = bytes([_COMMAND_TYPE.MEMBERSHIP])
_HEAD = struct.Struct("<II")  # length, crc32
_IDX_TERM = struct.Struct("<QQ")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class AppendJournal(Journal):
    def __init__(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self._log_path = os.path.join(path, "journal.log")
        self._meta_path = os.path.join(path, "journal.meta")
        self._entries: list[tuple[bytes, int, int]] = []
        self._offsets: list[int] = []  # file offset of each entry's record
        self._meta: dict[str, object] = {}
        self._buffer: list[bytes] = []
        self._buffered = 0  # bytes in _buffer
        self._truncate = False  # the file holds records past _end that the next flush cuts off
        self._meta_dirty = False
        self.flushes = 0
        self.copies_skipped = 0  # entries the leader sent again that were already here
        if os.path.exists(self._meta_path):
            with open(self._meta_path) as fh:
                self._meta = json.load(fh)
        self._fd = os.open(self._log_path, os.O_RDWR | os.O_CREAT, 0o600)
        self._end = self._load()

    def _load(self) -> int:
        with open(self._log_path, "rb") as fh:
            data = fh.read()
        pos = 0
        while pos + _HEAD.size <= len(data):
            length, crc = _HEAD.unpack_from(data, pos)
            body = data[pos + _HEAD.size:pos + _HEAD.size + length]
            if length < _IDX_TERM.size or len(body) < length or zlib.crc32(body) != crc:
                break
            idx, term = _IDX_TERM.unpack_from(body, 0)
            self._entries.append((body[_IDX_TERM.size:], idx, term))
            self._offsets.append(pos)
            pos += _HEAD.size + length
        if pos != len(data):
            os.truncate(self._log_path, pos)  # a torn tail: never acknowledged, drop it
        return pos

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
        self._entries = []
        self._offsets = []
        self._buffer = []
        self._buffered = 0
        self._truncate = False
        os.ftruncate(self._fd, 0)
        os.fsync(self._fd)
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
                command[:1] == _MEMBERSHIP for command, _idx, _term in entries[entryFrom:]):
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

        Rewrites the remaining records into a new file and renames it over the old one.
        """
        if entryTo <= 0:
            return
        self.flush()
        keep = self._entries[entryTo:]
        tmp = self._log_path + ".compact"
        offsets = []
        with open(tmp, "wb") as fh:
            pos = 0
            for command, idx, term in keep:
                body = _IDX_TERM.pack(idx, term) + command
                record = _HEAD.pack(len(body), zlib.crc32(body)) + body
                offsets.append(pos)
                fh.write(record)
                pos += len(record)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._log_path)
        _fsync_dir(self.path)
        os.close(self._fd)
        self._fd = os.open(self._log_path, os.O_RDWR)
        self._entries, self._offsets, self._end = keep, offsets, pos

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """Bytes of log records since the last compaction, flushed or not (also, roughly, the
        memory the entries take: they are kept in memory until compacted)."""
        return self._end + self._buffered

    def _destroy(self) -> None:
        self.flush()
        os.close(self._fd)

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        # Only a hint for replay after a restart: written with the next term change or once a second.
        self._meta["commit"] = raftCommitIndex
        self._meta_dirty = True

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta.get("commit", 1))

    def setCurrentTerm(self, term: int, votedForNodeId) -> None:  # noqa: N802, N803
        self._meta["term"] = term
        self._meta["vote"] = votedForNodeId
        self._write_meta()

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("term", 0))

    def getVotedForNodeId(self):  # noqa: N802
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
        if self._truncate:
            os.ftruncate(self._fd, self._end)
            self._truncate = False
        data = b"".join(self._buffer)
        self._buffer = []
        self._buffered = 0
        written = os.pwrite(self._fd, data, self._end)
        while written < len(data):  # pwrite may write less; finish it
            written += os.pwrite(self._fd, data[written:], self._end + written)
        self._end += len(data)
        os.fdatasync(self._fd)
        self.flushes += 1

    def _write_meta(self) -> None:
        tmp = self._meta_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(self._meta, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._meta_path)
        _fsync_dir(self.path)
        self._meta_dirty = False
