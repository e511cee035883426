"""Who is asking a management API (HTTP or gRPC): a broker user with RabbitMQ's management tags.

Credentials are the broker's users (configured or replicated: node/auth.py checks them, loopback-only
users included), presented as HTTP basic auth -- in the ``Authorization`` header over HTTP, in the
``authorization`` metadata over gRPC.  What a user may do follows RabbitMQ's user tags
(https://www.rabbitmq.com/docs/management#permissions):

* ``management``: the management API at all; sees and changes only the vhosts it has permissions
  in, and only its own connections and channels;
* ``policymaker``: management, plus policies and parameters (raftmq has none yet);
* ``monitoring``: management, plus every vhost, every connection and channel, node-level data;
* ``administrator``: everything, including users, permissions, vhosts and definitions.

A login is checked with PBKDF2 (~5 ms): answers are remembered per (user, stored secret,
password digest), so a dashboard polling every few seconds costs a dictionary lookup; a changed
password or user record changes the key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.node.auth import AuthError, Principal
from raftmq.store.core import queries as Q

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT = "administrator", "monitoring", "policymaker", "management"
# Each tag grants the tags it includes (RabbitMQ's is_admin / is_monitor / is_policymaker / is_mgmt).
_IMPLIED = {
    ADMINISTRATOR: {ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT},
    MONITORING: {MONITORING, MANAGEMENT},
    POLICYMAKER: {POLICYMAKER, MANAGEMENT},
    MANAGEMENT: {MANAGEMENT},
}
_CACHE_SIZE = 256


@dataclass(frozen=True)
class Operator:
    """An authenticated management user."""

    name: str
    tags: frozenset[str]
    principal: Principal

    def has(self, tag: str) -> bool:
        """Whether this user's tags grant ``tag`` (administrator grants them all)."""
        return any(tag in _IMPLIED.get(t, ()) for t in self.tags)

    @property
    def sees_all_vhosts(self) -> bool:
        return self.has(MONITORING)

    def may_see_vhost(self, vhost: str) -> bool:
        return self.sees_all_vhosts or self.principal.may_access_vhost(vhost)

    def may_use_vhost(self, vhost: str) -> bool:
        """Changing anything in a vhost needs permissions there, whatever the tags (as RabbitMQ)."""
        return self.principal.may_access_vhost(vhost)


def user_tags(broker: Broker, name: str) -> list[str]:
    """A user's tags: the replicated user's, else the configured one's."""
    record = Q.user(broker.machine, name)
    if record is not None:
        return list(record.tags)
    user = broker.config.users.get(name)
    return list(user.tags) if user is not None else []


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """``Basic base64(user:password)`` -> (user, password); None when absent or malformed."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def basic_header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class Gatekeeper:
    """Checks management logins against the broker's users (one per node, shared by HTTP and gRPC)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._known: dict[tuple, Principal] = {}

    def login(self, user: str, password: str, peer_host: str | None, cached_only: bool = False) -> Operator | None:
        """The operator, or None for an unknown user, a wrong password or a loopback-only user
        connecting from elsewhere.  ``cached_only``: None too when the credentials would need a
        password check (a PBKDF2): the HTTP API answers remembered ones on its loop."""
        broker = self.broker
        record = Q.user(broker.machine, user)
        configured = broker.config.users.get(user)
        stored = record.password_hash if record is not None else (configured.password if configured else None)
        if stored is None:  # the same PBKDF2 as a known user's login: the time tells nothing (issue 31)
            if cached_only:
                return None
            with contextlib.suppress(AuthError):
                broker.auth.authenticate("PLAIN", f"\0{user}\0{password}".encode(), "127.0.0.1")
            self._refused(user, peer_host, "no such user")
            return None
        # The permissions are part of the key: a change (for a user of the configuration file, its
        # overlay, store/core/users.py) must reach the next request, not wait for the cache to clear.
        permissions = record.permissions if record is not None else Q.permission_overlay(broker.machine, user)
        key = (user, stored, hashlib.sha256(password.encode()).digest(), tuple(sorted(permissions.items())))
        principal = self._known.get(key)
        if principal is None:
            if cached_only:
                return None
            try:
                principal = broker.auth.authenticate("PLAIN", f"\0{user}\0{password}".encode(), "127.0.0.1")
            except AuthError as exc:
                self._refused(user, peer_host, str(exc))
                return None
            if len(self._known) >= _CACHE_SIZE:
                self._known.clear()
            self._known[key] = principal
        loopback_only = record.loopback_only if record is not None else configured.loopback_only
        if loopback_only:
            from raftmq.node.auth import is_loopback

            if not is_loopback(peer_host):
                self._refused(user, peer_host, f"user '{user}' can only connect via localhost")
                return None
        return Operator(user, frozenset(user_tags(broker, user)), principal)

    def _refused(self, user: str, peer_host: str | None, reason: str) -> None:
        """A management login refused: noted in the audit history (node/audit.py, bounded per
        address there), from whichever thread checked it."""
        self.broker.audit_from_thread(self.broker.audit.login_refused, user, "PLAIN", peer_host, reason,
                                      "management")

    def login_header(self, header: str | None, peer_host: str | None, cached_only: bool = False) -> Operator | None:
        credentials = parse_basic(header)
        return self.login(*credentials, peer_host, cached_only) if credentials else None
