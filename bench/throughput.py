"""Throughput of one raftmq node, and of RabbitMQ in the same run, with the same clients.

Scenarios (each bounded by a message count and a time limit):

* ``publish``: pika publishes transient messages to a classic/non-durable queue, no confirms.
* ``confirm``: aio-pika publishes persistent messages to a durable queue with publisher confirms,
  keeping a window of unconfirmed messages in flight (what a careful producer does).
* ``confirm (pika async)``: the same with pika's ``SelectConnection`` and a confirm callback.  It
  costs the client ~30 µs per message against aio-pika's 150-400 µs (aio-pika 10), so this is the
  scenario in which the broker, not the client, sets the rate.
* ``consume``: pika consumes what ``publish`` left, with manual acks and prefetch 256.

Both brokers run side by side for the whole run; each round measures every scenario on each broker,
the two measurements of a scenario back to back, alternating which broker goes first; the summary
gives medians and the per-round ratios.

Usage::

    python bench/throughput.py                 # raftmq only (starts its own node)
    python bench/throughput.py --rabbitmq      # also Debian's rabbitmq-server on a private port
    python bench/throughput.py --cluster 3 --rabbitmq --rounds 5   # issue #3: 3 nodes vs a quorum queue
    python bench/throughput.py --cluster 3 --rabbitmq --sched-batch   # the nodes under SCHED_BATCH
    python bench/throughput.py --url amqp://guest:guest@127.0.0.1:5672/%2F   # an already running broker
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aio_pika
import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.ops.local.cluster import Cluster  # noqa: E402
from raftmq.ops.local.node import RaftmqNode  # noqa: E402
from tests.support import rabbitmq  # noqa: E402

TIME_LIMIT = 30.0  # seconds per scenario, whatever the count


def bench_publish(url: str, count: int, size: int, quorum: bool = False) -> tuple[float, str]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    if quorum:
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    else:
        ch.queue_declare(queue, auto_delete=False)
    body = b"x" * size
    start = time.perf_counter()
    sent = 0
    while sent < count and time.perf_counter() - start < TIME_LIMIT:
        ch.basic_publish("", queue, body)
        sent += 1
    ch.queue_declare(queue, passive=True)  # a round trip: everything before it has been processed
    elapsed = time.perf_counter() - start
    conn.close()
    return sent / elapsed, queue


def bench_consume(url: str, queue: str, count: int) -> float:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=256)
    got = 0
    start = time.perf_counter()
    for method, _props, _body in ch.consume(queue, inactivity_timeout=2.0):
        if method is None:
            break
        got += 1
        if got % 64 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got >= count or time.perf_counter() - start > TIME_LIMIT:
            ch.basic_ack(method.delivery_tag, multiple=True)
            break
    elapsed = time.perf_counter() - start
    ch.cancel()
    ch.queue_delete(queue)
    conn.close()
    return got / elapsed


def bench_latency(url: str, quorum: bool = False, count: int = 500) -> tuple[float, float]:
    """Publish -> delivery round trip of single messages (ms): p50 and p99."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    if quorum:
        queue = f"bench-l-{uuid.uuid4().hex[:8]}"
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    else:
        queue = ch.queue_declare("", exclusive=True).method.queue
    arrived: list[float] = []
    ch.basic_consume(queue, lambda c, m, p, b: arrived.append(time.perf_counter()), auto_ack=True)
    samples = []
    deadline = time.perf_counter() + TIME_LIMIT
    for _ in range(count):
        if time.perf_counter() > deadline:
            break
        sent = time.perf_counter()
        before = len(arrived)
        ch.basic_publish("", queue, b"ping")
        while len(arrived) == before and time.perf_counter() < deadline:
            conn.process_data_events(time_limit=0.01)
        if len(arrived) > before:
            samples.append((arrived[-1] - sent) * 1000)
    if quorum:
        ch.queue_delete(queue)
    conn.close()
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


async def _confirmed(url: str, count: int, size: int, window: int, quorum: bool) -> float:
    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        queue = await ch.declare_queue(f"bench-d-{uuid.uuid4().hex[:8]}", durable=True,
                                       arguments={"x-queue-type": "quorum"} if quorum else None)
        body = b"x" * size
        sem = asyncio.Semaphore(window)
        done = 0

        async def one() -> None:
            nonlocal done
            async with sem:
                await ch.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), queue.name)
                done += 1

        start = time.perf_counter()
        tasks = []
        for _ in range(count):
            if time.perf_counter() - start > TIME_LIMIT:
                break
            await sem.acquire()
            sem.release()
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.wait_for(asyncio.gather(*tasks), TIME_LIMIT)
        elapsed = time.perf_counter() - start
        await queue.delete(if_unused=False, if_empty=False)
        return done / elapsed


def bench_confirmed_pika(url: str, count: int, size: int, window: int, quorum: bool,
                         queue: str | None = None) -> float:
    """Persistent publishes with confirms through pika's asynchronous ``SelectConnection``: up to
    ``window`` unconfirmed, topped up from the confirm callback.  Confirmed messages per second.
    ``queue``: a name to use (declared here too, deleted at the end), e.g. one the caller declared
    beforehand through another node so that a quorum queue's leader is not on the client's node."""
    queue = queue or f"bench-p-{uuid.uuid4().hex[:8]}"
    body = b"x" * size
    properties = pika.BasicProperties(delivery_mode=2)
    state = {"sent": 0, "settled": 0, "acked": 0, "start": 0.0, "elapsed": 0.0}
    channel_box: list = []

    def top_up() -> None:
        channel = channel_box[0]
        while (state["sent"] < count and state["sent"] - state["settled"] < window
               and time.perf_counter() - state["start"] < TIME_LIMIT):
            channel.basic_publish("", queue, body, properties)
            state["sent"] += 1

    def on_confirm(frame) -> None:
        method = frame.method
        settled = method.delivery_tag - state["settled"] if method.multiple else 1
        state["settled"] += settled
        if isinstance(method, pika.spec.Basic.Ack):
            state["acked"] += settled
        finished = state["sent"] >= count or time.perf_counter() - state["start"] >= TIME_LIMIT
        if finished and state["settled"] >= state["sent"]:
            state["elapsed"] = time.perf_counter() - state["start"]
            channel_box[0].queue_delete(queue, callback=lambda _frame: connection.close())
        else:
            top_up()

    def on_declared(_frame) -> None:
        state["start"] = time.perf_counter()
        top_up()

    def on_channel(channel) -> None:
        channel_box.append(channel)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: channel.queue_declare(
            queue, durable=True, arguments={"x-queue-type": "quorum"} if quorum else None, callback=on_declared))

    connection = pika.SelectConnection(pika.URLParameters(url),
                                       on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                       on_close_callback=lambda c, _reason: c.ioloop.stop())
    stop_at = connection.ioloop.call_later(TIME_LIMIT * 2, connection.close)  # a broker that stops answering
    connection.ioloop.start()
    connection.ioloop.remove_timeout(stop_at)
    if not state["elapsed"]:
        raise RuntimeError(f"pika confirms did not finish: {state}")
    return state["acked"] / state["elapsed"]


PUBLISH = "publish (no confirms)"
CONSUME = "consume (acks, prefetch 256)"
RTT_P50 = "round trip p50 (ms, lower is better)"
RTT_P99 = "round trip p99 (ms, lower is better)"


def confirms_key(window: int) -> str:
    return f"persistent + confirms (window {window})"


def pika_confirms_key(window: int) -> str:
    return f"confirms, pika async (window {window})"


def run_round(targets: list[tuple[str, str, bool]], args) -> dict[str, dict[str, float]]:
    """One round: every scenario on every broker, the brokers back to back *per scenario* (in the
    order given), so that the two measurements of a scenario are seconds apart, not minutes: this
    machine's speed drifts by up to 2x within minutes, and with a minute between them the per-round
    ratios of one run (5 rounds, session 9) ranged from 0.67 to 1.44x.  Printed as it goes."""
    results: dict[str, dict[str, float]] = {name: {} for name, _, _ in targets}
    queues: dict[str, str] = {}

    def measure(keys: tuple[str, ...], run) -> None:
        """``run(url, quorum, name)`` on each broker in turn; it returns one value per key."""
        for name, url, quorum in targets:
            for key, value in zip(keys, run(url, quorum, name), strict=True):
                results[name][key] = value
                show(name, key, value)

    def publish(url: str, quorum: bool, name: str) -> tuple[float]:
        rate, queues[name] = bench_publish(url, args.count, args.size, quorum)
        return (rate,)

    measure((PUBLISH,), publish)
    measure((CONSUME,), lambda url, quorum, name: (bench_consume(url, queues[name], args.count),))
    measure((confirms_key(args.window),), lambda url, quorum, name: (asyncio.run(
        _confirmed(url, args.confirm_count, args.size, args.window, quorum)),))
    measure((pika_confirms_key(args.window),), lambda url, quorum, name: (bench_confirmed_pika(
        url, args.confirm_count, args.size, args.window, quorum),))
    measure((RTT_P50, RTT_P99), lambda url, quorum, name: bench_latency(url, quorum))
    return results


def show(name: str, key: str, value: float) -> None:
    unit = "" if "(ms" in key else " msg/s"
    print(f"  {name:10s} {key:38s} {value:10.1f}{unit}", flush=True)


def summarise(rounds: dict[str, list[dict[str, float]]]) -> None:
    """Median of each scenario per broker; with two brokers, the ratio of the medians and the
    range of the per-round ratios (each round measures both brokers back to back)."""
    names = list(rounds)
    pair = len(names) == 2
    n = len(next(iter(rounds.values())))
    print(f"\nmedian of {n} round{'s' if n > 1 else ''} (msg/s unless ms)")
    print(f"{'scenario':40s}" + "".join(f"{name:>14s}" for name in names)
          + ("         ratio  per-round ratios" if pair else ""))
    for key in rounds[names[0]][0]:
        medians = [statistics.median(r[key] for r in rounds[name]) for name in names]
        row = f"{key:40s}" + "".join(f"{m:14.1f}" for m in medians)
        if pair:
            ratios = sorted(a[key] / b[key] for a, b in zip(rounds[names[0]], rounds[names[1]], strict=True))
            row += f"{medians[0] / medians[1]:13.2f}x  {ratios[0]:.2f}-{ratios[-1]:.2f}x"
        print(row)
    if pair:
        print("(ratio: first / second broker; for the latency rows lower is better)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="benchmark an already running broker instead of starting raftmq")
    parser.add_argument("--rabbitmq", action="store_true", help="also start and benchmark rabbitmq-server")
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--confirm-count", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=100, help="message body size in bytes")
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed messages in flight")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every scenario per broker, brokers alternating; medians are reported")
    parser.add_argument("--sched-batch", action="store_true",
                        help="run the raftmq nodes with sched_batch = true (SCHED_BATCH threads)")
    parser.add_argument("--cluster", type=int, default=0, metavar="N",
                        help="benchmark an N-node raftmq cluster (clients on a follower) instead of one node; "
                             "RabbitMQ then uses quorum queues")
    args = parser.parse_args()

    targets: list[tuple[str, str, bool]] = []  # (name, url, quorum queues)
    with contextlib.ExitStack() as stack:
        if args.url:
            targets.append(("broker", args.url, False))
        elif args.cluster:
            cluster = stack.enter_context(Cluster(args.cluster,
                                                  extra_config="sched_batch = true" if args.sched_batch else ""))
            follower = cluster.followers()[0]
            cluster.connection(follower).close()
            targets.append((f"raftmq x{args.cluster}", follower.url, False))
        else:
            node = stack.enter_context(RaftmqNode(tempfile.mkdtemp(prefix="raftmq-bench-"),
                                                  env={"RAFTMQ_SCHED_BATCH": "true"} if args.sched_batch else None))
            targets.append(("raftmq", node.url, False))
        if args.rabbitmq:
            if not rabbitmq.available():
                print("rabbitmq-server is not installed (apt-get install rabbitmq-server)", file=sys.stderr)
            else:
                rmq = stack.enter_context(rabbitmq.RabbitMQ())
                targets.append(("rmq quorum" if args.cluster else "rabbitmq", rmq.url, bool(args.cluster)))
        # Identical runs on this machine differ by 10-25 %, and its speed drifts over minutes: so
        # both brokers stay up, every round measures each once, and the order alternates.
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in targets}
        for number in range(args.rounds):
            print(f"round {number + 1} of {args.rounds}", flush=True)
            order = targets if number % 2 == 0 else targets[::-1]
            for name, results in run_round(order, args).items():
                rounds[name].append(results)
    summarise(rounds)


if __name__ == "__main__":
    main()
