"""Old code against new code, side by side, and RabbitMQ in the same run: 3-node raftmq clusters, one
per checkout, and optionally a 3-node RabbitMQ cluster with 3-replica quorum queues, measured in
alternating rounds with the same client (this machine drifts by up to 2x within minutes: only such
paired figures mean anything).

Each checkout runs its own cluster with its own virtualenv (``CHECKOUT/.venv/bin/python``), started
through that checkout's ``raftmq.ops.local.cluster.Cluster``.  The client (this script's pika) always
talks to a node that does not lead: for raftmq a *follower* (checked in every round from its
status.json: a leader change that put the client on the leader is reported); for RabbitMQ node r2,
with every queue declared beforehand through r1 (so its quorum queue leader is r1, checked with
``rabbitmqctl list_queues name leader`` for every queue of the first round).

Scenarios (``--scenarios``, comma separated; all by default), each bounded by a count and by
throughput.TIME_LIMIT (30 s):

* ``confirm256`` / ``confirm4k``: ``--count`` persistent 256 B / 4 KiB publishes with confirms through
  pika's asynchronous connection, ``--window`` unconfirmed in flight (bench/throughput.py's
  ``confirm (pika async)``), to a durable queue (raftmq) or a quorum queue (RabbitMQ).
  Confirmed msg/s.
* ``latency``: ``--latency-count`` single *persistent* 256 B messages, each published with confirms
  on a channel that also consumes the durable/quorum queue (auto-ack), the next sent once the
  previous one is both delivered and confirmed: publish->delivery p50/p99 and publish->confirm
  p50/p99 (ms).  (bench/throughput.py's ``bench_latency`` sends transient messages without confirms;
  persistence and confirms are what issue 29's journal changes sit under.)
* ``consume``: ``--consume-count`` persistent ``--consume-size`` (4 KiB) messages are published
  (not timed) and then consumed (prefetch 256, acks every 64).  For raftmq this runs on a second
  cluster per checkout, started with ``--disk-cache-mib`` body_cache_bytes and
  ``--disk-write-behind-mib`` body_write_behind_bytes (1 MiB each by default), so that the backlog's
  bodies are in the body store on disk, not in memory, and the consumer's follower reads them back
  (the deltas of its bodies_written and body_cache_loaded, bodies read from the body store, are
  printed every round).  RabbitMQ's
  quorum queue keeps its log on disk (ra segments) and caches what it likes; it is not tuned.

In each round every scenario is measured on every system back to back, the order of the systems
rotating through all six permutations (old before new in half of the rounds).  Printed per round and
as a summary: the median per system, the ratios new/old and new/rabbitmq of the medians and the
range of the per-round ratios.  For the latency rows lower is better (a ratio above 1: new slower).
``--max-minutes`` bounds the whole run: no round starts after it.

Flags replaced in issue 29: ``--scenario confirm --size 256`` / ``--size 4096`` are now
``--scenarios confirm256`` / ``confirm4k``; ``--scenario consume`` is ``--scenarios consume``, which
now reads the backlog from disk (before, with 256 B bodies, it came from the body cache).

Usage::

    git worktree add /tmp/base <old commit> && (make the venv there, e.g. /work/mkworktree.sh)
    # a checkout others commit to meanwhile runs whatever it holds when each node starts: pin it,
    # e.g. git clone -q /work/main /tmp/new && git -C /tmp/new checkout --detach <commit> (+ its venv)
    python bench/ab_cluster.py --old /tmp/base --new . --rounds 6
    python bench/ab_cluster.py --old /tmp/base --new . --rabbitmq --rounds 4 \\
        --scenarios confirm256,confirm4k,latency,consume --count 10000
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import TIME_LIMIT, bench_confirmed_pika, bench_consume  # noqa: E402

SCENARIOS = ("confirm256", "confirm4k", "latency", "consume")

# Runs inside a checkout's virtualenv: start a cluster, print a follower's URL and data directory,
# stop at EOF on stdin (also when this script dies: the pipe closes), remove the data.
_CLUSTER = r"""
import json, shutil, sys, tempfile
from raftmq.ops.local.cluster import Cluster
base = tempfile.mkdtemp(prefix="raftmq-ab-")
cluster = Cluster(3, base, extra_config=sys.argv[1]).start()
try:
    leader = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    print(json.dumps({"url": follower.url, "leader": leader.node_id, "follower": follower.node_id,
                      "data_dir": str(follower.data_dir), "pids": [n.pid for n in cluster.nodes],
                      "leader_url": leader.url, "leader_data_dir": str(leader.data_dir),
                      "nodes": [{"id": n.node_id, "url": n.url, "data_dir": str(n.data_dir)} for n in cluster.nodes]}),
          flush=True)
    sys.stdin.read()
finally:
    cluster.stop()
    shutil.rmtree(base, ignore_errors=True)
"""


class CheckoutCluster:
    """A 3-node raftmq cluster of one checkout, in a child process of that checkout's virtualenv."""

    def __init__(self, checkout: Path, extra_config: str) -> None:
        self.checkout = checkout
        python = checkout / ".venv" / "bin" / "python"
        self.proc = subprocess.Popen([str(python), "-c", _CLUSTER, extra_config], cwd=checkout,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info: dict = {}

    def wait_ready(self) -> CheckoutCluster:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the cluster of {self.checkout} did not start")
        self.info = json.loads(line)
        return self

    @property
    def url(self) -> str:
        return self.info["url"]

    def status(self, after: float = 0.0, timeout: float = 5.0, node: str = "follower") -> dict:
        """The status.json of the node that was the ``node`` ("follower" or "leader") when the cluster
        started, written after ``after`` (a time.time()); {} if none."""
        path = Path(self.info["data_dir" if node == "follower" else "leader_data_dir"]) / "status.json"
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                status = json.loads(path.read_text())
                if status.get("time", 0) >= after:
                    return status
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class RaftmqTarget:
    """One checkout: a cluster with the default configuration and, for ``consume``, one whose
    message bodies live on disk (small body cache and write-behind)."""

    quorum = False

    def __init__(self, name: str, clusters: dict[str, CheckoutCluster]) -> None:
        self.name = name
        self.clusters = clusters

    def url(self, kind: str) -> str:
        return self.clusters[kind].url

    def declare(self, kind: str, queue: str) -> None:
        """Nothing to do: every raftmq queue lives in the one Raft log, led by the cluster's leader."""

    def check(self, kind: str, queue: str) -> str:
        """Where the client is: its node must still be a follower."""
        cluster = self.clusters[kind]
        status = cluster.status()
        role = status.get("role", "?")
        where = f"client on {cluster.info['follower']} ({role}), leader {status.get('leader_node', '?')}"
        return where if role == "follower" else f"WARNING: {where}"

    def disk_counters(self, kind: str, after: float = 0.0) -> dict[str, int]:
        status = self.clusters[kind].status(after)
        return {key: status.get(key, 0) for key in ("body_cache_misses", "body_cache_loaded", "bodies_written")}


class RabbitTarget:
    """A 3-node RabbitMQ cluster: the client on r2, every queue declared through r1 (its leader)."""

    quorum = True

    def __init__(self, cluster) -> None:
        self.name = "rabbitmq"
        self.rc = cluster

    def url(self, kind: str) -> str:
        return self.rc.url(1)

    def declare(self, kind: str, queue: str) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.rc.url(0)))
        try:
            conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        finally:
            conn.close()

    def check(self, kind: str, queue: str) -> str:
        out = self.rc.ctl(0, "list_queues", "name", "leader", "members", "--quiet", "--no-table-headers")
        for line in out.splitlines():
            fields = line.split("\t")
            if fields[0] == queue:
                where = f"client on {self.rc.nodename(1)}, quorum queue leader {fields[1]}, members {fields[2]}"
                return where if fields[1] != self.rc.nodename(1) else f"WARNING: {where}"
        return f"WARNING: queue {queue} not listed by r1"

    def disk_counters(self, kind: str, after: float = 0.0) -> dict[str, int]:
        return {}


def bench_roundtrip(url: str, queue: str, count: int, size: int, quorum: bool,
                    time_limit: float = TIME_LIMIT) -> tuple[list[float], list[float]]:
    """Single persistent messages with confirms on a channel that also consumes ``queue``
    (auto-ack); the next is published once the previous is delivered and confirmed.  Returns the
    publish->delivery and publish->confirm times (ms).  Bounded by ``count`` and ``time_limit``
    (seconds; bench/latency.py sets its per-cell limit)."""
    body = b"x" * size
    properties = pika.BasicProperties(delivery_mode=2)
    delivered: list[float] = []
    confirmed: list[float] = []
    state = {"sent": 0, "t0": 0.0, "got": False, "acked": False, "start": 0.0}
    box: list = []

    def publish_next() -> None:
        channel = box[0]
        if state["sent"] >= count or time.perf_counter() - state["start"] > time_limit:
            channel.queue_delete(queue, callback=lambda _frame: connection.close())
            return
        state.update(got=False, acked=False, t0=time.perf_counter())
        state["sent"] += 1
        channel.basic_publish("", queue, body, properties)

    def settle_one() -> None:
        if state["got"] and state["acked"]:
            publish_next()

    def on_message(_channel, _method, _props, _body) -> None:
        delivered.append((time.perf_counter() - state["t0"]) * 1000)
        state["got"] = True
        settle_one()

    def on_confirm(_frame) -> None:
        confirmed.append((time.perf_counter() - state["t0"]) * 1000)
        state["acked"] = True
        settle_one()

    def on_consuming(_frame) -> None:
        state["start"] = time.perf_counter()
        publish_next()

    def on_channel(channel) -> None:
        box.append(channel)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: channel.queue_declare(
            queue, durable=True, arguments={"x-queue-type": "quorum"} if quorum else None,
            callback=lambda _f: channel.basic_consume(queue, on_message, auto_ack=True, callback=on_consuming)))

    connection = pika.SelectConnection(pika.URLParameters(url),
                                       on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                       on_close_callback=lambda c, _reason: c.ioloop.stop())
    stop_at = connection.ioloop.call_later(time_limit * 2, connection.close)  # a broker that stops answering
    connection.ioloop.start()
    connection.ioloop.remove_timeout(stop_at)
    if not delivered:
        raise RuntimeError(f"no round trip finished: {state}")
    return delivered, confirmed


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def fill(url: str, queue: str, count: int, size: int, quorum: bool) -> int:
    """Publish ``count`` persistent messages (no confirms) and wait until the queue, as the client's
    node sees it, holds them all.  Bounded by count and TIME_LIMIT (twice: publishing, then waiting)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"} if quorum else None)
        body = b"x" * size
        properties = pika.BasicProperties(delivery_mode=2)
        start = time.perf_counter()
        sent = 0
        while sent < count and time.perf_counter() - start < TIME_LIMIT:
            ch.basic_publish("", queue, body, properties)
            sent += 1
        deadline = time.perf_counter() + TIME_LIMIT
        while True:
            queued = ch.queue_declare(queue, passive=True).method.message_count
            if queued >= sent or time.perf_counter() > deadline:
                return queued
            conn.sleep(0.1)
    finally:
        conn.close()


class Bench:
    """The scenarios: each takes a target and returns {metric: value} (and may print a note)."""

    def __init__(self, args, verify: Callable[[object, str, str], None]) -> None:
        self.args = args
        self.verify = verify

    def metrics(self, scenario: str) -> list[str]:
        return {
            "confirm256": ["confirm 256 B (msg/s)"],
            "confirm4k": ["confirm 4 KiB (msg/s)"],
            "latency": ["publish->delivery p50 (ms)", "publish->delivery p99 (ms)",
                        "publish->confirm p50 (ms)", "publish->confirm p99 (ms)"],
            "consume": [f"consume {self.args.consume_size} B from disk (msg/s)"],
        }[scenario]

    def run(self, scenario: str, target, warm: bool = False) -> dict[str, float]:
        args = self.args
        scale = 10 if warm else 1
        queue = f"ab-{scenario}-{uuid.uuid4().hex[:8]}"
        kind = "disk" if scenario == "consume" else "default"
        target.declare(kind, queue)
        if not warm:
            self.verify(target, kind, queue)
        url = target.url(kind)
        if scenario in ("confirm256", "confirm4k"):
            size = 256 if scenario == "confirm256" else 4096
            rate = bench_confirmed_pika(url, args.count // scale, size, args.window, target.quorum, queue=queue)
            return dict(zip(self.metrics(scenario), [rate], strict=True))
        if scenario == "latency":
            delivered, confirmed = bench_roundtrip(url, queue, args.latency_count // scale, 256, target.quorum)
            values = [percentile(delivered, 0.5), percentile(delivered, 0.99),
                      percentile(confirmed, 0.5), percentile(confirmed, 0.99)]
            return dict(zip(self.metrics(scenario), values, strict=True))
        count = args.consume_count // scale
        before = target.disk_counters(kind)
        loaded = before
        queued = fill(url, queue, count, args.consume_size, target.quorum)
        if before:
            time.sleep(1.0)  # write-behind: the follower writes what exceeds body_write_behind_bytes
            loaded = target.disk_counters(kind, after=time.time())
        rate = bench_consume(url, queue, queued)
        if before and not warm:
            after = target.disk_counters(kind, after=time.time())
            print(f"    {target.name} consume: {queued} queued; bodies written on the client's follower "
                  f"{loaded['bodies_written'] - before['bodies_written']}; while consuming, bodies read from disk "
                  f"{after['body_cache_loaded'] - loaded['body_cache_loaded']} (cache misses "
                  f"{after['body_cache_misses'] - loaded['body_cache_misses']}, the rest read ahead)",
                  flush=True)
        return dict(zip(self.metrics(scenario), [rate], strict=True))


ORDERS = [("old", "new", "rabbitmq"), ("new", "old", "rabbitmq"), ("rabbitmq", "old", "new"),
          ("rabbitmq", "new", "old"), ("old", "rabbitmq", "new"), ("new", "rabbitmq", "old")]


def commit(checkout: Path) -> str:
    """The checkout's commit, and whether its tracked files differ from it."""
    run = subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty", "--abbrev=10"],
                         capture_output=True, text=True, timeout=30)
    return run.stdout.strip() or "not a git checkout"


def fmt(metric: str, value: float) -> str:
    return f"{value:.2f}" if "(ms)" in metric else f"{value:,.0f}"


def summarise(results: dict[str, dict[str, list[float]]], metrics: list[str], names: list[str]) -> None:
    rounds = len(results[names[0]][metrics[0]])
    print(f"\nsummary: medians of {rounds} round(s); ratios of the medians, and [range of the per-round ratios]")
    pairs = [("new", "old")] + ([("new", "rabbitmq")] if "rabbitmq" in names else [])
    header = f"{'metric':34s}" + "".join(f"{n:>12s}" for n in names)
    header += "".join(f"  {a}/{b:<8s}{'[per round]':>14s}" for a, b in pairs)
    print(header)
    for metric in metrics:
        row = f"{metric:34s}" + "".join(f"{fmt(metric, statistics.median(results[n][metric])):>12s}" for n in names)
        for a, b in pairs:
            ratios = [x / y for x, y in zip(results[a][metric], results[b][metric], strict=True)]
            ratio = statistics.median(results[a][metric]) / statistics.median(results[b][metric])
            row += f"  {ratio:11.2f}  [{min(ratios):.2f}-{max(ratios):.2f}]"
        print(row)
    print("(msg/s: higher is better; ms: lower is better, a ratio above 1 means new is slower)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="checkout of the old code (with .venv)")
    parser.add_argument("--new", type=Path, required=True, help="checkout of the new code (with .venv)")
    parser.add_argument("--rabbitmq", action="store_true",
                        help="also a 3-node RabbitMQ cluster (quorum queues, client on r2, leader r1)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma separated, of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=20_000, help="messages per confirm scenario")
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed messages in flight")
    parser.add_argument("--latency-count", type=int, default=1000, help="round trips per latency scenario")
    parser.add_argument("--consume-count", type=int, default=20_000, help="backlog of the consume scenario")
    parser.add_argument("--consume-size", type=int, default=4096, help="body size of the consume backlog")
    parser.add_argument("--disk-cache-mib", type=int, default=1,
                        help="body_cache_bytes of the raftmq clusters for consume (MiB)")
    parser.add_argument("--disk-write-behind-mib", type=int, default=1,
                        help="body_write_behind_bytes of the raftmq clusters for consume (MiB)")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="no round starts after this")
    parser.add_argument("--extra-config", default="",
                        help='TOML lines added to every raftmq node\'s configuration, e.g. \'audit_retention = "metadata"\'')
    args = parser.parse_args()
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if unknown := set(scenarios) - set(SCENARIOS):
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    # A SIGTERM (or ^C) ends the rounds; the clusters are stopped (by PID) and the summary printed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    started = time.monotonic()
    commits = {"old": commit(args.old), "new": commit(args.new)}
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: scenarios {','.join(scenarios)}, {args.rounds} rounds; "
          f"old {args.old} ({commits['old']}), new {args.new} ({commits['new']})"
          f"{', rabbitmq 3 nodes' if args.rabbitmq else ''}", flush=True)
    extra = args.extra_config.replace("\\n", "\n") + "\n" if args.extra_config else ""
    configs = {"default": "disk_free_limit = 1\n" + extra}
    if "consume" in scenarios:
        configs["disk"] = (f"disk_free_limit = 1\nbody_cache_bytes = {args.disk_cache_mib << 20}\n"
                           f"body_write_behind_bytes = {args.disk_write_behind_mib << 20}\n{extra}")
        print(f"consume runs on raftmq clusters with body_cache_bytes = {args.disk_cache_mib} MiB and "
              f"body_write_behind_bytes = {args.disk_write_behind_mib} MiB: the backlog's bodies are read from disk",
              flush=True)
    with contextlib.ExitStack() as stack:
        targets: dict[str, object] = {}
        for name, checkout in (("old", args.old.resolve()), ("new", args.new.resolve())):
            clusters = {}
            for kind, config in configs.items():  # one at a time: 12 nodes booting at once time out here
                clusters[kind] = CheckoutCluster(checkout, config)
                stack.callback(clusters[kind].stop)
                info = clusters[kind].wait_ready().info
                print(f"raftmq {name} ({kind}): leader {info['leader']}, client on follower {info['follower']}, "
                      f"pids {info['pids']}", flush=True)
            targets[name] = RaftmqTarget(name, clusters)
        if args.rabbitmq:
            from rabbit_cluster import RabbitCluster

            rc = RabbitCluster(3)
            stack.callback(rc.stop)
            rc.start()
            targets["rabbitmq"] = RabbitTarget(rc)
            print(f"rabbitmq: {', '.join(f'{rc.nodename(i)} pid {rc.servers[i].pid}' for i in range(3))}; "
                  f"client on {rc.nodename(1)}", flush=True)
        names = [n for n in ("old", "new", "rabbitmq") if n in targets]
        orders = [[n for n in order if n in targets] for order in ORDERS]

        checked: set[tuple[str, str]] = set()

        def verify(target, kind: str, queue: str) -> None:
            """Where the client is against the leader: raftmq every time (a status.json read),
            RabbitMQ (a rabbitmqctl call, ~2 s) once per scenario kind and queue type."""
            key = (target.name, queue.split("-")[1])
            if isinstance(target, RaftmqTarget) or key not in checked:
                where = target.check(kind, queue)
                if isinstance(target, RabbitTarget) or where.startswith("WARNING"):
                    print(f"    {target.name} {queue}: {where}", flush=True)
                checked.add(key)

        bench = Bench(args, verify)
        metrics = [m for s in scenarios for m in bench.metrics(s)]
        results: dict[str, dict[str, list[float]]] = {n: {m: [] for m in metrics} for n in names}
        print("warm-up (a tenth of each count, not counted)", flush=True)
        for scenario, name in itertools.product(scenarios, names):
            bench.run(scenario, targets[name], warm=True)
        for number in range(args.rounds):
            if time.monotonic() - started > args.max_minutes * 60:
                print(f"--max-minutes {args.max_minutes} reached: {number} rounds", flush=True)
                break
            order = orders[number % len(orders)]
            print(f"round {number + 1} of {args.rounds} ({time.strftime('%H:%M:%S')}, load average "
                  f"{os.getloadavg()[0]:.1f}), order {', '.join(order)}", flush=True)
            try:
                for scenario in scenarios:
                    for name in order:
                        for metric, value in bench.run(scenario, targets[name]).items():
                            results[name][metric].append(value)
                    for metric in bench.metrics(scenario):
                        line = "  ".join(f"{n} {fmt(metric, results[n][metric][-1])}" for n in names)
                        last = {n: results[n][metric][-1] for n in names}
                        line += f"  | new/old {last['new'] / last['old']:.2f}"
                        if "rabbitmq" in last:
                            line += f"  new/rabbitmq {last['new'] / last['rabbitmq']:.2f}"
                        print(f"  {metric:34s} {line}", flush=True)
            except (RuntimeError, pika.exceptions.AMQPError, OSError, KeyboardInterrupt, SystemExit) as exc:
                print(f"round {number + 1} failed or was interrupted ({exc!r}): the summary covers the rounds "
                      f"before it", flush=True)
                break
    for name, checkout in (("old", args.old), ("new", args.new)):
        if commit(checkout) != commits[name]:
            print(f"WARNING: {checkout} moved from {commits[name]} to {commit(checkout)} during the run: its "
                  f"nodes may run either; measure a pinned clone instead", flush=True)
    done = min(len(v) for r in results.values() for v in r.values())
    if done:
        summarise({n: {m: v[:done] for m, v in r.items()} for n, r in results.items()}, metrics, names)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: done in {(time.monotonic() - started) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
