"""ops/http/session.py: the UI's session store -- random ids, expiry, a bound on its size.

A fake clock drives expiry; no broker (the operator a session resolves to is checked against a
real node in tests/integration/test_ui_session.py).
"""

from __future__ import annotations

from raftmq.ops.http.session import SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ids_are_random_256_bit_and_not_stored():
    """Each id and CSRF token is 32 random bytes (43 url-safe base64 characters); the store keeps
    only digests of the ids, so the id itself is nowhere in it."""
    store = SessionStore()
    first, session = store.open("alice", "hash-a")
    second, _ = store.open("alice", "hash-a")
    assert first != second and len(first) == 43 and len(session.csrf) == 43 and session.csrf != first
    assert store.get(first) is session and store.get(second) is not session
    assert first.encode() not in repr(store._sessions).encode()
    assert store.get("not-a-session") is None


def test_expiry_and_close():
    """A session is gone ``ttl`` seconds after it was opened, and at once when closed (logout)."""
    clock = Clock()
    store = SessionStore(ttl=60, clock=clock)
    old, _ = store.open("alice", "h")
    clock.now += 59.9
    assert store.get(old) is not None
    clock.now += 0.2
    assert store.get(old) is None and len(store) == 0
    live, _ = store.open("bob", "h")
    assert store.close(live) and store.get(live) is None and not store.close(live)


def test_bounded_expired_first_then_oldest():
    """At the bound, expired sessions are dropped first, then the oldest: never more than ``limit``."""
    clock = Clock()
    store = SessionStore(ttl=100, limit=3, clock=clock)
    a, _ = store.open("a", "h")
    clock.now += 60
    b, _ = store.open("b", "h")
    c, _ = store.open("c", "h")
    clock.now += 50  # a has expired, b and c have not
    d, _ = store.open("d", "h")
    assert len(store) == 3 and store.get(a) is None and all(store.get(x) for x in (b, c, d))
    e, _ = store.open("e", "h")  # none expired: the oldest (b) goes
    assert len(store) == 3 and store.get(b) is None and all(store.get(x) for x in (c, d, e))
    for i in range(100):
        store.open(f"u{i}", "h")
    assert len(store) == 3
