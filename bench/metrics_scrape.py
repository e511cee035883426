"""The cost of a /metrics scrape on a node with many queues, and what it does to another client.

Starts one node with ``--metrics-port``, declares QUEUES queues (3 samples each in the exposition),
then prints: (a) 20 sequential scrapes: time per scrape (p50, max) and size; (b) for SECONDS, 1 and 4
scrapers in parallel in a loop while a pika client does round trips (connect, declare, publish,
get): scrapes done and failed, the round trips' p50 and max, and the node's threads at the end; (c) the same
round trips without scrapers, as the baseline.

Run it with the interpreter of the checkout to measure (its raftmq is the one the node runs), from
a directory that is not a checkout: ``cd /tmp && /work/X/.venv/bin/python /work/X/bench/metrics_scrape.py``
for each of the old and the new code.  Arguments: QUEUES (default 5000), SECONDS (default 8).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pika

from raftmq.ops.local.node import RaftmqNode, free_port


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def scrape(port: int) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read()


def round_trips(url: str, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set() and len(out) < 2000:
        start = time.monotonic()
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        body = uuid.uuid4().bytes
        ch.basic_publish("", q, body)
        while ch.basic_get(q, auto_ack=True)[2] != body:
            pass
        conn.close()
        out.append(time.monotonic() - start)


def scraper(port: int, stop: threading.Event, done: list[int], failed: list[int]) -> None:
    while not stop.is_set():
        try:
            scrape(port)
            done[0] += 1
        except OSError:  # HTTPError 500 included (the old server raced the loop)
            failed[0] += 1


def summary(times: list[float]) -> str:
    times = sorted(times)
    if not times:
        return "none"
    return f"{len(times)}, p50 {times[len(times) // 2] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms"


def main() -> None:
    queues = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    port = free_port()
    with RaftmqNode(Path(tempfile.mkdtemp()) / "n", extra_args=["--metrics-port", str(port)]) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        start = time.monotonic()
        for i in range(queues):
            ch.queue_declare(f"q{i}")
        conn.close()
        print(f"{queues} queues declared in {time.monotonic() - start:.1f} s")
        times = []
        for _ in range(20):
            start = time.monotonic()
            size = len(scrape(port))
            times.append(time.monotonic() - start)
        print(f"sequential scrapes: {summary(times)}, {size / 1e6:.2f} MB each")
        for scrapers in (0, 1, 4):
            stop = threading.Event()
            done, failed = [0], [0]
            trips: list[float] = []
            workers = [threading.Thread(target=scraper, args=(port, stop, done, failed), daemon=True)
                       for _ in range(scrapers)]
            workers.append(threading.Thread(target=round_trips, args=(node.url, stop, trips), daemon=True))
            for w in workers:
                w.start()
            time.sleep(seconds)
            stop.set()
            for w in workers:
                w.join(60)
            print(f"{scrapers} scrapers for {seconds:.0f} s: {done[0]} scrapes, {failed[0]} failed; round trips {summary(trips)}; "
                  f"node threads {threads(node.pid)}")


if __name__ == "__main__":
    main()
