"""The CPU cost of the single-node state's commit and load, old code against new, in alternating rounds
(issue 29: every record sealed with a CRC32C at commit, checked at load).

End-to-end figures (bench/ab_single.py) on a shared 2-core machine vary by 2x between rounds; this
times only what changed, in-process: ``DurableStore.commit`` of batches like a confirmed publish's
(a message record with its body + its queue entry, ``--batch`` messages per transaction, no fsync: the
fsync is the same in both and would drown the difference), then ``DurableStore.load`` of everything.
Each round runs the old and the new checkout's code in a fresh subprocess (its own .venv), in
alternating order.

Usage::

    python bench/state_commit.py --old /tmp/base --new . --rounds 6 --size 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

_RUN = r"""
import json, struct, sys, tempfile, time
from raftmq.store.disk.durable import DurableStore, entry_key
from raftmq.store.core.effects import PUT, PUT_WITH_BODY
import msgpack
count, size, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = DurableStore(tempfile.mkdtemp(prefix="raftmq-commit-"))
body = b"b" * size
props = b"\x10\x00\x02"
pack = lambda o: msgpack.packb(o, use_bin_type=True)
bodies = {}
t_commit = 0.0
for first in range(1, count + 1, batch):
    ids = range(first, min(first + batch, count + 1))
    ops = []
    for i in ids:
        bodies[i] = body
        ops.append((PUT_WITH_BODY, "messages", struct.pack(">Q", i), ["", "q", props, None, 0, 1_700_000_000_000_000], 3, i))
        ops.append((PUT, "entries", entry_key(1, i), pack([i, None, 0, 0])))
    t = time.perf_counter()
    store.commit(ops, (2, count + 1), first, body_of=bodies.get)
    t_commit += time.perf_counter() - t
    bodies.clear()
t = time.perf_counter()
state = store.load()
t_load = time.perf_counter() - t
assert len(state.messages) == count
print(json.dumps({"commit_us": 1e6 * t_commit / count, "load_us": 1e6 * t_load / count}))
"""


def run(checkout: Path, count: int, size: int, batch: int) -> dict:
    python = checkout / ".venv" / "bin" / "python"
    done = subprocess.run([str(python), "-c", _RUN, str(count), str(size), str(batch)], cwd=checkout,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100, help="messages per commit (one write transaction)")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"old": [], "new": []}
    checkouts = {"old": args.old.resolve(), "new": args.new.resolve()}
    for i in range(args.rounds):
        for name in (["old", "new"] if i % 2 == 0 else ["new", "old"]):
            results[name].append(run(checkouts[name], args.count, args.size, args.batch))
        o, n = results["old"][-1], results["new"][-1]
        print(f"round {i + 1}: commit old {o['commit_us']:.2f} new {n['commit_us']:.2f} us/msg; "
              f"load old {o['load_us']:.2f} new {n['load_us']:.2f} us/msg", flush=True)
    for key, what in (("commit_us", "commit (message record + entry, no fsync)"), ("load_us", "load at start")):
        old = statistics.median(r[key] for r in results["old"])
        new = statistics.median(r[key] for r in results["new"])
        print(f"{what}, {args.size} B, {args.count:,} messages, batches of {args.batch}, medians of {args.rounds}: "
              f"old {old:.2f} us/msg, new {new:.2f} us/msg (+{new - old:.2f} us, x{new / old:.2f})")


if __name__ == "__main__":
    main()
