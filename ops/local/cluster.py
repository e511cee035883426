"""Launch an N-node raftmq cluster of real processes (loopback ports, or network namespaces) for
tests, benchmarks and chaos runs.

Each member is a :class:`RaftmqNode` started with one shared TOML file (members, secret).  The
nodes report their Raft role in ``<data>/status.json`` (node/status.py); ``digests()`` asks every
node for a state digest (SIGUSR1 -> ``digest.json``) to prove replicas are identical.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .node import RaftmqNode, free_port


class ClusterError(RuntimeError):
    pass


class Cluster:
    def __init__(self, size: int = 3, base_dir: str | os.PathLike[str] | None = None, *,
                 extra_config: str = "", start_timeout: float = 30.0, network=None) -> None:
        """``network``: a :class:`raftmq.ops.chaos.netns.NetnsNetwork` to run the nodes in (one namespace
        and address each); by default every node runs on 127.0.0.1 with free ports."""
        self.base = Path(base_dir or tempfile.mkdtemp(prefix="raftmq-cluster-"))
        self.base.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.extra_config = extra_config
        self.start_timeout = start_timeout
        self.network = network
        self.hosts = network.addresses if network else ["127.0.0.1"] * size
        if network:
            self.members = [(f"n{i + 1}", 5672, 4401) for i in range(size)]
        else:
            self.members = [(f"n{i + 1}", free_port(), free_port()) for i in range(size)]
        self.config_path = self._write_config(self.base / "cluster.toml", self.members)
        self.nodes = [
            RaftmqNode(self.base / node_id, amqp, node_id=node_id, config=self.config_path,
                       start_timeout=start_timeout, host=self.hosts[i],
                       command_prefix=network.prefix(i) if network else None)
            for i, (node_id, amqp, _raft) in enumerate(self.members)
        ]

    @property
    def groups(self) -> int:
        """How many Raft groups each node runs (issue 34): ``raft_groups`` in the extra config,
        else RAFTMQ_RAFT_GROUPS (the nodes inherit the environment), else 1."""
        found = re.search(r"^\s*raft_groups\s*=\s*(\d+)", self.extra_config, re.MULTILINE)
        return int(found.group(1) if found else os.environ.get("RAFTMQ_RAFT_GROUPS") or 1)

    @property
    def queue_group(self) -> int:
        """The group a test's queues go in when pinned with :meth:`queue_arguments`: the first
        queue group when there are several, else the only one."""
        return 1 if self.groups > 1 else 0

    def queue_arguments(self, **arguments: object) -> dict:
        """Queue arguments placing a queue in :attr:`queue_group` (``x-queue-group``, issue 34;
        nothing with one group), so that a test knows whose journal, bodies and status to look at."""
        return {**arguments, "x-queue-group": 1} if self.groups > 1 else dict(arguments)

    @staticmethod
    def group_dir(node: RaftmqNode, group: int = 0) -> Path:
        """A group's data directory on ``node``: the node's own for group 0 (the metadata group,
        or the only one), ``groups/g<N>`` for queue group N (its worker's, node/worker.py)."""
        return node.data_dir if group == 0 else node.data_dir / "groups" / f"g{group}"

    def _write_config(self, path: Path, members: list[tuple[str, int, int]]) -> Path:
        lines = ['cluster_secret = "test-secret-not-for-production"', self.extra_config, ""]
        for i, (node_id, amqp, raft) in enumerate(members):
            host = self.hosts[i] if i < len(self.hosts) else "127.0.0.1"
            lines += ["[[cluster]]", f'node_id = "{node_id}"', f'raft = "{host}:{raft}"',
                      f'amqp = "{host}:{amqp}"', ""]
        path.write_text("\n".join(lines))
        return path

    def raft_address(self, node: RaftmqNode) -> str:
        return next(f"{node.host}:{raft}" for node_id, _a, raft in self.members if node_id == node.node_id)

    def admin(self, *args: str) -> str:
        """Run ``raftmq cluster ...`` with this cluster's config; return its stdout."""
        done = subprocess.run([sys.executable, "-m", "raftmq", "cluster", *args, "--config", str(self.config_path)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise ClusterError(f"raftmq cluster {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def add_node(self, admin_address: str | None = None) -> RaftmqNode:
        """Start a new member (its config lists every member and itself) and add it with
        ``raftmq cluster add``, or through the gRPC admin API at ``admin_address``."""
        node_id = f"n{len(self.members) + 1}"
        self.members.append((node_id, free_port(), free_port()))
        config = self._write_config(self.base / f"cluster-{node_id}.toml", self.members)
        node = RaftmqNode(self.base / node_id, self.members[-1][1], node_id=node_id, config=config,
                          start_timeout=self.start_timeout)
        node.start()
        if admin_address:
            self.grpc_admin(admin_address, "add-member", self.raft_address(node))
        else:
            self.admin("add", "--raft", self.raft_address(node))
        self.nodes.append(node)
        return node

    def remove_node(self, node: RaftmqNode, admin_address: str | None = None) -> None:
        if admin_address:
            self.grpc_admin(admin_address, "remove-member", self.raft_address(node))
        else:
            self.admin("remove", "--raft", self.raft_address(node))

    @staticmethod
    def grpc_admin(address: str, *args: str) -> str:
        """Run ``raftmq admin --address ADDRESS ...``; return its stdout."""
        done = subprocess.run([sys.executable, "-m", "raftmq", "admin", "--address", address, *args],
                              capture_output=True, text=True, timeout=90)
        if done.returncode != 0:
            raise ClusterError(f"raftmq admin {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Cluster:
        """Start every node and wait for the cluster to form; on failure stop what was started
        (``with Cluster(...)`` never reaches ``__exit__`` when ``__enter__`` raises)."""
        try:
            for node in self.nodes:
                node.start()
            self.wait_formed()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_formed(self, timeout: float = 20.0) -> RaftmqNode:
        """Wait for an agreed leader and for every node to be ready and to know every member's
        client address (members announce themselves through the log once a leader exists, so
        known-hosts lists and redirects are complete only after this)."""
        deadline = time.monotonic() + timeout
        wanted = sorted(n.node_id for n in self.nodes)
        while True:
            leader = self.leader(timeout=max(0.1, deadline - time.monotonic()))
            statuses = [self.status(n) for n in self.nodes]
            if all(s and s.get("ready") and s.get("members") == wanted for s in statuses):
                return leader
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster not formed within {timeout}s: {statuses}")
            time.sleep(0.05)

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

    def status(self, node: RaftmqNode, group: int = 0) -> dict | None:
        """``status.json`` of the node (``group`` 0) or of its queue group ``group``'s worker."""
        try:
            return json.loads((self.group_dir(node, group) / "status.json").read_text())
        except (OSError, ValueError):
            return None

    def fresh_status(self, node: RaftmqNode, timeout: float = 5.0, group: int = 0) -> dict | None:
        """A status written after now by the node's current process (for a queue group: by the
        worker of the node's current process, whose status carries the node's boot stamp)."""
        start = time.time()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.status(node, group)
            if st and st["time"] >= start and self._current(node, st, group):
                return st
            time.sleep(0.1)
        return None

    def _current(self, node: RaftmqNode, st: dict | None, group: int) -> bool:
        """Whether ``st`` (a status of ``group`` on ``node``) comes from the node's current process
        (for a queue group, from the worker of it: the same boot stamp)."""
        if not st:
            return False
        if group == 0:
            return st.get("pid") == node.pid
        main = self.status(node)
        return bool(main) and main.get("pid") == node.pid and main.get("boot") == st.get("boot")

    def leader(self, timeout: float = 10.0, exclude: RaftmqNode | None = None, group: int = 0) -> RaftmqNode:
        """The node that every live node agrees is the leader (and that says so itself) of
        ``group`` (issue 34: 0 is the metadata group, or the only one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [n for n in self.nodes if n.is_alive() and n is not exclude]
            statuses = {n.node_id: self.status(n, group) for n in live}
            leaders = [n for n in live if (statuses[n.node_id] or {}).get("role") == "leader"
                       and self._current(n, statuses[n.node_id], group)]
            if len(leaders) == 1:
                agreed = [s.get("leader_node") for s in statuses.values() if s and s.get("ready")]
                if len(agreed) > len(self.nodes) // 2 and all(a == leaders[0].node_id for a in agreed):
                    return leaders[0]
            time.sleep(0.05)
        raise ClusterError(f"no agreed leader of group {group} within {timeout}s: "
                           f"{ {n.node_id: self.status(n, group) for n in self.nodes} }")

    wait_leader = leader

    def followers(self) -> list[RaftmqNode]:
        leader = self.leader()
        return [n for n in self.nodes if n is not leader and n.is_alive()]

    def wait_applied_equal(self, timeout: float = 20.0, nodes: list[RaftmqNode] | None = None,
                           group: int = 0) -> int:
        """Wait until the given (default: live) nodes have applied the same Raft index of ``group``,
        twice in a row."""
        nodes = nodes or [n for n in self.nodes if n.is_alive()]
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            indexes = {n.node_id: (self.status(n, group) or {}).get("raft_applied") for n in nodes}
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

    def wait_caught_up(self, node: RaftmqNode, timeout: float = 30.0, group: int = 0) -> None:
        """Wait until ``node`` is ready and has applied what the leader had committed when asked
        (works under continuous load, unlike :meth:`wait_applied_equal`); for a queue group, what
        the highest commit index of the live nodes' replicas of it was."""
        if group == 0:
            leader = self.leader(timeout=timeout)
            target = (self.fresh_status(leader) or {}).get("commit_index") or 0
        else:
            target = max((self.fresh_status(n, group=group) or {}).get("commit_index") or 0
                         for n in self.nodes if n.is_alive())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.fresh_status(node, timeout=1.0, group=group) or {}
            if st.get("ready") and (st.get("raft_applied") or 0) >= target:
                return
            time.sleep(0.1)
        raise ClusterError(f"{node.node_id} did not catch up to {target} in group {group}: {self.status(node, group)}")

    def digests(self, nodes: list[RaftmqNode] | None = None, timeout: float = 10.0,
                path: str = "digest.json", group: int | None = None) -> dict[str, tuple[int, str]]:
        """Each node's state digest (SIGUSR1, then ``path`` under its data directory: a queue
        group's is ``groups/g<N>/digest.json``, issue 34, or name it by ``group``)."""
        if group:
            path = f"groups/g{group}/digest.json"
        nodes = nodes or [n for n in self.nodes if n.is_alive()]
        start = time.time()
        for n in nodes:
            os.kill(n.pid, signal.SIGUSR1)
        out: dict[str, tuple[int, str]] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < len(nodes):
            for n in nodes:
                try:
                    d = json.loads((n.data_dir / path).read_text())
                except (OSError, ValueError):
                    continue
                if d["time"] >= start:
                    out[n.node_id] = (d["applied_index"], d["digest"])
            time.sleep(0.05)
        if len(out) < len(nodes):
            raise ClusterError(f"digests missing: got {sorted(out)}")
        return out

    def all_digests(self, nodes: list[RaftmqNode] | None = None,
                    timeout: float = 10.0) -> dict[int, dict[str, tuple[int, str]]]:
        """:meth:`digests` of every group (one SIGUSR1 each time: the main process passes it on
        to its workers), by group number."""
        return {group: self.digests(nodes, timeout, group=group) for group in range(self.groups)}

    def wait_digests_equal(self, timeout: float = 20.0, nodes: list[RaftmqNode] | None = None) -> dict:
        """Wait until every group's replicas on the given (default: live) nodes have one digest
        each (a queue group's followers apply a moment after its leader); return the digests."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = self.all_digests(nodes)
            except ClusterError:
                found = {}
            if found and all(len({d for _index, d in by_node.values()}) == 1 for by_node in found.values()):
                return found
            if time.monotonic() > deadline:
                raise ClusterError(f"replicas differ: {found}")
            time.sleep(0.5)

    # ------------------------------------------------------------------ clients

    def connection(self, node: RaftmqNode, timeout: float = 10.0, **params):
        """A pika connection to ``node``, retried until the node accepts clients (has a leader)."""
        import pika  # a client library: needed by tests and chaos runs, not by the broker

        deadline = time.monotonic() + timeout
        while True:
            try:
                return pika.BlockingConnection(pika.URLParameters(node.url + "?" + "&".join(
                    f"{k}={v}" for k, v in {"connection_attempts": 1, "socket_timeout": 5, **params}.items())))
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
