"""Rates as RabbitMQ's ``*_details.rate``: the change between the last two samples per second."""

from __future__ import annotations

import time
from types import SimpleNamespace

from raftmq.ops.http.rates import Rates
from raftmq.store.core.model import Queue, VHost


def test_rates_between_the_last_two_samples():
    queue = Queue(1, "/", "q", True, None, False, {})
    machine = SimpleNamespace(stats={"published": 0, "delivered": 0, "acked": 0}, vhosts={"/": VHost("/")},
                              queue_counts={})
    machine.vhosts["/"].queues["q"] = queue
    rates = Rates(SimpleNamespace(machine=machine))
    assert rates.message_stats()["publish_details"] == {"rate": 0.0}  # no two samples yet
    rates.sample()
    started = time.monotonic()
    time.sleep(0.2)
    machine.stats["published"] = 10
    queue.next_seq = 11  # ten messages enqueued
    queue.unacked_count = 4
    machine.queue_counts[1] = [6, 2]  # (delivered or got, acked) of the queue: store/core/machine.py
    rates.sample()
    elapsed = time.monotonic() - started
    stats = rates.message_stats()
    assert stats["publish"] == 10
    assert abs(stats["publish_details"]["rate"] - 10 / elapsed) < 10 / elapsed * 0.3
    assert rates.queue_rate(queue, "publish") > 0
    assert rates.queue_rate(queue, "messages_unacknowledged") > 0
    assert rates.queue_rate(queue, "messages_ready") == 0.0
    # Per-queue deliver/get and ack rates (RabbitMQ's queue message_stats.*_details, issue 35).
    assert abs(rates.queue_rate(queue, "deliver_get") - 6 / elapsed) < 6 / elapsed * 0.3
    assert abs(rates.queue_rate(queue, "ack") - 2 / elapsed) < 2 / elapsed * 0.3
    queue.next_seq = 1  # a restarted single node renumbers from its oldest message: never negative
    rates.sample()
    assert rates.queue_rate(queue, "publish") == 0.0


def test_a_queue_declared_between_samples_counts_from_nothing():
    """A queue that was not there at the earlier sample has its whole counts as the change (its
    publish and deliver_get rates show at the next sample, not one interval later)."""
    machine = SimpleNamespace(stats={}, vhosts={"/": VHost("/")}, queue_counts={})
    rates = Rates(SimpleNamespace(machine=machine))
    rates.sample()
    queue = Queue(7, "/", "new", True, None, False, {})
    machine.vhosts["/"].queues["new"] = queue
    queue.next_seq = 6
    machine.queue_counts[7] = [3, 1]
    time.sleep(0.1)
    rates.sample()
    assert rates.queue_rate(queue, "publish") > 0
    assert rates.queue_rate(queue, "deliver_get") > 0 and rates.queue_rate(queue, "ack") > 0
