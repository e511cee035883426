"""`raftmq cluster up`: a local cluster of N nodes on loopback ports, with embedded defaults.

Writes one shared TOML file (members and a generated secret kept in ``<data>/cluster.secret``,
mode 0600), starts one ``raftmq server`` process per member, prints the client URLs, and on
Ctrl-C / SIGTERM stops exactly the processes it started (by PID).  Restarting it reuses the
data directories and the secret, so the cluster comes back with its state.

A node that dies (kill -9, a crash) is started again, with its data, after a backoff: 0.5 s,
doubling to at most 30 s while it keeps dying young, back to 0.5 s once it ran for a minute.  The
others keep serving meanwhile (a majority of three survives one death), so failover can be shown
with this very command; each death and restart is one line on stderr.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from raftmq.store.disk.sealed import EXIT_STORE_DAMAGED
from raftmq.versions import EXIT_FORMAT_TOO_NEW

BACKOFF_FIRST = 0.5  # seconds before the first restart of a node that died
BACKOFF_MAX = 30.0
HEALTHY_AFTER = 60.0  # a node that ran this long starts over at BACKOFF_FIRST when it dies


@dataclass
class Supervised:
    """One member's process, restarted with a backoff when it dies."""

    node_id: str
    command: list[str]
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    backoff: float = BACKOFF_FIRST
    restart_at: float | None = None  # monotonic time of the next start, while it is down
    restarts: int = 0
    given_up: bool = False

    def start(self) -> None:
        self.process = subprocess.Popen(self.command)
        self.started_at = time.monotonic()
        self.restart_at = None

    def check(self, now: float) -> None:
        """Notice a death and schedule the restart; start it when its time has come."""
        if self.given_up:
            return
        if self.restart_at is None and self.process is not None and self.process.poll() is not None:
            if self.process.returncode == EXIT_FORMAT_TOO_NEW:  # its data needs a newer raftmq: no retry helps
                print(f"node {self.node_id} exited: its data was written by a newer raftmq; not restarting it",
                      file=sys.stderr, flush=True)
                self.given_up = True
                return
            if self.process.returncode == EXIT_STORE_DAMAGED:  # a damaged store: a person must look
                print(f"node {self.node_id} exited: a store of its own is damaged (its log names it; "
                      f"`raftmq verify --data-dir` lists it); not restarting it", file=sys.stderr, flush=True)
                self.given_up = True
                return
            if now - self.started_at >= HEALTHY_AFTER:
                self.backoff = BACKOFF_FIRST
            print(f"node {self.node_id} (pid {self.process.pid}) exited with {self.process.returncode}; "
                  f"restarting in {self.backoff:.1f} s", file=sys.stderr, flush=True)
            self.restart_at = now + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        elif self.restart_at is not None and now >= self.restart_at:
            self.start()
            self.restarts += 1
            print(f"restarted {self.node_id} (pid {self.process.pid})", file=sys.stderr, flush=True)


def write_cluster_files(data_dir: Path, nodes: int, host: str, amqp_base: int, raft_base: int) -> Path:
    data_dir.mkdir(parents=True, exist_ok=True)
    secret_file = data_dir / "cluster.secret"
    if not secret_file.exists():
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
    lines = [f'host = "{host}"', f'cluster_secret_file = "{secret_file.resolve()}"', ""]
    for i in range(nodes):
        lines += ["[[cluster]]", f'node_id = "n{i + 1}"', f'raft = "{host}:{raft_base + i}"',
                  f'amqp = "{host}:{amqp_base + i}"', ""]
    config = data_dir / "cluster.toml"
    config.write_text("\n".join(lines))
    return config


def cluster_up(nodes: int = 3, host: str = "127.0.0.1", amqp_base: int = 5672, raft_base: int = 4401,
               data_dir: str = "data", log_level: str = "INFO", metrics_base: int = 15692,
               admin_base: int = 15680, http_base: int = 15672) -> int:
    root = Path(data_dir)
    config = write_cluster_files(root, nodes, host, amqp_base, raft_base)
    members: list[Supervised] = []
    stopping = False

    def stop(*_args) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for i in range(nodes):
        node_id = f"n{i + 1}"
        cmd = [sys.executable, "-m", "raftmq", "server", "--config", str(config), "--node-id", node_id,
               "--port", str(amqp_base + i), "--data-dir", str(root / node_id), "--log-level", log_level]
        where = [f"amqp://guest:guest@{host}:{amqp_base + i}/%2F"]
        if http_base:
            cmd += ["--http-port", str(http_base + i)]
            where.append(f"management UI http://{host}:{http_base + i}/ (API /api/)")
        if metrics_base:
            cmd += ["--metrics-port", str(metrics_base + i)]
            where.append(f"metrics http://{host}:{metrics_base + i}/metrics")
        if admin_base:
            cmd += ["--admin-port", str(admin_base + i)]
            where.append(f"gRPC admin {host}:{admin_base + i}")
        member = Supervised(node_id, cmd)
        member.start()
        members.append(member)
        print(f"started {node_id} (pid {member.process.pid}): {', '.join(where)}", flush=True)
    print(f"cluster config: {config}; a node that dies is restarted; Ctrl-C stops all {nodes} nodes", flush=True)
    try:
        while not stopping:
            now = time.monotonic()
            for member in members:
                member.check(now)
            time.sleep(0.1)
    finally:
        procs = [m.process for m in members if m.process is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return 0
