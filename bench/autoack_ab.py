"""Old code against new code on ONE node each, side by side: 0-9-1 auto-ack consume (issue 31, the
auto-ack credit of node/amqp091/autoack.py).

Two scenarios per round, alternating old and new (this machine drifts: only paired figures mean
anything):

* backlog: ``--count`` x ``--size`` queued, then one auto-ack consumer that reads as fast as it can (a
  raw socket client counting basic.deliver frames: pika would measure itself) -- msg/s from consume to
  the last delivery.  The old node assigns the whole backlog in one apply; the new one in credit
  slices topped up as the deliveries are written;
* (``--cluster``: 3-node clusters, the client on a follower)
* latency: publish -> delivery of single messages to an auto-ack consumer (pika), p50 and p99 in ms
  (bench/throughput.bench_latency).

Each checkout runs its own node with its own virtualenv (``CHECKOUT/.venv/bin/python``).  Run the
same checkout as ``--old`` and ``--new`` to size the noise.

Usage::

    git archive <old commit> | tar -x -C /tmp/base && (a .venv there, pip install -e .)
    python bench/autoack_ab.py --old /tmp/base --new . --rounds 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from throughput import bench_latency  # noqa: E402

from tests.integration import rawamqp as raw  # noqa: E402

_NODE = r"""
import json, sys, tempfile
from raftmq.ops.local.node import RaftmqNode
from raftmq.ops.local.cluster import Cluster
env = {"RAFTMQ_DISK_FREE_LIMIT": "1", **json.loads(sys.argv[1])}
if sys.argv[2] == "cluster":  # the client on a follower: top-ups go through the leader's commit
    extra = "".join(f"{k[len('RAFTMQ_'):].lower()} = {v}\n" for k, v in env.items())
    cluster = Cluster(3, tempfile.mkdtemp(prefix="raftmq-autoack-ab-"), extra_config=extra).start()
    leader = cluster.leader()
    node = next(n for n in cluster.nodes if n is not leader)
    cluster.connection(node).close()
else:
    cluster = None
    node = RaftmqNode(tempfile.mkdtemp(prefix="raftmq-autoack-ab-"), env=env, start_timeout=120).start()
print(json.dumps({"url": node.url, "port": node.port}), flush=True)
for line in sys.stdin:
    pass
cluster.stop() if cluster is not None else node.terminate()
"""


def start(checkout: str, env: dict[str, str], cluster: bool) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([str(Path(checkout) / ".venv/bin/python"), "-c", _NODE, json.dumps(env),
                             "cluster" if cluster else "node"], cwd=checkout,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def fill(url: str, queue: str, count: int, size: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue)
    body = b"x" * size
    for _ in range(count):
        ch.basic_publish("", queue, body)
    ch.queue_declare(queue, passive=True)  # a round trip: every publish before it was applied
    conn.close()


def consume_backlog(port: int, queue: str, count: int) -> float:
    """msg/s for one raw auto-ack consumer reading ``count`` queued deliveries as fast as it can."""
    client = raw.RawClient("127.0.0.1", port, timeout=30)
    client.handshake()
    client.open_channel(1)
    start_t = time.perf_counter()  # from the consume: the old node assigns the backlog before consume-ok
    client.send(raw.basic_consume(1, queue, "c", no_ack=True))
    client.expect_method(raw.BASIC_CONSUME_OK, channel=1)
    seen = 0
    buf = client.buf  # what came with consume-ok
    sock = client.sock
    sock.settimeout(30)
    deadline = time.monotonic() + 120
    deliver = struct.pack(">HH", 60, 60)
    while seen < count and time.monotonic() < deadline:
        if seen or not buf:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
        pos = 0
        while len(buf) - pos >= 7:
            ftype, _channel, size = struct.unpack_from(">BHI", buf, pos)
            if len(buf) - pos < 8 + size:
                break
            if ftype == raw.FRAME_METHOD and buf[pos + 7:pos + 11] == deliver:
                seen += 1
            pos += 8 + size
        buf = buf[pos:]
    elapsed = time.perf_counter() - start_t
    client.close()
    if seen < count:
        raise RuntimeError(f"only {seen} of {count} delivered")
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--latency-count", type=int, default=300)
    parser.add_argument("--node-env", action="append", default=[], metavar="RAFTMQ_X=V",
                        help="an environment setting for both nodes (e.g. RAFTMQ_WRITE_BUFFER_HIGH=4194304)")
    parser.add_argument("--cluster", action="store_true",
                        help="3-node clusters, the client on a follower (its top-ups commit through the leader)")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.node_env)
    nodes = {"old": start(args.old, env, args.cluster), "new": start(args.new, env, args.cluster)}
    results: dict[str, dict[str, list[float]]] = {k: {"msgs": [], "p50": [], "p99": []} for k in nodes}
    try:
        for r in range(args.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for name in order:
                info = nodes[name][1]
                queue = f"ab-{r}"
                fill(info["url"], queue, args.count, args.size)
                rate = consume_backlog(info["port"], queue, args.count)
                p50, p99 = bench_latency(info["url"], count=args.latency_count)
                results[name]["msgs"].append(rate)
                results[name]["p50"].append(p50)
                results[name]["p99"].append(p99)
                print(f"round {r} {name}: backlog {args.count} x {args.size} B auto-ack {rate:8.0f} msg/s; "
                      f"latency p50 {p50:.2f} ms p99 {p99:.2f} ms", flush=True)
    finally:
        for proc, _ in nodes.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    for key, label in (("msgs", "backlog msg/s"), ("p50", "latency p50 ms"), ("p99", "latency p99 ms")):
        old, new = results["old"][key], results["new"][key]
        ratios = [n / o for n, o in zip(new, old, strict=True) if o]
        print(f"{label}: old median {statistics.median(old):.2f}, new median {statistics.median(new):.2f}; "
              f"new/old per round {min(ratios):.2f}-{max(ratios):.2f} (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
