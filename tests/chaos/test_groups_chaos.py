"""A short chaos run with queue groups (issue 34: "the chaos harness and its checker run with several
groups ... and stay VALID"): three nodes in network namespaces, each with ``raft_groups = 3`` (the
metadata group in the main process, queue groups 1 and 2 in worker processes), the usual workload
with its 0-9-1 queues placed in queue groups 1 and 2 (``x-queue-group``) and the 0-10 session
queue in the metadata group, under kill -9 of a random node and of the node leading the most groups.

Checked: the total-queue checker's verdict (no confirmed message lost, nothing unexpected or
damaged, no duplicate from the 0-10 session-resume publisher or into the deduplicating queue); every
group's replicas identical at the end (group 0's digests and each queue group's worker digest,
``<data>/groups/g<N>/digest.json``); both queue groups carried the workload (their Raft logs grew);
and a node is all its processes: after each kill -9 of a node's main process its workers stopped by
themselves (their link closed) before the node was started again, none left running.
"""

from __future__ import annotations

import json

import pytest

from raftmq.ops.chaos import backends, netns, runner

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")]


@pytest.mark.timeout(240)
def test_kills_with_three_groups_lose_nothing_and_leave_every_groups_replicas_identical(tmp_path):
    backend = backends.NetnsBackend(str(tmp_path / "cluster"), groups=3)
    config = runner.RunConfig(duration=25, nemeses=["leader-kill", "kill"], fault_seconds=3.0, quiet_seconds=3.0,
                              seed=34, out_dir=str(tmp_path / "run"), groups=3)
    result = runner.run_on_fresh(backend, config)
    report = result.report
    print(json.dumps({k: report[k] for k in ("valid", "confirmed_by_kind", "received", "lost_count", "recovered",
                                                "groups_identical", "group_applied", "worker_exit_seconds",
                                                "worker_stragglers", "node_exits", "fault_errors", "settle_error")},
                     indent=1))
    for fault in result.faults:
        print(f"{fault.start:7.1f} {fault.end:7.1f} {fault.name}")
    kills = [f.name for f in result.faults if f.name.startswith("kill -9")]
    assert len(kills) >= 2 and any(f.startswith("kill -9 leader") for f in kills), kills
    assert all("(leads group" in name for name in kills)  # the groups each killed node led
    assert report["confirmed_by_kind"]["0-9-1"] > 200 and report["confirmed_by_kind"]["0-10"] > 200
    assert report["confirmed_by_kind"]["0-9-1-dedup"] > 200
    assert report["lost_count"] == 0 and not report["unexpected"] and report["damaged_count"] == 0, report["lost"]
    assert not report["duplicated"]["0-10"] and not report["duplicated"]["0-9-1-dedup"], report["duplicated"]
    # Every group's replicas: group 0 in ``digests``, queue groups 1 and 2 in ``group_digests``.
    assert report["replicas_identical"] is True
    assert sorted(report["group_digests"]) == ["1", "2"]
    for group, digests in report["group_digests"].items():
        assert len(digests) == 3 and len(set(digests.values())) == 1, (group, digests)
    assert report["groups_identical"] == {"1": True, "2": True}
    # Each queue group's log carried its queue's publishes, acks and consumes (not only the topology).
    assert report["group_applied"]["1"] > 200 and report["group_applied"]["2"] > 200, report["group_applied"]
    # A node is all its processes: every killed main process's workers went by themselves.
    assert len(report["worker_exit_seconds"]) == len(kills) and not report["worker_stragglers"]
    assert not report["node_exits"] and not report["fault_errors"] and report["settle_error"] is None
    assert not report["drain_errors"] and not report["client_errors"]
    assert result.valid
