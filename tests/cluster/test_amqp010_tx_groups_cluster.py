"""AMQP 0-10 transactions across queue groups in a three-node cluster (issue 34, session 21):
``raft_groups = 3``, a real 0-10 client (client/amqp010.py) committing transactions that transfer
to a queue of group 1 and one of group 2, while the node it is connected to -- the metadata
group's leader (0-10 clients are redirected to it), the coordinator of the two-phase commit --
is killed (-9).

0-10 spec class tx (tx.commit L6280ff) with session resume (3.5.4 replay, 3.6.2 re-attach, the
idempotence barrier of 3.2.4): the client fails over, resumes its session and is told which of its
commands completed.  Checked: every transaction is whole (each body in both queues or in
neither); every commit the client saw complete is in both queues exactly once, in order; a commit
the client was told aborted (TransactionAborted: its buffered work died with the node, or its
outcome was abort) is in neither; nothing is applied twice; every group's replicas end identical.
"""

from __future__ import annotations

import asyncio

import pytest

from raftmq.client.amqp010 import Connection, TransactionAborted
from raftmq.ops.local.cluster import Cluster
from tests.cluster.test_tx_groups_cluster import bodies

pytestmark = pytest.mark.cluster

COMMITS = 30


def test_commits_across_groups_through_a_kill_of_the_coordinators_node_are_whole_and_exactly_once(tmp_path):
    with Cluster(3, tmp_path, extra_config="raft_groups = 3") as cluster:
        leader = cluster.leader()
        conn = cluster.connection(leader)
        ch = conn.channel()
        ch.queue_declare("x-a", durable=True, arguments={"x-queue-group": 1})
        ch.queue_declare("x-b", durable=True, arguments={"x-queue-group": 2})
        conn.close()
        hosts = [f"127.0.0.1:{n.port}" for n in cluster.nodes]

        async def scenario() -> tuple[list[int], list[int], int]:
            client = await Connection.connect(hosts)  # redirected to the metadata leader
            assert client.current == f"127.0.0.1:{leader.port}"
            session = await client.session(b"tx-across", timeout=60)
            await session.tx_select()
            committed: list[int] = []
            aborted: list[int] = []
            kill: asyncio.Future | None = None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            for i in range(COMMITS):
                if loop.time() > deadline:
                    break
                await session.publish("", "x-a", b"%d" % i, persistent=True)
                await session.publish("", "x-b", b"%d" % i, persistent=True)
                commit = asyncio.ensure_future(session.tx_commit())
                if i == 8:  # killed with this commit in flight
                    kill = asyncio.ensure_future(asyncio.to_thread(leader.kill9))
                try:
                    await asyncio.wait_for(commit, 40)
                    committed.append(i)
                except TransactionAborted:
                    aborted.append(i)
            if kill is not None:
                await kill
            reconnects = client.reconnects
            await client.close()
            return committed, aborted, reconnects

        committed, aborted, reconnects = asyncio.run(asyncio.wait_for(scenario(), 150))
        assert reconnects >= 1 and len(committed) + len(aborted) == COMMITS
        assert len(committed) >= COMMITS - 3  # (at most the one in flight and the next are lost)
        survivor = next(n for n in cluster.nodes if n is not leader)
        conn = cluster.connection(survivor, timeout=20)
        ch = conn.channel()
        a, b = bodies(ch, "x-a"), bodies(ch, "x-b")
        conn.close()
        assert a == b == [b"%d" % i for i in committed], (committed, aborted, a, b)
        leader.start()
        cluster.wait_digests_equal(timeout=60)  # every group's replicas, the restarted node's too
