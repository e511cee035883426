"""The benchmark matrix: raftmq (one node, three nodes) against RabbitMQ (classic, quorum queues)
in the same run, with the same clients (pika, aio-pika).

Scenarios, each bounded by a message count and a time limit (``bench.throughput.TIME_LIMIT``):

* publish 256 B / 4 KB without confirms (pika), consume with acks and prefetch 256 (pika);
* persistent publish with confirms, 256 B / 4 KB, 1,000 in flight (aio-pika);
* round trip publish -> delivery of single messages, p50 / p99 (pika);
* fan-out: publish to a fanout exchange bound to 10 queues (deliveries are 10x the publishes);
* 1,000 queues: declare them, then publish round-robin across them;
* memory per 100k queued 256 B messages (RSS growth of the broker's processes);
* leader-kill failover (raftmq x3: kill -9 to the first confirm; RabbitMQ here is one node: n/a).

Targets: ``raftmq`` (one node) vs ``rabbitmq`` classic queues; ``raftmq x3`` (clients on a
follower) vs ``rmq quorum`` (quorum queues on the same single RabbitMQ node: Raft with one member,
so its replication costs are lower than a real three-node RabbitMQ cluster's).

    python bench/matrix.py [--quick] [--no-rabbitmq] [--out bench/results]

Prints a table with ratios, writes ``matrix-<time>.json`` and ``matrix-<time>.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput import TIME_LIMIT, _confirmed, bench_consume, bench_latency, bench_publish  # noqa: E402
from raftmq.ops.local.cluster import Cluster  # noqa: E402
from raftmq.ops.local.node import RaftmqNode  # noqa: E402
from tests.support import rabbitmq  # noqa: E402

HIGHER_IS_BETTER = "msg/s"


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue  # gone meanwhile
    return total


def group_pids(pgid: int) -> list[int]:
    """Every process in process group ``pgid`` (RabbitMQ's beam.smp runs under its start script)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                pids.append(int(entry))
    return pids


def bench_fanout(url: str, count: int, queues: int = 10, quorum: bool = False) -> float:
    """Publishes per second to a fanout exchange bound to ``queues`` queues (then drained)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    exchange = f"bench-fan-{uuid.uuid4().hex[:6]}"
    ch.exchange_declare(exchange, "fanout")
    names = []
    for i in range(queues):
        name = f"{exchange}-{i}"
        ch.queue_declare(name, durable=quorum, arguments={"x-queue-type": "quorum"} if quorum else None)
        ch.queue_bind(name, exchange)
        names.append(name)
    body = b"x" * 256
    start = time.perf_counter()
    sent = 0
    while sent < count and time.perf_counter() - start < TIME_LIMIT:
        ch.basic_publish(exchange, "", body)
        sent += 1
    for name in names:
        ch.queue_declare(name, passive=True)  # a round trip after everything was routed
    elapsed = time.perf_counter() - start
    for name in names:
        ch.queue_delete(name)
    ch.exchange_delete(exchange)
    conn.close()
    return sent / elapsed


def bench_many_queues(url: str, queues: int, count: int, quorum: bool = False) -> tuple[float, float]:
    """Declares per second of ``queues`` queues, then publishes per second round-robin over them."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    prefix = f"bench-many-{uuid.uuid4().hex[:6]}"
    names = [f"{prefix}-{i}" for i in range(queues)]
    start = time.perf_counter()
    for name in names:
        ch.queue_declare(name, durable=quorum, arguments={"x-queue-type": "quorum"} if quorum else None)
    declare_rate = queues / (time.perf_counter() - start)
    body = b"x" * 256
    start = time.perf_counter()
    sent = 0
    while sent < count and time.perf_counter() - start < TIME_LIMIT:
        ch.basic_publish("", names[sent % queues], body)
        sent += 1
    ch.queue_declare(names[0], passive=True)
    publish_rate = sent / (time.perf_counter() - start)
    for name in names:
        ch.queue_delete(name)
    conn.close()
    return declare_rate, publish_rate


def bench_memory(url: str, pids: list[int], count: int = 100_000, quorum: bool = False) -> float:
    """RSS growth (MB) of the broker's processes per 100k queued 256 B messages."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    queue = f"bench-mem-{uuid.uuid4().hex[:6]}"
    ch.queue_declare(queue, durable=quorum, arguments={"x-queue-type": "quorum"} if quorum else None)
    time.sleep(1.0)
    before = rss_bytes(pids)
    body = b"x" * 256
    start = time.perf_counter()
    sent = 0
    while sent < count and time.perf_counter() - start < 2 * TIME_LIMIT:
        ch.basic_publish("", queue, body)
        sent += 1
    ch.queue_declare(queue, passive=True)
    time.sleep(1.0)
    grown = rss_bytes(pids) - before
    ch.queue_delete(queue)
    conn.close()
    return grown / 1e6 * (100_000 / max(1, sent))


def bench_failover(cluster: Cluster, kills: int) -> tuple[float, float]:
    """Leader kill -9 to the first confirm of a publisher on a follower (ms): p50, max."""
    from bench.failover import Publisher, kill_leader_once

    publisher = Publisher(cluster, f"bench-fo-{uuid.uuid4().hex[:6]}")
    publisher.node = cluster.followers()[0]
    publisher.start()
    samples = []
    try:
        for _ in range(kills):
            time.sleep(1.0)
            seconds = kill_leader_once(cluster, publisher)
            if seconds is not None:
                samples.append(seconds * 1000)
    finally:
        publisher.stop.set()
        publisher.join(timeout=30)
    samples.sort()
    return (samples[len(samples) // 2], samples[-1]) if samples else (float("nan"), float("nan"))


def run_target(name: str, url: str, pids: list[int], args, quorum: bool, cluster: Cluster | None = None) -> dict:
    results: dict[str, float] = {}

    def record(key: str, value: float) -> None:
        results[key] = value
        print(f"  {name:11s} {key:44s} {value:12.1f}", flush=True)

    for size, label in ((256, "256 B"), (4096, "4 KB")):
        rate, queue = bench_publish(url, args.count, size, quorum)
        record(f"publish {label}, no confirms (msg/s)", rate)
        if size == 256:
            record("consume, acks, prefetch 256 (msg/s)", bench_consume(url, queue, args.count))
        else:
            _drop_queue(url, queue)
        record(f"publish {label}, confirms, window 1000 (msg/s)",
               asyncio.run(_confirmed(url, args.confirm_count, size, 1000, quorum)))
    p50, p99 = bench_latency(url, quorum, count=args.latency_count)
    record("round trip p50 (ms)", p50)
    record("round trip p99 (ms)", p99)
    record("fan-out to 10 queues, publishes (msg/s)", bench_fanout(url, args.fanout_count, 10, quorum))
    declares, publishes = bench_many_queues(url, args.queues, args.count, quorum)
    record(f"{args.queues} queues: declares (queues/s)", declares)
    record(f"{args.queues} queues: publishes round-robin (msg/s)", publishes)
    record("memory per 100k queued 256 B (MB)", bench_memory(url, pids, args.memory_count, quorum))
    if cluster is not None:
        p50, worst = bench_failover(cluster, args.kills)
        record("leader kill -9 -> first confirm p50 (ms)", p50)
        record("leader kill -9 -> first confirm max (ms)", worst)
    return results


def _drop_queue(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_delete(queue)
    conn.close()


def lower_is_better(key: str) -> bool:
    return "(ms)" in key or "(MB)" in key


def print_table(table: dict[str, dict[str, float]], pairs: list[tuple[str, str]]) -> None:
    names = list(table)
    keys = list(dict.fromkeys(k for t in table.values() for k in t))
    header = f"{'scenario':50s}" + "".join(f"{n:>13s}" for n in names)
    header += "".join(f"{a + '/' + b:>24s}" for a, b in pairs)
    print("\n" + header)
    for key in keys:
        row = f"{key:50s}" + "".join(f"{table[n][key]:13.1f}" if key in table[n] else f"{'-':>13s}" for n in names)
        for a, b in pairs:
            if key in table.get(a, {}) and key in table.get(b, {}) and table[b][key]:
                ratio = table[a][key] / table[b][key]
                row += f"{ratio:23.2f}x"
            else:
                row += f"{'-':>24s}"
        print(row)
    print("(ratios above 1 mean raftmq is faster, except for ms and MB rows, where below 1 is better)")


def plot(table: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in dict.fromkeys(k for t in table.values() for k in t)]
    fig, axes = plt.subplots((len(keys) + 3) // 4, 4, figsize=(16, 3 * ((len(keys) + 3) // 4)))
    for ax, key in zip(axes.flat, keys, strict=False):
        names = [n for n in table if key in table[n]]
        ax.bar(names, [table[n][key] for n in names], color=["tab:blue", "tab:cyan", "tab:orange", "tab:red"][
            :len(names)])
        ax.set_title(key, fontsize=8)
        ax.tick_params(axis="x", labelsize=7, rotation=20)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-rabbitmq", action="store_true", help="raftmq only")
    parser.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0
    args.count = int(20_000 * scale)
    args.confirm_count = int(10_000 * scale)
    args.latency_count = int(300 * scale) or 10
    args.fanout_count = int(5_000 * scale)
    args.queues = int(1_000 * scale)
    args.memory_count = int(100_000 * scale)
    args.kills = 3 if not args.quick else 1

    table: dict[str, dict[str, float]] = {}
    started = time.time()
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(RaftmqNode(tempfile.mkdtemp(prefix="raftmq-matrix-")))
        table["raftmq"] = run_target("raftmq", node.url, [node.pid], args, quorum=False)
        node.terminate()
        cluster = stack.enter_context(Cluster(3))
        follower = cluster.followers()[0]
        cluster.connection(follower).close()
        table["raftmq x3"] = run_target("raftmq x3", follower.url, [n.pid for n in cluster.nodes], args,
                                        quorum=False, cluster=cluster)
        cluster.stop()
        if not args.no_rabbitmq and rabbitmq.available():
            rmq = stack.enter_context(rabbitmq.RabbitMQ())
            pids = group_pids(rmq.pid)
            table["rabbitmq"] = run_target("rabbitmq", rmq.url, pids, args, quorum=False)
            table["rmq quorum"] = run_target("rmq quorum", rmq.url, pids, args, quorum=True)
        elif not args.no_rabbitmq:
            print("rabbitmq-server is not installed (apt-get install rabbitmq-server): raftmq only", file=sys.stderr)
    pairs = [(a, b) for a, b in (("raftmq", "rabbitmq"), ("raftmq x3", "rmq quorum")) if a in table and b in table]
    print_table(table, pairs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"matrix-{stamp}.json").write_text(json.dumps(
        {"started": started, "seconds": time.time() - started, "quick": args.quick, "cpus": os.cpu_count(),
         "results": table}, indent=2))
    try:
        plot(table, out / f"matrix-{stamp}.png")
    except ImportError:
        pass
    print(f"\nwritten: {out}/matrix-{stamp}.json, .png ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
