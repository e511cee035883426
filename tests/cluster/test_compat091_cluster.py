"""Issue 22's orderings in a three-node cluster, where a publish's confirm and return exist only once
its Raft entry is committed and applied: the client talks to a follower (every command goes to the
leader and back) and to the leader, with many channels and thousands of messages in flight.

The scenarios are the single-broker ones (tests/integration/compat091.py); see
tests/integration/test_compat091.py for the rules and their references.
"""

from __future__ import annotations

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.integration import compat091 as x

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(3, tmp_path_factory.mktemp("compat091")) as c:
        yield c


@pytest.fixture(params=["follower", "leader"])
def node(request, cluster):
    return cluster.followers()[0] if request.param == "follower" else cluster.leader()


@pytest.mark.timeout(180)
def test_confirms_precede_channel_close_ok(node):
    """20 channels x 400 confirm-mode publishes, each channel closed right after its last publish:
    every publish is confirmed before its channel's close-ok, nothing comes after it."""
    outcomes = x.confirms_then_close(node.host, node.port, channels=20, per_channel=400, timeout=120)
    for n, o in outcomes.items():
        assert o.closed and o.after_close == [] and o.duplicates == 0, (n, o.after_close[:5])
        assert o.confirmed == set(range(1, 401)), (n, len(o.confirmed))


@pytest.mark.timeout(180)
def test_returns_precede_later_replies(node):
    """20 channels x 50 rounds of (unroutable mandatory publish, confirm.select): per channel the
    return, then its ack, then select-ok, in publish order."""
    seen = x.returns_then_selects(node.host, node.port, channels=20, rounds=50, timeout=120)
    for n, events in seen.items():
        assert events == x.expected_returns_then_selects(n, 50), n


@pytest.mark.timeout(180)
def test_close_ok_then_the_node_waits_for_the_client(node):
    """Eight connections, each 2,000 publishes then connection.close in one write: each gets close-ok
    without a reset, and its socket stays open (later frames discarded) until the client closes it."""
    started = [x.start_burst_then_close(node.host, node.port, publishes=2000) for _ in range(8)]
    for c, queue in started:
        with c:
            outcome = x.finish_close(c, queue, hold=0.3, timeout=60)
        assert outcome.before_close_ok == [] and outcome.answered_later_frames == []
        assert outcome.open_after
