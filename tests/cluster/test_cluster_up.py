"""`raftmq cluster up` survives a killed node: the supervisor restarts it with a backoff and a log
line while the others keep serving; Ctrl-C (SIGINT) still stops every node it started."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from raftmq.ops.local.node import free_port, probe_amqp
from tests.support.http_api import call

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _consecutive_free(count: int) -> int:
    """A base port with ``count`` free ports from it (the cluster uses base+i)."""
    for _ in range(100):
        base = free_port()
        sockets = []
        try:
            for i in range(count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no run of free ports")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_node_is_restarted_and_ctrl_c_stops_all(tmp_path):
    amqp, raft, http = _consecutive_free(3), _consecutive_free(3), _consecutive_free(3)
    up = subprocess.Popen([sys.executable, "-m", "raftmq", "cluster", "up", "--data-dir", str(tmp_path),
                           "--amqp-base-port", str(amqp), "--raft-base-port", str(raft), "--http-base-port", str(http),
                           "--admin-base-port", "0", "--metrics-base-port", "0", "--log-level", "WARNING"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read(stream) -> None:
        for line in stream:
            lines.append(line)

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in (up.stdout, up.stderr)]
    for r in readers:
        r.start()
    pids: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 30
        while len(pids) < 3 and time.monotonic() < deadline:
            for line in list(lines):
                m = re.match(r"started (n\d) \(pid (\d+)\)", line)
                if m:
                    pids[m.group(1)] = int(m.group(2))
            time.sleep(0.1)
        assert len(pids) == 3, lines
        assert any(f"management UI http://127.0.0.1:{http}/" in line for line in lines)  # the UI's URL
        deadline = time.monotonic() + 30
        while not all(probe_amqp("127.0.0.1", amqp + i) for i in range(3)):
            assert time.monotonic() < deadline, lines
            time.sleep(0.2)

        os.kill(pids["n2"], signal.SIGKILL)
        killed_at = time.monotonic()
        restarted = None
        while restarted is None and time.monotonic() - killed_at < 30:
            assert up.poll() is None, lines  # the supervisor keeps running
            for line in list(lines):
                m = re.match(r"restarted n2 \(pid (\d+)\)", line)
                if m:
                    restarted = int(m.group(1))
            # the other two keep serving meanwhile
            assert probe_amqp("127.0.0.1", amqp) and probe_amqp("127.0.0.1", amqp + 2)
            time.sleep(0.1)
        assert restarted is not None and restarted != pids["n2"], lines
        assert any(re.match(r"node n2 \(pid \d+\) exited with -9; restarting in", line) for line in lines)
        while not probe_amqp("127.0.0.1", amqp + 1):
            assert time.monotonic() - killed_at < 30, lines
            time.sleep(0.2)
        back_after = time.monotonic() - killed_at
        assert back_after < 15, back_after  # "back within seconds"
        status, _ = call(f"http://127.0.0.1:{http + 1}", "GET", "/api/overview")
        assert status == 200
        pids["n2"] = restarted
    finally:
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()
            code = up.wait()
        for pid in pids.values():  # whatever the supervisor left: only our own children, by PID
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert code == 0
    assert not any(_alive(pid) for pid in pids.values())
