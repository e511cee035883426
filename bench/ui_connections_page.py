"""The UI's Connections and Channels pages with 1,000 connections on a 3-node cluster (issue 35).

Since part three, /api/connections and /api/channels list every member's clients: the node asked
builds its own rows and asks the other members over the Raft port (ops/http/members.py: each
member answers the view its loop built, at most 1 s old; the asker keeps the answers 1 s).  This
starts a local 3-node cluster (real processes, loopback), opens CONNECTIONS pika connections spread
over the three nodes (one channel each), and times, ROUNDS times each, the requests the pages make
on one node (Basic auth, one keep-alive connection): page 1 of 100 of the connections, the same
with a name filter, page 1 of the channels, and the whole connection list (rabbitmqadmin).  Rounds
are 1.1 s apart so that every one asks the members afresh (the asker's 1 s cache expired): the
figures are the full cost, not the cache's.  Prints the median and the maximum in ms.

Run: ``.venv/bin/python bench/ui_connections_page.py [CONNECTIONS] [ROUNDS]`` (bounded: at most
3,000 connections, 50 rounds).
"""

from __future__ import annotations

import base64
import http.client
import json
import statistics
import sys
import tempfile
import time

import pika

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port

AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}


def get(conn: http.client.HTTPConnection, path: str) -> tuple[int, bytes]:
    conn.request("GET", path, headers=AUTH)
    response = conn.getresponse()
    return response.status, response.read()


def main() -> None:
    connections = min(int(sys.argv[1]) if len(sys.argv) > 1 else 1000, 3000)
    rounds = min(int(sys.argv[2]) if len(sys.argv) > 2 else 10, 50)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(3, tmp)
        ports = []
        for node in cluster.nodes:
            ports.append(free_port())
            node.extra_args = ["--http-port", str(ports[-1])]
        clients: list[pika.BlockingConnection] = []
        with cluster:
            cluster.wait_formed()
            start = time.monotonic()
            for i in range(connections):
                node = cluster.nodes[i % 3]
                client = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, heartbeat=0,
                                                                           blocked_connection_timeout=None))
                client.channel()
                clients.append(client)
            print(f"{connections} connections opened in {time.monotonic() - start:.1f} s")
            api = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=120)
            deadline = time.monotonic() + 60
            while True:  # every member's connections listed
                status, body = get(api, "/api/connections?page=1&page_size=1")
                if status == 200 and json.loads(body)["total_count"] == connections:
                    break
                assert time.monotonic() < deadline, (status, body[:200])
                time.sleep(0.5)
            cases = {
                "connections page 1 of 100": "/api/connections?page=1&page_size=100",
                "connections, name filter": "/api/connections?page=1&page_size=100&name=127.0.0.1%3A1&use_regex=false",
                "channels page 1 of 100": "/api/channels?page=1&page_size=100",
                "whole connection list": "/api/connections",
                "overview": "/api/overview",
            }
            for name, path in cases.items():
                times = []
                for _ in range(rounds):
                    time.sleep(1.1)  # past the asker's cache: the members are asked again
                    began = time.perf_counter()
                    status, body = get(api, path)
                    times.append((time.perf_counter() - began) * 1000)
                    assert status == 200, (status, body[:200])
                print(f"{name:28s} median {statistics.median(times):7.1f} ms  max {max(times):7.1f} ms"
                      f"  ({len(body)} bytes)")
            api.close()
            for client in clients:
                client.close()


if __name__ == "__main__":
    main()
