"""AMQP 1.0 against 0-9-1 on the same raftmq node (or cluster), side by side (issue 19).

Scenarios, each bounded by a message count and a time limit:

* ``confirmed publish``: persistent messages to a durable queue, at most ``--window`` unconfirmed:
  0-9-1 with publisher confirms through pika's SelectConnection (bench/throughput.py), 1.0 with
  unsettled transfers through python-qpid-proton's event loop (a message counts once accepted);
* ``consume``: what the publish left, 0-9-1 with manual acks and prefetch 256 (bench/throughput.py),
  1.0 with link credit 256 and an accepted disposition per message.

Each round measures every scenario on both protocols back to back, alternating which goes first; the
summary gives medians and the per-round 1.0/0-9-1 ratios, and the CPU time the node (the one the
clients use) spent per message: the Python clients (proton's event loop costs ~60 us per message,
pika's ~20) often set the rate, so the node's CPU is the fairer comparison of the two front ends.

Usage::

    python -m bench.amqp10 --rounds 3 --count 20000
    python -m bench.amqp10 --cluster 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pika
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.throughput import bench_confirmed_pika, bench_consume
from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import RaftmqNode

TIME_LIMIT = 60.0


class _Send(MessagingHandler):
    def __init__(self, url: str, address: str, count: int, size: int, window: int) -> None:
        super().__init__(auto_settle=True)
        self.url, self.address, self.count, self.window = url, address, count, window
        self.body = b"x" * size
        self.sent = self.accepted = 0
        self.start = self.elapsed = 0.0

    def on_start(self, event) -> None:
        conn = event.container.connect(self.url)
        event.container.create_sender(conn, self.address)
        self.start = time.perf_counter()

    def on_sendable(self, event) -> None:
        sender = event.sender
        while (sender.credit > 0 and self.sent < self.count and self.sent - self.accepted < self.window
               and time.perf_counter() - self.start < TIME_LIMIT):
            sender.send(Message(body=self.body, durable=True, inferred=True))
            self.sent += 1

    def on_accepted(self, event) -> None:
        self.accepted += 1
        if self.accepted >= self.count or (self.accepted >= self.sent
                                           and time.perf_counter() - self.start >= TIME_LIMIT):
            self.elapsed = time.perf_counter() - self.start
            event.connection.close()
        else:
            self.on_sendable(event)


class _Receive(MessagingHandler):
    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__(prefetch=256, auto_accept=True)
        self.url, self.address, self.count = url, address, count
        self.received = 0
        self.start = self.elapsed = 0.0

    def on_start(self, event) -> None:
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address)
        self.start = time.perf_counter()

    def on_message(self, event) -> None:
        self.received += 1
        if self.received >= self.count or time.perf_counter() - self.start >= TIME_LIMIT:
            self.elapsed = time.perf_counter() - self.start
            event.connection.close()


def amqp10_publish(url: str, queue: str, count: int, size: int, window: int) -> float:
    handler = _Send(url, f"/queues/{queue}", count, size, window)
    Container(handler).run()
    return handler.accepted / handler.elapsed


def amqp10_consume(url: str, queue: str, count: int) -> float:
    handler = _Receive(url, f"/queues/{queue}", count)
    Container(handler).run()
    return handler.received / handler.elapsed


def _declare(amqp091_url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp091_url))
    conn.channel().queue_declare(queue, durable=True)
    conn.close()


def node_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Metered(dict):
    """Scenario results, with the node's CPU per message beside each rate."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def measure(self, key: str, count: int, run) -> None:
        before = node_cpu(self.pid)
        self[key] = run()
        self[f"{key} node us/msg"] = (node_cpu(self.pid) - before) * 1e6 / count


def run_round(amqp091_url: str, amqp10_url: str, args, first_10: bool, pid: int) -> dict[str, float]:
    out = _Metered(pid)
    order = ["1.0", "0-9-1"] if first_10 else ["0-9-1", "1.0"]
    queues = {}
    for protocol in order:
        if protocol == "1.0":
            queue = f"bench10-{uuid.uuid4().hex[:8]}"
            _declare(amqp091_url, queue)
            out.measure("confirmed publish 1.0", args.count,
                        lambda q=queue: amqp10_publish(amqp10_url, q, args.count, args.size, args.window))
            queues["1.0"] = queue
        else:
            out.measure("confirmed publish 0-9-1", args.count,
                        lambda: bench_confirmed_pika(amqp091_url, args.count, args.size, args.window, False))
            queue = f"bench091-{uuid.uuid4().hex[:8]}"
            _declare(amqp091_url, queue)
            amqp10_publish(amqp10_url, queue, args.count, args.size, args.window)  # filled alike for consume
            queues["0-9-1"] = queue
    for protocol in order:
        if protocol == "1.0":
            out.measure("consume 1.0", args.count, lambda: amqp10_consume(amqp10_url, queues["1.0"], args.count))
        else:
            out.measure("consume 0-9-1", args.count, lambda: bench_consume(amqp091_url, queues["0-9-1"], args.count))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--cluster", type=int, default=0)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-amqp10-"))
    if args.cluster:
        cluster = Cluster(args.cluster, base)
        cluster.start()
        target = cluster.leader()
        stop = cluster.stop
    else:
        target = RaftmqNode(base / "node")
        target.start()
        stop = target.stop
    try:
        amqp091_url = target.url
        amqp10_url = f"amqp://guest:guest@127.0.0.1:{target.port}"
        rounds = [run_round(amqp091_url, amqp10_url, args, i % 2 == 0, target.pid) for i in range(args.rounds)]
    finally:
        stop()
    print(f"{args.rounds} rounds, {args.count} messages of {args.size} B, window {args.window}, "
          f"{'cluster of ' + str(args.cluster) if args.cluster else 'one node'}")
    for scenario in ("confirmed publish", "consume"):
        v10 = [r[f"{scenario} 1.0"] for r in rounds]
        v091 = [r[f"{scenario} 0-9-1"] for r in rounds]
        ratios = [a / b for a, b in zip(v10, v091, strict=True)]
        print(f"{scenario:20s} 1.0 {statistics.median(v10):9.0f} msg/s   0-9-1 {statistics.median(v091):9.0f} msg/s"
              f"   1.0/0-9-1 per round: {', '.join(f'{r:.2f}' for r in ratios)}")
        c10 = statistics.median(r[f"{scenario} 1.0 node us/msg"] for r in rounds)
        c091 = statistics.median(r[f"{scenario} 0-9-1 node us/msg"] for r in rounds)
        print(f"{'':20s} node CPU per message: 1.0 {c10:.1f} us, 0-9-1 {c091:.1f} us")


if __name__ == "__main__":
    main()
