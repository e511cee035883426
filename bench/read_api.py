"""The whole-table reads of node/ and ops/ before and after store/core/queries.py (issue 33).

Builds a state machine in process (no node, no storage) with QUEUES queues, each with a message and
every tenth with a consumer, then times, per call: the rates sample (ops/http/rates.py, every 5 s), the
metrics scrape's queue families (ops/metrics.py, up to its queue_consumers family), the /api/queues
rows (ops/http/views.py queue_view over every queue, as ops/http/resources.py list_queues builds
them) and /api/overview's totals.  Prints the minimum and the median of ROUNDS calls of each, in µs
per queue.

Run it once per tree, alternating, with the tree first on the path:
``cd /tmp && PYTHONPATH=/path/to/tree /work/X/.venv/bin/python /work/X/bench/read_api.py [QUEUES] [ROUNDS]``.
Old trees (no store/core/queries.py) are measured through the model, as their code read it.
"""

from __future__ import annotations

import statistics
import sys
import time
from types import SimpleNamespace

from raftmq.ops.http import views
from raftmq.ops.http.rates import Rates
from raftmq.ops.metrics import BrokerCollector
from raftmq.store.core.commands import Op, VhostAdd, make

try:  # a machine that carries out its own effects (issue 33); before it, the machine itself did
    from raftmq.store.applier import StoredMachine as StateMachine
except ImportError:
    from raftmq.store.core.machine import StateMachine

NOW = 1_700_000_000_000_000
NEW = hasattr(views, "by_name")
if NEW:
    from raftmq.store.core import queries as Q


def build(queues: int) -> StateMachine:
    m = StateMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/"), make(Op.CHANNEL_OPEN, "c", 1, 1)])
    token = 1
    for start in range(0, queues, 1000):
        batch = []
        for i in range(start, min(start + 1000, queues)):
            token += 3
            batch += [make(Op.QUEUE_DECLARE, "c", token, 1, "/", f"q{i}", False, False, False, False, {}),
                      make(Op.PUBLISH, "c", token + 1, 1, "/", "", f"q{i}", False, b"\x00\x00", b"body", False, 0,
                           None)]
            if i % 10 == 0:
                batch.append(make(Op.CONSUME, "c", token + 2, 1, "/", f"q{i}", f"t{i}", False, False, {}))
        m.apply_batch(NOW, batch)
    return m


def scrape_queues(collector: BrokerCollector) -> None:
    for family in collector.collect_in_steps():
        if getattr(family, "name", "") == "raftmq_queue_consumers":
            return


def queue_rows(broker, m: StateMachine, rates: Rates) -> list:
    if NEW:
        return [views.queue_view(broker, q, rates) for v in Q.vhost_names(m)
                for q in sorted(Q.queues(m, v), key=views.by_name)]
    return [views.queue_view(broker, q, rates) for v in m.vhosts.values()
            for q in sorted(v.queues.values(), key=lambda q: q.name)]


def overview_totals(m: StateMachine) -> tuple:
    if NEW:
        vhosts = Q.vhosts(m)
        return (sum(v.messages_ready for v in vhosts), sum(v.messages_unacknowledged for v in vhosts),
                sum(v.consumers for v in vhosts), sum(v.queues for v in vhosts))
    queues = [q for v in m.vhosts.values() for q in v.queues.values()]
    return (sum(len(q.ready) for q in queues), sum(q.unacked_count for q in queues),
            sum(len(q.consumers) for q in queues), len(queues))


def timed(fn, rounds: int, queues: int) -> tuple[float, float]:
    """(minimum, median) µs per queue: on a shared machine the minimum is the figure least disturbed
    by other processes."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples) / queues * 1e6, statistics.median(samples) / queues * 1e6


def main() -> None:
    queues = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    m = build(queues)
    broker = SimpleNamespace(machine=m, config=SimpleNamespace(node_id="n1"))
    rates = Rates(broker)
    rates.sample()
    rates.sample()
    collector = BrokerCollector(broker)
    assert overview_totals(m)[3] == queues
    figures = {
        "rates sample": timed(rates.sample, rounds, queues),
        "metrics queue families": timed(lambda: scrape_queues(collector), rounds, queues),
        "/api/queues rows": timed(lambda: queue_rows(broker, m, rates), rounds, queues),
        "/api/overview totals": timed(lambda: overview_totals(m), rounds, queues),
    }
    tree = "new (queries)" if NEW else "old (model)"
    print(f"{tree}, {queues} queues, min/median of {rounds} in µs per queue: "
          + ", ".join(f"{name} {low:.2f}/{mid:.2f}" for name, (low, mid) in figures.items()))


if __name__ == "__main__":
    main()
