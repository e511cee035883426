"""The two small files beside the Raft journal's segments, each checksummed (issue 29).

* :class:`MetaFile` -- term, vote, first index, commit hint and a pending repair, in **two
  copies** (``journal.meta`` and ``journal.meta.copy``), each a JSON document with a sequence
  number and a CRC32C.  Raft needs the term and the vote to survive (§5.1, §5.2); a bit flip in the
  only copy would make a node forget a vote and possibly grant a second one in the same term.  Both
  copies are written (in place, each fsynced) whenever the meta changes: a crash can tear only the
  copy being written, and the other one holds the same or the previous state.  Reading takes the
  valid copy with the higher sequence number.  A file written before checksums (a bare JSON
  object) is read as it is, once, and rewritten in the new form.

* :class:`SyncedMark` -- where the journal was last fsynced: (segment number, bytes of that
  segment, last index).  Written after every flush's ``fdatasync``, into one of two fixed slots
  in turn (each with its CRC32C), *without* an fsync of its own: it costs one 48-byte ``pwrite``
  per flush.  It is what tells a torn tail from damage at the next start: a crash can only tear
  what was never fsynced, so a bad record *before* the mark, a segment shorter than the mark, or
  a journal ending before the mark's index means bytes that were once durable (and possibly
  acknowledged) are gone.  The mark is written after the data it describes is durable, so after a
  power loss it can only lag behind the data (less is then detected, nothing wrongly); after a
  kill -9 it is exact.  Operations that legitimately shorten the journal (a conflict's cut, a
  clear before a snapshot install) write the lowered mark *with* an fsync before they cut.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict, cast

from raftmq.integrity import checksum

log = logging.getLogger(__name__)

META_NAME = "journal.meta"
META_COPY_NAME = "journal.meta.copy"
MARK_NAME = "journal.synced"


class MetaUnreadable(Exception):
    """Neither copy of the journal's meta file could be read intact."""


def _fsync_dir(path: str) -> None:
    """Make a directory's entries (a created, renamed or deleted file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _meta_crc(seq: int, meta: Mapping[str, object]) -> int:
    return checksum(json.dumps([seq, meta], sort_keys=True, separators=(",", ":")).encode())


class RepairMeta(TypedDict):
    """A pending repair (raft/repair.py): up to which entry, and why.  ``until_term`` is missing
    from a meta file written before it was kept (the current term stands in)."""

    until: int
    until_term: NotRequired[int]
    reason: str


class JournalMeta(TypedDict, total=False):
    """What the meta file holds: JSON values whose bytes the copy's checksum proved (``_parse_meta``);
    readers still convert them (``int(...)``), a file of an earlier version being unchecked."""

    first_index: int
    commit: int  # the commit hint (replay after a restart)
    term: int
    vote: str | None  # pysyncobj's votedForNodeId (a node's address), None before any vote
    repair: RepairMeta


def _parse_meta(raw: bytes) -> tuple[int, JournalMeta] | None:
    """(seq, meta) of one copy, or None if it is damaged.  A bare object (no ``crc``) is a file
    written before checksums: sequence -1, so that any checked copy wins over it."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    if "crc" not in doc:
        return (-1, cast(JournalMeta, doc)) if "seq" not in doc and "meta" not in doc else None
    seq, meta = doc.get("seq"), doc.get("meta")
    if not isinstance(seq, int) or not isinstance(meta, dict) or doc["crc"] != _meta_crc(seq, meta):
        return None
    return seq, cast(JournalMeta, meta)


class MetaFile:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.paths = (os.path.join(directory, META_NAME), os.path.join(directory, META_COPY_NAME))
        self.seq = 0
        self.problems: list[str] = []  # what load found wrong (a damaged copy, both damaged)

    def load(self, mend: bool = True) -> JournalMeta:
        """The newest intact meta; {} for a new journal.  Raises MetaUnreadable when a meta file
        exists and no copy of it is intact (the term and vote are then unknown).  ``mend``:
        rewrite both copies when one was damaged or old (not when a stopped node is verified)."""
        found: list[tuple[int, JournalMeta]] = []
        present = 0
        legacy = False
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    raw = fh.read()
            except FileNotFoundError:
                continue
            present += 1
            parsed = _parse_meta(raw)
            if parsed is None:
                self.problems.append(f"{os.path.basename(path)}: damaged (checksum or syntax)")
                continue
            legacy = legacy or parsed[0] < 0
            found.append(parsed)
        if not present:
            return {}
        if not found:
            raise MetaUnreadable("; ".join(self.problems))
        seq, meta = max(found, key=lambda item: item[0])
        self.seq = max(seq, 0)
        if mend and (self.problems or legacy or len(found) < 2):
            if self.problems:
                log.error("raft journal meta: %s; the other copy is intact and is used (term %s)",
                          "; ".join(self.problems), meta.get("term"))
            self.write(meta)  # both copies intact again (and in the checked form)
        return meta

    def write(self, meta: JournalMeta) -> None:
        """Both copies, each written in place and fsynced, one after the other."""
        self.seq += 1
        data = json.dumps({"seq": self.seq, "crc": _meta_crc(self.seq, meta), "meta": meta},
                          sort_keys=True, separators=(",", ":")).encode()
        created = False
        for path in self.paths:
            created = created or not os.path.exists(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        if created:
            _fsync_dir(self.directory)


@dataclass(frozen=True, slots=True)
class Mark:
    """The journal was fsynced up to ``size`` bytes of segment ``segment``, entry ``index``."""

    seq: int
    segment: int
    size: int
    index: int
    term: int = 0  # of the entry at ``index``: what a learner compares candidates with (raft/repair.py)


_SLOT = struct.Struct("<QQQQQ")  # seq, segment number, synced bytes of that segment, last index, its term
_SLOT_BYTES = 48  # the slot, its crc32c (u32), padding


class SyncedMark:
    def __init__(self, directory: str, readonly: bool = False) -> None:
        self.path = os.path.join(directory, MARK_NAME)
        self.existed = os.path.exists(self.path)
        if readonly and not self.existed:
            self._fd = -1
            self.damaged, self.mark, self._seq = False, None, 0
            return
        self._fd = os.open(self.path, os.O_RDONLY if readonly else os.O_RDWR | os.O_CREAT, 0o600)
        self.damaged = False  # the file exists but neither slot is intact
        self.mark = self._read() if self.existed else None
        self._seq = self.mark.seq if self.mark is not None else 0
        if not self.existed and not readonly:
            _fsync_dir(directory)

    def _read(self) -> Mark | None:
        data = os.pread(self._fd, 2 * _SLOT_BYTES, 0)
        best: Mark | None = None
        for slot in range(2):
            raw = data[slot * _SLOT_BYTES:slot * _SLOT_BYTES + _SLOT.size + 4]
            if len(raw) < _SLOT.size + 4:
                continue
            (crc,) = struct.unpack_from("<I", raw, _SLOT.size)
            if checksum(raw[:_SLOT.size]) != crc:
                continue
            mark = Mark(*_SLOT.unpack_from(raw, 0))
            if best is None or mark.seq > best.seq:
                best = mark
        if best is None and len(data) > 0:
            self.damaged = True
        return best

    def record(self, segment: int, size: int, index: int, term: int = 0, *, sync: bool = False) -> None:
        """Write the mark into the older slot; ``sync`` for a mark that goes *down* (a cut)."""
        self._seq += 1
        slot = _SLOT.pack(self._seq, segment, size, index, term)
        os.pwrite(self._fd, slot + struct.pack("<I", checksum(slot)) + bytes(_SLOT_BYTES - _SLOT.size - 4),
                  (self._seq % 2) * _SLOT_BYTES)
        if sync:
            os.fdatasync(self._fd)
        self.mark = Mark(self._seq, segment, size, index, term)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
