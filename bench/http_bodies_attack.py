"""Large management bodies against a real node: its RSS and another client's round trip (issue 31 item 9).

Starts one node with the default configuration plus an HTTP port, then, each attack four times in
parallel while a pika client does round trips (connect, declare, publish, get): (a) definitions of
30 MB (the issue's attack), (b) 19 MB definitions whose bulk is one string (under the 20 MiB cap),
(c) definitions carrying 999,000 empty lists (just under the default budget of 2 M counted values).  Prints each
request's status, the node's RSS before and at peak, and the round trips' p50 and max.

Run it with the interpreter of the checkout to measure (its raftmq is the one the node runs):
``.venv/bin/python bench/http_bodies_attack.py`` here, and the same file with another checkout's
interpreter for the old code.
"""

from __future__ import annotations

import base64
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pika

from raftmq.ops.local.node import RaftmqNode, free_port

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()
MB = 1 << 20


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def post(port: int, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/definitions", data=body, method="POST",
                                     headers={"Authorization": AUTH, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (ConnectionError, urllib.error.URLError):
        return 0


def round_trip(url: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        body = uuid.uuid4().bytes
        ch.basic_publish("", q, body)
        for _ in range(1000):
            method, _props, got = ch.basic_get(q, auto_ack=True)
            if method is not None:
                assert got == body
                return
            time.sleep(0.001)
    finally:
        conn.close()


def attack(node: RaftmqNode, port: int, name: str, body: bytes) -> None:
    times: list[float] = []
    stop = threading.Event()

    def trips() -> None:
        while not stop.is_set() and len(times) < 2000:
            start = time.monotonic()
            round_trip(node.url)
            times.append(time.monotonic() - start)

    statuses: list[int] = []
    senders = [threading.Thread(target=lambda: statuses.append(post(port, body))) for _ in range(4)]
    before = peak = rss(node.pid)
    tripper = threading.Thread(target=trips)
    tripper.start()
    start = time.monotonic()
    for t in senders:
        t.start()
    while any(t.is_alive() for t in senders) and time.monotonic() - start < 300:
        peak = max(peak, rss(node.pid))
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    stop.set()
    tripper.join()
    times.sort()
    print(f"{name}: statuses {sorted(statuses)} in {elapsed:.1f} s; RSS {before / MB:.0f} -> peak {peak / MB:.0f} MB; "
          f"round trips {len(times)}, p50 {times[len(times) // 2] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms")


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="http-bodies-"))
    port = free_port()
    (directory / "node.toml").write_text(f'http_port = {port}\n[users.guest]\npassword = "guest"\n'
                                         'tags = ["administrator"]\n')
    node = RaftmqNode(directory / "data", config=directory / "node.toml")
    with node:
        time.sleep(1)
        print(f"node pid {node.pid}, python {os.path.realpath(__file__)}")
        attack(node, port, "(a) 30 MB definitions x4", b'{"comment": "' + b"x" * (30 * MB) + b'"}')
        attack(node, port, "(b) 19 MB definitions x4", b'{"comment": "' + b"x" * (19 * MB) + b'"}')
        attack(node, port, "(c) 999,000 empty lists x4", b'{"comment": [' + b"[]," * 998_999 + b"[]]}")


if __name__ == "__main__":
    main()
