"""Rates as RabbitMQ's ``*_details.rate``: the change between the last two samples per second."""

from __future__ import annotations

import time
from types import SimpleNamespace

from raftmq.ops.http.rates import Rates
from raftmq.store.core.model import Queue, VHost


def test_rates_between_the_last_two_samples():
    queue = Queue(1, "/", "q", True, None, False, {})
    machine = SimpleNamespace(stats={"published": 0, "delivered": 0, "acked": 0}, vhosts={"/": VHost("/")})
    machine.vhosts["/"].queues["q"] = queue
    rates = Rates(SimpleNamespace(machine=machine))
    assert rates.message_stats()["publish_details"] == {"rate": 0.0}  # no two samples yet
    rates.sample()
    started = time.monotonic()
    time.sleep(0.2)
    machine.stats["published"] = 10
    queue.next_seq = 11  # ten messages enqueued
    queue.unacked_count = 4
    rates.sample()
    elapsed = time.monotonic() - started
    stats = rates.message_stats()
    assert stats["publish"] == 10
    assert abs(stats["publish_details"]["rate"] - 10 / elapsed) < 10 / elapsed * 0.3
    assert rates.queue_rate(queue, "publish") > 0
    assert rates.queue_rate(queue, "messages_unacknowledged") > 0
    assert rates.queue_rate(queue, "messages_ready") == 0.0
    queue.next_seq = 1  # a restarted single node renumbers from its oldest message: never negative
    rates.sample()
    assert rates.queue_rate(queue, "publish") == 0.0
