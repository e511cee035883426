"""Three in-process replicas: pipelined entries reach each follower once; a lost leader is replaced in one round."""

from __future__ import annotations

import os
import threading
import time

from raftmq.ops.local.node import free_port
from raftmq.raft.replica import ENTRY, Replica


def free_address() -> str:
    return f"127.0.0.1:{free_port()}"


def wait_for_leader(replicas: list[Replica], timeout: float = 15.0) -> Replica:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(r.is_leader for r in replicas):
        time.sleep(0.02)
    return next(r for r in replicas if r.is_leader)


def test_pipelined_entries_are_sent_to_each_follower_once(tmp_path):
    """The leader sends entries without waiting for replies.  A reply acknowledges an earlier
    AppendEntries, and must not move the leader's nextIndex back over entries already on their
    way (pysyncobj did, and re-sent every entry in flight: the followers' journals saw copies)."""
    addresses = [free_address() for _ in range(3)]
    applied: dict[int, list[tuple]] = {i: [] for i in range(3)}
    lock = threading.Lock()

    def sink(i):
        def receive(item):
            if item[0] == ENTRY:
                with lock:
                    applied[i].append((item[3], item[4], bytes(item[5])))
        return receive

    replicas = [Replica(addr, [a for a in addresses if a != addr], str(tmp_path / f"n{i}"), "secret",
                        sink=sink(i)) for i, addr in enumerate(addresses)]
    try:
        deadline = time.monotonic() + 15
        leader = wait_for_leader(replicas)
        while time.monotonic() < deadline and not all(r.leader_address for r in replicas):
            time.sleep(0.02)
        blobs = [os.urandom(64 << 10) for _ in range(200)]  # 12.5 MiB, proposed back to back
        for seq, blob in enumerate(blobs):
            leader.propose(seq, "test", seq, blob, lambda _res, err: None)
        expected = [("test", seq, blob) for seq, blob in enumerate(blobs)]
        while time.monotonic() < deadline + 30:
            with lock:
                if all(len(applied[i]) >= len(blobs) for i in range(3)):
                    break
            time.sleep(0.05)
        for i in range(3):
            assert applied[i] == expected, f"replica {i} applied other entries"
        followers = [r for r in replicas if r is not leader]
        assert [f.journal.copies_skipped for f in followers] == [0, 0]
    finally:
        for r in replicas:
            r.destroy()


def test_followers_idle_for_longer_than_the_connection_timeout_elect_in_one_round(tmp_path):
    """Followers exchange nothing while a leader lives.  pysyncobj closes a link on its first use
    after 3.5 s without a read, so the first vote request after a leader's death was lost and the
    election took two rounds (term + 2, twice the failover time).  With keepalives the links stay
    warm: one round, term + 1 (Raft 5.2)."""
    addresses = [free_address() for _ in range(3)]
    replicas = [Replica(addr, [a for a in addresses if a != addr], str(tmp_path / f"n{i}"), "secret",
                        sink=lambda _item: None) for i, addr in enumerate(addresses)]
    try:
        wait_for_leader(replicas)
        time.sleep(5.0)  # longer than pysyncobj's connectionTimeout (3.5 s): the followers' link idles
        leader = wait_for_leader(replicas)  # the one now (a loaded machine may have seen an election)
        followers = [r for r in replicas if r is not leader]
        term = leader._SyncObj__raftCurrentTerm
        leader.destroy()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(f.is_leader for f in followers):
            time.sleep(0.01)
        new_leader = next(f for f in followers if f.is_leader)
        assert new_leader._SyncObj__raftCurrentTerm == term + 1
    finally:
        for r in replicas:
            r.destroy()
