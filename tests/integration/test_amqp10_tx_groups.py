"""AMQP 1.0 transactions across queue groups (issue 34, session 21): one node with three Raft
groups (``node``), python-qpid-proton's transaction API against queues placed with
``x-queue-group`` in groups 1 and 2 (two worker processes), counted with pika.

A discharge (4.3) whose work touches queues of several groups is committed by the two-phase
commit through the groups' logs (docs/design.md "Transactions across groups"): its posted
transfers (4.4.1) and its retirements (4.4.2, the accepts of deliveries of both groups) happen
together or not at all, and the discharge is answered once, after the decision.  Section numbers
cite /work/shared/specs/amqp-1-0.txt; the transaction errors are 4.5.8's.  Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

from tests.integration.helpers import uniq, wait_until  # noqa: E402
from tests.integration.test_amqp10_transactions import TRANSACTIONAL_STATE, declare, discharge  # noqa: E402
from tests.support.groups import channel  # noqa: E402

TIMEOUT = 10


@pytest.fixture(scope="module")
def node(module_groups_node):
    return module_groups_node


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


@pytest.fixture
def setup(node):
    """A pika channel, a 1.0 connection, queues q1 (group 1) and q2 (group 2) holding "old" each,
    and the queues the transactions send to, t1 (group 1) and t2 (group 2): no link receives from
    those, so their counts show what was committed."""
    conn, ch = channel(node)
    q1, q2, t1, t2 = uniq("q1"), uniq("q2"), uniq("t1"), uniq("t2")
    for name, group in ((q1, 1), (q2, 2), (t1, 1), (t2, 2)):
        ch.queue_declare(name, durable=True, arguments={"x-queue-group": group})
    for name in (q1, q2):
        ch.basic_publish("", name, b"old")
    amqp = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=TIMEOUT)
    yield ch, amqp, q1, q2, t1, t2
    amqp.close()
    conn.close()


def work(amqp, txn, q1: str, q2: str, send_to: tuple[str, ...]):
    """Receive the old message of each queue (our receivers keep it acquired), accept both received
    deliveries and post a new one to each of ``send_to``, all in ``txn``: the receivers."""
    receivers, received = [], []
    for queue in (q1, q2):
        receiver = amqp.create_receiver(f"/queues/{queue}", credit=1)
        assert receiver.receive(timeout=TIMEOUT).body == b"old"
        receivers.append(receiver)
        received.append(receiver.fetcher.unsettled.popleft())
    for delivery in received:
        txn.accept(delivery)
    # The posting outcomes come after the accepts were read (one connection's frames, in order).
    sent = [txn.send(amqp.create_sender(f"/queues/{queue}").link, Message(body=b"new", inferred=True))
            for queue in send_to]
    amqp.wait(lambda: all(d.remote_state == TRANSACTIONAL_STATE for d in sent), timeout=TIMEOUT, msg="posted")
    return receivers


def test_a_discharge_over_two_groups_commits_every_send_and_accept(setup):
    """4.3 fail=false: the sends to t1 and t2 and the accepts of q1's and q2's old messages happen at
    the commit and not before (4.4.1: held until the discharge); after it t1 and t2 hold the new
    message, and q1's and q2's old ones stay gone after the connection closes."""
    ch, amqp, q1, q2, t1, t2 = setup
    txn, events = declare(amqp)
    work(amqp, txn, q1, q2, (t1, t2))
    assert (count(ch, t1), count(ch, t2)) == (0, 0)
    assert discharge(amqp, txn, events, commit=True) == "committed"
    assert (count(ch, t1), count(ch, t2)) == (1, 1)
    amqp.close()
    wait_until(lambda: (count(ch, q1), count(ch, q2)) == (0, 0), timeout=5, what="after close")
    assert [ch.basic_get(q, auto_ack=True)[2] for q in (t1, t2)] == [b"new", b"new"]
    assert (count(ch, q1), count(ch, q2)) == (0, 0)


def test_a_discharge_over_two_groups_rolled_back_applies_nothing(setup):
    """4.3 fail=true: neither send happens (t1, t2 empty), neither accept: both old messages come
    back (released, 4.4.4.2) once the receivers are closed."""
    ch, amqp, q1, q2, t1, t2 = setup
    txn, events = declare(amqp)
    receivers = work(amqp, txn, q1, q2, (t1, t2))
    assert discharge(amqp, txn, events, commit=False) == "aborted"
    assert (count(ch, t1), count(ch, t2)) == (0, 0)
    for receiver in receivers:
        receiver.close()
    wait_until(lambda: (count(ch, q1), count(ch, q2)) == (1, 1), timeout=5, what="the old ones back")
    assert [ch.basic_get(q, auto_ack=True)[2] for q in (q1, q2)] == [b"old", b"old"]
    assert (count(ch, t1), count(ch, t2)) == (0, 0)


def test_a_discharge_one_group_cannot_do_is_rejected_and_nothing_is_applied(setup):
    """4.4.4.1 ("MUST NOT allow the successful discharge"): q1 is deleted after its message was
    received and accepted in the transaction (its receiving link is detached with
    amqp:resource-deleted); the commit is rejected with amqp:transaction:rollback (4.5.8) and
    nothing of it happens: t2 gets no new message and q2's old one is not accepted (back in q2 once
    its receiver closes).  (The front end refuses this one before the two-phase commit, since the
    link that received the delivery is gone; a participant's own refusal at prepare, the delivery
    gone with its link still attached, is tests/unit/node/test_tx_groups_sessions.py's.)"""
    ch, amqp, q1, q2, _t1, t2 = setup
    txn, events = declare(amqp)
    receivers = work(amqp, txn, q1, q2, (t2,))
    ch.queue_delete(q1)
    with pytest.raises(LinkDetached):
        amqp.wait(lambda: False, timeout=TIMEOUT, msg="q1's receiver detached")
    assert discharge(amqp, txn, events, commit=True) == "commit_failed"
    assert events.condition == "amqp:transaction:rollback"
    assert count(ch, t2) == 0
    receivers[1].close()
    wait_until(lambda: count(ch, q2) == 1, timeout=5, what="q2's old message back")
    assert ch.basic_get(q2, auto_ack=True)[2] == b"old"


def test_a_participant_refusing_at_prepare_rejects_the_discharge_and_nothing_is_applied(setup, node):
    """The refusal of the two-phase commit itself: worker 1 (group 1) is stopped (SIGSTOP) and q1
    deleted by another connection (its delete waits in group 1's log), so the front end still sees
    q1's receiving link attached and sends the discharge to the coordinator; group 1 applies the
    delete, then its prepare finds the accepted delivery gone and refuses (406); every group
    aborts.  The discharge is answered once, rejected with amqp:transaction:rollback (4.5.8,
    4.4.4.1), and t2 gets no new message and q2 keeps its old one."""
    ch, amqp, q1, q2, _t1, t2 = setup
    txn, events = declare(amqp)
    receivers = work(amqp, txn, q1, q2, (t2,))
    other_conn, other = channel(node)  # (open before worker 1 stops: a channel opens in every group)
    worker1 = json.loads((Path(node.data_dir) / "groups" / "g1" / "status.json").read_text())["pid"]
    deleter = threading.Thread(target=other.queue_delete, args=(q1,), daemon=True)
    os.kill(worker1, signal.SIGSTOP)
    try:
        deleter.start()
        time.sleep(0.5)  # the delete reaches group 1's log ahead of the prepare
        events.outcome = None
        txn.commit()
        with contextlib.suppress(proton.Timeout):
            amqp.wait(lambda: events.outcome is not None, timeout=1.0, msg="(the discharge sent)")
        assert events.outcome is None  # group 1 has not voted
    finally:
        os.kill(worker1, signal.SIGCONT)
    deadline = time.monotonic() + TIMEOUT
    while events.outcome is None and time.monotonic() < deadline:
        with contextlib.suppress(LinkDetached):  # q1's receiver, detached by the delete
            amqp.wait(lambda: events.outcome is not None, timeout=TIMEOUT, msg="discharge")
    assert events.outcome == "commit_failed" and events.condition == "amqp:transaction:rollback"
    deleter.join(TIMEOUT)
    other_conn.close()
    assert count(ch, t2) == 0
    receivers[1].close()
    wait_until(lambda: count(ch, q2) == 1, timeout=5, what="q2's old message back")
    assert ch.basic_get(q2, auto_ack=True)[2] == b"old"
