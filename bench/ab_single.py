"""Old code against new code on ONE node, side by side: the single-node publish path with confirms
(persistent messages, a durable queue: each batch committed to the LMDB state and fsynced before its
confirms), measured in alternating rounds with the same client (this machine drifts by up to 2x within
minutes: only such paired figures mean anything).  Written for issue 29 (checksums of the single-node
state and the audit history); bench/ab_cluster.py does the same for 3-node clusters.

Each checkout runs its own node with its own virtualenv (``CHECKOUT/.venv/bin/python``); the client is
pika's asynchronous connection (window 1,000: the ``confirm (pika async)`` scenario of
bench/throughput.py).  ``--audit body`` turns the audit history on in both nodes (its writer thread
seals every record too).  ``--restart N`` also times a restart on N queued persistent messages (the
state is read back and, in the new code, every record checked).

Usage::

    git archive <old commit> | tar -x -C /tmp/base && (a .venv there, pip install -e .)
    python bench/ab_single.py --old /tmp/base --new . --rounds 6 --size 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import bench_confirmed_pika  # noqa: E402

# Runs inside a checkout's virtualenv: start a node, print its URL, then obey stdin lines:
# "restart" -> stop (SIGTERM) and start again, print the seconds until AMQP answers; EOF -> stop.
_NODE = r"""
import json, os, sys, tempfile, time
from raftmq.ops.local.node import RaftmqNode
env = {"RAFTMQ_DISK_FREE_LIMIT": "1"}
if sys.argv[1] != "none":
    env["RAFTMQ_AUDIT_RETENTION"] = sys.argv[1]
node = RaftmqNode(tempfile.mkdtemp(prefix="raftmq-ab1-"), env=env, start_timeout=120).start()
print(json.dumps({"url": node.url}), flush=True)
for line in sys.stdin:
    if line.strip() == "restart":
        node.terminate()
        t = time.perf_counter()
        node.start()
        print(json.dumps({"restart_s": time.perf_counter() - t}), flush=True)
node.terminate()
"""


class CheckoutNode:
    def __init__(self, checkout: Path, audit: str) -> None:
        python = checkout / ".venv" / "bin" / "python"
        self.proc = subprocess.Popen([str(python), "-c", _NODE, audit], cwd=checkout, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the node of {checkout} did not start")
        self.url = json.loads(line)["url"]

    def restart(self) -> float:
        self.proc.stdin.write("restart\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["restart_s"]

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def fill(url: str, queue: str, count: int, size: int) -> None:
    """``count`` persistent messages in a durable queue, confirmed (blocking publishes in bursts)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    body = b"r" * size
    for _ in range(count):
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code (with .venv)")
    parser.add_argument("--new", type=Path, required=True, help="checkout of the new code (with .venv)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--audit", choices=("none", "metadata", "body"), default="none")
    parser.add_argument("--restart", type=int, default=0, metavar="N",
                        help="then time a restart with N queued persistent messages of --size (0: no)")
    args = parser.parse_args()

    nodes = {"old": CheckoutNode(args.old.resolve(), args.audit), "new": CheckoutNode(args.new.resolve(), args.audit)}
    rates: dict[str, list[float]] = {"old": [], "new": []}
    try:
        time.sleep(1)
        for node in nodes.values():  # warm-up, not counted
            bench_confirmed_pika(node.url, 2000, args.size, args.window, quorum=False)
        for i in range(args.rounds):
            order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
            for name in order:
                rates[name].append(bench_confirmed_pika(nodes[name].url, args.count, args.size, args.window,
                                                        quorum=False))
            print(f"round {i + 1}: old {rates['old'][-1]:,.0f}  new {rates['new'][-1]:,.0f} msg/s  "
                  f"new/old {rates['new'][-1] / rates['old'][-1]:.2f}", flush=True)
        ratios = [n / o for n, o in zip(rates["new"], rates["old"], strict=True)]
        print(f"confirmed msg/s, {args.size} B persistent, one node, audit {args.audit}, medians of "
              f"{args.rounds} rounds: old {statistics.median(rates['old']):,.0f}, "
              f"new {statistics.median(rates['new']):,.0f}; new/old "
              f"{statistics.median(rates['new']) / statistics.median(rates['old']):.3f} "
              f"(per round {min(ratios):.2f}-{max(ratios):.2f}, new faster in {sum(r > 1 for r in ratios)} "
              f"of {len(ratios)})", flush=True)
        if args.restart:
            for node in nodes.values():
                fill(node.url, "restart-backlog", args.restart, args.size)
            times: dict[str, list[float]] = {"old": [], "new": []}
            for i in range(3):
                for name in (["old", "new"] if i % 2 == 0 else ["new", "old"]):
                    times[name].append(nodes[name].restart())
            print(f"restart with {args.restart:,} queued x {args.size} B (start to AMQP answering), medians of 3: "
                  f"old {statistics.median(times['old']):.2f} s, new {statistics.median(times['new']):.2f} s "
                  f"(old {times['old']}, new {times['new']})", flush=True)
    finally:
        for node in nodes.values():
            node.stop()


if __name__ == "__main__":
    main()
