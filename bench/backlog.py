"""A backlog larger than memory (issue 18, "How we will check it"): a 3-node raftmq cluster and a
3-node RabbitMQ cluster with quorum queues, side by side, the same client.

For each broker, in turn:

1. publish ``--backlog-mb`` of persistent ``--size`` byte messages into one durable queue (RabbitMQ:
   a quorum queue declared on its first node; the client is on another node in both cases) with
   pika's asynchronous connection and publisher confirms (window ``--window``), in steps of
   ``--step-mb``; after each step print the step's confirm rate, the RSS of every node, and
   (raftmq) the snapshots written so far and the longest (from the nodes' logs);
2. kill -9 one node that does not host the client's connection and start it again with the full
   backlog: seconds until it answers AMQP, and (raftmq) until it has applied what the leader had;
3. consume everything (prefetch 256, acks every 64 messages, multiple), check every message (each
   body is a function of its sequence number: a corrupt, missing or duplicate one is counted), and
   print the consume rate and the RSS after.

Every phase is bounded in time (``--phase-limit`` seconds); a phase that hits it says so.  The
issue's goals (5 GB with a 256 MB cache) are for after the change; on the current code keep the
backlog small (the whole model and every body is in memory on every node).

Usage::

    python bench/backlog.py --backlog-mb 300            # both brokers
    python bench/backlog.py --backlog-mb 300 --only raftmq
    python bench/backlog.py --backlog-mb 5120 --step-mb 1024 --phase-limit 1800   # the issue's size
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rabbit_cluster import RabbitCluster  # noqa: E402

from raftmq.ops.local.cluster import Cluster  # noqa: E402
from raftmq.ops.local.node import NodeStartError  # noqa: E402

QUEUE = "backlog"
MB = 1 << 20
_SNAPSHOT_LINE = re.compile(rb"snapshot at index (\d+) written in ([0-9.]+) s(?: \(marker reached after ([0-9.]+) s, "
                            rb"bodies checkpoint ([0-9.]+) s, child ([0-9.]+) s\))?")


def make_body(seq: int, size: int) -> bytes:
    """Message ``seq``'s body: its number, then SHA-256 of the number repeated (checkable)."""
    head = seq.to_bytes(8, "big")
    digest = hashlib.sha256(head).digest()
    return (head + digest * (size // 32 + 1))[:size]


def rss_mb(pids: list[int], field: str = "VmRSS:") -> float:
    """Resident MB of ``pids``: ``VmRSS`` (all), or ``RssAnon`` (memory the processes own,
    without the pages of files they map -- LMDB reads through mmap, and the kernel takes those
    pages back when it needs them)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith(field):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total / MB


def disk_mb(path: Path) -> float:
    """Bytes allocated on disk under ``path`` (sparse LMDB files count what they use)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total / MB


def publish(url: str, first: int, count: int, size: int, window: int, limit: float, quorum: bool) -> tuple[int, float]:
    """Publish messages ``first``..``first+count-1`` with confirms; (confirmed, seconds)."""
    properties = pika.BasicProperties(delivery_mode=2)
    state = {"sent": 0, "settled": 0, "acked": 0, "start": 0.0, "elapsed": 0.0, "nacked": 0}
    box: list = []

    def top_up() -> None:
        ch = box[0]
        while (state["sent"] < count and state["sent"] - state["settled"] < window
               and time.perf_counter() - state["start"] < limit):
            ch.basic_publish("", QUEUE, make_body(first + state["sent"], size), properties)
            state["sent"] += 1

    def on_confirm(frame) -> None:
        m = frame.method
        n = m.delivery_tag - state["settled"] if m.multiple else 1
        state["settled"] += n
        if isinstance(m, pika.spec.Basic.Ack):
            state["acked"] += n
        else:
            state["nacked"] += n
        done = state["sent"] >= count or time.perf_counter() - state["start"] >= limit
        if done and state["settled"] >= state["sent"]:
            state["elapsed"] = time.perf_counter() - state["start"]
            connection.close()
        else:
            top_up()

    def on_declared(_frame) -> None:
        state["start"] = time.perf_counter()
        top_up()

    def on_channel(ch) -> None:
        box.append(ch)
        args = {"x-queue-type": "quorum"} if quorum else None
        ch.confirm_delivery(on_confirm, callback=lambda _f: ch.queue_declare(
            QUEUE, durable=True, arguments=args, callback=on_declared))

    connection = pika.SelectConnection(pika.URLParameters(url),
                                       on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                       on_close_callback=lambda c, _r: c.ioloop.stop())
    stop_at = connection.ioloop.call_later(limit + 60, connection.close)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(stop_at)
    if not state["elapsed"]:
        state["elapsed"] = time.perf_counter() - state["start"]
    if state["nacked"]:
        print(f"    {state['nacked']} publishes nacked", flush=True)
    return state["acked"], state["elapsed"]


@dataclass
class Consumed:
    got: int = 0
    bad: int = 0
    duplicates: int = 0
    seconds: float = 0.0
    seen: set = field(default_factory=set)


def consume(url: str, expected: int, size: int, limit: float) -> Consumed:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=256)
    out = Consumed()
    start = time.perf_counter()
    unacked = 0
    for method, _props, body in ch.consume(QUEUE, inactivity_timeout=5.0):
        if method is None or time.perf_counter() - start > limit:
            break
        seq = int.from_bytes(body[:8], "big")
        if body != make_body(seq, size):
            out.bad += 1
        elif seq in out.seen:
            out.duplicates += 1
        else:
            out.seen.add(seq)
        out.got += 1
        unacked += 1
        if unacked >= 64:
            ch.basic_ack(method.delivery_tag, multiple=True)
            unacked = 0
        if out.got >= expected:
            break
    if unacked:
        ch.basic_ack(method.delivery_tag, multiple=True)
    out.seconds = time.perf_counter() - start
    ch.cancel()
    conn.close()
    return out


def snapshots(logs: list[Path]) -> tuple[int, float, str]:
    """Snapshots written so far on every node, the longest, and where its time went (the time
    from the marker's proposal until the loop reached it, the bodies' checkpoint on the loop,
    the forked child), from their logs."""
    count, longest, phases = 0, 0.0, ""
    for path in logs:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        for m in _SNAPSHOT_LINE.finditer(data):
            count += 1
            if float(m.group(2)) > longest:
                longest = float(m.group(2))
                if m.group(3) is not None:
                    phases = f" (reached {float(m.group(3)):.2f}, checkpoint {float(m.group(4)):.2f}, " \
                             f"child {float(m.group(5)):.2f})"
    return count, longest, phases


class RaftmqTarget:
    name = "raftmq x3"
    quorum = False

    def __init__(self, extra_config: str) -> None:
        self.cluster = Cluster(3, extra_config=extra_config, start_timeout=120.0).start()
        leader = self.cluster.leader()
        self.client_node = next(n for n in self.cluster.nodes if n is not leader)
        self.url = self.client_node.url
        self.roles = f"nodes n1/n2/n3, leader {leader.node_id}, client on {self.client_node.node_id}"

    def rss(self) -> list[float]:
        return [rss_mb([n.pid]) if n.is_alive() else 0.0 for n in self.cluster.nodes]

    def anon(self) -> list[float]:
        return [rss_mb([n.pid], "RssAnon:") if n.is_alive() else 0.0 for n in self.cluster.nodes]

    def disk(self) -> list[float]:
        return [disk_mb(n.data_dir) for n in self.cluster.nodes]

    def snapshots(self) -> tuple[int, float]:
        return snapshots([n.log_path for n in self.cluster.nodes])

    def restart_one(self) -> str:
        # A follower without the client's connection (RabbitMQ: r3, neither queue leader nor client's node).
        leader = self.cluster.leader()
        node = next(n for n in self.cluster.nodes if n is not self.client_node and n is not leader)
        node.kill9()
        started = time.monotonic()
        refused = 0
        while True:
            try:
                node.start()
                break
            except NodeStartError as exc:
                # A snapshot child forked by the killed node outlives it and keeps its listening
                # socket until it has written the snapshot (seen here): try again.
                if "address already in use" not in str(exc) or time.monotonic() - started > 120:
                    raise
                refused += 1
                time.sleep(0.5)
        ready = time.monotonic() - started
        self.cluster.wait_caught_up(node, timeout=300)
        caught = time.monotonic() - started
        note = f" ({refused} starts refused: port still held by the killed node's snapshot child)" if refused else ""
        return f"{node.node_id} killed -9: AMQP ready after {ready:.1f} s, caught up after {caught:.1f} s{note}"

    def stop(self) -> None:
        self.cluster.stop()
        shutil.rmtree(self.cluster.base, ignore_errors=True)  # ~1 GB of journals and snapshots at 300 MB


class RabbitTarget:
    name = "rmq quorum x3"
    quorum = True

    def __init__(self) -> None:
        self.rc = RabbitCluster(3).start()
        # The queue's leader is the node it is declared on: r1; the client publishes through r2.
        conn = pika.BlockingConnection(pika.URLParameters(self.rc.url(0)))
        conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        conn.close()
        self.url = self.rc.url(1)
        self.roles = "nodes r1/r2/r3, queue leader r1, client on r2"

    def rss(self) -> list[float]:
        return [rss_mb(self.rc.pids(i)) for i in range(3)]

    def anon(self) -> list[float]:
        return [rss_mb(self.rc.pids(i), "RssAnon:") for i in range(3)]

    def disk(self) -> list[float]:
        return [disk_mb(self.rc.base / f"r{i + 1}") for i in range(3)]

    def snapshots(self) -> tuple[int, float] | None:
        return None

    def restart_one(self) -> str:
        seconds = self.rc.restart(2)
        return f"r3 killed -9: booted and ready after {seconds:.1f} s"

    def stop(self) -> None:
        self.rc.stop()


def run(target, args) -> None:
    name = target.name
    per_step = max(1, args.step_mb * MB // args.size)
    total = args.backlog_mb * MB // args.size
    print(f"\n== {name}: {total} x {args.size} B = {total * args.size / MB:.0f} MB, steps of "
          f"{per_step} messages; {target.roles}; RSS MB per node at start {fmt(target.rss())}", flush=True)
    published, step = 0, 0
    phase_start = time.monotonic()
    while published < total:
        remaining = args.phase_limit - (time.monotonic() - phase_start)
        if remaining <= 0:
            print(f"  publish phase hit its limit of {args.phase_limit:.0f} s", flush=True)
            break
        n = min(per_step, total - published)
        acked, seconds = publish(target.url, published, n, args.size, args.window, remaining, target.quorum)
        published += acked
        step += 1
        snap = target.snapshots()
        snap_text = "" if snap is None else f"  snapshots {snap[0]}, longest {snap[1]:.2f} s{snap[2]}"
        print(f"  step {step}: {published * args.size / MB:6.0f} MB queued  confirm {acked / seconds:7.0f} msg/s "
              f"({acked} in {seconds:.1f} s)  RSS MB {fmt(target.rss())} (anon {fmt(target.anon())})  "
              f"disk MB {fmt(target.disk())}{snap_text}",
              flush=True)
        if acked < n:
            print(f"  step {step} confirmed {acked} of {n}: stopping the publish phase", flush=True)
            break
    print(f"  restart: {target.restart_one()}; RSS MB {fmt(target.rss())}", flush=True)
    result = consume(target.url, published, args.size, args.phase_limit)
    missing = published - len(result.seen)
    print(f"  consume: {result.got} in {result.seconds:.1f} s = {result.got / result.seconds:.0f} msg/s; "
          f"checked: {missing} missing, {result.bad} corrupt, {result.duplicates} duplicates; "
          f"RSS MB {fmt(target.rss())} (anon {fmt(target.anon())})", flush=True)
    snap = target.snapshots()
    if snap is not None:
        print(f"  snapshots over the run (all nodes): {snap[0]}, longest {snap[1]:.2f} s{snap[2]}", flush=True)


def fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.0f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog-mb", type=int, default=300, help="bytes of bodies to queue, in MiB")
    parser.add_argument("--step-mb", type=int, default=0, help="report every this many MiB (default: a third)")
    parser.add_argument("--size", type=int, default=4096, help="body size in bytes")
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed publishes in flight")
    parser.add_argument("--phase-limit", type=float, default=180.0, help="seconds per publish or consume phase")
    parser.add_argument("--only", choices=("raftmq", "rabbitmq"), help="one broker only")
    parser.add_argument("--rabbitmq-first", action="store_true", help="run RabbitMQ before raftmq")
    parser.add_argument("--raftmq-config", default="disk_free_limit = 1\n",
                        help="extra TOML for the raftmq nodes (default: the default memory alarm and "
                             "body cache, the disk alarm out of the way)")
    args = parser.parse_args()
    args.step_mb = args.step_mb or max(1, args.backlog_mb // 3)
    for which in ("rabbitmq", "raftmq") if args.rabbitmq_first else ("raftmq", "rabbitmq"):
        if args.only and args.only != which:
            continue
        target = RaftmqTarget(args.raftmq_config) if which == "raftmq" else RabbitTarget()
        try:
            run(target, args)
        finally:
            target.stop()


if __name__ == "__main__":
    main()
