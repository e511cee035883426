"""Launch a raftmq broker node as a real OS process (tests, benchmarks, chaos runs).

The node is started as ``sys.executable -m raftmq server --host 127.0.0.1 --port PORT --data-dir DIR``
(plus ``--node-id`` / ``--config`` when given), with stdout and stderr going to ``DIR/node.log``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

AMQP_HEADER = b"AMQP\x00\x00\x09\x01"


_LISTEN_PORTS = (10_000, 32_767)  # below Linux's ephemeral range (32768-60999 by default)
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


GROUP_PORT_MARGIN = 1_000  # a queue group's Raft port is its member's + g x raft_group_port_step (100)


def listen_range(env: Mapping[str, str]) -> tuple[int, int]:
    """The ports :func:`free_port` draws from: below the ephemeral range, and under pytest-xdist
    (``make test`` runs two workers) a slice of its own per worker.  Two processes each keep their
    own record of what they handed out, so without slices both could hand out the same port while
    neither had bound it yet, or while a test restarted its node.  Each slice ends
    ``GROUP_PORT_MARGIN`` early, for the queue groups' ports above a member's."""
    low, high = _LISTEN_PORTS[0], min(_LISTEN_PORTS[1], _ephemeral_low() - 1)
    worker = env.get("PYTEST_XDIST_WORKER", "")
    count = env.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        span = (high - low + 1) // int(count)
        low += int(worker[2:]) % int(count) * span
        high = low + span - 1 - GROUP_PORT_MARGIN
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, for a server started later.

    Taken below the kernel's ephemeral range: a port from that range (what binding to port 0
    gives) can be taken in the meantime as the local port of any outgoing connection -- a node's
    Raft links, a client -- and the server then fails with "address already in use" (seen in
    bench/failover.py).  Ports below it are only ever taken by explicit binds; none is handed out
    twice by one process, and pytest-xdist's workers draw from disjoint slices (:func:`listen_range`).
    """
    low, high = listen_range(os.environ)
    for _ in range(200):
        port = random.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range: the old way
        s.bind((host, 0))
        return s.getsockname()[1]


def probe_amqp(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when host:port answers the AMQP 0-9-1 protocol header with a connection.start method frame.

    The frame is: type 1 (method), channel 0, then class 10 / method 10 at the start of the payload.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(AMQP_HEADER)
            buf = b""
            deadline = time.monotonic() + timeout
            while len(buf) < 11 and time.monotonic() < deadline:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            return len(buf) >= 11 and buf[0] == 1 and buf[1:3] == b"\x00\x00" and buf[7:11] == b"\x00\x0a\x00\x0a"
    except OSError:
        return False


class NodeStartError(RuntimeError):
    pass


class RaftmqNode:
    """One raftmq server process.

    ``start()`` launches it and waits (``start_timeout``, 20 s by default) until the port answers the
    AMQP header with connection.start; ``kill9()`` sends SIGKILL; ``terminate()`` SIGTERM then waits;
    ``restart()`` starts it again on the same port with the same data dir.
    """

    host = "127.0.0.1"

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, port: int | None = None, *,
                 node_id: str | None = None, config: str | os.PathLike[str] | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 start_timeout: float = 20.0, require_amqp: bool = True, host: str | None = None,
                 command_prefix: list[str] | None = None) -> None:
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="raftmq-node-")
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.node_id = node_id
        self.config = config
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(env or {})
        self.start_timeout = start_timeout
        self.require_amqp = require_amqp
        if host is not None:
            self.host = host  # e.g. an address inside a network namespace the test created
        self.command_prefix = list(command_prefix or [])  # e.g. ["ip", "netns", "exec", "ns1"]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fh = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "node.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        cmd = [*self.command_prefix, sys.executable, "-m", "raftmq", "server", "--host", self.host,
               "--port", str(self.port),
               "--data-dir", str(self.data_dir)]
        if self.node_id:
            cmd += ["--node-id", self.node_id]
        if self.config:
            cmd += ["--config", str(self.config)]
        return cmd + self.extra_args

    def start(self) -> RaftmqNode:
        if self.proc is not None and self.proc.poll() is None:
            raise NodeStartError(f"node already running (pid {self.proc.pid})")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115 - kept open while the node runs
        self._log_fh.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(self.command())}\n".encode())
        self._log_fh.flush()
        self.proc = subprocess.Popen(self.command(), stdout=self._log_fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        try:
            self.wait_ready(self.start_timeout)
        except BaseException:
            self.kill9()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise NodeStartError(
                    f"raftmq exited with code {self.proc.returncode} during startup\n{self.log_tail()}")
            if self.require_amqp:
                if probe_amqp(self.host, self.port, timeout=1.0):
                    return
            else:
                try:
                    with socket.create_connection((self.host, self.port), timeout=0.5):
                        return
                except OSError:
                    pass
            time.sleep(0.1)
        raise NodeStartError(
            f"raftmq did not answer AMQP on {self.host}:{self.port} within {timeout}s\n{self.log_tail()}")

    def _close_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def kill9(self) -> None:
        """SIGKILL the node process (by PID) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close_log()

    def kill9_whole(self) -> None:
        """kill -9 of the whole node (issue 34: a node is all its processes): its queue groups'
        workers (pids from its status.json) at once, then its main process."""
        for info in ((self.status() or {}).get("groups") or {}).values():
            try:
                os.kill(int(info["pid"]), signal.SIGKILL)
            except (OSError, KeyError, ValueError, TypeError):
                pass
        self.kill9()

    def terminate(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._close_log()
        return self.proc.returncode

    stop = terminate

    def restart(self, *, hard: bool = False) -> RaftmqNode:
        """Stop (SIGKILL when ``hard`` else SIGTERM) and start again with the same data dir and port."""
        if hard:
            self.kill9()
        else:
            self.terminate()
        return self.start()

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict | None:
        """The node's status.json (written twice a second), or None before the first one."""
        try:
            return json.loads((self.data_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None

    def wait_history(self, timeout: float = 15.0) -> dict:
        """Wait until the audit writer has written every event the node applied (status.json);
        stop applying first (no client traffic) or the target keeps moving."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status()
            if st and st.get("pid") == self.pid and st.get("audit_last_seq") == st.get("event_seq") \
                    and st.get("time", 0) > time.time() - 0.4:
                first = st["event_seq"]
                time.sleep(0.6)  # and a later status agrees (nothing still in flight)
                st = self.status()
                if st and st.get("audit_last_seq") == st.get("event_seq") == first:
                    return st
            time.sleep(0.1)
        raise TimeoutError(f"audit history of {self.data_dir} did not catch up: {self.status()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def __enter__(self) -> RaftmqNode:
        if not self.is_alive():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()
