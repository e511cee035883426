"""free_port's ranges (ops/local/node.py listen_range): disjoint per pytest-xdist worker."""

from raftmq.ops.local.node import GROUP_PORT_MARGIN, listen_range


def test_without_xdist_the_whole_range():
    low, high = listen_range({})
    assert low == 10_000 and high >= low + 10_000


def test_two_workers_get_disjoint_slices_with_room_for_group_ports():
    whole = listen_range({})
    gw0 = listen_range({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2"})
    gw1 = listen_range({"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"})
    assert whole[0] == gw0[0] < gw0[1] < gw1[0] < gw1[1] <= whole[1]
    assert gw0[1] + GROUP_PORT_MARGIN < gw1[0]  # a queue group's port above gw0's stays out of gw1's
    assert gw1[1] + GROUP_PORT_MARGIN <= whole[1] + 1


def test_one_worker_or_garbage_is_the_whole_range():
    assert listen_range({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "1"}) == listen_range({})
    assert listen_range({"PYTEST_XDIST_WORKER": "master", "PYTEST_XDIST_WORKER_COUNT": "x"}) == listen_range({})
