"""A 0-9-1 client pipelining behind queue.declare through a follower of a 3-node cluster with queue
groups (issue 34; node/amqp091/channel.py "order behind a topology change").

On a follower the node's view (its replica of the metadata group) and its queue groups' replicas
apply the declare at their own pace, after the leader: the channel holds the publish and the get
sent behind the declare until the declare's reply, which comes from this node's replicas (the
metadata group's, joined with each queue group's echo).  AMQP 0-9-1 general 4.7 (a channel's methods
in order), 4.6 (a synchronous method's effects visible after its response).  Checked over raw frames
(tests/integration/test_groups_pipelining.py's helpers): for several new queues, declare + a confirmed
mandatory publish + basic.get in one write, through a follower: declare-ok, get-ok with the body, the
publish acked, no basic.return.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.integration import rawamqp as r
from tests.integration.test_groups_pipelining import answers, publish, queue_declare

pytestmark = pytest.mark.cluster

QUEUES = 5


@pytest.fixture
def cluster(tmp_path):
    with Cluster(3, tmp_path, extra_config="raft_groups = 3") as c:
        yield c


def test_pipelined_declare_publish_get_through_a_follower(cluster):
    leader = cluster.leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    run = uuid.uuid4().hex[:8]
    with r.RawClient(follower.host, follower.port, timeout=30) as c:
        c.handshake()
        c.open_channel(1)
        c.send(r.method_frame(1, r.CONFIRM_SELECT, b"\x00"))
        c.expect_method(r.CONFIRM_SELECT_OK, 1)
        for i in range(QUEUES):
            queue = f"pipe-cluster-{run}-{i}"
            c.send(queue_declare(1, queue) + publish(1, "", queue, b"body %d" % i, mandatory=True)
                   + r.basic_get(1, queue))
            events = answers(c, 1, r.BASIC_GET_OK)
            assert [m for m, _ in events if m != r.BASIC_ACK] == [r.QUEUE_DECLARE_OK, r.BASIC_GET_OK], events
            assert events[-1][1] == b"body %d" % i
            acked = [struct.unpack_from(">Q", p, 4)[0] for m, p in events if m == r.BASIC_ACK]
            while not acked or acked[-1] < i + 1:  # this publish's confirm (delivery tag i + 1)
                f = c.read_method(30)
                assert f.method == r.BASIC_ACK, f
                acked.append(struct.unpack_from(">Q", f.payload, 4)[0])
