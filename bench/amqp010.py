"""AMQP 0-10 publish throughput with session resume on, beside 0-9-1 confirms, on a 3-node cluster.

Both publish persistent messages to a durable queue with ``--window`` unconfirmed messages in flight
(0-10: transfers not yet completed by the broker; 0-9-1: aio-pika publisher confirms), the client
connected to the node the cluster leads from (0-10 is redirected there; 0-9-1 goes to a follower
like in bench/throughput.py).

    python bench/amqp010.py [--count 20000] [--window 1000] [--size 100]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput import TIME_LIMIT, _confirmed  # noqa: E402
from raftmq.client.amqp010 import Connection  # noqa: E402
from raftmq.ops.local.cluster import Cluster  # noqa: E402


async def publish_010(hosts: list[str], count: int, size: int, window: int) -> float:
    conn = await Connection.connect(hosts)
    session = await conn.session(f"bench-{uuid.uuid4().hex[:6]}".encode(), timeout=60)
    queue = f"bench010-{uuid.uuid4().hex[:8]}"
    await session.queue_declare(queue, durable=True)
    body = b"x" * size
    in_flight: set[asyncio.Future] = set()
    start = time.perf_counter()
    sent = 0
    while sent < count and time.perf_counter() - start < TIME_LIMIT:
        if len(in_flight) >= window:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        in_flight.add(session.publish_nowait("", queue, body, persistent=True))
        sent += 1
    await asyncio.wait_for(asyncio.gather(*in_flight), TIME_LIMIT)
    elapsed = time.perf_counter() - start
    await conn.close()
    return sent / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    with Cluster(3) as cluster:
        hosts = [f"127.0.0.1:{n.port}" for n in cluster.nodes]
        follower = cluster.followers()[0]
        cluster.connection(follower).close()
        rate_010 = asyncio.run(publish_010(hosts, args.count, args.size, args.window))
        rate_091 = asyncio.run(_confirmed(follower.url, args.count, args.size, args.window, False))
    print(f"{'3-node cluster, persistent, window ' + str(args.window):48s}{'msg/s':>10s}")
    print(f"{'AMQP 0-10 (session resume on, raftmq client)':48s}{rate_010:10.0f}")
    print(f"{'AMQP 0-9-1 (publisher confirms, aio-pika)':48s}{rate_091:10.0f}")


if __name__ == "__main__":
    main()
