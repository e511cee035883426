"""AMQP 0-10 session resume on queues of queue groups across node kills (issue 34, session 20):
three nodes, ``raft_groups = 3``, a queue placed in queue group 1 (``x-queue-group``), a producer
session and a consumer session; the node leading the metadata group is killed (kill -9) twice and
restarted.  0-10 spec 3.5.4 replay and 3.6.2 re-attach: the clients re-attach with force on another
node, learn what was completed (every group's barrier intersected, store/core/group_sessions.py),
replay the rest; every message arrives exactly once, in order.  Afterwards every group's replicas
are identical.
"""

from __future__ import annotations

import asyncio

import pytest

from raftmq.client.amqp010 import Connection
from raftmq.ops.local.cluster import Cluster
from tests.cluster.test_groups_cluster import wait_group_digests_equal
from tests.support.groups import kill_leaders

pytestmark = pytest.mark.cluster

N = 300
QUEUE = "sessions-in-group-1"


async def produce(hosts: list[str]) -> int:
    conn = await Connection.connect(hosts)
    session = await conn.session(b"g-producer", timeout=60)
    for i in range(N):
        await session.publish("", QUEUE, str(i).encode(), persistent=True)
    await conn.close()
    return conn.reconnects


async def consume(hosts: list[str]) -> tuple[list[int], int]:
    conn = await Connection.connect(hosts)
    session = await conn.session(b"g-consumer", timeout=60)
    subscription = await session.subscribe(QUEUE, window=50)
    got: list[int] = []
    while len(got) < N:
        message = await subscription.get(timeout=60)
        assert message is not None, f"stalled after {len(got)} messages"
        got.append(int(message.body))
        await message.accept()
    extra = await subscription.get(timeout=2)  # anything more would be a duplicate
    await conn.close()
    return got + ([int(extra.body)] if extra else []), conn.reconnects


def test_sessions_on_a_queue_group_queue_are_exactly_once_across_metadata_leader_kills(tmp_path):
    with Cluster(3, tmp_path, extra_config="raft_groups = 3") as cluster:
        leader = cluster.leader()
        conn = cluster.connection(leader)
        conn.channel().queue_declare(QUEUE, durable=True, arguments={"x-queue-group": 1})
        conn.close()
        hosts = [f"127.0.0.1:{n.port}" for n in sorted(cluster.nodes, key=lambda n: n is leader)]

        async def run():
            return await asyncio.wait_for(asyncio.gather(produce(hosts), consume(hosts),
                                                         kill_leaders(cluster, 2, 1.5, 1.0)), 300)

        producer_reconnects, (got, consumer_reconnects), kills = asyncio.run(run())
        assert kills == 2
        assert producer_reconnects + consumer_reconnects >= 1  # the kills did hit the clients
        missing = sorted(set(range(N)) - set(got))
        duplicates = sorted({i for i in got if got.count(i) > 1})
        assert not missing and not duplicates, f"missing {missing}, duplicated {duplicates}"
        assert got == list(range(N)), "out of order"  # every message, once, in order
        for group in range(1, 3):
            wait_group_digests_equal(cluster, group, timeout=60)
