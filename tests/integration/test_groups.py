"""Queue groups on one node (issue 34): ``raft_groups = 3`` runs the metadata group in the node's
main process and two queue groups in worker processes; pika sees one broker.

What is checked here, with a real node and real clients: queues land in the queue groups; a publish
routed to queues of two groups is confirmed once and stored by each; consumers and acks reach the
queue's group; dead-lettering crosses groups (the message outbox); a transaction within a group
and one across groups commit; everything survives a restart (the group state in
each group's LMDB mirror); a worker killed takes its node down (a node is all its processes).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode
from tests.integration.helpers import consume_acked, wait_until
from tests.support.groups import channel


@pytest.fixture
def node(groups_node):
    return groups_node


def group_status(node: RaftmqNode, group: int) -> dict:
    return json.loads((Path(node.data_dir) / "groups" / f"g{group}" / "status.json").read_text())


def test_a_fanout_over_two_groups_is_confirmed_stored_by_each_and_consumed_from_each(node):
    """Two queues declared one after the other go to the two queue groups (balanced placement);
    50 confirmed publishes to a fanout bound to both reach each queue once; each queue's consumer
    gets its 50 and acks them; both workers applied batches (their status files)."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    ch.queue_declare("ga", durable=True)
    ch.queue_declare("gb", durable=True)
    ch.exchange_declare("gfan", "fanout", durable=True)
    ch.queue_bind("ga", "gfan")
    ch.queue_bind("gb", "gfan")
    for i in range(50):
        ch.basic_publish("gfan", "", b"m%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)
    assert ch.queue_declare("ga", passive=True).method.message_count == 50
    assert ch.queue_declare("gb", passive=True).method.message_count == 50
    assert consume_acked(ch, "ga", 50) == [b"m%d" % i for i in range(50)]
    assert consume_acked(ch, "gb", 50) == [b"m%d" % i for i in range(50)]
    assert ch.queue_declare("ga", passive=True).method.message_count == 0
    wait_until(lambda: all(group_status(node, g)["batches_applied"] > 0 for g in (1, 2)),
               what="both queue groups applying")
    conn.close()


def test_dead_lettering_crosses_groups_through_the_message_outbox(node):
    """A message expiring in a queue of one group is dead-lettered into a queue of the other
    (x-message-ttl, x-dead-letter-exchange): it arrives once, with its x-death header."""
    conn, ch = channel(node)
    ch.queue_declare("dl-target", durable=True)  # group 1
    ch.queue_declare("dl-source", durable=True, arguments={  # group 2
        "x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dl-target"})
    ch.basic_publish("", "dl-source", b"expiring")
    wait_until(lambda: ch.queue_declare("dl-target", passive=True).method.message_count == 1,
               what="the dead-lettered copy in the other group's queue")
    method, props, body = ch.basic_get("dl-target", auto_ack=True)
    assert body == b"expiring" and props.headers["x-death"][0]["queue"] == "dl-source"
    assert ch.queue_declare("dl-source", passive=True).method.message_count == 0
    conn.close()


def test_a_transaction_within_a_group_and_one_across_groups_both_commit(node):
    """0-9-1 tx.commit of publishes to one queue: one group's TxCommit, committed; of publishes
    to queues of two groups: the two-phase commit (tests/integration/test_tx_groups.py has its
    cases), committed in both."""
    conn, ch = channel(node)
    ch.queue_declare("tx-a")
    ch.queue_declare("tx-b")
    ch.tx_select()
    ch.basic_publish("", "tx-a", b"1")
    ch.basic_publish("", "tx-a", b"2")
    ch.tx_commit()
    assert ch.queue_declare("tx-a", passive=True).method.message_count == 2
    ch.basic_publish("", "tx-a", b"3")
    ch.basic_publish("", "tx-b", b"4")
    ch.tx_commit()
    assert ch.queue_declare("tx-b", passive=True).method.message_count == 1
    assert ch.queue_declare("tx-a", passive=True).method.message_count == 3
    conn.close()


def test_queues_their_groups_and_messages_survive_a_restart(node):
    """Durable queues in both queue groups, persistent messages, a binding: after a restart the
    queues are where they were (a publish to the fanout still reaches both) and hold their messages."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    ch.queue_declare("ra", durable=True)
    ch.queue_declare("rb", durable=True)
    ch.exchange_declare("rfan", "fanout", durable=True)
    ch.queue_bind("ra", "rfan")
    ch.queue_bind("rb", "rfan")
    for i in range(5):
        ch.basic_publish("rfan", "", b"before%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()
    node.terminate()
    node.start()
    conn, ch = channel(node)
    ch.confirm_delivery()
    ch.basic_publish("rfan", "", b"after", pika.BasicProperties(delivery_mode=2))
    expected = [b"before%d" % i for i in range(5)] + [b"after"]
    assert consume_acked(ch, "ra", 6) == expected
    assert consume_acked(ch, "rb", 6) == expected
    conn.close()


def test_a_killed_worker_stops_its_node_and_the_node_restarts_whole(node):
    """kill -9 of a queue group's worker: the node stops (it cannot serve that group's queues);
    started again, the confirmed messages of both groups are there."""
    conn, ch = channel(node)
    ch.confirm_delivery()
    ch.queue_declare("ka", durable=True)
    ch.queue_declare("kb", durable=True)
    for q in ("ka", "kb"):
        ch.basic_publish("", q, b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    os.kill(group_status(node, 1)["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 15
    while node.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not node.is_alive()
    node.start()
    conn, ch = channel(node)
    assert [ch.queue_declare(q, passive=True).method.message_count for q in ("ka", "kb")] == [1, 1]
    conn.close()
