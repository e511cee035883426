"""Logins against configured users and users managed through the admin API (replicated)."""

from __future__ import annotations

import pytest

from raftmq.node.auth import Authenticator, AuthError, hash_password, verify_password
from raftmq.node.config import UserConfig
from raftmq.store.core.users import UserRecord


def plain(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def test_password_hash_is_salted_and_verifies():
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first != second and "s3cret" not in first  # fresh salt each time, never the password
    assert verify_password(first, "s3cret") and verify_password(second, "s3cret")
    assert not verify_password(first, "S3cret")
    assert not verify_password("garbage", "s3cret") and not verify_password("md5$1$x$y", "s3cret")


def test_a_managed_user_replaces_a_configured_one_and_permissions_follow_changes():
    managed: dict[str, UserRecord] = {}
    auth = Authenticator({"guest": UserConfig("guest")}, lambda: managed)
    assert auth.authenticate("PLAIN", plain("guest", "guest"), "127.0.0.1").name == "guest"

    managed["guest"] = UserRecord("guest", hash_password("changed"), permissions={"/": ("^g-.*", ".*", ".*")})
    with pytest.raises(AuthError):
        auth.authenticate("PLAIN", plain("guest", "guest"), "127.0.0.1")
    principal = auth.authenticate("PLAIN", plain("guest", "changed"), "10.0.0.5")
    assert principal.may_configure("/", "g-1") and not principal.may_configure("/", "other")
    assert not principal.may_access_vhost("/other")

    managed["guest"].permissions["/"] = (".*", ".*", ".*")  # set-permissions: new logins see it
    assert auth.authenticate("PLAIN", plain("guest", "changed"), "10.0.0.5").may_configure("/", "other")

    managed["ops"] = UserRecord("ops", hash_password("pw"), loopback_only=True, permissions={"/": (".*",) * 3})
    assert auth.authenticate("PLAIN", plain("ops", "pw"), "::1").name == "ops"
    with pytest.raises(AuthError, match="localhost"):
        auth.authenticate("PLAIN", plain("ops", "pw"), "10.0.0.5")
    with pytest.raises(AuthError):
        auth.authenticate("PLAIN", plain("nobody", "pw"), "127.0.0.1")


def test_permission_answers_are_remembered_and_stay_right():
    auth = Authenticator({"u": UserConfig(password="p", permissions={"/": ("^cfg-.*", "^amq\\.direct$|^out-.*", "")})})
    principal = auth.authenticate("PLAIN", b"\x00u\x00p", "127.0.0.1")
    for _ in range(2):  # the second round answers from memory
        assert principal.may_write("/", "amq.direct") and principal.may_write("/", "out-1")
        assert not principal.may_write("/", "amq.directx") and not principal.may_write("/", "in-1")
        assert principal.may_configure("/", "cfg-q") and not principal.may_configure("/", "q")
        assert not principal.may_read("/", "anything") and not principal.may_write("/other", "out-1")
    for i in range(10_000):  # many distinct names: the memory stays bounded
        principal.may_write("/", f"out-{i}")
    assert len(principal._decisions) <= 4096


def test_a_configured_user_gets_the_overlay_of_the_admin_api():
    """Permissions set through the admin API for a configuration-file user (the replicated overlay,
    store/core/users.py) apply on top of the file's for new logins: a vhost added, a vhost's patterns
    replaced, a file permission cleared (None); the password stays the file's."""
    overlay: dict[str, dict] = {}
    auth = Authenticator({"guest": UserConfig("guest")}, dict, lambda: overlay)
    login = lambda: auth.authenticate("PLAIN", plain("guest", "guest"), "127.0.0.1")  # noqa: E731
    assert login().may_access_vhost("/") and not login().may_access_vhost("new")
    overlay["guest"] = {"new": (".*", ".*", ".*")}
    assert login().may_access_vhost("new") and login().may_configure("/", "anything")
    overlay["guest"] = {"new": ("^n$", "", ""), "/": None}
    principal = login()
    assert principal.may_configure("new", "n") and not principal.may_configure("new", "m")
    assert not principal.may_access_vhost("/")
    assert auth.principal_named("guest", "127.0.0.1").permissions.keys() == {"new"}  # ANONYMOUS logins alike
    overlay.clear()
    assert login().may_access_vhost("/") and not login().may_access_vhost("new")


def test_anonymous_login_obeys_loopback_only():
    """Issue 31 item 6: ``principal_named`` (the 1.0 ANONYMOUS login) checks what a password login
    checks besides the password: a loopback-only user (configured or managed) is refused from
    another address, and allowed from loopback."""
    managed = {"ops": UserRecord("ops", hash_password("pw"), loopback_only=True, permissions={"/": (".*",) * 3})}
    auth = Authenticator({"guest": UserConfig("guest", loopback_only=True), "any": UserConfig("x")}, lambda: managed)
    for name in ("guest", "ops"):
        assert auth.principal_named(name, "127.0.0.1").name == name
        assert auth.principal_named(name, "::1").name == name
        for host in ("10.0.0.5", None, "not-an-address"):
            with pytest.raises(AuthError, match="localhost"):
                auth.principal_named(name, host)
    assert auth.principal_named("any", "10.0.0.5").name == "any"
    with pytest.raises(AuthError, match="does not exist"):
        auth.principal_named("nobody", "127.0.0.1")


def test_every_login_costs_one_pbkdf2_and_a_user_changed_meanwhile_is_refused(monkeypatch):
    """Issue 31 item 8: unknown users, configuration-file users (plain password) and managed users
    (PBKDF2 record) each cost exactly one PBKDF2 (counted), so the time does not tell which users
    exist; ``conclude`` refuses a user whose password changed while the hash ran."""
    import hashlib

    from raftmq.node import auth as auth_module

    calls = []
    real = hashlib.pbkdf2_hmac
    monkeypatch.setattr(auth_module.hashlib, "pbkdf2_hmac", lambda *a: calls.append(a[3]) or real(*a))
    managed = {"m": UserRecord("m", hash_password("pw"), permissions={"/": (".*",) * 3})}
    auth = Authenticator({"c": UserConfig("cpw")}, lambda: managed)
    calls.clear()
    for user, password, ok in (("m", "pw", True), ("m", "no", False), ("c", "cpw", True), ("c", "no", False),
                               ("nobody", "pw", False)):
        before = len(calls)
        attempt = auth.prepare("PLAIN", plain(user, password))
        assert auth_module.check_password(attempt) is ok
        assert calls[before:] == [auth_module.HASH_ITERATIONS], (user, password)
    attempt = auth.prepare("PLAIN", plain("m", "pw"))
    matched = auth_module.check_password(attempt)
    managed["m"] = UserRecord("m", hash_password("new"), permissions={"/": (".*",) * 3})
    with pytest.raises(AuthError):
        auth.conclude(attempt, matched, "127.0.0.1")


def test_refused_logins_are_counted_each_and_logged_once_per_interval(caplog):
    """A flood of refused logins (wrong password, unknown user, loopback-only user from elsewhere,
    anonymous as an unknown user) is counted one by one (``refused``: status and metrics) but logged
    at most once per ``refusal_log_interval``; the next line after it says how many were not logged
    (issue 31: a line per attempt).  A login that succeeds is not counted."""
    import asyncio
    import logging

    auth = Authenticator({"guest": UserConfig("guest", loopback_only=True)}, refusal_log_interval=60.0)

    async def flood() -> None:
        for _ in range(20):
            with pytest.raises(AuthError):
                await auth.login("PLAIN", plain("guest", "wrong"), "127.0.0.1")
            with pytest.raises(AuthError):
                await auth.login("PLAIN", plain("nobody", "x"), "127.0.0.1")
        with pytest.raises(AuthError):
            await auth.login("PLAIN", plain("guest", "guest"), "10.1.2.3")  # loopback-only
        with pytest.raises(AuthError):
            await auth.login("PLAIN", b"no separators", "127.0.0.1")  # malformed response
        assert (await auth.login("PLAIN", plain("guest", "guest"), "127.0.0.1")).name == "guest"
        auth.pool.close()

    with caplog.at_level(logging.INFO, logger="raftmq.node.auth"):
        asyncio.run(flood())
        with pytest.raises(AuthError):
            auth.principal_named("nobody", "127.0.0.1")
    assert auth.refused == 43
    lines = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()]
    assert lines == ["login refused for user 'guest' from 127.0.0.1: Login was refused using authentication "
                     "mechanism PLAIN."]
    auth._refusal_log._next = 0.0  # the interval has passed
    auth.note_refused("guest", "127.0.0.1", AuthError("again"))
    last = [r.getMessage() for r in caplog.records if "login refused" in r.getMessage()][-1]
    assert last.endswith("again (42 more since the last report)"), last


def test_update_secret_keeps_a_password_users_principal_whatever_the_secret():
    """connection.update-secret (issue 32): as RabbitMQ's internal user store, a password user's
    secret is not checked -- the principal is the one the connection logged in with, unchanged,
    and nothing is counted as a refused login (the hook a token backend would fill)."""
    import asyncio

    auth = Authenticator({"guest": UserConfig("guest")})
    principal = auth.authenticate("PLAIN", plain("guest", "guest"), "127.0.0.1")
    for secret in (b"guest", b"a made-up token", b""):
        assert asyncio.run(auth.update_secret(principal, secret, "127.0.0.1")) is principal
    assert auth.refused == 0
