"""Where a confirmed publish->delivery round trip goes, stage by stage (issue 30).

Starts a 3-node cluster (``raftmq.ops.local.cluster.Cluster``, this checkout) with the stage tracer
on (``trace_stages``, raftmq/trace.py), runs ``--count`` lone round trips with pika on a follower
and then on the leader -- each a persistent ``--size`` B message published with confirms on a
channel that also consumes its queue (auto-ack), the next published once the previous one is both
delivered and confirmed (bench/ab_cluster.py's ``bench_roundtrip``) -- collects every node's ring
(SIGUSR2 -> ``<data>/trace.msgpack``), joins the events per batch (raftmq/trace_report.py) and
prints, per stage, p50 / p99 / mean of the time since the previous stage, against the round trip
the client measured.  The client stamps its send and receipt with the nodes' clock
(CLOCK_MONOTONIC), so the first and last rows are the client's own process and the loopback hops.

Bounded by ``--count`` and TIME_LIMIT per placement.  Usage::

    .venv/bin/python bench/latency_stages.py --count 1000
    .venv/bin/python bench/latency_stages.py --count 1000 --no-trace   # the same client, tracer off
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pika

from raftmq.ops.local.cluster import Cluster
from raftmq.trace import TraceDamaged, monotonic_ns, read_dump
from raftmq.trace_report import Breakdown, ClientTrip, NodeEvents, Row, breakdown, format_table, join_trip

TIME_LIMIT = 60.0  # seconds of round trips per placement, at most
TRACE_EVENTS = 200_000  # ring per node: ~20 events per round trip on the busiest node


def roundtrips(url: str, queue: str, count: int, size: int = 256, arguments: dict | None = None) -> list[ClientTrip]:
    """``count`` lone round trips (see the module docstring), stamped with CLOCK_MONOTONIC."""
    body = b"x" * size
    properties = pika.BasicProperties(delivery_mode=2)
    trips: list[ClientTrip] = []
    state = {"sent": 0, "t0": 0, "got": 0, "acked": 0, "start": 0.0}
    box: list = []

    def publish_next() -> None:
        channel = box[0]
        if state["sent"] >= count or time.monotonic() - state["start"] > TIME_LIMIT:
            channel.queue_delete(queue, callback=lambda _frame: connection.close())
            return
        state.update(got=0, acked=0)
        state["sent"] += 1
        state["t0"] = monotonic_ns()
        channel.basic_publish("", queue, body, properties)

    def settle_one() -> None:
        if state["got"] and state["acked"]:
            trips.append(ClientTrip(state["t0"], state["got"], state["acked"]))
            publish_next()

    def on_message(_channel, _method, _props, _body) -> None:
        state["got"] = monotonic_ns()
        settle_one()

    def on_confirm(_frame) -> None:
        state["acked"] = monotonic_ns()
        settle_one()

    def on_consuming(_frame) -> None:
        state["start"] = time.monotonic()
        publish_next()

    def on_channel(channel) -> None:
        box.append(channel)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: channel.queue_declare(
            queue, durable=True, arguments=arguments, callback=lambda _f: channel.basic_consume(
                queue, on_message, auto_ack=True, callback=on_consuming)))

    connection = pika.SelectConnection(pika.URLParameters(url),
                                       on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                       on_close_callback=lambda c, _reason: c.ioloop.stop())
    stop_at = connection.ioloop.call_later(TIME_LIMIT * 2, connection.close)  # a broker that stops answering
    connection.ioloop.start()
    connection.ioloop.remove_timeout(stop_at)
    return trips


def collect(cluster: Cluster, timeout: float = 15.0) -> dict[str, NodeEvents]:
    """Every node's ring: SIGUSR2 each, then read (and check) the trace file each writes."""
    paths = {node.node_id: node.data_dir / "trace.msgpack" for node in cluster.nodes}
    for node in cluster.nodes:
        paths[node.node_id].unlink(missing_ok=True)
        os.kill(node.pid, signal.SIGUSR2)
    found: dict[str, NodeEvents] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(paths):
        for node_id, path in paths.items():
            if node_id not in found and path.exists():
                try:
                    found[node_id] = NodeEvents.from_dump(read_dump(str(path)))
                except (OSError, TraceDamaged):
                    pass  # (renamed into place whole: retried until the deadline)
        if time.monotonic() > deadline:
            raise TimeoutError(f"trace files missing after {timeout} s: {sorted(set(paths) - set(found))}")
        time.sleep(0.05)
    return found


def measure(cluster: Cluster, node, count: int, size: int = 256,
            arguments: dict | None = None) -> tuple[Breakdown, list[dict]]:
    """Round trips through ``node``, then the breakdown of them from every node's ring
    (``arguments``: the queue's, e.g. ``x-queue-group``)."""
    trips = roundtrips(node.url, f"stages-{uuid.uuid4().hex[:8]}", count, size, arguments)
    rings = collect(cluster)
    joined = [join_trip(trip, node.node_id, rings) for trip in trips]
    return breakdown(joined), joined


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1000, help="round trips per placement")
    parser.add_argument("--size", type=int, default=256, help="message body bytes")
    parser.add_argument("--where", default="follower,leader", help="client placements, in order")
    parser.add_argument("--warmup", type=int, default=100, help="round trips before each measured run")
    parser.add_argument("--no-trace", action="store_true",
                        help="tracer off: only the client's round trips (what tracing itself costs)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = Path(tempfile.mkdtemp(prefix="raftmq-stages-"))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {args.count} round trips of {args.size} B per placement; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    config = "" if args.no_trace else f"trace_stages = true\ntrace_stages_events = {TRACE_EVENTS}"
    cluster = Cluster(3, base, extra_config=config).start()
    try:
        for where in [w.strip() for w in args.where.split(",") if w.strip()]:
            leader = cluster.leader()
            node = leader if where == "leader" else next(n for n in cluster.nodes if n is not leader)
            if args.warmup:
                roundtrips(node.url, f"warm-{uuid.uuid4().hex[:8]}", args.warmup, args.size)
            if args.no_trace:
                trips = roundtrips(node.url, f"stages-{uuid.uuid4().hex[:8]}", args.count, args.size)
                total = Row("", [(trip.deliver - trip.send) / 1e6 for trip in trips])
            else:
                result, _ = measure(cluster, node, args.count, args.size)
            after = cluster.leader()
            moved = "" if after is leader else f" (WARNING: the leader changed to {after.node_id})"
            title = f"client on the {where} {node.node_id}, leader {leader.node_id}{moved}"
            if args.no_trace:
                print(f"\n{title}, tracer off: publish -> delivery p50 {total.p(0.5):.3f} ms, p99 "
                      f"{total.p(0.99):.3f} ms, mean {total.mean:.3f} ms ({total.n} round trips)", flush=True)
            else:
                print(f"\n{format_table(result, title)}", flush=True)
        print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
