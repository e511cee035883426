"""Transactions across queue groups on one node (issue 34): ``raft_groups = 3``, pika's tx class
over queues of the metadata group and both queue groups, committed by the two-phase commit
through the groups' logs (store/core/tx_groups.py; docs/design.md "Transactions across groups").

AMQP 0-9-1 reference 1.9 (class tx): "all publish and ack requests issued within a transaction
will complete successfully or none of them will" (the spec asks it of one queue; raftmq keeps it
across queues and groups); a part a group cannot commit (an ack whose delivery is gone) is
refused with 406 precondition-failed (reference, constants), and then every group aborts.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode

GROUPS = {"RAFTMQ_RAFT_GROUPS": "3"}


@pytest.fixture(scope="module")
def node(tmp_path_factory, broker_kind):
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    with RaftmqNode(tmp_path_factory.mktemp("txg") / "node", env=GROUPS) as n:
        yield n


def channel(node: RaftmqNode):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    return conn, conn.channel()


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def declare_three(ch, prefix: str) -> tuple[str, str, str]:
    """Queues in group 1, group 2 and the metadata group (x-queue-group pins them)."""
    names = (f"{prefix}-g1", f"{prefix}-g2", f"{prefix}-g0")
    for name, group in zip(names, (1, 2, 0), strict=True):
        ch.queue_declare(name, durable=True, arguments={"x-queue-group": group})
    return names


def test_publishes_to_two_groups_and_an_ack_in_a_third_commit_all_together(node):
    """tx.select; publish to queues of groups 1 and 2, ack a message got from a queue of group 0;
    before tx.commit another connection sees none of it; after tx.commit-ok it sees all of it
    (both messages queued, the acked one gone for good: not requeued when the channel closes),
    and a mandatory publish routed nowhere in the same transaction comes back as basic.return."""
    conn, ch = channel(node)
    a, b, c = declare_three(ch, "all")
    ch.basic_publish("", c, b"to-ack", pika.BasicProperties(delivery_mode=2))
    method, _props, body = ch.basic_get(c)
    assert body == b"to-ack"
    returned: list[bytes] = []
    ch.add_on_return_callback(lambda _ch, _m, _p, body: returned.append(body))
    ch.tx_select()
    ch.basic_publish("", a, b"one", pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("", b, b"two", pika.BasicProperties(delivery_mode=2))
    ch.basic_publish("", "no-such-queue", b"back", mandatory=True)
    ch.basic_ack(method.delivery_tag)
    other_conn, other = channel(node)
    assert (count(other, a), count(other, b)) == (0, 0)
    ch.tx_commit()
    assert (count(other, a), count(other, b), count(other, c)) == (1, 1, 0)
    conn.process_data_events(0.2)
    assert returned == [b"back"]
    conn.close()  # the ack was committed: closing the channel requeues nothing
    assert count(other, c) == 0
    assert other.basic_get(a, auto_ack=True)[2] == b"one"
    assert other.basic_get(b, auto_ack=True)[2] == b"two"
    other_conn.close()


def test_a_part_a_group_cannot_commit_aborts_every_group(node):
    """The transaction acks a message of queue g1 and publishes to g1, g2 and g0; before the
    commit another connection deletes g1 (its delivery is gone): group 1 refuses at prepare, the
    coordinator aborts, the client's channel gets 406 and no group shows any of the publishes.
    Then a second transaction on a new channel commits normally (nothing stays held)."""
    conn, ch = channel(node)
    g1, g2, g0 = declare_three(ch, "refused")
    ch.basic_publish("", g1, b"to-ack")
    method, _props, _body = ch.basic_get(g1)
    ch.tx_select()
    ch.basic_publish("", g2, b"never")
    ch.basic_publish("", g0, b"never")
    ch.basic_ack(method.delivery_tag)
    other_conn, other = channel(node)
    other.queue_delete(g1)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.tx_commit()
    assert refused.value.reply_code == 406
    assert (count(other, g2), count(other, g0)) == (0, 0)
    ch = conn.channel()
    ch.tx_select()
    ch.basic_publish("", g2, b"later")
    ch.basic_publish("", g0, b"later")
    ch.tx_commit()
    assert (count(other, g2), count(other, g0)) == (1, 1)
    conn.close()
    other_conn.close()


def test_many_transactions_across_groups_in_a_row_each_commit_once(node):
    """20 transactions, each one publish to a queue of each queue group: 20 messages in each,
    in order (each transaction's prepares are applied once, in order, per group)."""
    conn, ch = channel(node)
    a, b, _c = declare_three(ch, "row")
    ch.tx_select()
    for i in range(20):
        ch.basic_publish("", a, b"%d" % i)
        ch.basic_publish("", b, b"%d" % i)
        ch.tx_commit()
    assert (count(ch, a), count(ch, b)) == (20, 20)
    assert [ch.basic_get(a, auto_ack=True)[2] for _ in range(20)] == [b"%d" % i for i in range(20)]
    conn.close()


def test_a_node_killed_with_a_transaction_half_prepared_finishes_it_whole_after_restart(tmp_path, broker_kind):
    """Worker 2 is stopped (SIGSTOP) before tx.commit: group 1 prepares (holds the publish in its
    LMDB mirror) and votes, group 0 keeps the record; then the whole node is killed (-9).  After
    the restart the coordinator's and group 1's records come back from their mirrors, group 2 gets
    its prepare and refuses (the client's channel died with the node), every group aborts: neither
    queue shows the message.  A transaction after that commits in both (the per-group sequence
    numbers came back too: a lost one would leave the next prepare waiting forever)."""
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    with RaftmqNode(tmp_path / "node", env=GROUPS) as n:
        conn, ch = channel(n)
        ch.queue_declare("k-g1", durable=True, arguments={"x-queue-group": 1})
        ch.queue_declare("k-g2", durable=True, arguments={"x-queue-group": 2})
        ch.tx_select()
        ch.basic_publish("", "k-g1", b"half", pika.BasicProperties(delivery_mode=2))
        ch.basic_publish("", "k-g2", b"half", pika.BasicProperties(delivery_mode=2))
        worker2 = json.loads((Path(n.data_dir) / "groups" / "g2" / "status.json").read_text())["pid"]
        os.kill(worker2, signal.SIGSTOP)
        failed: list[BaseException] = []

        def commit() -> None:
            try:
                ch.tx_commit()
            except BaseException as exc:  # noqa: BLE001 - the node dies under it
                failed.append(exc)

        committer = threading.Thread(target=commit)
        committer.start()
        time.sleep(1.0)  # group 1 prepares and votes meanwhile; group 2 is stopped
        assert committer.is_alive()  # no answer: group 2 has not voted
        n.kill9()
        os.kill(worker2, signal.SIGKILL)
        committer.join(timeout=15)
        assert not committer.is_alive() and failed
        n.start()
        conn, ch = channel(n)
        assert (count(ch, "k-g1"), count(ch, "k-g2")) == (0, 0)
        ch.tx_select()
        ch.basic_publish("", "k-g1", b"after")
        ch.basic_publish("", "k-g2", b"after")
        done = threading.Event()
        threading.Thread(target=lambda: (ch.tx_commit(), done.set()), daemon=True).start()
        assert done.wait(15), "the next transaction did not complete"
        assert (count(ch, "k-g1"), count(ch, "k-g2")) == (1, 1)
        conn.close()
