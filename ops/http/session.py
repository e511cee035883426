"""Login sessions of the management UI: a server-side store of random session ids (issue 35).

The UI logs in once (POST /api/login, ops/http/login.py) and then sends a cookie instead of Basic
credentials: a browser that holds Basic credentials resends them with any site's requests and
cannot forget them (no logout), and the browser's prompt is no login form.

* A session id is 256 random bits (``secrets.token_urlsafe(32)``), sent only in an ``HttpOnly``,
  ``SameSite=Strict`` cookie (``Secure`` on a TLS listener); the store keeps the SHA-256 of each id,
  so a lookup compares digests, not the secret, and a dump of the store holds no usable id.
* Each session has its own CSRF token (another 256 bits) that the page reads from the login answer
  or /api/whoami and sends as ``X-CSRF-Token`` with every change: a cookie is sent by the browser
  whoever's page asks, the token only by a page of this origin (ops/http/common.py checks it).
* A session expires ``ttl`` seconds after login (RabbitMQ's ``login_session_timeout``: 8 hours) and
  ends at logout; it is also void once its user is deleted or its password changed (the stored
  password hash seen at login is kept and compared at each request), and what it may do is read
  afresh from the user's current tags and permissions at each request.
* The store holds at most ``limit`` sessions: expired ones are dropped first, then the oldest.
  Only a correct password opens a session, so a flood of logins is bounded by the login pool
  (node/logins.py) and can at worst end older sessions, not grow memory.

Sessions live in the answering node's memory: the UI talks to one node, and a restart logs it out.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.node.auth import AuthError
from raftmq.store.core import queries as Q

from ..operator import Operator, user_tags

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

COOKIE = "raftmq_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL = 8 * 3600.0  # seconds, RabbitMQ's management.login_session_timeout default (480 minutes)
MAX_SESSIONS = 1024


@dataclass
class Session:
    """One logged-in browser: who, the password hash seen at login, its CSRF token, its end."""

    user: str
    stored: str
    csrf: str
    expires: float


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).digest()


class SessionStore:
    """Sessions by the digest of their id, bounded in number and in time (see the module docstring)."""

    def __init__(self, ttl: float = SESSION_TTL, limit: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.limit = max(1, limit)
        self.clock = clock
        self._sessions: dict[bytes, Session] = {}  # in creation order: the first is the oldest

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, user: str, stored: str) -> tuple[str, Session]:
        """A new session for ``user``: (its id, for the cookie only; the session)."""
        now = self.clock()
        if len(self._sessions) >= self.limit:
            self._drop_expired(now)
        while len(self._sessions) >= self.limit:
            del self._sessions[next(iter(self._sessions))]
        session_id = secrets.token_urlsafe(32)
        session = Session(user, stored, secrets.token_urlsafe(32), now + self.ttl)
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        """The live session of this id, or None (unknown, ended or expired: an expired one is dropped)."""
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is not None and session.expires <= self.clock():
            del self._sessions[key]
            return None
        return session

    def close(self, session_id: str) -> bool:
        """End a session (logout); whether there was one."""
        return self._sessions.pop(_digest(session_id), None) is not None

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[key]


def stored_secret(broker: Broker, user: str) -> str | None:
    """The user's password hash as the login checked it (replicated user first, then the file's)."""
    record = Q.user(broker.machine, user)
    if record is not None:
        return record.password_hash
    configured = broker.config.users.get(user)
    return configured.password if configured is not None else None


def session_operator(broker: Broker, session: Session, peer_host: str | None) -> Operator | None:
    """The operator a live session acts as now, or None when its user is gone, its password changed,
    or it may not log in from ``peer_host`` (a loopback-only user): the same rules as a login but
    the password check, with the user's current tags and permissions."""
    stored = stored_secret(broker, session.user)
    if stored is None or not secrets.compare_digest(stored.encode(), session.stored.encode()):
        return None
    try:
        principal = broker.auth.principal_named(session.user, peer_host)
    except AuthError:
        return None
    return Operator(session.user, frozenset(user_tags(broker, session.user)), principal)
