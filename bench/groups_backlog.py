"""Consuming a backlog from a queue group (issue 34, docs/design.md "Bodies across the link"): two
source trees side by side (old and new code), alternating rounds, one node with ``raft_groups = 3``.

Each round, per tree: a fresh node; ``--count`` messages of ``--size`` bytes published with confirms
(transient, or ``--persistent``) to a queue placed in queue group 1 (``x-queue-group``); then one
pika consumer with manual acks (``--prefetch``, 0 = none; a multiple ack every 64 deliveries) drains
it.  Printed per run: the consume rate (messages over the wall time from basic.consume to the last
delivery), the CPU seconds per message of the main process and of the queue group's worker over the
drain (/proc/<pid>/stat utime+stime), and the main process's peak RssAnon above its level before
the consumer attached (sampled every 50 ms by a thread).

The tree is chosen by PYTHONPATH for the node's processes (``python -m raftmq`` resolves the first
``raftmq`` on the path, after its working directory: the script runs them from a temporary one):
``--tree old=/path/to/old/checkout --tree new=.``; each run prints the group's ``link_bodies_*``
figures when its tree writes them (the new code), which tells the trees apart.  Bounded: every wait has
a time limit, and each node is terminated after its run.

Usage::

    git archive <old commit> | tar -x -C /tmp/old
    python bench/groups_backlog.py --tree old=/tmp/old --tree new=. --count 10000 --size 4096 --prefetch 256
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.ops.local.node import RaftmqNode  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_anon(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def worker_pid(node: RaftmqNode, group: int, timeout: float = 10.0) -> int:
    import json
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return int(json.loads((node.data_dir / "status.json").read_text())["groups"][str(group)]["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise TimeoutError("no worker pid in status.json")


def run(tree: str, args: argparse.Namespace, base: Path) -> dict:
    where = base / f"n{time.monotonic_ns()}"
    where.mkdir()
    (where / "raftmq.toml").write_text("raft_groups = 3\ndisk_free_limit = 1\n")
    env = {"PYTHONPATH": str(Path(tree).resolve())}
    node = RaftmqNode(where / "data", config=where / "raftmq.toml", env=env).start()
    try:
        params = pika.URLParameters(node.url)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("backlog", durable=args.persistent, arguments={"x-queue-group": 1})
        body = bytes(args.size)
        props = pika.BasicProperties(delivery_mode=2 if args.persistent else 1)
        for _ in range(args.count):
            ch.basic_publish("", "backlog", body, props)
        conn.close()
        time.sleep(1.0)
        main, worker = node.pid, worker_pid(node, 1)
        assert main is not None
        before_rss = rss_anon(main)
        peak = [before_rss]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_anon(main))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        if args.prefetch:
            ch.basic_qos(prefetch_count=args.prefetch)
        got = 0
        cpu0 = (cpu(main), cpu(worker))
        sampler.start()
        start = time.monotonic()
        deadline = start + args.time_limit
        for method, _props, _body in ch.consume("backlog", auto_ack=False, inactivity_timeout=10):
            if method is None or time.monotonic() > deadline:
                break
            got += 1
            if got % 64 == 0 or got == args.count:
                ch.basic_ack(method.delivery_tag, multiple=True)
            if got == args.count:
                break
        wall = time.monotonic() - start
        cpu1 = (cpu(main), cpu(worker))
        time.sleep(0.6)  # (status files written after the drain)
        import json
        links = {k: v for k, v in json.loads((node.data_dir / "groups" / "g1" / "status.json").read_text()).items()
                 if k.startswith("link_bodies")}
        stop.set()
        sampler.join()
        ch.cancel()
        conn.close()
        return {"rate": got / wall, "got": got, "main_us": (cpu1[0] - cpu0[0]) / max(got, 1) * 1e6,
                "worker_us": (cpu1[1] - cpu0[1]) / max(got, 1) * 1e6, "rss_mib": (peak[0] - before_rss) / (1 << 20), "links": links}
    finally:
        node.terminate()
        shutil.rmtree(where, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per drain")
    args = parser.parse_args()
    trees = {name: str(Path(where).resolve()) for name, where in (item.split("=", 1) for item in args.tree)}
    base = Path(tempfile.mkdtemp(prefix="groups-backlog-"))
    # ``python -m raftmq`` puts its working directory first on the path: run the nodes from one
    # that holds no raftmq, so that PYTHONPATH chooses the tree.
    os.chdir(base)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    try:
        for round_no in range(args.rounds):
            names = list(trees) if round_no % 2 == 0 else list(reversed(trees))
            for name in names:
                r = run(trees[name], args, base)
                results[name].append(r)
                print(f"round {round_no + 1} {name:>4}: {r['rate']:8.0f} msg/s ({r['got']} msgs), main "
                      f"{r['main_us']:6.1f} µs/msg, worker {r['worker_us']:6.1f} µs/msg, main heap +{r['rss_mib']:.1f} MiB "
                      f"{r['links'] or ''}",
                      flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{args.count} x {args.size} B {'persistent' if args.persistent else 'transient'}, "
          f"prefetch {args.prefetch or 'none'}, medians of {args.rounds} rounds:")
    for name, runs in results.items():
        print(f"  {name:>4}: {statistics.median(r['rate'] for r in runs):8.0f} msg/s, main "
              f"{statistics.median(r['main_us'] for r in runs):6.1f} µs/msg, worker "
              f"{statistics.median(r['worker_us'] for r in runs):6.1f} µs/msg, main heap "
              f"+{statistics.median(r['rss_mib'] for r in runs):.1f} MiB")


if __name__ == "__main__":
    main()
