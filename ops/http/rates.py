"""Rates per second, as RabbitMQ's ``*_details: {"rate": ...}``: sampled, not counted on the hot path.

Every ``SAMPLE_INTERVAL`` seconds (RabbitMQ's default collect_statistics_interval is 5 s) the node's
message counters and each queue's depths and publish/deliver/ack counts are sampled
(store/core/queries.py); a rate is the change between the last two samples divided by the time
between them.  Every node applies every command, so any node's per-queue rates are the cluster's.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from raftmq.node.group_figures import node_totals
from raftmq.store.core import queries as Q

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

SAMPLE_INTERVAL = 5.0

# RabbitMQ's message_stats names -> raftmq's message counters (queries.message_stats).
MESSAGE_STATS = {
    "publish": "published",
    "deliver_get": "delivered",
    "redeliver": "redelivered",
    "ack": "acked",
    "drop_unroutable": "unroutable",
}


# A queue's sample: its numbers behind these rates (publish: queries.QueueDepth.published; deliver_get
# and ack: queries.queue_counts, counted by the machine per queue since this node started applying).
_QUEUE_FIELDS = ("messages", "messages_ready", "messages_unacknowledged", "publish", "deliver_get", "ack")
_COUNTERS = ("publish", "deliver_get", "ack")  # totals that only grow: a negative step is a reset, not a rate


class Rates:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._stats: list[tuple[float, dict[str, int]]] = []
        self._queues: list[tuple[float, dict[int, tuple[int, ...]]]] = []

    def sample(self, figures: dict | None = None, stats: dict[str, int] | None = None) -> None:
        """``figures``, ``stats``: with queue groups, the workers' queue figures and the node's
        summed counters (node/group_figures.py); None with one group."""
        now = time.monotonic()
        machine = self.broker.machine
        self._stats = [*self._stats[-1:], (now, stats if stats is not None else Q.message_stats(machine))]
        counts = Q.all_queue_counts(machine)
        depths = {q.qid: (q.messages_ready + q.messages_unacknowledged, q.messages_ready, q.messages_unacknowledged,
                          q.published, *counts.get(q.qid, (0, 0))) for q in Q.queue_depths(machine)}
        if figures:
            for qid, f in figures.items():
                if qid in depths:
                    depths[qid] = (f.messages_ready + f.messages_unacknowledged, f.messages_ready,
                                   f.messages_unacknowledged, f.published, f.delivered, f.acked)
        self._queues = [*self._queues[-1:], (now, depths)]

    async def run(self) -> None:
        while True:
            host = getattr(self.broker, "group_host", None)
            if host is None:
                self.sample()
            else:  # issue 34: queues of queue groups and the counters of every group's process
                figures = await host.figures.ask(None)
                stats, _bodies = await node_totals(self.broker, Q.message_stats(self.broker.machine), {})
                self.sample(figures, stats)
            await asyncio.sleep(SAMPLE_INTERVAL)

    def message_stats(self) -> dict:
        """Overview ``message_stats``: totals since this node started applying, with rates (with
        queue groups, every group's as last sampled)."""
        current = (self._stats[-1][1] if getattr(self.broker, "group_host", None) is not None and self._stats
                   else Q.message_stats(self.broker.machine))
        out: dict = {}
        for name, counter in MESSAGE_STATS.items():
            out[name] = current.get(counter, 0)
            out[f"{name}_details"] = {"rate": self._rate(counter)}
        return out

    def _rate(self, counter: str) -> float:
        if len(self._stats) < 2:
            return 0.0
        (t0, a), (t1, b) = self._stats
        return round((b.get(counter, 0) - a.get(counter, 0)) / max(t1 - t0, 1e-6), 1)

    def queue_rate(self, queue: Q.QueueInfo | Q.QueueDepth, field: str) -> float:
        if len(self._queues) < 2:
            return 0.0
        (t0, a), (t1, b) = self._queues
        if queue.qid not in b:
            return 0.0
        i = _QUEUE_FIELDS.index(field)
        # A queue declared after the earlier sample started from nothing: everything it counts is new.
        before = a[queue.qid][i] if queue.qid in a else 0
        rate = round((b[queue.qid][i] - before) / max(t1 - t0, 1e-6), 1)
        return max(rate, 0.0) if field in _COUNTERS else rate
