"""The UI's Queues page with 10,000 queues (issue 35): how long /api/queues takes to answer a page.

Starts one node (a real process, loopback), imports QUEUES queues through /api/definitions, then
times, ROUNDS times each, the requests the Queues page makes (Basic auth, on one keep-alive
connection): the first page of 100, a page filtered by a name substring, a regex filter, the
last page, and the whole list without paging (what rabbitmqadmin asks).  Prints the median and
the maximum in ms.  Run: ``.venv/bin/python bench/ui_queues_page.py [QUEUES] [ROUNDS]``.
"""

from __future__ import annotations

import base64
import http.client
import json
import statistics
import sys
import tempfile
import time

from raftmq.ops.local.node import RaftmqNode, free_port

AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


def request(conn: http.client.HTTPConnection, method: str, path: str, body=None) -> tuple[int, bytes]:
    headers = dict(AUTH)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def main() -> None:
    queues = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    http_port = free_port()
    with tempfile.TemporaryDirectory() as tmp, RaftmqNode(tmp, extra_args=["--http-port", str(http_port)]) as node:
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=600)
        deadline = time.monotonic() + 20
        while True:
            try:
                if request(conn, "GET", "/api/overview")[0] == 200:
                    break
            except OSError:
                conn.close()
            assert time.monotonic() < deadline, node.log_tail(20)
            time.sleep(0.2)
        start = time.monotonic()
        definitions = {"queues": [{"name": f"orders-{i:05d}", "vhost": "/", "durable": True} for i in range(queues)]}
        status, body = request(conn, "POST", "/api/definitions", definitions)
        assert status == 204, (status, body[:300])
        print(f"{queues} queues imported in {time.monotonic() - start:.1f} s")
        last = -(-queues // 100)
        cases = {
            "page 1 of 100": "/api/queues?page=1&page_size=100",
            "page 1, name filter": "/api/queues?page=1&page_size=100&name=orders-09&use_regex=false",
            "page 1, regex filter": "/api/queues?page=1&page_size=100&name=%5Eorders-0%5B0-4%5D1&use_regex=true",
            f"page {last} (last)": f"/api/queues?page={last}&page_size=100",
            "page 1 sorted by messages": "/api/queues?page=1&page_size=100&sort=messages&sort_reverse=true",
            "whole list (no paging)": "/api/queues",
        }
        for label, path in cases.items():
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                status, body = request(conn, "GET", path)
                times.append((time.perf_counter() - t0) * 1000)
                assert status == 200, (status, body[:300])
            print(f"{label:28s} median {statistics.median(times):8.1f} ms  max {max(times):8.1f} ms"
                  f"  ({len(body)} bytes)")
        conn.close()


if __name__ == "__main__":
    main()
