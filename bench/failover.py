"""Leader kill -9 to first publisher confirm, over repeated kills of a 3-node raftmq cluster.

A publisher connected to a follower publishes persistent messages with confirms, one at a time,
without pause. Each round SIGKILLs the current leader and measures the time from the kill to the
first confirm of a message published after it, then restarts the killed node and waits until it
has caught up. Prints every round and p50/p99. Also checks that no confirmed message was lost.

    python bench/failover.py [--kills 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.ops.local.cluster import Cluster  # noqa: E402

ROUND_LIMIT = 30.0  # seconds to wait for a confirm after a kill


class Publisher(threading.Thread):
    def __init__(self, cluster: Cluster, queue: str) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.queue = queue
        self.confirmed: list[tuple[float, int]] = []  # (time published, seq)
        self.stop = threading.Event()
        self.node = None
        self.seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            node = self.node
            try:
                conn = self.cluster.connection(node, timeout=ROUND_LIMIT)
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(self.queue, durable=True)
                while not self.stop.is_set() and self.node is node:
                    self.seq += 1
                    sent_at = time.monotonic()
                    ch.basic_publish("", self.queue, str(self.seq).encode(),
                                     pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append((sent_at, self.seq))
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.05)  # reconnect (the node may have closed us with 320)


def kill_leader_once(cluster: Cluster, publisher: Publisher) -> float | None:
    """Kill -9 the leader (moving the publisher off it first); seconds until the first confirm of
    a message published after the kill, or None; then restart the node and wait for it."""
    leader = cluster.leader()
    if publisher.node is leader:
        publisher.node = next(n for n in cluster.nodes if n is not leader)
        time.sleep(1.0)
    killed_at = time.monotonic()
    leader.kill9()
    deadline = killed_at + ROUND_LIMIT
    confirm_time = None
    while time.monotonic() < deadline:
        if publisher.confirmed and publisher.confirmed[-1][0] > killed_at:  # appended in order
            # The first confirm after the kill: the time it arrived is when the list grew past it.
            confirm_time = time.monotonic() - killed_at
            break
        time.sleep(0.005)
    leader.start()
    cluster.wait_caught_up(leader)
    return confirm_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=10)
    args = parser.parse_args()
    times: list[float] = []
    with Cluster(3) as cluster:
        leader = cluster.leader()
        publisher = Publisher(cluster, "failover-bench")
        publisher.node = next(n for n in cluster.nodes if n is not leader)
        publisher.start()
        time.sleep(1.0)
        for round_no in range(1, args.kills + 1):
            confirm_time = kill_leader_once(cluster, publisher)
            if confirm_time is None:
                print(f"round {round_no}: no confirm within {ROUND_LIMIT}s", flush=True)
            else:
                times.append(confirm_time)
                print(f"round {round_no}: first confirm {confirm_time * 1000:.0f} ms after kill -9", flush=True)
        publisher.stop.set()
        publisher.join(timeout=10)
        confirmed = {seq for _, seq in publisher.confirmed}
        conn = cluster.connection(cluster.nodes[0])
        ch = conn.channel()
        stored = set()
        while True:
            method, _p, body = ch.basic_get("failover-bench", auto_ack=True)
            if method is None:
                break
            stored.add(int(body))
        conn.close()
    lost = confirmed - stored
    print(f"\nconfirmed {len(confirmed)} messages, stored {len(stored)}, lost {len(lost)}")
    if times:
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        print(f"leader kill -9 -> first confirm: p50 {statistics.median(times) * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {len(times)} kills")


if __name__ == "__main__":
    main()
