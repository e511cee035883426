"""A background scrubber for the Raft journal and the snapshot file (issue 29).

Damage at rest is found when the node reads the bytes back: at its next start (the journal's scan,
the snapshot's checksum) or when the leader reads an old entry for a follower far behind.  Both can
be months away on a quiet node, by which time the other copies may be gone too.  The scrubber reads
every flushed journal record and the whole snapshot in a background thread, at most
``bytes_per_second`` (throttled by sleeping after every ``chunk`` bytes, so a pass over a 1 GiB
journal at the default 8 MiB/s takes about two minutes and never competes with the tick thread for
long), checks their checksums and reports what fails to ``on_damage`` -- from the scrubber's
thread; :class:`raft.replica.Replica` hands it to its tick, which repairs by taking a new snapshot:
that rewrites a damaged snapshot file and drops the journal's records up to the applied index, so a
damaged committed record is no longer needed by anyone (a follower far behind gets the snapshot).

Only bytes already fsynced are read (the synced mark says how far the newest segment is), so the
scrubber never races a write; a segment deleted by compaction meanwhile is skipped.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable

from raftmq.integrity import Damage

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<II")  # as raft/journal.py's records: length, crc32


def scrub_segment(path: str, limit: int, throttle: Callable[[int], None] = lambda _n: None,
                  chunk: int = 1 << 20) -> Damage | None:
    """Verify the records of one segment file up to ``limit`` bytes; the first damage, if any."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None  # compacted away meanwhile
    try:
        pos = 0
        buffer = b""
        base = 0  # file offset of buffer[0]
        while pos < limit:
            if pos + _HEAD.size > base + len(buffer):
                buffer = buffer[pos - base:] + os.pread(fd, min(chunk, limit - base - len(buffer)), base + len(buffer))
                base = pos
                throttle(len(buffer))
                if pos + _HEAD.size > base + len(buffer):
                    return Damage("journal", path, f"offset {pos}", f"ends at {base + len(buffer)} bytes, "
                                  f"{limit} were fsynced")
            length, crc = _HEAD.unpack_from(buffer, pos - base)
            end = pos + _HEAD.size + length
            if end > limit:
                return Damage("journal", path, f"offset {pos}", f"a record of {length} bytes runs past the "
                              f"{limit} bytes fsynced (its length field is damaged)")
            if end > base + len(buffer):
                buffer = buffer[pos - base:] + os.pread(fd, end - base - len(buffer), base + len(buffer))
                base = pos
                throttle(length)
                if end > base + len(buffer):
                    return Damage("journal", path, f"offset {pos}", "the file is shorter than what was fsynced")
            body = buffer[pos - base + _HEAD.size:end - base]
            if zlib.crc32(body) != crc:
                return Damage("journal", path, f"offset {pos}", "record fails its checksum")
            pos = end
        return None
    finally:
        os.close(fd)


class StorageScrubber:
    """Passes over the journal's flushed segments and the snapshot, forever, rate-limited."""

    def __init__(self, targets: Callable[[], list[tuple[str, int]]], snapshot_path: str,
                 verify_snapshot: Callable[[str], list[Damage]], on_damage: Callable[[Damage], None],
                 bytes_per_second: int, pause_between_passes: float = 60.0) -> None:
        self._targets = targets  # (segment path, bytes fsynced) of the journal's segments, oldest first
        self._snapshot_path = snapshot_path
        self._verify_snapshot = verify_snapshot
        self._on_damage = on_damage
        self.bytes_per_second = bytes_per_second
        self.pause_between_passes = pause_between_passes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.bytes = 0  # bytes read back and verified
        self.found = 0  # damaged places reported
        self._reported: set[tuple[str, str]] = set()  # a damage is reported once

    def start(self) -> None:
        if self.bytes_per_second <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="storage-scrubber", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _throttle(self, nbytes: int) -> None:
        self.bytes += nbytes
        if self.bytes_per_second > 0:
            self._stop.wait(nbytes / self.bytes_per_second)

    def one_pass(self) -> list[Damage]:
        found: list[Damage] = []
        for path, limit in self._targets():
            if self._stop.is_set():
                return found
            damage = scrub_segment(path, limit, self._throttle)
            if damage is not None:
                found.append(damage)
        if os.path.exists(self._snapshot_path) and not self._stop.is_set():
            try:
                size = os.path.getsize(self._snapshot_path)
            except FileNotFoundError:
                size = 0
            if size:
                found.extend(self._verify_snapshot(self._snapshot_path))
                self._throttle(size)
        self.passes += 1
        for damage in found:
            key = (damage.path, damage.where)
            if key not in self._reported:
                self._reported.add(key)
                self.found += 1
                self._on_damage(damage)
        return found

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            try:
                self.one_pass()
            except Exception:  # the scrubber must never take the node down
                log.exception("storage scrubber pass failed")
            log.debug("storage scrub pass %d done: %d bytes in %.1f s", self.passes, self.bytes,
                      time.monotonic() - started)
            self._stop.wait(self.pause_between_passes)
