"""What a check of the files on disk found (issue 29, docs/design.md "Storage faults").

Every store that is read back (the Raft journal and its meta file, snapshots, the body store, the
single-node state, the audit history) checks what it reads and, when asked to verify a stopped
node's files (``raftmq verify --data-dir DIR``) or scrubbed in the background, reports each damaged
place as a :class:`Damage`.  The one type lets the CLI, the scrubber, status.json and the tests
treat every store alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import crc32c


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged place in one file."""

    store: str  # "journal", "journal-meta", "snapshot", "bodies", "state", "events"
    path: str  # the file (or directory) it is in
    where: str  # record index, key, offset: enough for a person to find it
    what: str  # what is wrong: "checksum mismatch", "truncated: 120 of 4096 bytes", ...

    def __str__(self) -> str:
        return f"{self.store}: {self.path} at {self.where}: {self.what}"


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC32C of ``data`` (hardware based where the CPU has SSE4.2: ~0.28 us per 4 KiB here,
    against zlib.crc32's 1.1 us), the checksum every store uses for what it writes from now on."""
    return crc32c.crc32c(data)


class SnapshotDamaged(Exception):
    """A snapshot file failed its checksum, or LMDB could not read it (the Raft log sets such a
    file aside at start; the store's snapshot format raises it)."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"snapshot {path} is damaged: {what}")
        self.path, self.what = path, what
