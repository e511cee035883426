"""Micro-benchmark of message bodies on disk (issue 18): the LMDB body store against reading bodies
back from the Raft journal's segments, in process, on this machine's disk.

``store`` (store/disk/bodies.py + body_store.py + body_cache.py):
  * put: ``Bodies.carry_out`` of batches of publishes with the write-behind bound exceeded, so every
    body is written to LMDB (the worst case: a backlog), then a checkpoint (fsync);
  * get: a consumer reading the backlog in order with read-ahead (the cache ``--cache`` bytes),
    then random gets of single ids without read-ahead; cache hit rate of each;
  * delete: acks, applied at the checkpoint after next.

``keeping up``: consumers ack each message 1,000 messages after it is published, with the default
write-behind bound: the bodies never reach LMDB.

``journal`` (raft/journal.py): the same batches appended as Raft entries (a batch header and the
msgpack batch, as raft/replica.py proposes them) and fdatasync'ed -- a cost the cluster pays
anyway -- then each body read back: pread of the entry's record, CRC, msgpack decode of the whole
batch, pick the publish; in order (one decode per batch, kept for the batch's next bodies) and at
random (one decode per body).

Usage: python bench/bodies.py [--count 20000] [--size 4096] [--batch 50] [--cache 8388608]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.raft.journal import AppendJournal  # noqa: E402
from raftmq.raft.replica import _BATCH_HEAD, BATCH_COMMAND  # noqa: E402
from raftmq.store.core.commands import Op, decode_batch, encode_batch  # noqa: E402
from raftmq.store.disk.bodies import Bodies, BodyEffects  # noqa: E402
from raftmq.store.disk.body_store import BodyStore  # noqa: E402

PROPS = b"\x10\x00\x02"  # delivery-mode 2


def batches(count: int, size: int, batch: int) -> list[list[tuple[int, bytes]]]:
    rng = random.Random(7)
    out, msg_id = [], 1
    while msg_id <= count:
        group = []
        for _ in range(min(batch, count - msg_id + 1)):
            group.append((msg_id, rng.randbytes(size)))
            msg_id += 1
        out.append(group)
    return out


def us(seconds: float, n: int) -> float:
    return seconds / n * 1e6


def bench_store(work: str, groups, cache_bytes: int) -> dict[str, float]:
    store = BodyStore(os.path.join(work, "bodies"), map_size=1 << 34)
    bodies = Bodies(store, cache_bytes=cache_bytes, write_behind_bytes=0)  # every body written at once
    n = sum(len(g) for g in groups)
    t = time.perf_counter()
    for group in groups:
        bodies.carry_out(BodyEffects(puts=group))
    put = time.perf_counter() - t
    t = time.perf_counter()
    bodies.checkpoint()
    sync = time.perf_counter() - t
    disk = store.disk_bytes()
    bodies.cache.clear()
    # A consumer reading the backlog in order, read-ahead of 64 ids whenever the next is missing.
    ids = [msg_id for g in groups for msg_id, _ in g]
    cache = bodies.cache
    h0, m0 = cache.hits, cache.misses
    t = time.perf_counter()
    for pos, msg_id in enumerate(ids):
        if msg_id not in cache:
            bodies.read_ahead(ids[pos:pos + 64])
        body = bodies.get(msg_id)
        assert body is not None
        bodies.carry_out(BodyEffects(deletes=[msg_id]))  # the ack
    ordered = time.perf_counter() - t
    ordered_hit = (cache.hits - h0) / max(1, cache.hits - h0 + cache.misses - m0)
    # Random single gets, no read-ahead (cache cleared; the store is still whole: deletes deferred).
    cache.clear()
    h0, m0 = cache.hits, cache.misses
    sample = random.Random(3).choices(ids, k=min(n, 5000))
    t = time.perf_counter()
    for msg_id in sample:
        assert bodies.get(msg_id) is not None
    rand = time.perf_counter() - t
    random_hit = (cache.hits - h0) / max(1, cache.hits - h0 + cache.misses - m0)
    bodies.checkpoint()
    t = time.perf_counter()
    bodies.checkpoint()  # the acks' deletes are applied at the checkpoint after next
    delete = time.perf_counter() - t
    assert len(store) == 0
    store.close()
    return {"put us": us(put, n), "checkpoint fsync s": sync, "disk bytes/body": disk / n,
            "get in order us": us(ordered, n), "hit rate in order": ordered_hit,
            "get random us": us(rand, len(sample)), "hit rate random": random_hit,
            "delete us": us(delete, n)}


def bench_keeping_up(work: str, groups, cache_bytes: int, lag: int = 1000) -> dict[str, float]:
    """Consumers keeping up: each message is acked ``lag`` messages after it was published, with
    the default write-behind bound (16 MiB): how many bodies reach LMDB, and the cost per message
    of put + get + delete."""
    store = BodyStore(os.path.join(work, "keeping-up"), map_size=1 << 34)
    bodies = Bodies(store, cache_bytes=cache_bytes)
    ids = [msg_id for g in groups for msg_id, _ in g]
    n = len(ids)
    acked = 0
    t = time.perf_counter()
    for group in groups:
        bodies.carry_out(BodyEffects(puts=group))
        last = group[-1][0]
        done = []
        while acked < n and ids[acked] <= last - lag:
            assert bodies.get(ids[acked]) is not None
            done.append(ids[acked])
            acked += 1
        bodies.carry_out(BodyEffects(deletes=done))
    rest = ids[acked:]
    for msg_id in rest:
        assert bodies.get(msg_id) is not None
    bodies.carry_out(BodyEffects(deletes=rest))
    bodies.checkpoint()
    seconds = time.perf_counter() - t
    written = bodies.stats.written
    store.close()
    return {"put+get+ack us": us(seconds, n), "bodies written to LMDB": written}


def bench_churn(work: str, live_mb: int, rounds: int, per_round: int) -> None:
    """LMDB under churn: a store holding ~``live_mb`` of bodies of mixed sizes (1-64 KiB, so
    overflow values need 1-17 contiguous pages), each round publishing ``per_round`` bodies and
    deleting as many (mostly the oldest, some at random: requeues, expiry); put time per round
    shows whether the free-page search degrades as the free list fragments."""
    rng = random.Random(11)
    store = BodyStore(os.path.join(work, "churn"), map_size=1 << 36)
    live: list[int] = []
    next_id, live_bytes = 1, 0
    sizes: dict[int, int] = {}

    def body(size: int) -> bytes:
        return rng.randbytes(16) * (size // 16)

    batch: list[tuple[int, bytes]] = []
    while live_bytes < live_mb << 20:
        size = rng.choice((1024, 4096, 4096, 4096, 16384, 65536))
        batch.append((next_id, body(size)))
        live.append(next_id)
        sizes[next_id] = size
        live_bytes += size
        next_id += 1
        if len(batch) == 50:
            store.put_many(batch)
            batch = []
    store.put_many(batch)
    print(f"  churn: {len(live)} bodies, {live_bytes >> 20} MB live, file {store.disk_bytes() >> 20} MB", flush=True)
    for r in range(rounds):
        put_s = del_s = 0.0
        for _ in range(per_round // 50):
            group = []
            for _ in range(50):
                size = rng.choice((1024, 4096, 4096, 4096, 16384, 65536))
                group.append((next_id, body(size)))
                live.append(next_id)
                next_id += 1
            t = time.perf_counter()
            store.put_many(group)
            put_s += time.perf_counter() - t
            dead = [live.pop(0) if rng.random() < 0.9 else live.pop(rng.randrange(len(live))) for _ in range(50)]
            t = time.perf_counter()
            store.delete_many(dead)
            del_s += time.perf_counter() - t
        print(f"  churn round {r + 1}: put {us(put_s, per_round):.1f} us, delete {us(del_s, per_round):.1f} us, "
              f"file {store.disk_bytes() >> 20} MB", flush=True)
    store.close()


def bench_journal(work: str, groups) -> dict[str, float]:
    journal = AppendJournal(os.path.join(work, "journal"))
    n = sum(len(g) for g in groups)
    where: dict[int, tuple[int, int]] = {}  # msg id -> (journal position, command position)
    t = time.perf_counter()
    for index, group in enumerate(groups, start=1):
        commands = [[Op.PUBLISH, "c1", 0, 1, "/", "", "q", False, PROPS, body, True, 0, None]
                    for _, body in group]
        blob = encode_batch(commands)
        origin = b"n1"
        head = _BATCH_HEAD.pack(BATCH_COMMAND, 0, index, len(origin))
        journal.add(b"\x00" + head + origin + blob, index, 1)
        journal.flush()
        for k, (msg_id, _) in enumerate(group):
            where[msg_id] = (index - 1, k)
    append = time.perf_counter() - t
    journal.setRaftCommitIndex(len(groups))  # evicts the commands from memory: reads go to disk
    skip = 1 + _BATCH_HEAD.size + 2

    def read_batch(pos: int) -> list:
        command, _idx, _term = journal[pos]
        return decode_batch(memoryview(command)[skip:])

    ids = list(where)
    t = time.perf_counter()
    cached_pos, cached = -1, None
    for msg_id in ids:
        pos, k = where[msg_id]
        if pos != cached_pos:
            cached_pos, cached = pos, read_batch(pos)
        assert len(cached[k][9]) > 0
    ordered = time.perf_counter() - t
    sample = random.Random(3).choices(ids, k=min(n, 5000))
    t = time.perf_counter()
    for msg_id in sample:
        pos, k = where[msg_id]
        assert len(read_batch(pos)[k][9]) > 0
    rand = time.perf_counter() - t
    size = journal.size_bytes
    journal._destroy()
    return {"append+fdatasync us (paid anyway)": us(append, n), "disk bytes/body": size / n,
            "get in order us": us(ordered, n), "get random us": us(rand, len(sample))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=50, help="publishes per Raft entry")
    parser.add_argument("--cache", type=int, default=8 << 20, help="body cache bytes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--churn-mb", type=int, default=0,
                        help="instead: LMDB churn with this many MB live (mixed 1-64 KiB bodies)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one under /tmp)")
    args = parser.parse_args()
    if args.churn_mb:
        work = tempfile.mkdtemp(prefix="raftmq-bodies-", dir=args.dir)
        try:
            bench_churn(work, args.churn_mb, args.rounds, args.count)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    groups = batches(args.count, args.size, args.batch)
    print(f"{args.count} bodies of {args.size} B, {args.batch} per batch, cache {args.cache} B", flush=True)
    for r in range(args.rounds):
        work = tempfile.mkdtemp(prefix="raftmq-bodies-", dir=args.dir)
        try:
            for name in ("store", "keeping up", "journal"):
                if name == "store":
                    row = bench_store(work, groups, args.cache)
                elif name == "journal":
                    row = bench_journal(work, groups)
                else:
                    row = bench_keeping_up(work, groups, args.cache)
                print(f"round {r + 1} {name:10s} " + "  ".join(
                    f"{k} {v:.3f}" if v < 10 else f"{k} {v:.0f}" for k, v in row.items()), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
