"""What a Raft snapshot costs with the bodies in the model (today) and without them (issue 18).

Builds a cluster-mode state machine (no LMDB mirror) holding ``--count`` queued persistent
messages of ``--size`` bytes in one durable queue, applied as batches of 50 publishes, then times
``store/snapshot.write_snapshot`` (pickle of the model + one LMDB file, what the forked snapshot
child does) and the snapshot's size.  Then it replaces every queued body by ``b""`` -- a stand-in
for a model that keeps only the body's id and size -- and measures again, then the queued entries
alone pickled as objects against flat msgpack rows.

Usage: python bench/snapshot_cost.py [--count 76800] [--size 4096]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgpack  # noqa: E402

from raftmq.store.applier import StoredMachine  # noqa: E402
from raftmq.store.core.commands import Op  # noqa: E402
from raftmq.store.disk.snapshot import write_snapshot  # noqa: E402

NOW = 1_700_000_000_000_000
PROPS = b"\x10\x00\x02"


def build(count: int, size: int) -> StoredMachine:
    machine = StoredMachine()
    machine.apply_batch(NOW, [[Op.VHOST_ADD, None, None, "/"], [Op.CHANNEL_OPEN, "c", 1, 1]])
    machine.apply_batch(NOW, [[Op.QUEUE_DECLARE, "c", 2, 1, "/", "q", False, True, False, False, {}]])
    body = os.urandom(size)
    token = 3
    for start in range(0, count, 50):
        batch = []
        for _ in range(min(50, count - start)):
            batch.append([Op.PUBLISH, "c", token, 1, "/", "", "q", False, PROPS, body[:-8] + token.to_bytes(8, "big"),
                          True, 0, None])
            token += 1
        machine.apply_batch(NOW, batch)
    return machine


def measure(machine: StoredMachine, work: str, label: str) -> None:
    path = os.path.join(work, f"{label}.lmdb")
    t = time.perf_counter()
    write_snapshot(path, machine, b"meta")
    seconds = time.perf_counter() - t
    print(f"  {label:12s} write_snapshot {seconds:6.2f} s, file {os.path.getsize(path) / (1 << 20):7.1f} MB",
          flush=True)
    os.unlink(path)


def entries_two_ways(machine: StoredMachine) -> None:
    """The queued entries alone: pickled as objects (what the snapshot does today) against flat
    msgpack rows of the fields a bodiless model needs (what it could do)."""
    entries = list(machine.vhosts["/"].queues["q"].ready._levels[0])
    t = time.perf_counter()
    blob = pickle.dumps(entries, protocol=5)
    pickled = time.perf_counter() - t
    t = time.perf_counter()
    rows = msgpack.packb([[e.seq, e.message.id, len(e.message.body), e.expires_at, e.priority, e.delivery_count,
                           e.message.exchange, e.message.routing_key, e.message.properties, e.message.persistent,
                           e.message.priority, e.message.published_at] for e in entries], use_bin_type=True)
    flat = time.perf_counter() - t
    print(f"  entries only: pickled {pickled:.2f} s / {len(blob) / (1 << 20):.1f} MB, "
          f"flat msgpack rows {flat:.2f} s / {len(rows) / (1 << 20):.1f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=76_800)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    t = time.perf_counter()
    machine = build(args.count, args.size)
    queue = machine.vhosts["/"].queues["q"]
    print(f"{len(queue.ready)} queued x {args.size} B built in {time.perf_counter() - t:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="raftmq-snapcost-") as work:
        measure(machine, work, "with bodies")
        for level in queue.ready._levels:
            for entry in level:
                entry.message.body = b""
        measure(machine, work, "no bodies")
        entries_two_ways(machine)


if __name__ == "__main__":
    main()
