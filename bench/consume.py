"""CPU cost of the AMQP 0-9-1 delivery path per consumed message, in process (no sockets, no Raft).

A single-node broker; one in-process connection publishes a backlog, another consumes it over a
transport that keeps what is written (tests/support/transport.py).  With manual acks the consumer
acks (multiple) everything delivered so far each round, as a client keeping up would; the script
reports the CPU time of each round (the ack's apply, the next assignments, their bodies and their
encoding) per message delivered.  With ``--no-ack`` the whole backlog is assigned at once.

``--cache-mib``/``--write-behind-mib`` small: the backlog is on disk, and each delivery reads it.

Usage::

    python bench/consume.py                                  # 20,000 x 4 KB, prefetch 256, in memory
    python bench/consume.py --cache-mib 8 --write-behind-mib 1   # the backlog on disk
    python bench/consume.py --no-ack
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import struct
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

QUEUE = "bench-consume"
BASIC_QOS = (60, 10)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def connection(broker: Broker, product: str) -> tuple[Amqp091Connection, RecordingTransport]:
    transport = RecordingTransport()
    conn = Amqp091Connection(broker, transport)
    conn.start(b"")
    for frame in raw.opening_frames(QUEUE, product=product):
        conn.data_received(frame)
    for _ in range(2000):  # the password is checked in the login pool; what follows start-ok waits
        if not conn.checking_login:
            break
        await asyncio.sleep(0.001)
    return conn, transport


async def one_run(args) -> tuple[float, float, dict]:
    data_dir = tempfile.mkdtemp(prefix="raftmq-consume-")
    config = Config(data_dir=data_dir, port=0,
                    body_cache_bytes=args.cache_mib << 20, body_write_behind_bytes=args.write_behind_mib << 20)
    if args.scrub_mib is not None:  # the body store's scrubber (issue 29): 0 turns it off
        config.scrub_bytes_per_second = args.scrub_mib << 20
    broker = Broker(config)
    await broker.start()
    await asyncio.sleep(0.01)
    publisher, _ = await connection(broker, "bench-publisher")
    body = b"x" * args.size
    message = (raw.basic_publish(1, "", QUEUE) + raw.content_header_frame(1, len(body)) + raw.body_frame(1, body))
    for start in range(0, args.count, 500):
        publisher.data_received(message * min(500, args.count - start))
        await settle()
    await asyncio.sleep(0.05)
    consumer, transport = await connection(broker, "bench-consumer")
    await settle()
    if not args.no_ack:
        consumer.data_received(raw.method_frame(1, BASIC_QOS, struct.pack(">IHB", 0, args.prefetch, 0)))
    consumer.data_received(raw.basic_consume(1, QUEUE, "c", no_ack=args.no_ack))
    channel = consumer.channels[1]
    start_cpu, start_wall = time.thread_time(), time.perf_counter()
    rounds: list[float] = []
    acked = 0
    deadline = time.monotonic() + 120
    while channel._next_delivery_tag < args.count and time.monotonic() < deadline:
        t0 = time.thread_time()
        tag = channel._next_delivery_tag
        if not args.no_ack and tag > acked:
            consumer.data_received(raw.method_frame(1, raw.BASIC_ACK, struct.pack(">QB", tag, 1)))
            acked = tag
        await settle()
        transport.data.clear()
        sent = channel._next_delivery_tag - tag
        if sent:
            rounds.append((time.thread_time() - t0) / sent)
    cpu, wall = time.thread_time() - start_cpu, time.perf_counter() - start_wall
    delivered = channel._next_delivery_tag
    stats = {"delivered": delivered, "hits": broker.bodies.cache.hits, "misses": broker.bodies.cache.misses,
             "loaded": broker.bodies.cache.loaded, "written": broker.bodies.stats.written,
             "median_round_us": statistics.median(rounds) * 1e6 if rounds else 0.0}
    await broker.stop()
    shutil.rmtree(data_dir, ignore_errors=True)
    return cpu / max(delivered, 1), wall, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=4096, help="body size in bytes")
    parser.add_argument("--prefetch", type=int, default=256)
    parser.add_argument("--no-ack", action="store_true", help="auto-ack, no prefetch")
    parser.add_argument("--cache-mib", type=int, default=256)
    parser.add_argument("--write-behind-mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scrub-mib", type=int, default=None,
                        help="scrub_bytes_per_second in MiB/s (default: the config's, 8; 0: off)")
    args = parser.parse_args()
    tune_gc()
    for _ in range(args.repeat):
        per_msg, wall, stats = asyncio.run(one_run(args))
        print(f"{stats['delivered']} x {args.size} B {'auto-ack' if args.no_ack else f'prefetch {args.prefetch}'}: "
              f"{per_msg * 1e6:6.2f} µs/msg CPU in all, median round {stats['median_round_us']:6.2f} µs/msg, "
              f"{wall:.2f} s; cache hits {stats['hits']} misses {stats['misses']} loaded {stats['loaded']}, "
              f"written {stats['written']}")


if __name__ == "__main__":
    main()
