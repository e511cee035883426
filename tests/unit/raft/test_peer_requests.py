"""Body fetches over the Raft port (raft/peer_requests.py carrying store/disk/body_fetch.py's
requests): a real Replica (pysyncobj transport with raft/wire.py's sealed framing) on loopback
answers a follower's catch-up from a real LMDB store."""

from __future__ import annotations

import pytest

from raftmq.ops.local.node import free_port
from raftmq.raft.peer_requests import PeerRequestFailed, ask, serve
from raftmq.raft.replica import Replica
from raftmq.store.disk.bodies import Bodies, BodyEffects
from raftmq.store.disk.body_fetch import PEER_REQUEST, catch_up, encode_request
from raftmq.store.disk.body_fetch import serve as serve_bodies
from raftmq.store.disk.body_store import BodyStore


@pytest.fixture
def member(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    replica = Replica(address, [], str(tmp_path / "raft"), "secret", sink=lambda _item: None)
    store = BodyStore(str(tmp_path / "member-bodies"), map_size=1 << 26)
    bodies = Bodies(store, cache_bytes=1 << 20)
    serve(replica, PEER_REQUEST, lambda request: serve_bodies(bodies, request))
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
        report = catch_up(follower, {i: len(b) for i, b in live.items()}, [ask("secret", address, PEER_REQUEST)],
                          answer_bytes=40_000)
        assert report.still_missing == [] and report.fetched == len(live) and report.requests > 1
        assert all(store.get(i) == b for i, b in live.items())  # on the follower's disk, identical
    finally:
        store.close()


def test_a_wrong_secret_gets_no_bodies(member):
    address, bodies = member
    bodies.carry_out(BodyEffects(puts=[(1, b"secret body")]))
    with pytest.raises(PeerRequestFailed):
        ask("not-the-secret", address, PEER_REQUEST, timeout=3.0)(encode_request([1]))


def test_a_garbage_request_is_refused(member):
    address, _bodies = member
    with pytest.raises(PeerRequestFailed):
        ask("secret", address, PEER_REQUEST, timeout=3.0)(b"\xc1 not msgpack")
