"""node/descriptors.py: the reserve's arithmetic and the refusal log's rate limit (issue 31 item 4)."""

from __future__ import annotations

import logging

from raftmq.node.descriptors import DescriptorReserve, RefusalLog, open_descriptors


def test_reserve_refuses_once_fewer_than_reserve_remain_and_counts_kept_sockets():
    reserve = DescriptorReserve(reserve=10, limit=100)
    reserve._counted, reserve._counted_at = 89, float("inf")  # a count that stays fresh
    assert not reserve.exhausted()  # 89 open: 11 left
    reserve.kept()
    assert not reserve.exhausted()  # 90: exactly 10 left
    reserve.kept()
    assert reserve.exhausted()  # 91: 9 left


def test_reserve_is_at_most_half_the_limit():
    assert DescriptorReserve(reserve=256, limit=200).reserve == 100


def test_open_descriptors_counts_this_process():
    before = open_descriptors()
    with open(__file__) as _fh:
        assert open_descriptors() == before + 1


def test_refusal_log_logs_once_per_interval_and_then_the_count(caplog):
    refusals = RefusalLog(logging.getLogger("test.refusals"), interval=3600)
    with caplog.at_level(logging.WARNING):
        for i in range(100):
            refusals.warning("flood", "refused %d", i)
    assert [r.getMessage() for r in caplog.records] == ["refused 0"]
    refusals._last["flood"] = float("-inf")
    with caplog.at_level(logging.WARNING):
        refusals.warning("flood", "refused %d", 100)
    assert caplog.records[-1].getMessage() == "refused 100 (and 99 more like it not logged in the last 3600s)"
