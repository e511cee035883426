"""The body store's scrubber: re-reads every stored body in the background at a bounded rate,
verifies it against its checksum, and repairs what it finds (issue 29; docs/design.md "Damaged
bodies").

Why: a body is verified when it is read for a delivery, but a backlog may sit on disk for days
before it is read, and by then the members that had intact copies may have lost theirs too (a
second fault).  Finding damage early, while a peer still has the body, is what makes it
repairable.

How it stays out of the way:

* It runs in a thread of its own and reads in slices of ``SLICE_BYTES`` (``BodyStore.scrub_slice``:
  a read transaction of its own, without the store's lock, so the loop keeps reading and writing;
  the lock is taken only for a bisection and, when something fails, to re-read it through the
  read path).  It never takes LMDB's write lock except to write a repaired body.
* After each slice it sleeps long enough to keep to ``bytes_per_second`` (config
  ``scrub_bytes_per_second``; 0 turns it off).  8 MiB/s by default: a 10 GB store is read in about
  twenty minutes, at a few percent of one disk's bandwidth.
* What it finds is repaired like a read's damage (``Bodies.repair``: from the members, each copy
  verified), or, on a single node, reported (logged at ERROR, counted in ``bodies_damaged``); a
  delivery of that body is then refused (``store/disk/bodies.py``).
"""

from __future__ import annotations

import logging
import threading
import time

from .bodies import REPAIR_RETRY_SECONDS, Bodies

log = logging.getLogger(__name__)

#: Bytes verified per slice: a few ms of reading and checksumming (0.28 us per 4 KiB for the CRC).
SLICE_BYTES = 1 << 20
#: Seconds between two passes, as the journal's scrubber (raft/scrub.py): a small store was read
#: again and again, and the thread's share of the GIL showed in the loop's latency (3-node round
#: trip p99 2.52 against 2.38 ms with scrubbing off, bench/ab_cluster.py, 8 rounds).
PAUSE_BETWEEN_PASSES = 60.0


class BodyScrubber:
    """Scrubs ``bodies.store`` in a daemon thread until ``stop``."""

    def __init__(self, bodies: Bodies, bytes_per_second: int, slice_bytes: int = SLICE_BYTES) -> None:
        self.bodies = bodies
        self.bytes_per_second = bytes_per_second
        self.slice_bytes = slice_bytes
        self.passes = 0  # whole passes over the store
        self.bytes = 0  # bytes verified
        self.found = 0  # damaged bodies found by the scrubber
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.bytes_per_second <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="body-scrub", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def step(self, position: tuple[int, int] = (0, 0)) -> tuple[tuple[int, int], int]:
        """One slice from ``position``: verify, repair what fails.  Returns the next position and
        the bytes read.  (The thread's loop; tests call it directly.)"""
        position, read, damaged = self.bodies.store.scrub_slice(position, self.slice_bytes)
        self.bytes += read
        if damaged:
            self.found += len(damaged)
            got = self.bodies.repair(damaged, wait=True)
            if len(got) < len(damaged):
                log.error("scrub: %d damaged message bodies not repaired (no member has them intact, "
                          "or this node has no members): their deliveries will be refused",
                          len(damaged) - len(got))
        return position, read

    def _run(self) -> None:
        position = (0, 0)
        pass_bytes = 0
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                position, read = self.step(position)
            except Exception:  # the store closed under us (shutdown), or a bug: never kill the node
                if self._stop.is_set():
                    return
                log.exception("scrubbing the body store failed; retrying in a minute")
                self._stop.wait(60)
                position = (0, 0)
                continue
            pass_bytes += read
            # Keep to the rate; after a whole pass, wait PAUSE_BETWEEN_PASSES.
            pause = max(read / self.bytes_per_second - (time.monotonic() - began), 0.0)
            if position == (0, 0):
                self.passes += 1
                if self.passes == 1 or self.passes % 100 == 0:
                    log.info("scrub: pass %d over the body store done (%d bytes verified in all, "
                             "%d damaged bodies found)", self.passes, self.bytes, self.found)
                pause = max(pause, PAUSE_BETWEEN_PASSES)
                pass_bytes = 0
            self._wait(pause)

    def _wait(self, pause: float) -> None:
        """Sleep ``pause`` seconds, but retry the repair of damaged bodies no member had every
        REPAIR_RETRY_SECONDS meanwhile: the member with an intact copy may have been down or behind
        (seen in a chaos run: the only other member up lagged; a minute's pause left the damage
        until after the run)."""
        deadline = time.monotonic() + pause
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._stop.wait(min(left, REPAIR_RETRY_SECONDS))
            try:
                damaged = sorted(self.bodies.store.damaged)
            except RuntimeError:  # changed by the loop while copied: the next round
                continue
            if damaged and not self._stop.is_set():
                self.bodies.repair(damaged, wait=True)
