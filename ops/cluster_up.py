"""`raftmq cluster up`: a local cluster of N nodes on loopback ports, with embedded defaults.

Writes one shared TOML file (members and a generated secret kept in ``<data>/cluster.secret``,
mode 0600), starts one ``raftmq server`` process per member, prints the client URLs, and on
Ctrl-C / SIGTERM stops exactly the processes it started (by PID).  Restarting it reuses the
data directories and the secret, so the cluster comes back with its state.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path


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
    procs: list[subprocess.Popen] = []
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
            where.append(f"management API http://{host}:{http_base + i}/api/overview")
        if metrics_base:
            cmd += ["--metrics-port", str(metrics_base + i)]
            where.append(f"metrics http://{host}:{metrics_base + i}/metrics")
        if admin_base:
            cmd += ["--admin-port", str(admin_base + i)]
            where.append(f"gRPC admin {host}:{admin_base + i}")
        procs.append(subprocess.Popen(cmd))
        print(f"started {node_id} (pid {procs[-1].pid}): {', '.join(where)}", flush=True)
    print(f"cluster config: {config}; Ctrl-C stops all {nodes} nodes", flush=True)
    try:
        while not stopping:
            for p in procs:
                if p.poll() is not None:
                    print(f"node pid {p.pid} exited with {p.returncode}", file=sys.stderr, flush=True)
                    stopping = True
            time.sleep(0.2)
    finally:
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
