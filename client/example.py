"""A producer and a consumer on raftmq's AMQP 0-10 client, with failover and session resume.

    python -m raftmq.client.example produce --queue demo --count 1000
    python -m raftmq.client.example consume --queue demo --count 1000

Both take ``--hosts`` (default: the three nodes of ``raftmq cluster up``); kill nodes while they
run: each message still arrives once, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from .amqp010 import Connection

DEFAULT_HOSTS = "127.0.0.1:5672,127.0.0.1:5673,127.0.0.1:5674"


async def produce(args) -> None:
    conn = await Connection.connect(args.hosts.split(","), args.user, args.password)
    session = await conn.session(f"producer-{args.queue}".encode(), timeout=60)
    await session.queue_declare(args.queue, durable=True)
    for i in range(args.count):
        await session.publish("", args.queue, str(i).encode(), persistent=True)
        if (i + 1) % 100 == 0:
            print(f"published {i + 1} (via {conn.current}, {conn.reconnects} failovers)", flush=True)
    await conn.close()


async def consume(args) -> None:
    conn = await Connection.connect(args.hosts.split(","), args.user, args.password)
    session = await conn.session(f"consumer-{args.queue}".encode(), timeout=60)
    await session.queue_declare(args.queue, durable=True)
    subscription = await session.subscribe(args.queue, window=100)
    for i in range(args.count):
        message = await subscription.get(timeout=args.timeout)
        if message is None:
            print(f"nothing for {args.timeout}s after {i} messages", file=sys.stderr)
            break
        await message.accept()
        if (i + 1) % 100 == 0:
            print(f"received {i + 1}: last {message.body.decode()} (via {conn.current})", flush=True)
    await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("produce", "consume"))
    parser.add_argument("--hosts", default=DEFAULT_HOSTS)
    parser.add_argument("--queue", default="demo")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--user", default="guest")
    parser.add_argument("--password", default="guest")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    asyncio.run(produce(args) if args.role == "produce" else consume(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
