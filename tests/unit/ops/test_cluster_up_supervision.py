"""`raftmq cluster up` restarts a node that died, but not one that cannot start: data of a newer
raftmq (78) or a damaged store of its own (74, issue 29) -- a restart would only fail again."""

from __future__ import annotations

import sys
import time

import pytest

from raftmq.ops.cluster_up import Supervised


def exiting_with(status: int) -> Supervised:
    node = Supervised("n1", [sys.executable, "-c", f"raise SystemExit({status})"])
    node.start()
    node.process.wait(10)
    return node


@pytest.mark.parametrize("status", [74, 78])
def test_a_node_that_cannot_start_is_not_restarted(status, capsys):
    node = exiting_with(status)
    node.check(time.monotonic())
    assert node.given_up and node.restart_at is None
    assert "not restarting" in capsys.readouterr().err


def test_a_node_that_died_otherwise_is_restarted_after_a_backoff():
    node = exiting_with(1)
    now = time.monotonic()
    node.check(now)
    assert not node.given_up and node.restart_at is not None
    node.check(node.restart_at)
    assert node.restarts == 1
    node.process.wait(10)
