"""Latency of an HTTP API request whose Basic credentials the node verified before (issue 31).

Starts a node with its HTTP API (tests.integration.helpers.http_node, guest as administrator),
warms up, then times ``--count`` sequential ``GET /api/whoami`` and prints the median and p90.
Remembered credentials are answered on the loop (ops/operator.py ``cached_only``); before, every
request went through a worker thread.  Run it on two checkouts to compare.

Usage::

    python bench/http_auth.py [--count 300]
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.helpers import http_node  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300)
    args = parser.parse_args()
    node = http_node(Path(tempfile.mkdtemp(prefix="raftmq-http-auth-"))).start()
    try:
        headers = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}

        def get() -> float:
            started = time.perf_counter()
            request = urllib.request.Request(f"{node.http}/api/whoami", headers=headers)
            with urllib.request.urlopen(request, timeout=10) as answer:
                answer.read()
            return time.perf_counter() - started

        for _ in range(20):
            get()
        times = sorted(get() for _ in range(args.count))
        print(f"GET /api/whoami x{args.count}: median {1000 * statistics.median(times):.3f} ms, "
              f"p90 {1000 * times[int(0.9 * len(times))]:.3f} ms")
    finally:
        node.terminate()


if __name__ == "__main__":
    main()
