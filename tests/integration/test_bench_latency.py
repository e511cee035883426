"""Smoke test of bench/latency.py (issue 30's instrument), run as a user runs it, with tiny counts.

One 3-node cluster of this checkout (no old checkout, no RabbitMQ), one round of 20 round trips
per cell: every protocol's cell (0-9-1 publisher confirms; 1.0 unsettled transfer settled by an
``accepted`` disposition, spec 2.6.12 and 3.4.2; 0-10 transfer completed by session.completed,
spec 3.6.1, on a follower thanks to connection.open ``insist``, spec L4135) and both placements
must print numbers, the client must have been where the placement says, and --json must hold
the same cells.  Timings are printed by the script, never asserted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"\d+\.\d\d"


def test_latency_bench_prints_every_cell(tmp_path: Path) -> None:
    """Each (protocol, placement) row of the round shows p50/p99/p999 and confirm p50/p99 for
    ``new``; the summary has the medians and the goal lines; the JSON has 20 samples per cell, the
    percentiles ordered (p50 <= p99 <= p999) and the client on a follower / the leader as asked."""
    out_json = tmp_path / "latency.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.latency", "--new", str(ROOT), "--no-old", "--no-rabbitmq",
         "--rounds", "1", "--count", "20", "--cell-seconds", "10", "--max-minutes", "2", "--json", str(out_json)],
        cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for protocol in ("0-9-1", "1.0", "0-10"):
        for placement in ("follower", "leader"):
            row = re.search(rf"^  {re.escape(protocol)}\s+{placement}\s+new "
                            rf"{NUMBER}/{NUMBER}/{NUMBER} c {NUMBER}/{NUMBER}$", out, re.M)
            assert row, f"no {protocol} {placement} row with numbers in:\n{out}"
            assert re.search(rf"^{re.escape(protocol)} {placement}\s+p50\s+{NUMBER}$", out, re.M), out
            assert f"{protocol} {placement}".ljust(16) + " p50 < 1 ms: " in out
    assert "MISPLACED" not in out and "WARNING" not in out and "FAILED" not in out, out
    assert "new follower: client on n" in out and "(follower)" in out, out
    assert "(leader), leader n" in out, out

    data = json.loads(out_json.read_text())
    assert data["rounds"][0]["round"] == 1 and data["rounds"][0]["order"] == ["new"]
    cells = data["rounds"][0]["cells"]
    assert {(c["protocol"], c["placement"]) for c in cells} == {
        (p, q) for p in ("0-9-1", "1.0", "0-10") for q in ("follower", "leader")}
    for cell in cells:
        assert cell["system"] == "new" and cell["na"] == "" and cell["failed"] == "" and cell["placed"], cell
        assert cell["samples"] == 20, cell
        assert 0 < cell["p50"] <= cell["p99"] <= cell["p999"], cell
        assert 0 < cell["confirm p50"] <= cell["confirm p99"], cell
    assert set(data["medians"]) == {f"{p} {q}" for p in ("0-9-1", "1.0", "0-10") for q in ("follower", "leader")}
