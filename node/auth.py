"""Authentication (SASL PLAIN and AMQPLAIN) and RabbitMQ-style vhost permissions."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from raftmq.node.config import UserConfig
from raftmq.ratelog import RateLimitedLog
from raftmq.store.core.users import UserRecord, overlaid

from .logins import LoginPool

log = logging.getLogger(__name__)

MECHANISMS = ("PLAIN", "AMQPLAIN")
HASH_SCHEME = "pbkdf2-sha256"
HASH_ITERATIONS = 20_000  # ~5 ms per login on this machine: cheap for clients, costly to brute-force


def hash_password(password: str, *, salt: bytes | None = None, iterations: int = HASH_ITERATIONS) -> str:
    """``pbkdf2-sha256$iterations$salt$hash`` (base64): what the log and LMDB hold, never the password."""
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"{HASH_SCHEME}${iterations}${b64(salt).decode()}${b64(digest).decode()}"


# RabbitMQ's password hashes (definitions imported from RabbitMQ keep their users' passwords):
# base64(4 bytes of salt + digest(salt + password)), stored here as ``rabbit-<algorithm>$<base64>``.
RABBIT_HASHES = {"rabbit_password_hashing_sha256": "sha256", "rabbit_password_hashing_sha512": "sha512",
                 "rabbit_password_hashing_md5": "md5"}


def verify_password(stored: str, password: str) -> bool:
    if stored.startswith("rabbit-"):
        return _verify_rabbit(stored, password)
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != HASH_SCHEME:
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(expected, actual)


def _verify_rabbit(stored: str, password: str) -> bool:
    algorithm, _, encoded = stored[len("rabbit-"):].partition("$")
    if algorithm not in RABBIT_HASHES.values():
        return False
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError:
        return False
    salt, expected = raw[:4], raw[4:]
    return len(raw) > 4 and hmac.compare_digest(hashlib.new(algorithm, salt + password.encode()).digest(), expected)


# A record no password matches, verified for logins that have no PBKDF2 record of their own (an
# unknown user, a configuration-file user, a RabbitMQ-imported hash): every login then costs one
# PBKDF2 at HASH_ITERATIONS, so that its time does not tell whether the user exists (issue 31).
_DUMMY_HASH = hash_password(base64.b64encode(os.urandom(18)).decode())


class AuthError(Exception):
    pass


class LoginBusy(AuthError):
    """Too many logins pending in the login pool: refused without hashing (node/logins.py)."""


@dataclass(frozen=True)
class Attempt:
    """A parsed login, its user's stored credential read on the loop (``None``: no such user), and
    whether that credential is the configuration file's plain password."""

    mechanism: str
    username: str
    password: str = field(repr=False)  # never in a log line or a traceback's repr
    stored: str | None = field(repr=False)
    plain: bool = True


def check_password(attempt: Attempt) -> bool:
    """The CPU-bound half of a login, for any thread (hashlib releases the GIL): one PBKDF2
    whatever the user, then the real comparison."""
    stored = attempt.stored
    if stored is not None and not attempt.plain and stored.startswith(HASH_SCHEME + "$"):
        return verify_password(stored, attempt.password)
    verify_password(_DUMMY_HASH, attempt.password)  # the same cost as a stored PBKDF2 record
    if stored is None:
        return False
    if attempt.plain:
        return hmac.compare_digest(stored.encode(), attempt.password.encode())
    return verify_password(stored, attempt.password)


def parse_plain(response: bytes) -> tuple[str, str]:
    """RFC 4616: [authzid] NUL authcid NUL passwd."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise AuthError("malformed PLAIN response")
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")


def parse_amqplain(response: bytes) -> tuple[str, str]:
    """AMQPLAIN: a field table without its length prefix holding LOGIN and PASSWORD."""
    from raftmq.protocol.amqp091.errors import AMQPError
    from raftmq.protocol.amqp091.fieldtable import decode_table

    try:
        table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
    except AMQPError as exc:
        raise AuthError("malformed AMQPLAIN response") from exc
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if isinstance(login, bytes):
        login = login.decode("utf-8", "replace")
    if isinstance(password, bytes):
        password = password.decode("utf-8", "replace")
    if not isinstance(login, str) or not isinstance(password, str):
        raise AuthError("AMQPLAIN response lacks LOGIN/PASSWORD")
    return login, password


def is_loopback(peer_host: str | None) -> bool:
    if not peer_host:
        return False
    try:
        return ipaddress.ip_address(peer_host.split("%")[0]).is_loopback
    except ValueError:
        return False


_DECISIONS_KEPT = 4096  # remembered (vhost, kind, resource) answers per principal


@dataclass(frozen=True)
class Principal:
    """A user's compiled permissions.  They never change (a permission change makes a new
    principal, for new connections), so answers are remembered: a publish checks write access to
    its exchange, and a regular-expression match per message was a visible share of publishing."""

    name: str
    permissions: dict[str, tuple[re.Pattern, re.Pattern, re.Pattern]]
    _decisions: dict[tuple[str, int, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def may_access_vhost(self, vhost: str) -> bool:
        return vhost in self.permissions

    def allows(self, vhost: str, kind: int, resource: str) -> bool:
        """Permission ``kind`` (0 configure, 1 write, 2 read: node/core/access.py) on ``resource``."""
        key = (vhost, kind, resource)
        decision = self._decisions.get(key)
        if decision is None:
            perms = self.permissions.get(vhost)
            decision = perms is not None and perms[kind].search(resource) is not None
            if len(self._decisions) >= _DECISIONS_KEPT:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def may_configure(self, vhost: str, resource: str) -> bool:
        return self.allows(vhost, 0, resource)

    def may_write(self, vhost: str, resource: str) -> bool:
        return self.allows(vhost, 1, resource)

    def may_read(self, vhost: str, resource: str) -> bool:
        return self.allows(vhost, 2, resource)


def _compile(permissions: Mapping[str, tuple[str, str, str]]) -> dict[str, tuple[re.Pattern, re.Pattern, re.Pattern]]:
    """RabbitMQ's reading of a permission: a regular expression *searched* in the name (``perm`` grants
    ``xpermx``; anchor it to mean a prefix), and the empty string grants nothing (RabbitMQ reads it
    as ``^$``, which no resource name but the empty one matches -- and the default exchange is
    named ``amq.default`` for permissions, see node/core/access.py)."""
    return {vh: tuple(re.compile(p or "^$") for p in perms) for vh, perms in permissions.items()}


class Authenticator:
    """Checks logins against the configured users and the users managed through the admin API.

    ``managed`` returns the replicated users (``StateMachine.users``); one of them with the same
    name as a configured user replaces it.  ``overlay`` returns the permissions set through the
    admin API for configured users (``StateMachine.permission_overlay``, store/core/users.py), applied on
    top of the file's: the file stays the source of their password and tags.  Permissions are
    compiled once per change.
    """

    def __init__(self, users: dict[str, UserConfig],
                 managed: Callable[[], Mapping[str, UserRecord]] = dict,
                 overlay: Callable[[], Mapping[str, dict]] = dict, *,
                 login_workers: int = 2, login_limit: int = 64, refusal_log_interval: float = 1.0) -> None:
        self._users = users
        self.pool = LoginPool(LoginBusy, login_workers, login_limit)
        # Client logins refused (wrong password, unknown user, loopback-only, malformed response;
        # not those refused as too many pending, counted by the pool): counted, and logged at most
        # once per ``refusal_log_interval`` seconds with the number not logged in between -- a
        # flood of wrong passwords wrote a line each (issue 31).  Every front end's login goes
        # through :meth:`login` or :meth:`principal_named`, so this is the one place that logs them.
        self.refused = 0
        self._refusal_log = RateLimitedLog(log, refusal_log_interval)
        # Told of each refused login (user name tried or None, mechanism, address, reason): the
        # node's audit notes (node/audit.py, issue 36), which bound their own rate per address.
        self.on_refused: Callable[[str | None, str, str | None, str], None] | None = None
        self._managed = managed
        self._overlay = overlay
        self._principals = {name: Principal(name, _compile(user.permissions)) for name, user in users.items()}
        self._managed_principals: dict[str, tuple[tuple, Principal]] = {}
        self._overlaid_principals: dict[str, tuple[tuple, Principal]] = {}

    def authenticate(self, mechanism: str, response: bytes, peer_host: str | None) -> Principal:
        """A login checked on the calling thread (one PBKDF2, ~5 ms): front ends on the event loop
        use :meth:`login`, which hashes in the bounded login pool."""
        attempt = self.prepare(mechanism, response)
        return self.conclude(attempt, check_password(attempt), peer_host)

    async def login(self, mechanism: str, response: bytes, peer_host: str | None) -> Principal:
        """:meth:`authenticate` with the hash in the login pool (node/logins.py): the loop only
        parses and looks up; ``LoginBusy`` (an AuthError) when too many logins are pending."""
        try:
            attempt = self.prepare(mechanism, response)
        except AuthError as exc:
            self.note_refused(None, peer_host, exc, mechanism)
            raise
        matched = await self.pool.run(check_password, attempt)  # LoginBusy: counted by the pool
        try:
            return self.conclude(attempt, matched, peer_host)
        except AuthError as exc:
            self.note_refused(attempt.username, peer_host, exc, attempt.mechanism)
            raise

    async def update_secret(self, principal: Principal, secret: bytes, peer_host: str | None) -> Principal:
        """The principal a connection carries on with after 0-9-1 connection.update-secret.

        As RabbitMQ's internal user store: every raftmq user is a password user, already
        authenticated when the connection opened, so the secret is not looked at and the principal
        is unchanged (RabbitMQ's ``rabbit_access_control:update_state`` asks only the backends
        whose state can expire -- OAuth 2 tokens -- and keeps the others' state as it is).

        The hook for a token backend: one would verify ``secret`` here (signature, expiry, that it
        names ``principal.name``), return the principal its new token grants, and raise AuthError
        to refuse (the 0-9-1 front end then closes the connection with 530, RabbitMQ's "New
        secret was refused by one of the backends"). Async, so that such a check can run in the
        login pool; the front end holds the frames sent after update-secret until it is done."""
        del secret, peer_host  # not used by the internal store: see above
        return principal

    def note_refused(self, username: str | None, peer_host: str | None, exc: Exception,
                     mechanism: str = "") -> None:
        """Count a refused client login and log it, rate-limited (see ``refused`` in __init__), and
        tell ``on_refused`` (the audit history)."""
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused(username, mechanism, peer_host, str(exc))
        who = f"user '{username}'" if username is not None else "a client"
        self._refusal_log.warning("login refused for %s from %s: %s", who, peer_host or "an unknown address", exc)

    def prepare(self, mechanism: str, response: bytes) -> Attempt:
        """Parse the response and read the user's stored credential (on the loop: no hashing)."""
        if mechanism == "PLAIN":
            username, password = parse_plain(response)
        elif mechanism == "AMQPLAIN":
            username, password = parse_amqplain(response)
        else:
            raise AuthError(f"unsupported authentication mechanism '{mechanism}'")
        record = self._managed().get(username)
        if record is not None:
            return Attempt(mechanism, username, password, record.password_hash, False)
        user = self._users.get(username)
        return Attempt(mechanism, username, password, None if user is None else user.password, True)

    def conclude(self, attempt: Attempt, matched: bool, peer_host: str | None) -> Principal:
        """The principal of a checked attempt.  The user is read again: a user deleted or given a
        new password while the hash ran is refused."""
        username = attempt.username
        refused = AuthError(f"Login was refused using authentication mechanism {attempt.mechanism}.")
        if not matched:
            raise refused
        record = self._managed().get(username)
        if record is not None:
            if attempt.plain or record.password_hash != attempt.stored:
                raise refused
            loopback_only = record.loopback_only
            principal = self._managed_principal(record)
        else:
            user = self._users.get(username)
            if user is None or not attempt.plain or user.password != attempt.stored:
                raise refused
            loopback_only = user.loopback_only
            principal = self._config_principal(username)
        if loopback_only and not is_loopback(peer_host):
            raise AuthError(f"user '{username}' can only connect via localhost")
        return principal

    def principal_named(self, username: str, peer_host: str | None) -> Principal:
        """The principal of a user without a password check: the AMQP 1.0 ANONYMOUS login, which logs
        in as the one user the operator configured for it (``amqp10_anonymous_user``).  Everything
        :meth:`conclude` checks besides the password applies: a loopback-only user (guest, by
        default) is refused from another address (issue 31)."""
        try:
            return self._named(username, peer_host)
        except AuthError as exc:
            self.note_refused(username, peer_host, exc, "ANONYMOUS")
            raise

    def _named(self, username: str, peer_host: str | None) -> Principal:
        record = self._managed().get(username)
        if record is not None:
            loopback_only, principal = record.loopback_only, self._managed_principal(record)
        elif username in self._principals:
            loopback_only, principal = self._users[username].loopback_only, self._config_principal(username)
        else:
            raise AuthError(f"anonymous login user '{username}' does not exist")
        if loopback_only and not is_loopback(peer_host):
            raise AuthError(f"user '{username}' can only connect via localhost")
        return principal

    def _config_principal(self, name: str) -> Principal:
        """A configured user's principal: the file's permissions, or with the overlay applied."""
        overlay = self._overlay().get(name)
        if not overlay:
            return self._principals[name]
        key = tuple(sorted(overlay.items()))  # vhost names are unique: never compares patterns
        cached = self._overlaid_principals.get(name)
        if cached is None or cached[0] != key:
            permissions = overlaid(self._users[name].permissions, overlay)
            cached = self._overlaid_principals[name] = (key, Principal(name, _compile(permissions)))
        return cached[1]

    def _managed_principal(self, record: UserRecord) -> Principal:
        key = tuple(sorted(record.permissions.items()))
        cached = self._managed_principals.get(record.name)
        if cached is None or cached[0] != key:
            cached = self._managed_principals[record.name] = (key, Principal(record.name, _compile(record.permissions)))
        return cached[1]
