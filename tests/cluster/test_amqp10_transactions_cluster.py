"""AMQP 1.0 transactions (spec part 4) through a leader kill in a 3-node cluster.

A proton 0.40 client on a follower moves a message from queue A to queue B in a transaction (receive
from A, send to B, accept A's delivery, commit) while the leader is killed -9: just before the
discharge is sent, and just after.  The commit is one log entry (node/amqp10/transactions.py), so
whatever the timing the queues show all of it or none of it -- never half (the message in both queues
or in neither), never twice (two copies in B) -- and what the client was told matches: "committed"
means B holds the message and A does not; "commit failed" (amqp:transaction:rollback) means nothing
was applied; a lost connection (the node had no leader for ``leaderless_close_after``) leaves the
client in doubt, and the queues still hold exactly one copy.  The last round kills the leader and the
other follower just after the discharge: the client's node cannot commit anything, drops the client
(in doubt), and once the two are back the entry it proposed is applied whole or not at all.  4.3: the discharge is answered only
once the commit is applied, i.e. committed by a majority.
"""

from __future__ import annotations

import time

import pika
import pytest
from proton import ConnectionException, Message, Timeout
from proton.utils import BlockingConnection, LinkDetached

from raftmq.ops.local.cluster import Cluster
from tests.integration.test_amqp10_transactions import TRANSACTIONAL_STATE, declare

pytestmark = pytest.mark.cluster

TIMEOUT = 30


def _counts(cluster: Cluster, a: str, b: str) -> tuple[int, int]:
    conn = cluster.connection(cluster.leader(timeout=20), timeout=20)
    try:
        ch = conn.channel()
        return (ch.queue_declare(a, passive=True, durable=True).method.message_count,
                ch.queue_declare(b, passive=True, durable=True).method.message_count)
    finally:
        conn.close()


def _round(cluster: Cluster, index: int, kill: str) -> tuple[str, tuple[int, int]]:
    """One A->B transaction with the leader killed ``kill`` ("before"/"after") the discharge is sent, or
    ("majority") the leader and the other follower killed just after it: (what the client was told, the
    queues' counts once its connection is gone and the killed nodes are back)."""
    leader = cluster.leader(timeout=20)
    follower, other = cluster.followers()[:2]
    killed = [leader, other] if kill == "majority" else [leader]
    a, b = f"tx-a{index}", f"tx-b{index}"
    admin = cluster.connection(follower, timeout=20)
    ch = admin.channel()
    ch.queue_declare(a, durable=True)
    ch.queue_declare(b, durable=True)
    ch.basic_publish("", a, f"m{index}".encode(), pika.BasicProperties(delivery_mode=2))
    admin.close()
    cluster.wait_applied_equal()
    told = "in doubt"
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{follower.port}", timeout=TIMEOUT)
    try:
        txn, events = declare(amqp)
        receiver = amqp.create_receiver(f"/queues/{a}", credit=1)
        message = receiver.receive(timeout=TIMEOUT)
        received = receiver.fetcher.unsettled.popleft()
        sender = amqp.create_sender(f"/queues/{b}")
        sent = txn.send(sender.link, Message(body=message.body, durable=True))
        amqp.wait(lambda: sent.remote_state == TRANSACTIONAL_STATE, timeout=TIMEOUT, msg="posted")
        txn.accept(received)
        events.outcome = None
        if kill == "before":
            leader.kill9()
            txn.commit()
        else:
            txn.commit()
            amqp.container.timeout = 0.01
            amqp.container.process()  # the discharge leaves now
            for node in killed:
                node.kill9()
        amqp.wait(lambda: events.outcome is not None, timeout=TIMEOUT, msg="discharge outcome")
        told = events.outcome
        if told == "commit_failed":
            assert events.condition == "amqp:transaction:rollback", events.condition
    except (ConnectionException, LinkDetached, Timeout):
        pass  # the node dropped us: in doubt
    finally:
        try:
            amqp.close()
        except Exception:  # noqa: BLE001 - already gone
            pass
    for node in killed:
        if kill == "majority":
            node.start()
    # Once the client's connection is gone, an uncommitted accept returns its message to A.
    deadline = time.monotonic() + 30
    while True:
        counts = _counts(cluster, a, b)
        if sum(counts) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if kill != "majority":
        leader.start()
    for node in killed:
        cluster.wait_caught_up(node)
    return told, counts


def test_transaction_through_leader_kills_is_all_or_nothing(tmp_path) -> None:
    """4.3/4.4: through a leader kill, never half and never twice; what the client heard is the truth."""
    results = []
    with Cluster(3, tmp_path) as cluster:
        cluster.leader(timeout=20)
        for index, kill in enumerate(("before", "after", "before", "after", "majority")):
            told, (in_a, in_b) = _round(cluster, index, kill)
            results.append((kill, told, in_a, in_b))
            assert in_a + in_b == 1, results  # all or nothing: exactly one copy of the message
            if told == "committed":
                assert (in_a, in_b) == (0, 1), results
            elif told == "commit_failed":
                assert (in_a, in_b) == (1, 0), results
    print("leader-kill rounds (kill, client told, in A, in B):", results)
