"""Old code against new code, side by side: two 3-node raftmq clusters, one per checkout, measured in
alternating rounds with the same client (this machine drifts by up to 2x within minutes: only such
paired figures mean anything).

Each checkout runs its own cluster with its own virtualenv (``CHECKOUT/.venv/bin/python``), started
through that checkout's ``raftmq.ops.local.cluster.Cluster``; the client (this script's pika) publishes
persistent messages with confirms through pika's asynchronous connection (window 1,000, the
``confirm (pika async)`` scenario of bench/throughput.py) to a *follower* of each cluster, each round
measuring both clusters back to back, alternating which goes first.

Usage::

    git worktree add /tmp/base <old commit> && (make the venv there, e.g. /work/mkworktree.sh)
    python bench/ab_cluster.py --old /tmp/base --new . --rounds 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import bench_confirmed_pika, bench_consume, bench_publish  # noqa: E402

# Runs inside a checkout's virtualenv: start a cluster, print a follower's URL, stop at EOF on stdin.
_CLUSTER = r"""
import json, sys, tempfile
from raftmq.ops.local.cluster import Cluster
cluster = Cluster(3, tempfile.mkdtemp(prefix="raftmq-ab-"), extra_config="disk_free_limit = 1\n").start()
leader = cluster.leader()
follower = next(n for n in cluster.nodes if n is not leader)
print(json.dumps({"url": follower.url, "leader": leader.node_id}), flush=True)
sys.stdin.read()
cluster.stop()
"""


class CheckoutCluster:
    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        python = checkout / ".venv" / "bin" / "python"
        self.proc = subprocess.Popen([str(python), "-c", _CLUSTER], cwd=checkout, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the cluster of {checkout} did not start")
        self.url = json.loads(line)["url"]

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code (with .venv)")
    parser.add_argument("--new", type=Path, required=True, help="checkout of the new code (with .venv)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--scenario", choices=("confirm", "consume"), default="confirm",
                        help="confirmed publishes (default), or consuming --count queued messages "
                             "(prefetch 256, acks every 64; the publish before it is not timed)")
    args = parser.parse_args()

    def measure(url: str) -> float:
        if args.scenario == "consume":
            _rate, queue = bench_publish(url, args.count, args.size)
            return bench_consume(url, queue, args.count)
        return bench_confirmed_pika(url, args.count, args.size, args.window, quorum=False)

    clusters = {"old": CheckoutCluster(args.old.resolve()), "new": CheckoutCluster(args.new.resolve())}
    rates: dict[str, list[float]] = {"old": [], "new": []}
    try:
        time.sleep(2)
        for cluster in clusters.values():  # warm-up, not counted
            bench_confirmed_pika(cluster.url, 2000, args.size, args.window, quorum=False)
            if args.scenario == "consume":
                bench_consume(cluster.url, bench_publish(cluster.url, 2000, args.size)[1], 2000)
        for i in range(args.rounds):
            order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
            for name in order:
                rates[name].append(measure(clusters[name].url))
            print(f"round {i + 1}: old {rates['old'][-1]:,.0f}  new {rates['new'][-1]:,.0f} msg/s  "
                  f"new/old {rates['new'][-1] / rates['old'][-1]:.2f}", flush=True)
    finally:
        for cluster in clusters.values():
            cluster.stop()
    ratios = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
    what = "consumed" if args.scenario == "consume" else "confirmed"
    print(f"{what} msg/s through a follower, medians of {args.rounds} rounds: "
          f"old {statistics.median(rates['old']):,.0f}, new {statistics.median(rates['new']):,.0f}; "
          f"new/old {statistics.median(rates['new']) / statistics.median(rates['old']):.2f} "
          f"(per round {min(ratios):.2f}-{max(ratios):.2f}, new faster in "
          f"{sum(r > 1 for r in ratios)} of {len(ratios)})")


if __name__ == "__main__":
    main()
