"""The admin API over TLS (admin_tls_cert / admin_tls_key) and JSON log lines (log_format)."""

from __future__ import annotations

import json
import time

import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.test_tls import self_signed
from tests.support.cli import raftmq


def admin(*args: str):
    return raftmq("admin", *args)


@pytest.fixture
def node(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's admin API and logs")
    cert, key = self_signed(tmp_path)
    port = free_port()
    with RaftmqNode(tmp_path / "n", extra_args=["--admin-port", str(port), "--log-format", "json"],
                    env={"RAFTMQ_ADMIN_TLS_CERT": str(cert), "RAFTMQ_ADMIN_TLS_KEY": str(key)}) as n:
        n.admin_address, n.cert = f"localhost:{port}", cert
        yield n


def test_admin_over_tls_verifies_with_the_ca_and_refuses_plaintext(node):
    done = admin("--address", node.admin_address, "--tls-ca", str(node.cert), "--json", "health")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["serving"] is True
    plain = admin("--address", node.admin_address, "health")
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
    assert node.is_alive()


def test_log_lines_are_json_objects(node):
    deadline = time.monotonic() + 5
    lines = []
    while time.monotonic() < deadline and not any("listening" in line for line in lines):
        lines = [line for line in node.log_path.read_text().splitlines() if line.startswith("{")]
        time.sleep(0.1)
    entries = [json.loads(line) for line in lines]
    assert all(e["node"] == "n1" and e["time"].endswith("+00:00") for e in entries)
    assert any(e["level"] == "INFO" and "listening" in e["message"] for e in entries), entries
