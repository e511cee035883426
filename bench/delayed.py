"""Delayed messages through a leader kill and a full restart of a 3-node raftmq cluster (issue 21).

Four publishers (connected to the followers) send ``--messages`` persistent messages with publisher
confirms to an ``x-delayed-message`` exchange, each with a random ``x-delay`` of 1..``--max-delay``
ms (seeded).  A third of the way through, the leader is killed with SIGKILL (and restarted); after
the last confirm, all three nodes are killed at once and started again while messages are still
held.  A consumer (manual acks, reconnecting to any node) records when each message arrives.

Checks: no message delivered before its delay (arrival < first publish attempt + delay: the broker
stamps the publish later than the client sent it, so an arrival before this is early), no
confirmed message lost.  Prints lateness (arrival - first attempt - delay) p50/p99/max, overall and
for the messages that were due while the whole cluster was down (their lateness includes the
restart) and, separately, for those due within 3 s after the leader kill and for the rest.
Lateness is seen by a consumer: it includes the consumer's own reconnections.  Bounded: ``--timeout`` seconds in all.

    python bench/delayed.py [--messages 10000] [--max-delay 5000] [--seed 21]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.ops.local.cluster import Cluster  # noqa: E402

EXCHANGE, QUEUE = "bench-delayed-x", "bench-delayed-q"
SETTLE = 3.0  # seconds after a fault still counted as its effect (the consumer reconnects, too)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Publisher(threading.Thread):
    """Publishes its share (seq, delay) one confirm at a time, failing over between the given
    nodes; a message whose confirm was lost is published again (the first attempt's time counts)."""

    def __init__(self, cluster: Cluster, nodes: list, work: list[tuple[int, int]], first_sent: dict,
                 confirmed: set, deadline: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.nodes, self.work = cluster, nodes, work
        self.first_sent, self.confirmed, self.deadline = first_sent, confirmed, deadline
        self.resent = 0
        self.done = False

    def run(self) -> None:
        i, attempt = 0, 0
        while i < len(self.work) and time.monotonic() < self.deadline:
            node = self.nodes[attempt % len(self.nodes)]
            attempt += 1
            try:
                conn = self.cluster.connection(node, timeout=5)
                ch = conn.channel()
                ch.confirm_delivery()
                while i < len(self.work) and time.monotonic() < self.deadline:
                    seq, delay = self.work[i]
                    if seq in self.first_sent:
                        self.resent += 1
                    else:
                        self.first_sent[seq] = time.time()
                    ch.basic_publish(EXCHANGE, "k", f"{seq} {delay}".encode(),
                                     pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}))
                    self.confirmed.add(seq)
                    i += 1
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.1)
        self.done = i == len(self.work)


class Consumer(threading.Thread):
    def __init__(self, cluster: Cluster, arrivals: dict, deadline: float) -> None:
        super().__init__(daemon=True)
        self.cluster, self.arrivals, self.deadline = cluster, arrivals, deadline
        self.deliveries = 0
        self.stop = threading.Event()

    def run(self) -> None:
        attempt = 0
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            node = self.cluster.nodes[attempt % len(self.cluster.nodes)]
            attempt += 1
            try:
                conn = self.cluster.connection(node, timeout=5)
                ch = conn.channel()
                ch.basic_qos(prefetch_count=500)
                for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.2):
                    if self.stop.is_set() or time.monotonic() > self.deadline:
                        break
                    if method is None:
                        continue
                    now = time.time()
                    self.deliveries += 1
                    self.arrivals.setdefault(int(body.split()[0]), now)  # the first arrival counts
                    ch.basic_ack(method.delivery_tag)
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--max-delay", type=int, default=5000, help="ms")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for the whole run")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    delays = {seq: rng.randint(1, args.max_delay) for seq in range(1, args.messages + 1)}
    started = time.monotonic()
    deadline = started + args.timeout
    first_sent: dict[int, float] = {}
    confirmed: set[int] = set()
    arrivals: dict[int, float] = {}
    with Cluster(3) as cluster:
        leader = cluster.leader()
        followers = [n for n in cluster.nodes if n is not leader]
        conn = cluster.connection(followers[0])
        ch = conn.channel()
        ch.exchange_declare(EXCHANGE, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        ch.queue_declare(QUEUE, durable=True)
        ch.queue_bind(QUEUE, EXCHANGE, "k")
        conn.close()
        consumer = Consumer(cluster, arrivals, deadline)
        consumer.start()
        seqs = list(delays)
        publishers = [Publisher(cluster, followers, [(s, delays[s]) for s in seqs[i::args.publishers]],
                                first_sent, confirmed, deadline) for i in range(args.publishers)]
        t0 = time.monotonic()
        for p in publishers:
            p.start()
        while len(first_sent) < args.messages // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        killed = cluster.leader()
        print(f"kill -9 leader {killed.node_id} after {len(first_sent)} publishes "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
        kill_at = time.time()
        killed.kill9()
        time.sleep(1.0)
        killed.start()
        for p in publishers:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        print(f"published {len(first_sent)}, confirmed {len(confirmed)} in {time.monotonic() - t0:.1f} s "
              f"({sum(p.resent for p in publishers)} resent after a lost confirm)", flush=True)
        down_from = time.time()
        held_before = len(confirmed) - len(arrivals)
        for node in cluster.nodes:
            node.kill9()
        for node in cluster.nodes:
            node.start()
        cluster.wait_formed(timeout=60)
        down_until = time.time()
        print(f"full restart (kill -9 of all 3, {held_before} messages not yet arrived): cluster back after "
              f"{down_until - down_from:.1f} s", flush=True)
        last_due = max(first_sent[s] + delays[s] / 1000 for s in first_sent)
        while len(set(arrivals) & confirmed) < len(confirmed) and time.monotonic() < deadline:
            if time.time() > last_due + 30:
                break
            time.sleep(0.1)
        consumer.stop.set()
        consumer.join(timeout=10)
    received = set(arrivals)
    lost = confirmed - received
    unexpected = received - set(first_sent)
    lateness = {s: (arrivals[s] - first_sent[s]) * 1000 - delays[s] for s in received & set(first_sent)}
    early = {s: v for s, v in lateness.items() if v < 0}
    windows = {"due within 3 s after the leader kill": (kill_at, kill_at + SETTLE),
               "due during the full restart or within 3 s after it": (down_from, down_until + SETTLE)}
    groups: dict[str, list[float]] = {"all": list(lateness.values()), "due with no fault in the 3 s before": []}
    for s, v in lateness.items():
        due = first_sent[s] + delays[s] / 1000
        name = next((n for n, (a, b) in windows.items() if a <= due <= b), "due with no fault in the 3 s before")
        groups.setdefault(name, []).append(v)
    print(f"\nconfirmed {len(confirmed)}, received {len(received)} ({consumer.deliveries} deliveries), "
          f"lost {len(lost)}, unexpected {len(unexpected)}, early {len(early)}")
    if early:
        print(f"  early by (ms): {sorted(early.values())[:10]}")
    for label, values in groups.items():
        if values:
            print(f"lateness {label} ({len(values)}): p50 {percentile(values, 0.5):.1f} ms, "
                  f"p99 {percentile(values, 0.99):.1f} ms, max {max(values):.1f} ms")
    print(f"run took {time.monotonic() - started:.1f} s")
    if lost or early or unexpected:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
