"""A short chaos run in network namespaces (``raftmq chaos run --backend netns``), judged by the
total-queue checker: no confirmed message lost, nothing unexpected, no duplicate from the 0-10
session-resume publisher, identical replicas at the end.

The workload (``raftmq.ops.chaos.workload``): a 0-9-1 publisher with confirms and a 0-10
publisher with session resume, both failing over by themselves, and a 0-9-1 consumer; every
nemesis once or more: partition of the leader, kill -9 of a node and of the leader, SIGSTOP,
a bridge (two nodes cut from each other) and 20% packet loss; a second run adds kill -9 of every
node at once (full-cluster restarts), which found a journal lost at restart when a node died
between writing a snapshot and compacting its journal (raft/replica.py).
"""

from __future__ import annotations

import json
import shutil

import pytest

from raftmq.ops.chaos import backends, netns, runner

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")]

NEMESES = ["partition", "kill", "leader-kill", "pause", "bridge", "loss"]


def run(tmp_path, nemeses: list[str], duration: float) -> runner.RunResult:
    backend = backends.NetnsBackend(str(tmp_path / "cluster"))
    config = runner.RunConfig(duration=duration, nemeses=nemeses, fault_seconds=3.5, quiet_seconds=3.0, seed=7,
                              out_dir=str(tmp_path / "run"))
    result = runner.run_on_fresh(backend, config)
    report = result.report
    print(json.dumps({k: report[k] for k in ("confirmed", "confirmed_by_kind", "received", "recovered", "lost",
                                                "availability", "skipped")}, indent=1))
    return result


def check_valid(result: runner.RunResult, tmp_path) -> None:
    report = result.report
    assert not report["skipped"]
    assert report["confirmed_by_kind"]["0-9-1"] > 500 and report["confirmed_by_kind"]["0-10"] > 500
    assert not report["lost"] and not report["unexpected"], report
    assert not report["duplicated"]["0-10"], report["duplicated"]
    assert not report["duplicated"]["0-9-1-dedup"], report["duplicated"]  # resends deduplicated (issue 21)
    assert report["replicas_identical"] and not report["client_errors"]
    assert result.valid
    assert (tmp_path / "run" / "timeline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(shutil.which("iptables") is None,
                    reason="the loss nemesis needs iptables (make test installs it with apt-get as root)")
def test_faults_lose_no_confirmed_message_and_duplicate_no_session_publish(tmp_path):
    result = run(tmp_path, NEMESES, duration=75)
    assert {f.name.split()[0] for f in result.faults} >= {"partition", "kill", "pause", "cut", "20%"}
    check_valid(result, tmp_path)


def test_with_full_cluster_restarts(tmp_path):
    result = run(tmp_path, ["restart-all", "kill", "partition"], duration=45)
    assert any(f.name.startswith("restart all") for f in result.faults)
    check_valid(result, tmp_path)
