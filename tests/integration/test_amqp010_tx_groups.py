"""AMQP 0-10 transactions across queue groups (issue 34, session 21): one node with three Raft
groups (the ``node`` fixture; or a node of its own for the kill), a real 0-10 client
(client/amqp010.py) over a real socket, queues placed with ``x-queue-group`` in groups 1 and 2
(two worker processes), counted with pika.

The 0-10 spec's tx class (/work/shared/specs/amqp-0-10.txt, 2.8 "Transactions", tx.commit L6280ff,
tx.rollback L6307ff): once a session is selected transactional, "the commands issued by the client
that instruct message transfer and message acceptance on that session are only committed on the
server once a tx.commit command has been issued"; a message published in a transaction "will not
be available for delivery from any queue to which it is routed until the transaction completes";
a rollback discards the transfers and accepts, and the messages stay acquired by the client.
raftmq commits such a transaction over queues of several groups all or nothing, by the two-phase
commit through the groups' logs (docs/design.md "Transactions across groups"), and completes the
tx.commit once, after the decision.  A part that cannot commit (an accepted message whose queue
was deleted) aborts every group: the commit fails with an execution exception, 406
precondition-failed (0-10 3.4.1.3; error code 406 "precondition-failed"), nothing applied.

Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from raftmq.client.amqp010 import ClientError, Connection, SessionException, TransactionAborted
from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp010 import codec as c
from tests.integration.helpers import uniq, wait_until
from tests.support.groups import channel

TIMEOUT = 10


@pytest.fixture(scope="module")
def node(module_groups_node):
    return module_groups_node


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def two_queues(ch, old: bool = True) -> tuple[str, str]:
    """A queue in group 1 and one in group 2, each with one message ``old`` when asked."""
    names = (uniq("txg1"), uniq("txg2"))
    for name, group in zip(names, (1, 2), strict=True):
        ch.queue_declare(name, durable=True, arguments={"x-queue-group": group})
        if old:
            ch.basic_publish("", name, b"old")
    return names


async def transactional_work(session, q1: str, q2: str) -> None:
    """In the open transaction: receive (acquire) the old message of each queue and accept it,
    transfer a new one to each.  The subscriptions are stopped first (message.stop L6186ff), so
    that what the commit or the rollback makes available stays in the queues to be counted."""
    for queue in (q1, q2):
        subscription = await session.subscribe(queue, destination=f"d-{queue}", window=1)
        message = await subscription.get(timeout=TIMEOUT)
        assert message is not None and message.body == b"old"
        await session.execute(c.MessageStop(destination=f"d-{queue}"))
        await message.accept()
    await session.publish("", q1, b"new")
    await session.publish("", q2, b"new")


async def transaction_in_flight(hosts: list[str], q1: str, q2: str):
    """A new session with tx.select and ``transactional_work`` done: (client, session)."""
    client = await Connection.connect(hosts)
    session = await client.session(uniq("tx").encode(), timeout=0)
    await session.tx_select()
    await transactional_work(session, q1, q2)
    return client, session


def test_a_commit_over_two_groups_makes_every_transfer_and_accept_happen_together(node):
    """tx.select; accept a message of q1 (group 1) and of q2 (group 2), transfer one to each; before
    tx.commit another connection sees neither transfer (and the old messages are acquired, not
    ready); the commit completes, and then both new messages are in their queues and both old ones
    gone for good (not back after the session's connection closed)."""
    conn, ch = channel(node)
    q1, q2 = two_queues(ch)
    hosts = [f"127.0.0.1:{node.port}"]

    async def scenario() -> None:
        client, session = await transaction_in_flight(hosts, q1, q2)
        assert (count(ch, q1), count(ch, q2)) == (0, 0)  # nothing published yet, the old ones acquired
        await session.tx_commit()
        assert (count(ch, q1), count(ch, q2)) == (1, 1)
        await client.close()

    try:
        run(scenario())
        wait_until(lambda: (count(ch, q1), count(ch, q2)) == (1, 1), timeout=5, what="after close")
        assert [ch.basic_get(q, auto_ack=True)[2] for q in (q1, q2)] == [b"new", b"new"]
        assert (count(ch, q1), count(ch, q2)) == (0, 0)
    finally:
        conn.close()


def test_a_rollback_over_two_groups_discards_every_transfer_and_accept(node):
    """tx.rollback (L6307ff): the transfers are discarded (neither queue gets a new message) and the
    accepts too: the old messages stay acquired by the session, and come back to their queues when
    it ends; a transaction after the rollback commits normally."""
    conn, ch = channel(node)
    q1, q2 = two_queues(ch)
    hosts = [f"127.0.0.1:{node.port}"]

    async def scenario() -> None:
        client, session = await transaction_in_flight(hosts, q1, q2)
        await session.tx_rollback()
        assert (count(ch, q1), count(ch, q2)) == (0, 0)  # no new message; the old ones still acquired
        await session.publish("", q1, b"later")
        await session.publish("", q2, b"later")
        await session.tx_commit()
        assert (count(ch, q1), count(ch, q2)) == (1, 1)
        await client.close()

    try:
        run(scenario())
        wait_until(lambda: (count(ch, q1), count(ch, q2)) == (2, 2), timeout=5, what="the old ones back")
        assert sorted(ch.basic_get(q1, auto_ack=True)[2] for _ in range(2)) == [b"later", b"old"]
        assert sorted(ch.basic_get(q2, auto_ack=True)[2] for _ in range(2)) == [b"later", b"old"]
    finally:
        conn.close()


def test_a_part_one_group_cannot_commit_aborts_both_and_the_commit_fails_406(node):
    """q1 is deleted (another connection) between the accept and tx.commit: group 1 cannot accept
    its message (the delivery is gone) and refuses; every group aborts: q2 gets no new message, its
    old one is not accepted (back in q2 once the session ends), and the commit fails with an
    execution exception 406 precondition-failed, which ends the session (3.4.1.3)."""
    conn, ch = channel(node)
    q1, q2 = two_queues(ch)
    hosts = [f"127.0.0.1:{node.port}"]

    async def scenario() -> int:
        client, session = await transaction_in_flight(hosts, q1, q2)
        ch.queue_delete(q1)
        with pytest.raises(SessionException) as refused:
            await session.tx_commit()
        await client.close()
        return refused.value.error_code

    try:
        assert run(scenario()) == 406
        wait_until(lambda: count(ch, q2) == 1, timeout=5, what="q2's old message back")
        assert ch.basic_get(q2, auto_ack=True)[2] == b"old"
    finally:
        conn.close()


def test_a_session_resumed_while_its_commit_is_deciding_learns_it_committed_exactly_once(node):
    """Worker 2 is stopped (SIGSTOP) before tx.commit: the metadata group has begun the commit and
    group 1 prepared, group 2 has not.  The client's transport is cut then; it reconnects and
    re-attaches its session (3.6.2, force) while the transaction is still deciding.  The resume
    is answered only once the transaction ended (worker 2 continued, SIGCONT), and reports the
    commit complete, so the client's tx.commit returns normally: not replayed as lost (the client
    would have rolled it back and reported it aborted although it committed), not applied twice.
    Both queues hold the message once."""
    conn, ch = channel(node)
    q1, q2 = two_queues(ch, old=False)
    worker2 = json.loads((Path(node.data_dir) / "groups" / "g2" / "status.json").read_text())["pid"]
    hosts = [f"127.0.0.1:{node.port}"]

    async def scenario() -> int:
        client = await Connection.connect(hosts, stall_timeout=0)
        session = await client.session(uniq("tx").encode(), timeout=60)
        await session.tx_select()
        await session.publish("", q1, b"once")
        await session.publish("", q2, b"once")
        os.kill(worker2, signal.SIGSTOP)
        try:
            commit = asyncio.ensure_future(session.tx_commit())
            await asyncio.sleep(1.0)  # begun, group 1 prepared; group 2 stopped
            assert not commit.done()
            client._drop_transport()
            await asyncio.sleep(2.0)  # the client re-attaches meanwhile: its answer waits
            assert not commit.done()
        finally:
            os.kill(worker2, signal.SIGCONT)
        await asyncio.wait_for(commit, 30)
        reconnects = client.reconnects
        await client.close()
        return reconnects

    try:
        assert run(scenario()) == 1
        assert (count(ch, q1), count(ch, q2)) == (1, 1)
        assert [ch.basic_get(q, auto_ack=True)[2] for q in (q1, q2)] == [b"once", b"once"]
    finally:
        conn.close()


def test_a_session_resumed_while_its_commit_aborts_learns_it_was_not_committed(node):
    """The transaction accepts q1's message (group 1) and transfers one to q2 (group 2).  Worker 1
    is stopped (SIGSTOP); another connection deletes q1 (its delete waits in group 1's log, ahead
    of the prepare); tx.commit; the transport is cut and the client re-attaches while the
    transaction decides.  Worker 1 continues: it deletes q1, then refuses its part (the accepted
    delivery is gone) and every group aborts.  The resume is answered only after the abort, without
    the commit in its completed set, so the client knows the commit did not happen (it replays it
    as lost: TransactionAborted) -- answered at once, the resume would have reported the commit
    complete (every group's barrier held its id) although it aborted.  q2 has no message."""
    conn, ch = channel(node)
    q1, q2 = two_queues(ch, old=False)
    ch.basic_publish("", q1, b"old")
    worker1 = json.loads((Path(node.data_dir) / "groups" / "g1" / "status.json").read_text())["pid"]
    hosts = [f"127.0.0.1:{node.port}"]
    deleted = threading.Event()
    other_conn, other = channel(node)  # (open before worker 1 stops: a channel opens in every group)

    def delete_q1() -> None:
        other.queue_delete(q1)  # answered once worker 1 continues
        other_conn.close()
        deleted.set()

    async def scenario() -> BaseException | None:
        client = await Connection.connect(hosts, stall_timeout=0)
        session = await client.session(uniq("tx").encode(), timeout=60)
        await session.tx_select()
        subscription = await session.subscribe(q1, destination="d", window=1)
        message = await subscription.get(timeout=TIMEOUT)
        assert message is not None
        await session.execute(c.MessageStop(destination="d"))
        await message.accept()
        await session.publish("", q2, b"never")
        os.kill(worker1, signal.SIGSTOP)
        try:
            threading.Thread(target=delete_q1, daemon=True).start()
            await asyncio.sleep(0.5)  # the delete reaches group 1's log first
            commit = asyncio.ensure_future(session.tx_commit())
            await asyncio.sleep(1.0)
            assert not commit.done()
            client._drop_transport()
            await asyncio.sleep(2.0)  # the client re-attaches meanwhile
            assert not commit.done()
        finally:
            os.kill(worker1, signal.SIGCONT)
        done, _ = await asyncio.wait([commit], timeout=30)
        assert done
        with contextlib.suppress(ClientError):
            await client.close()
        return commit.exception()

    try:
        outcome = run(scenario())
        assert isinstance(outcome, TransactionAborted), repr(outcome)
        assert deleted.wait(10)
        assert count(ch, q2) == 0
    finally:
        conn.close()


def test_a_node_killed_between_prepare_and_decision_is_whole_after_restart(tmp_path, broker_kind):
    """Worker 2 is stopped (SIGSTOP) before tx.commit: group 1 prepares (holds its transfer in its
    LMDB mirror) and votes, the metadata group keeps the record; the whole node is killed (-9)
    with the commit unanswered.  After the restart the coordinator's and group 1's records come
    back from their mirrors; a single node keeps no sessions over a restart, so group 2 finds the
    session gone and refuses, and every group aborts: neither queue shows the message, and the
    client's commit fails (it never completed).  A transaction of a new session then commits in
    both groups (the per-group sequence numbers came back too)."""
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    with RaftmqNode(tmp_path / "node", env={"RAFTMQ_RAFT_GROUPS": "3"}) as n:
        conn, ch = channel(n)
        q1, q2 = two_queues(ch, old=False)
        conn.close()
        worker2 = json.loads((Path(n.data_dir) / "groups" / "g2" / "status.json").read_text())["pid"]

        async def killed() -> BaseException | None:
            client = await Connection.connect([f"127.0.0.1:{n.port}"], stall_timeout=0, reconnect_timeout=2)
            session = await client.session(uniq("tx").encode(), timeout=120)
            await session.tx_select()
            await session.publish("", q1, b"half")
            await session.publish("", q2, b"half")
            os.kill(worker2, signal.SIGSTOP)
            commit = asyncio.ensure_future(session.tx_commit())
            await asyncio.sleep(1.0)  # group 1 prepares and votes meanwhile; group 2 is stopped
            assert not commit.done()  # no answer before the decision
            n.kill9()
            os.kill(worker2, signal.SIGKILL)
            done, _ = await asyncio.wait([commit], timeout=30)
            assert done, "the commit's caller was never told"
            with contextlib.suppress(ClientError):
                await client.close()
            return commit.exception()

        assert isinstance(run(killed(), timeout=60), ClientError)
        n.start()
        conn, ch = channel(n)
        assert (count(ch, q1), count(ch, q2)) == (0, 0)

        async def after() -> None:
            client = await Connection.connect([f"127.0.0.1:{n.port}"])
            session = await client.session(uniq("tx").encode(), timeout=0)
            await session.tx_select()
            await session.publish("", q1, b"after")
            await session.publish("", q2, b"after")
            await asyncio.wait_for(session.tx_commit(), 15)
            await client.close()

        run(after())
        assert (count(ch, q1), count(ch, q2)) == (1, 1)
        conn.close()
