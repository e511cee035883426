"""Publish-path cost in the state machine alone: apply N publishes (batches of 100) to a direct and a
fanout exchange, no consumers, no store, and print microseconds per publish (median of rounds).

Written to compare two checkouts side by side when routing changes (x-local-random added a type check
to ``Topology.route_into``): run it with each checkout's interpreter, alternating, e.g.
``/work/main/.venv/bin/python bench/route_apply.py`` and ``.venv/bin/python bench/route_apply.py``.
"""

from __future__ import annotations

import statistics
import sys
import time

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import Op, VhostAdd, make

NOW = 1_700_000_000_000_000
C = "n1.bench.1"


def machine() -> StoredMachine:
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    m.apply_batch(NOW, [make(Op.CHANNEL_OPEN, C, None, 1)])
    m.apply_batch(NOW, [make(Op.EXCHANGE_DECLARE, C, None, 1, "/", "d", "direct", False, False, False, False, {})])
    m.apply_batch(NOW, [make(Op.EXCHANGE_DECLARE, C, None, 1, "/", "f", "fanout", False, False, False, False, {})])
    for i in range(3):
        m.apply_batch(NOW, [make(Op.QUEUE_DECLARE, C, None, 1, "/", f"q{i}", False, False, False, False, {})])
        m.apply_batch(NOW, [make(Op.QUEUE_BIND, C, None, 1, "/", f"q{i}", "f", "", {})])
    m.apply_batch(NOW, [make(Op.QUEUE_BIND, C, None, 1, "/", "q0", "d", "k", {})])
    return m


def round_us(exchange: str, n: int) -> float:
    m = machine()
    batch = [make(Op.PUBLISH, C, None, 1, "/", exchange, "k", False, b"\x00\x00", b"x" * 64, False, 0, None)] * 100
    started = time.perf_counter()
    for i in range(n // 100):
        m.apply(NOW + i, batch, replies=False)
    return (time.perf_counter() - started) / n * 1e6


def main(n: int = 200_000, rounds: int = 5) -> None:
    for exchange in ("d", "f"):
        figures = [round_us(exchange, n) for _ in range(rounds)]
        print(f"{'direct' if exchange == 'd' else 'fanout x3'}: {statistics.median(figures):.3f} us/publish "
              f"(rounds {', '.join(f'{f:.3f}' for f in figures)})")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
