"""File descriptors: the process limit, how many are open, and a reserve kept for AMQP logins.

Every socket holds a descriptor, accepted or not yet authenticated.  Issue 31 showed 1,000
half-open HTTP requests taking a node at 1,024 descriptors to its limit, after which every AMQP
login failed (``accept`` gets EMFILE) with nothing logged.  So:

* at start the node raises its soft RLIMIT_NOFILE to the hard limit (:func:`raise_nofile_limit`):
  the soft default of 1,024 is far below what a broker needs, the hard limit is the operator's;
* a listener that is not the broker's business (the HTTP API) asks :class:`DescriptorReserve`
  before keeping a new socket, and refuses it while fewer than ``fd_reserve`` descriptors remain
  below the limit -- those stay for AMQP clients, whose own admission is node/admission.py.

Counting open descriptors means listing /proc/self/fd (O(open descriptors)); the count is cached
for ``RECOUNT_SECONDS`` and the sockets accepted since are added to it, so that a flood of
connections costs one listing per interval, not one per connection.  Where /proc is missing the
reserve cannot be checked and is not enforced (logged once).
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

RECOUNT_SECONDS = 0.1
FD_DIR = "/proc/self/fd"


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (old soft, new soft)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # e.g. a hard limit above the kernel's nr_open
        log.warning("cannot raise the file descriptor limit from %d to %d: %s", soft, hard, exc)
        return soft, soft
    return soft, hard


def nofile_limit() -> int:
    """The soft RLIMIT_NOFILE (what ``accept`` runs into)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def open_descriptors() -> int | None:
    """Descriptors this process has open now, or None where /proc is not available."""
    try:
        return len(os.listdir(FD_DIR)) - 1  # minus the one listdir itself opened
    except OSError:
        return None


@dataclass
class DescriptorReserve:
    """Whether a listener may keep one more socket without eating into the reserve."""

    reserve: int
    limit: int = field(default_factory=nofile_limit)
    _counted: int | None = None
    _counted_at: float = float("-inf")
    _since: int = 0  # sockets kept since the last count

    def __post_init__(self) -> None:
        if self.limit != resource.RLIM_INFINITY:
            self.reserve = max(0, min(self.reserve, self.limit // 2))

    def in_use(self) -> int | None:
        """Open descriptors (cached up to RECOUNT_SECONDS, plus the sockets kept since)."""
        now = time.monotonic()
        if now - self._counted_at >= RECOUNT_SECONDS:
            self._counted, self._counted_at, self._since = open_descriptors(), now, 0
        return None if self._counted is None else self._counted + self._since

    def exhausted(self) -> bool:
        """True while a new socket would leave fewer than ``reserve`` descriptors free."""
        if self.limit == resource.RLIM_INFINITY or self.reserve <= 0:
            return False
        used = self.in_use()
        return used is not None and used > self.limit - self.reserve

    def kept(self) -> None:
        """A socket was kept: count it until the next listing."""
        self._since += 1


@dataclass
class ListenerStats:
    """What a listener (besides the AMQP ones) reports: sockets it holds, refused and timed out.

    Registered by name in :data:`LISTENERS` (one node per process) for ops/metrics.py."""

    name: str
    open: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # reason -> sockets refused
    timed_out: int = 0

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


LISTENERS: dict[str, ListenerStats] = {}


def listener_stats(name: str) -> ListenerStats:
    """The stats of listener ``name``, registered on first use."""
    return LISTENERS.setdefault(name, ListenerStats(name))


@dataclass
class RefusalLog:
    """Logs a refusal at most once per ``interval`` seconds per kind, with the number left unlogged:
    a flood of refused sockets must not become a flood of log lines."""

    logger: logging.Logger
    interval: float = 10.0
    _last: dict[str, float] = field(default_factory=dict)
    _quiet: dict[str, int] = field(default_factory=dict)

    def warning(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, float("-inf")) < self.interval:
            self._quiet[kind] = self._quiet.get(kind, 0) + 1
            return
        self._last[kind] = now
        quiet = self._quiet.pop(kind, 0)
        if quiet:
            message += " (and %d more like it not logged in the last %ds)"
            args = (*args, quiet, int(self.interval))
        self.logger.warning(message, *args)
