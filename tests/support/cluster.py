"""Launch an N-node raftmq cluster of real processes on loopback ports for tests and benchmarks.

Each member is a :class:`RaftmqNode` started with one shared TOML file (members, secret).  The
nodes report their Raft role in ``<data>/status.json`` (node/status.py); ``digests()`` asks every
node for a state digest (SIGUSR1 -> ``digest.json``) to prove replicas are identical.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pika

from tests.support.raftmq_node import RaftmqNode, free_port


class ClusterError(RuntimeError):
    pass


class Cluster:
    def __init__(self, size: int = 3, base_dir: str | os.PathLike[str] | None = None, *,
                 extra_config: str = "", start_timeout: float = 30.0) -> None:
        self.base = Path(base_dir or tempfile.mkdtemp(prefix="raftmq-cluster-"))
        self.base.mkdir(parents=True, exist_ok=True)
        self.size = size
        amqp_ports = [free_port() for _ in range(size)]
        raft_ports = [free_port() for _ in range(size)]
        lines = ['host = "127.0.0.1"', 'cluster_secret = "test-secret-not-for-production"', extra_config, ""]
        for i in range(size):
            lines += ["[[cluster]]", f'node_id = "n{i + 1}"', f'raft = "127.0.0.1:{raft_ports[i]}"',
                      f'amqp = "127.0.0.1:{amqp_ports[i]}"', ""]
        self.config_path = self.base / "cluster.toml"
        self.config_path.write_text("\n".join(lines))
        self.nodes = [
            RaftmqNode(self.base / f"n{i + 1}", amqp_ports[i], node_id=f"n{i + 1}", config=self.config_path,
                       start_timeout=start_timeout)
            for i in range(size)
        ]

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Cluster:
        for node in self.nodes:
            node.start()
        self.wait_leader()
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.terminate()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes:
            if node.is_alive():
                node.kill9()

    # ------------------------------------------------------------------ status

    def status(self, node: RaftmqNode) -> dict | None:
        try:
            return json.loads((node.data_dir / "status.json").read_text())
        except (OSError, ValueError):
            return None

    def fresh_status(self, node: RaftmqNode, timeout: float = 5.0) -> dict | None:
        """A status written after now by the node's current process."""
        start = time.time()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status(node)
            if st and st.get("pid") == node.pid and st["time"] >= start:
                return st
            time.sleep(0.1)
        return None

    def leader(self, timeout: float = 10.0, exclude: RaftmqNode | None = None) -> RaftmqNode:
        """The node that every live node agrees is the leader (and that says so itself)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [n for n in self.nodes if n.is_alive() and n is not exclude]
            statuses = {n.node_id: self.status(n) for n in live}
            leaders = [n for n in live if (statuses[n.node_id] or {}).get("role") == "leader"
                       and (statuses[n.node_id] or {}).get("pid") == n.pid]
            if len(leaders) == 1:
                agreed = [s.get("leader_node") for s in statuses.values() if s and s.get("ready")]
                if len(agreed) > len(self.nodes) // 2 and all(a == leaders[0].node_id for a in agreed):
                    return leaders[0]
            time.sleep(0.05)
        raise ClusterError(f"no agreed leader within {timeout}s: "
                           f"{ {n.node_id: self.status(n) for n in self.nodes} }")

    wait_leader = leader

    def followers(self) -> list[RaftmqNode]:
        leader = self.leader()
        return [n for n in self.nodes if n is not leader and n.is_alive()]

    def wait_applied_equal(self, timeout: float = 20.0, nodes: list[RaftmqNode] | None = None) -> int:
        """Wait until the given (default: live) nodes have applied the same Raft index, twice in a row."""
        nodes = nodes or [n for n in self.nodes if n.is_alive()]
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            indexes = {n.node_id: (self.status(n) or {}).get("raft_applied") for n in nodes}
            values = set(indexes.values())
            if len(values) == 1 and None not in values:
                value = values.pop()
                if last == value:
                    return value
                last = value
            else:
                last = None
            time.sleep(0.6)
        raise ClusterError(f"applied indexes did not converge: {indexes}")

    def digests(self, nodes: list[RaftmqNode] | None = None, timeout: float = 10.0) -> dict[str, tuple[int, str]]:
        nodes = nodes or [n for n in self.nodes if n.is_alive()]
        start = time.time()
        for n in nodes:
            os.kill(n.pid, signal.SIGUSR1)
        out: dict[str, tuple[int, str]] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < len(nodes):
            for n in nodes:
                try:
                    d = json.loads((n.data_dir / "digest.json").read_text())
                except (OSError, ValueError):
                    continue
                if d["time"] >= start:
                    out[n.node_id] = (d["applied_index"], d["digest"])
            time.sleep(0.05)
        if len(out) < len(nodes):
            raise ClusterError(f"digests missing: got {sorted(out)}")
        return out

    # ------------------------------------------------------------------ clients

    def connection(self, node: RaftmqNode, timeout: float = 10.0, **params) -> pika.BlockingConnection:
        """A pika connection to ``node``, retried until the node accepts clients (has a leader)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return pika.BlockingConnection(pika.URLParameters(node.url + "?" + "&".join(
                    f"{k}={v}" for k, v in {"connection_attempts": 1, "socket_timeout": 5, **params}.items())))
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
