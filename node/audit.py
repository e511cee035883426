"""Who did what at this node's front ends, proposed through the log for every node's history (issue 36).

Connections opening and closing, refused logins, operations refused for a permission and
administrative changes happen at one node's front end (or admin API), never inside ``apply``.  Each
becomes an ``AuditNote`` command (store/core/audit.py) submitted through the log without a token, so
that every node records it at the same place of its history, with the leader-stamped time of its
batch.  Notes are proposed whatever this node's own ``audit_retention``: another node of the cluster
may keep a history, and the numbering (``event_seq``) is replicated either way.

*The principal once per connection.*  ``opened`` notes the connection's user, protocol, address
and name; per-message events carry only the connection id (``conn``), and readers join them with
the history's ``connections`` table (store/disk/event_writer.py, spark/datasource.py).  A
connection's principal is remembered here while it is open, so that a refused operation and the
close note carry it too.

*Bounded.*  A client hammering wrong passwords or a forbidden queue must not flood the log: refusals
(logins and operations) are limited per source address to ``per_source`` notes per ``window``
seconds and to ``per_window`` notes per window for the whole node; what is held back is counted
and proposed as one note per source and kind when its window is over (``flush``, from the node's
tick loop: ``detail`` "N more like this suppressed").  Opened/closed notes are not limited (their
rate is bounded by logins, which cost a PBKDF2 each in the bounded login pool, and by the
connection limits) and neither are administrative changes (an administrator's each one counts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.store.core import events as EV
from raftmq.store.core.commands import AuditNote

if TYPE_CHECKING:
    from .core.access import Access

log = logging.getLogger(__name__)

PER_SOURCE = 5  # refusal notes per source address and kind per window
PER_WINDOW = 100  # refusal notes per window for the whole node
WINDOW = 1.0  # seconds
MAX_SOURCES = 4096  # sources tracked at once (the oldest are flushed and forgotten past it)


@dataclass(slots=True)
class _Source:
    """Refusals of one kind from one address in the current window."""

    started: float
    noted: int = 0
    held: int = 0  # suppressed in this window
    vhost: str = ""
    principal: tuple = ()


class AuditNotes:
    """The node's note taker: builds AuditNote commands and hands them to ``submit``."""

    def __init__(self, submit: Callable[[AuditNote], None], *, clock: Callable[[], float] = time.monotonic,
                 per_source: int = PER_SOURCE, per_window: int = PER_WINDOW, window: float = WINDOW,
                 max_sources: int = MAX_SOURCES) -> None:
        self._submit = submit
        self._clock = clock
        self.per_source, self.per_window, self.window, self.max_sources = per_source, per_window, window, max_sources
        self._open: dict[str, tuple[list, str]] = {}  # conn -> (principal, vhost), while open
        self._sources: dict[tuple[int, str], _Source] = {}
        self._window_started = clock()
        self._window_noted = 0
        self.noted = 0  # notes proposed
        self.suppressed = 0  # refusal notes held back (then proposed as counts)

    # ------------------------------------------------------------------ connections

    def opened(self, conn: str, protocol: str, access: Access, address: str, name: str = "") -> None:
        """A client connection is open in ``access.vhost`` as ``access.principal``: note it, and let
        ``access`` report refused operations here."""
        principal = [access.principal.name, protocol, address, name or ""]
        self._open[conn] = (principal, access.vhost)
        access.on_refused = lambda operation, permission, kind, resource: self.refused(
            conn, operation, permission, kind, resource)
        self._note(AuditNote(conn, None, EV.CONNECTION_OPENED, access.vhost, "", "", "", principal))

    def closed(self, conn: str, reason: str = "") -> None:
        """A connection noted as opened is gone (a connection that never opened is not noted)."""
        known = self._open.pop(conn, None)
        if known is not None:
            principal, vhost = known
            self._note(AuditNote(conn, None, EV.CONNECTION_CLOSED, vhost, "", "", reason, principal))

    # ------------------------------------------------------------------ refusals (bounded)

    def refused(self, conn: str, operation: str, permission: str, kind: str, resource: str) -> None:
        """``operation`` on the ``kind`` (queue/exchange) ``resource`` refused for lack of ``permission``."""
        principal, vhost = self._open.get(conn, (["", "", "", ""], ""))
        self.refused_as(principal, vhost, conn, operation, permission, kind, resource)

    def refused_as(self, principal: list, vhost: str, conn: str | None, operation: str, permission: str,
                   kind: str, resource: str) -> None:
        """``refused`` for a principal without a client connection (an HTTP operator's request)."""
        queue, exchange = {"queue": (resource, ""), "exchange": ("", resource)}.get(kind, ("", ""))
        detail = f"{operation} needs {permission}"
        if self._admit(EV.ACCESS_REFUSED, principal[2], vhost, principal):
            self._note(AuditNote(conn, None, EV.ACCESS_REFUSED, vhost, queue, exchange, detail, principal))

    def vhost_refused(self, conn: str | None, protocol: str, user: str, address: str, vhost: str) -> None:
        """A logged-in user refused the vhost its connection asked to open (no permissions there)."""
        self.refused_as([user, protocol, address, ""], vhost, conn, "connection_open", "access", "vhost", vhost)

    def login_refused(self, username: str | None, mechanism: str, address: str | None, reason: str,
                      protocol: str = "") -> None:
        """A login refused (node/auth.py ``note_refused``): the user name tried, mechanism, address."""
        principal = [username or "", protocol, address or "", ""]
        if self._admit(EV.LOGIN_REFUSED, address or "", "", principal):
            self._note(AuditNote(None, None, EV.LOGIN_REFUSED, "", "", "", f"{mechanism}: {reason}", principal))

    # ------------------------------------------------------------------ administration

    def admin_change(self, user: str, protocol: str, address: str, what: str, vhost: str = "") -> None:
        """An administrative change that took effect: who (user, protocol, address) and what."""
        self._note(AuditNote(None, None, EV.ADMIN_CHANGE, vhost, "", "", what, [user, protocol, address, ""]))

    # ------------------------------------------------------------------ the bound

    def _admit(self, kind: int, address: str, vhost: str, principal: list) -> bool:
        """Whether a refusal note from ``address`` may go now; else it is counted for ``flush``."""
        now = self._clock()
        if now - self._window_started >= self.window:
            self._window_started, self._window_noted = now, 0
        key = (kind, address)
        source = self._sources.get(key)
        if source is None or now - source.started >= self.window:
            if source is not None and source.held:
                self._summarize(key, source)
            if source is None and len(self._sources) >= self.max_sources:
                self.flush(force=True)
            source = self._sources[key] = _Source(now)
        source.vhost, source.principal = vhost, tuple(principal)
        if source.noted < self.per_source and self._window_noted < self.per_window:
            source.noted += 1
            self._window_noted += 1
            return True
        source.held += 1
        self.suppressed += 1
        return False

    def flush(self, force: bool = False) -> None:
        """Propose the counts held back for sources whose window is over (all of them if ``force``),
        and forget those sources."""
        now = self._clock()
        for key, source in list(self._sources.items()):
            if force or now - source.started >= self.window:
                if source.held:
                    self._summarize(key, source)
                del self._sources[key]

    def _summarize(self, key: tuple[int, str], source: _Source) -> None:
        kind, _address = key
        principal = list(source.principal) or ["", "", key[1], ""]
        self._note(AuditNote(None, None, kind, source.vhost, "", "", f"{source.held} more like this suppressed",
                             principal))
        source.held = 0

    def _note(self, note: AuditNote) -> None:
        self.noted += 1
        self._submit(note)
