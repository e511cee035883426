"""The node's view of queues of queue groups (issue 34): with ``raft_groups = 3`` a queue placed in
a queue group is a stub in the main process's machine (store/core/groups.py), so the management API
asks the queue's worker for its figures (node/group_figures.py).

Checked with a real node (3 groups), pika, the HTTP API and the metrics port: /api/queues/{vhost}/
{name} and /api/queues show a queue group's queue's ready, unacknowledged and consumer counts and its
message_stats (publish, deliver_get, ack) as its group holds them, and its consumers
(consumer_details, /api/consumers), at once after the confirms and acks (RabbitMQ's management API,
https://www.rabbitmq.com/docs/management, reads each queue's process: the same promise);
/api/overview's queue_totals, /api/vhosts/{name} and the Prometheus per-queue gauges include them.
"""

from __future__ import annotations

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import wait_until
from tests.integration.test_metrics import scrape
from tests.support.http_api import call

GROUPS = {"RAFTMQ_RAFT_GROUPS": "3"}


@pytest.fixture
def node(tmp_path, broker_kind):
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    http, metrics = free_port(), free_port()
    with RaftmqNode(tmp_path / "node", env=GROUPS,
                    extra_args=["--http-port", str(http), "--metrics-port", str(metrics)]) as n:
        base = f"http://127.0.0.1:{http}"
        wait_until(lambda: call(base, "GET", "/api/overview")[0] == 200, what="the HTTP API")
        yield n, base, metrics


def test_the_http_api_shows_a_queue_groups_queue_as_its_group_holds_it(node):
    """Queue ``gr-1`` pinned to group 1 and ``gr-2`` to group 2 (``x-queue-group``): after 5 and 3
    confirmed publishes, 2 deliveries to an unacking consumer (prefetch 2) and one basic.get with
    ack, the API shows each queue's figures from its own group, and the totals add both up."""
    node, http, metrics = node
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("gr-1", durable=True, arguments={"x-queue-group": 1})
    ch.queue_declare("gr-2", durable=True, arguments={"x-queue-group": 2})
    for i in range(5):
        ch.basic_publish("", "gr-1", b"a%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)
    for i in range(3):
        ch.basic_publish("", "gr-2", b"b%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)

    code, one = call(http, "GET", "/api/queues/%2F/gr-1")
    assert code == 200
    assert (one["messages"], one["messages_ready"], one["messages_unacknowledged"], one["consumers"]) == \
        (5, 5, 0, 0), one
    assert one["message_stats"]["publish"] == 5, one["message_stats"]

    method, _props, body = ch.basic_get("gr-2")
    assert body == b"b0"
    ch.basic_ack(method.delivery_tag)
    ch.basic_qos(prefetch_count=2)
    got: list[bytes] = []
    tag = ch.basic_consume("gr-1", lambda c, m, p, b: got.append(b))
    wait_until(lambda: (conn.process_data_events(0.05), len(got) == 2)[1], what="two deliveries")

    def figures(name: str) -> tuple:
        code, q = call(http, "GET", f"/api/queues/%2F/{name}")
        assert code == 200
        return (q["messages"], q["messages_ready"], q["messages_unacknowledged"], q["consumers"],
                q["message_stats"]["deliver_get"], q["message_stats"]["ack"])

    # gr-1: 3 ready + 2 unacked, one consumer, 2 delivered; gr-2: 2 ready, 1 got and acked.
    wait_until(lambda: figures("gr-1") == (5, 3, 2, 1, 2, 0) and figures("gr-2") == (2, 2, 0, 0, 1, 1),
               timeout=5, what=f"the groups' figures: {figures('gr-1')} {figures('gr-2')}")
    code, listed = call(http, "GET", "/api/queues/%2F")
    assert code == 200
    by_name = {q["name"]: q for q in listed}
    assert (by_name["gr-1"]["messages_ready"], by_name["gr-1"]["messages_unacknowledged"]) == (3, 2)
    assert (by_name["gr-2"]["messages_ready"], by_name["gr-2"]["messages_unacknowledged"]) == (2, 0)

    code, one = call(http, "GET", "/api/queues/%2F/gr-1")
    assert [(c["consumer_tag"], c["prefetch_count"]) for c in one["consumer_details"]] == \
        [(tag, 2)], one["consumer_details"]
    code, consumers = call(http, "GET", "/api/consumers")
    assert code == 200 and [c["queue"]["name"] for c in consumers if c["consumer_tag"] == tag] == ["gr-1"], consumers

    code, overview = call(http, "GET", "/api/overview")
    assert code == 200
    totals = overview["queue_totals"]
    assert (totals["messages"], totals["messages_ready"], totals["messages_unacknowledged"]) == (7, 5, 2), totals
    assert overview["object_totals"]["consumers"] >= 1, overview["object_totals"]
    code, vhost = call(http, "GET", "/api/vhosts/%2F")
    assert code == 200 and (vhost["messages_ready"], vhost["messages_unacknowledged"]) == (5, 2), vhost
    samples = scrape(metrics)  # the Prometheus gauges too (ops/metrics.py)
    gauges = {(n, dict(labels)["queue"]): v for (n, labels), v in samples.items()
              if n.startswith("raftmq_queue_") and dict(labels).get("queue") in ("gr-1", "gr-2")}
    assert gauges[("raftmq_queue_messages_ready", "gr-1")] == 3, gauges
    assert gauges[("raftmq_queue_messages_unacked", "gr-1")] == 2, gauges
    assert gauges[("raftmq_queue_consumers", "gr-1")] == 1, gauges
    assert gauges[("raftmq_queue_messages_ready", "gr-2")] == 2, gauges
    conn.close()

