"""Body fetches over the Raft port (raft/body_peer.py): a real Replica (pysyncobj transport with
raft/wire.py's sealed framing) on loopback answers a follower's catch-up from a real LMDB store."""

from __future__ import annotations

import pytest

from raftmq.ops.local.node import free_port
from raftmq.raft.body_peer import ask, serve_bodies
from raftmq.raft.replica import Replica
from raftmq.store.disk.bodies import Bodies, BodyEffects
from raftmq.store.disk.body_fetch import FetchError, catch_up, encode_request
from raftmq.store.disk.body_store import BodyStore


@pytest.fixture
def member(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    replica = Replica(address, [], str(tmp_path / "raft"), "secret", sink=lambda _item: None)
    store = BodyStore(str(tmp_path / "member-bodies"), map_size=1 << 26)
    bodies = Bodies(store, cache_bytes=1 << 20)
    serve_bodies(replica, bodies)
    try:
        yield address, bodies
    finally:
        replica.destroy()
        store.close()


def test_follower_fetches_missing_bodies_over_the_raft_port(member, tmp_path):
    address, bodies = member
    live = {i: bytes([i % 251]) * (1000 + i) for i in range(1, 120)}
    bodies.carry_out(BodyEffects(puts=list(live.items())[:60]))  # still pending (write-behind)
    bodies.checkpoint()  # the first 60 on disk
    bodies.carry_out(BodyEffects(puts=list(live.items())[60:]))  # the rest pending
    store = BodyStore(str(tmp_path / "follower"), map_size=1 << 26)
    try:
        follower = Bodies(store, cache_bytes=1 << 20)
        report = catch_up(follower, {i: len(b) for i, b in live.items()}, [ask("secret", address)],
                          answer_bytes=40_000)
        assert report.still_missing == [] and report.fetched == len(live) and report.requests > 1
        assert all(store.get(i) == b for i, b in live.items())  # on the follower's disk, identical
    finally:
        store.close()


def test_a_wrong_secret_gets_no_bodies(member):
    address, bodies = member
    bodies.carry_out(BodyEffects(puts=[(1, b"secret body")]))
    with pytest.raises(FetchError):
        ask("not-the-secret", address, timeout=3.0)(encode_request([1]))


def test_a_garbage_request_is_refused(member):
    address, _bodies = member
    with pytest.raises(FetchError):
        ask("secret", address, timeout=3.0)(b"\xc1 not msgpack")
