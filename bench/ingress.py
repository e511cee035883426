"""CPU cost of the AMQP 0-9-1 front end per published message, in process (no sockets, no Raft).

A single-node broker gets an ``Amqp091Connection`` over a transport that keeps what is written;
the script opens a connection and a confirm-mode channel with raw frames, then feeds chunks of
``basic.publish`` + content header + body, as a client's TCP reads would bring them, and reports
the CPU time of ``data_received`` per message (frames -> commands) and of applying the batch and
sending the confirms (the state machine and the confirm path).  Medians over ``--rounds``.

In a cluster the node a publisher is connected to does this work on top of its share of Raft:
through a follower with pika's SelectConnection (window 1,000) the publisher's node used
~50 µs of CPU per confirmed message against ~16-19 µs for the other two, and a 100 KB read of
publishes took 15-18 ms to turn into commands (session 8, ``/proc`` and a trace of the loop).

Usage::

    python bench/ingress.py                      # 640 messages of 100 B per chunk, 40 rounds
    python bench/ingress.py --size 4096 --chunk 64 --profile   # and print a cProfile of data_received
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.node.amqp091.connection import Amqp091Connection  # noqa: E402
from raftmq.node.broker import Broker  # noqa: E402
from raftmq.node.server import tune_gc  # noqa: E402
from raftmq.ops.config import Config  # noqa: E402
from tests.integration import rawamqp as raw  # noqa: E402
from tests.support.transport import RecordingTransport  # noqa: E402


def publish(routing_key: str, body: bytes) -> bytes:
    """basic.publish to the default exchange, a header with delivery-mode 2 (pika's), the body."""
    return (raw.basic_publish(1, "", routing_key)
            + raw.content_header_frame(1, len(body), flags=0x1000, props=b"\x02") + raw.body_frame(1, body))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.001)


async def measure(args) -> None:
    tune_gc()  # the node's collector settings
    config = Config(data_dir=tempfile.mkdtemp(prefix="raftmq-ingress-"), port=0)
    broker = Broker(config)
    await broker.start()
    await settle()  # the default vhost is created through the log
    transport = RecordingTransport()
    conn = Amqp091Connection(broker, transport)
    conn.start(b"")
    for frame in raw.opening_frames("bench-ingress", product="bench", durable=True, confirms=True):
        conn.data_received(frame)
    for _ in range(2000):  # the password is checked in the login pool; what follows start-ok waits
        if not conn.checking_login:
            break
        await asyncio.sleep(0.001)
    await settle()
    if 1 not in conn.channels:
        raise SystemExit(f"the channel did not open: {bytes(transport.data[-300:])!r}")
    chunk = publish("bench-ingress", b"x" * args.size) * args.chunk
    profiler = cProfile.Profile() if args.profile else None
    ingress, apply = [], []
    for _ in range(args.rounds):
        start = time.thread_time()
        if profiler:
            profiler.enable()
        conn.data_received(chunk)
        if profiler:
            profiler.disable()
        middle = time.thread_time()
        await settle()
        apply.append((time.thread_time() - middle) / args.chunk)
        ingress.append((middle - start) / args.chunk)
    unconfirmed = conn.channels[1]._unconfirmed
    print(f"{args.chunk} messages of {args.size} B per chunk, {args.rounds} rounds; unconfirmed left: {unconfirmed}")
    for name, values in (("data_received (frames -> commands)", ingress), ("apply + confirms (single node)", apply)):
        print(f"  {name:36s} {statistics.median(values) * 1e6:6.2f} µs/msg CPU (median), "
              f"{min(values) * 1e6:6.2f} (best)")
    if profiler:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    await broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=100, help="body size in bytes")
    parser.add_argument("--chunk", type=int, default=640, help="messages per data_received call")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of data_received")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
