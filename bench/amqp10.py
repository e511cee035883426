"""AMQP 1.0 against 0-9-1 on the same raftmq node (or cluster), side by side (issue 19).

Scenarios, each bounded by a message count and a time limit:

* ``confirmed publish``: persistent messages to a durable queue, at most ``--window`` unconfirmed:
  0-9-1 with publisher confirms through pika's SelectConnection (bench/throughput.py), 1.0 with
  unsettled transfers through python-qpid-proton's event loop (a message counts once accepted);
* ``consume``: a queue filled by a publisher of the same protocol, 0-9-1 with manual acks and
  prefetch 256 (bench/throughput.py), 1.0 with link credit 256 and an accepted disposition per
  message (each protocol reads messages stored in its own format: the same-protocol path);
* ``latency``: publish -> delivery of single messages, one at a time (p50 and p99 in ms), 0-9-1 as
  bench/throughput.bench_latency (unconfirmed publish, auto-ack consumer), 1.0 the same way: a
  pre-settled sender and a pre-settled receiver on one connection, the next message sent when the
  previous one arrives.

Each round measures every scenario on both protocols back to back, alternating which goes first; the
summary gives medians and the per-round 1.0/0-9-1 ratios, and the CPU time the node (the one the
clients use) spent per message: the Python clients (proton's event loop costs ~60 us per message,
pika's ~20) often set the rate, so the node's CPU is the fairer comparison of the two front ends.

``--baseline REF`` measures another version of raftmq (a git ref of this repository, unpacked into a
temporary directory and run from there) side by side with this one: both run at once, each round
measures the 1.0 scenarios on both, alternating which goes first, and prints new/old per round.

``--profile`` instead profiles the client-facing node while a 1.0 and then a 0-9-1 consumer drain a
queue: cProfile of its event-loop thread (switched on and off by real-time signals through a
``sitecustomize`` the node is started with) and the CPU of each of its threads from /proc.

Usage::

    python -m bench.amqp10 --rounds 3 --count 20000
    python -m bench.amqp10 --cluster 3
    python -m bench.amqp10 --cluster 3 --baseline 9bf9ab1 --rounds 4
    python -m bench.amqp10 --cluster 3 --profile --count 10000
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pika
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container

from bench.throughput import bench_confirmed_pika, bench_consume, bench_latency
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
    def __init__(self, url: str, address: str, count: int, prefetch: int = 256, settled: bool = False) -> None:
        super().__init__(prefetch=prefetch, auto_accept=True)
        self.url, self.address, self.count = url, address, count
        self.settled = settled
        self.received = 0
        self.start = self.elapsed = 0.0

    def on_start(self, event) -> None:
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address, options=AtMostOnce() if self.settled else None)
        self.start = time.perf_counter()

    def on_message(self, event) -> None:
        self.received += 1
        if self.received >= self.count or time.perf_counter() - self.start >= TIME_LIMIT:
            self.elapsed = time.perf_counter() - self.start
            event.connection.close()


class _Latency(MessagingHandler):
    """One message at a time through a queue: sent pre-settled, received pre-settled, the next one sent
    when the previous one arrives; the first few (links settling in) are not counted."""

    WARMUP = 10

    def __init__(self, url: str, address: str, count: int) -> None:
        super().__init__(prefetch=16)
        self.url, self.address, self.count = url, address, count
        self.opened = 0
        self.sender = None
        self.sent_at = 0.0
        self.samples: list[float] = []
        self.seen = 0
        self.start = 0.0

    def on_start(self, event) -> None:
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address, options=AtMostOnce())
        self.sender = event.container.create_sender(conn, self.address, options=AtMostOnce())
        self.start = time.perf_counter()

    def on_link_opened(self, event) -> None:
        self.opened += 1
        if self.opened == 2:
            self._send()

    def _send(self) -> None:
        self.sent_at = time.perf_counter()
        self.sender.send(Message(body=b"ping"))

    def on_message(self, event) -> None:
        self.seen += 1
        if self.seen > self.WARMUP:
            self.samples.append((time.perf_counter() - self.sent_at) * 1000)
        if len(self.samples) >= self.count or time.perf_counter() - self.start >= TIME_LIMIT:
            event.connection.close()
        else:
            self._send()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def amqp10_latency(url: str, queue: str, count: int) -> tuple[float, float]:
    """p50, p99 publish -> delivery in ms."""
    handler = _Latency(url, f"/queues/{queue}", count)
    Container(handler).run()
    return _percentiles(handler.samples)


def amqp10_publish(url: str, queue: str, count: int, size: int, window: int) -> float:
    handler = _Send(url, f"/queues/{queue}", count, size, window)
    Container(handler).run()
    return handler.accepted / handler.elapsed


def amqp10_consume(url: str, queue: str, count: int, prefetch: int = 256, settled: bool = False) -> float:
    handler = _Receive(url, f"/queues/{queue}", count, prefetch, settled)
    Container(handler).run()
    return handler.received / handler.elapsed


def _declare(amqp091_url: str, queue: str, durable: bool = True) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp091_url))
    conn.channel().queue_declare(queue, durable=durable)
    conn.close()


def _delete(amqp091_url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp091_url))
    conn.channel().queue_delete(queue)
    conn.close()


def _fill_091(amqp091_url: str, queue: str, count: int, size: int) -> None:
    """``count`` persistent 0-9-1 messages into ``queue``, waited for until all are queued."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp091_url))
    ch = conn.channel()
    body, props = b"x" * size, pika.BasicProperties(delivery_mode=2)
    for _ in range(count):
        ch.basic_publish("", queue, body, props)
    deadline = time.monotonic() + TIME_LIMIT
    while ch.queue_declare(queue, passive=True).method.message_count < count and time.monotonic() < deadline:
        time.sleep(0.05)
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
            _fill_091(amqp091_url, queue, args.count, args.size)  # consumed in the format it was published in
            queues["0-9-1"] = queue
    for protocol in order:
        if protocol == "1.0":
            out.measure("consume 1.0", args.count, lambda: amqp10_consume(amqp10_url, queues["1.0"], args.count))
        else:
            out.measure("consume 0-9-1", args.count, lambda: bench_consume(amqp091_url, queues["0-9-1"], args.count))
    if args.latency:
        for protocol in order:
            if protocol == "1.0":
                queue = f"bench10-l-{uuid.uuid4().hex[:8]}"
                _declare(amqp091_url, queue, durable=False)
                out["latency 1.0"] = amqp10_latency(amqp10_url, queue, args.latency)
                _delete(amqp091_url, queue)
            else:
                out["latency 0-9-1"] = bench_latency(amqp091_url, False, args.latency)
    return out


def baseline_tree(ref: str) -> Path:
    """``ref`` of this repository unpacked into a temporary directory, laid out as the ``raftmq``
    package (pyproject's package-dir): the PYTHONPATH that makes node processes run that version."""
    root = Path(tempfile.mkdtemp(prefix="bench-amqp10-baseline-"))
    src = root / "src"
    src.mkdir()
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    package = root / "pkg" / "raftmq"
    package.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py"):
        (package / name).write_bytes((src / "raftmq" / name).read_bytes())
    for sub in ("client", "node", "ops", "protocol", "raft", "spark", "store"):
        (package / sub).symlink_to(src / sub)
    return root / "pkg"


PROFILE_ON, PROFILE_OFF = signal.SIGRTMIN + 3, signal.SIGRTMIN + 4  # (SIGUSR1 is the node's digest)
_PROFILE_HOOK = f"""
import os, signal, sys
if os.environ.get("RAFTMQ_BENCH_PROFILE") and "server" in sys.argv:
    import cProfile
    _profile = cProfile.Profile()

    def _on(sig, frame):
        _profile.enable()

    def _off(sig, frame):
        _profile.disable()
        _profile.dump_stats(os.path.join(os.environ["RAFTMQ_BENCH_PROFILE"], f"node-{{os.getpid()}}.prof"))
        _profile.clear()

    signal.signal({int(PROFILE_ON)}, _on)
    signal.signal({int(PROFILE_OFF)}, _off)
"""


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of ``pid`` (``tid:name``)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        out[f"{task.name}:{name}"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def profile_consume(args, base: Path) -> None:
    """cProfile of the node's event loop and its threads' CPU while each protocol's consumer drains."""
    hook = base / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_PROFILE_HOOK)
    out = base / "profiles"
    out.mkdir()
    os.environ["RAFTMQ_BENCH_PROFILE"] = str(out)  # inherited by the node processes
    target, stop = start_target(args, base / "nodes", hook, safe_path=False)
    try:
        url091, url10 = target.url, f"amqp://guest:guest@127.0.0.1:{target.port}"
        for protocol in ("1.0", "0-9-1"):
            queue = f"bench-prof-{uuid.uuid4().hex[:8]}"
            _declare(url091, queue)
            if protocol == "1.0":
                amqp10_publish(url10, queue, args.count, args.size, args.window)
            else:
                _fill_091(url091, queue, args.count, args.size)
            time.sleep(1.0)
            before_threads, before = thread_cpu(target.pid), node_cpu(target.pid)
            os.kill(target.pid, PROFILE_ON)
            rate = amqp10_consume(url10, queue, args.count) if protocol == "1.0" else \
                bench_consume(url091, queue, args.count)
            os.kill(target.pid, PROFILE_OFF)
            cpu, after_threads = node_cpu(target.pid) - before, thread_cpu(target.pid)
            time.sleep(1.0)
            print(f"\n=== consume {protocol}: {rate:.0f} msg/s, node CPU {cpu * 1e6 / args.count:.1f} us/msg "
                  f"(with the profiler on)")
            for name, seconds in after_threads.items():
                spent = seconds - before_threads.get(name, 0.0)
                if spent > 0.005:
                    print(f"  thread {name}: {spent * 1e6 / args.count:.1f} us/msg")
            profile = max(out.glob("node-*.prof"), key=lambda p: p.stat().st_mtime)
            pstats.Stats(str(profile)).sort_stats("tottime").print_stats(25)
            profile.unlink()
    finally:
        stop()
        os.environ.pop("RAFTMQ_BENCH_PROFILE", None)


def start_target(args, base: Path, pythonpath: Path | None = None, safe_path: bool = True):
    """A node or cluster (its client-facing node, and a function that stops it all)."""
    if args.cluster:
        cluster = Cluster(args.cluster, base)
        nodes = cluster.nodes
        starter, stop = cluster.start, cluster.stop
    else:
        node = RaftmqNode(base / "node")
        nodes = [node]
        starter, stop = node.start, node.stop
    if pythonpath is not None:
        for node in nodes:  # PYTHONSAFEPATH: the working directory (this tree) must not come first
            node.extra_env["PYTHONPATH"] = str(pythonpath)
            if safe_path:
                node.extra_env["PYTHONSAFEPATH"] = "1"
    starter()
    return (cluster.leader() if args.cluster else nodes[0]), stop


def amqp10_round(target, args) -> dict[str, float]:
    """The 1.0 scenarios on one target (baseline comparisons)."""
    amqp091_url, amqp10_url = target.url, f"amqp://guest:guest@127.0.0.1:{target.port}"
    out = _Metered(target.pid)
    queue = f"bench10-{uuid.uuid4().hex[:8]}"
    _declare(amqp091_url, queue)
    out.measure("confirmed publish 1.0", args.count,
                lambda: amqp10_publish(amqp10_url, queue, args.count, args.size, args.window))
    out.measure("consume 1.0", args.count, lambda: amqp10_consume(amqp10_url, queue, args.count))
    if args.presettled:  # a pre-settled receiver whose credit (1,000) exceeds the link's slice (links.py)
        queue = f"bench10-ps-{uuid.uuid4().hex[:8]}"
        _declare(amqp091_url, queue)
        amqp10_publish(amqp10_url, queue, args.count, args.size, args.window)
        out.measure("consume pre-settled 1.0", args.count,
                    lambda: amqp10_consume(amqp10_url, queue, args.count, 1000, True))
    if args.latency:
        queue = f"bench10-l-{uuid.uuid4().hex[:8]}"
        _declare(amqp091_url, queue, durable=False)
        out["latency 1.0"] = amqp10_latency(amqp10_url, queue, args.latency)
        _delete(amqp091_url, queue)
    return out


def compare_baseline(args, base: Path) -> None:
    old_path = baseline_tree(args.baseline)
    new, stop_new = start_target(args, base / "new")
    old, stop_old = start_target(args, base / "old", old_path)
    rounds: dict[str, list] = {"new": [], "old": []}
    try:
        for i in range(args.rounds):
            for name in (("new", "old") if i % 2 == 0 else ("old", "new")):
                rounds[name].append(amqp10_round(new if name == "new" else old, args))
                print(f"round {i + 1} {name}: " + ", ".join(
                    f"{k} {v[0]:.2f}/{v[1]:.2f} ms" if isinstance(v, tuple) else f"{k} {v:.1f}"
                    for k, v in rounds[name][-1].items()), flush=True)
    finally:
        stop_new()
        stop_old()
    print(f"\nthis tree against {args.baseline}: {args.rounds} rounds, {args.count} messages of {args.size} B, "
          f"{'cluster of ' + str(args.cluster) if args.cluster else 'one node'}")
    for key in rounds["new"][0]:
        if key.startswith("latency"):
            for i, label in ((0, "p50"), (1, "p99")):
                n = [r[key][i] for r in rounds["new"]]
                o = [r[key][i] for r in rounds["old"]]
                print(f"{key} {label:4s} new {statistics.median(n):7.2f} ms   old {statistics.median(o):7.2f} ms")
            continue
        n = [r[key] for r in rounds["new"]]
        o = [r[key] for r in rounds["old"]]
        ratios = ", ".join(f"{a / b:.2f}" for a, b in zip(n, o, strict=True))
        print(f"{key:32s} new {statistics.median(n):9.1f}   old {statistics.median(o):9.1f}   new/old per round: {ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--cluster", type=int, default=0)
    parser.add_argument("--latency", type=int, default=500, help="latency samples per round (0: none)")
    parser.add_argument("--presettled", action="store_true",
                        help="with --baseline: also consume with a pre-settled receiver, credit 1,000")
    parser.add_argument("--baseline", help="a git ref to measure side by side with this tree (1.0 only)")
    parser.add_argument("--profile", action="store_true", help="profile the node while consumers drain")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-amqp10-"))
    if args.profile:
        return profile_consume(args, base)
    if args.baseline:
        return compare_baseline(args, base)
    target, stop = start_target(args, base)
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
    if args.latency:
        for protocol in ("1.0", "0-9-1"):
            p50 = [r[f"latency {protocol}"][0] for r in rounds]
            p99 = [r[f"latency {protocol}"][1] for r in rounds]
            print(f"latency {protocol:6s} p50 {statistics.median(p50):6.2f} ms (rounds: "
                  f"{', '.join(f'{v:.2f}' for v in p50)})   p99 {statistics.median(p99):6.2f} ms (rounds: "
                  f"{', '.join(f'{v:.2f}' for v in p99)})")


if __name__ == "__main__":
    main()
