"""The ``disk-full`` nemesis (issue 17 item 5): a node's Raft store lives on a small filesystem of its
own (a 512 MiB tmpfs under <data>/raft), and the nemesis fills it to half the disk_free_limit for a
fault's length, then frees it. The node's disk alarm, evaluated as its store grows and every second,
blocks the publishers connected to it (connection.blocked; the node stops reading them) and unblocks
them when the space is back; the usual checker judges the run: no confirmed message lost, nothing
unexpected, no 0-10 duplicate, identical replicas.
"""

from __future__ import annotations

import json

import pytest

from raftmq.ops.chaos import backends, netns, runner

pytestmark = [pytest.mark.chaos,
              pytest.mark.skipif(not netns.available(), reason="needs root and iproute2 (network namespaces)")]


@pytest.mark.timeout(300)
def test_disk_full_blocks_publishers_and_loses_nothing(tmp_path):
    backend = backends.NetnsBackend(str(tmp_path / "cluster"), small_disks=512 << 20)
    config = runner.RunConfig(duration=40, nemeses=["disk-full"], fault_seconds=3.5, quiet_seconds=3.0, seed=7,
                              out_dir=str(tmp_path / "run"))
    result = runner.run_on_fresh(backend, config)
    report = result.report
    print(json.dumps({k: report[k] for k in ("confirmed", "confirmed_by_kind", "received", "lost",
                                                "availability", "skipped")}, indent=1))
    assert not report["skipped"]
    assert len(result.faults) >= 3 and all(f.name.startswith("disk-full") for f in result.faults)
    filled = {f.name.split()[1] for f in result.faults}
    for node in backend.cluster.nodes:
        if node.node_id in filled:
            text = node.log_path.read_text(errors="replace")
            assert "resource alarm set: low on disk" in text, node.node_id
            assert text.count("resource alarm cleared") >= text.count("resource alarm set"), node.node_id
    assert report["confirmed_by_kind"]["0-9-1"] > 100 and report["confirmed_by_kind"]["0-10"] > 100
    assert not report["lost"] and not report["unexpected"], report
    assert not report["duplicated"]["0-10"], report["duplicated"]
    assert not report["duplicated"]["0-9-1-dedup"], report["duplicated"]  # resends deduplicated (issue 21)
    assert report["replicas_identical"] and not report["client_errors"]
    assert result.valid
