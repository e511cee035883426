"""Where a chaos run's three nodes live and how faults are made there.

Both backends offer the same operations on node indexes 0..n-1: ``kill`` (SIGKILL) and
``start``, ``pause`` / ``resume`` (SIGSTOP / SIGCONT, docker pause), ``cut`` (drop the traffic
between pairs of nodes, both ways), ``loss`` (drop a fraction of a node's incoming packets),
``heal`` (undo cuts and loss), ``restart_all``, ``leader`` and ``settle`` (wait until the nodes
agree again); the netns backend also ``fill_disk`` / ``free_disk`` (a ballast file on a node's
small store filesystem, ``small_disks``).  ``damage(i, spec, rng)`` flips bits in, cuts or deletes
files of a stopped node (``damage.py``: the pure functions, the file layout): on the host's data
directory (netns) or the container's data volume (compose, the container stopped).

* ``NetnsBackend``: node processes in network namespaces (``netns.py``); cuts are blackhole
  routes, loss is ``iptables -m statistic`` inside the node's namespace.  Runs in CI (root).
* ``ComposeBackend``: the docker-compose cluster (``docker-compose.yml``); cuts and loss are
  iptables rules in the host's ``DOCKER-USER`` chain, which sees container-to-container traffic
  on the compose bridge (dockerd enables bridge netfilter).  Clients use the published ports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from . import damage as damages
from . import netns

GUEST_ANYWHERE = '[users.guest]\npassword = "guest"\nloopback_only = false\n'

# Seconds a settle takes digests again while they differ (a body repair in flight: see settle).
REPAIR_SETTLE = 10.0


class Unsupported(RuntimeError):
    """This backend cannot make that fault."""


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux: /proc/<pid>/task/*/children)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids += [int(k) for k in fh.read().split()]
    except OSError:
        pass
    return kids


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            try:  # reaped by init once re-parented; a zombie still has /proc/<pid>: check its state
                with open(f"/proc/{pid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.02)


def _run(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, timeout=timeout)


class NetnsBackend:
    name = "netns"

    def __init__(self, base_dir: str, size: int = 3, extra_config: str = "", small_disks: int = 0) -> None:
        """``small_disks``: give every node's Raft store (<data>/raft) a tmpfs of that many bytes of
        its own, which the ``disk-full`` nemesis fills (0: the stores share the host's disk)."""
        from raftmq.ops.local.cluster import Cluster

        self.net = netns.NetnsNetwork(size)
        self.cluster = Cluster(size, base_dir, network=self.net,
                               extra_config="node_down_after = 2.0\n" + extra_config + "\n" + GUEST_ANYWHERE)
        self.size = size
        self.small_disks = small_disks
        self._mounts: list[Path] = []
        self._lossy: set[int] = set()
        self._killed: set[int] = set()  # nodes down because a nemesis killed them
        self.exits: list[str] = []  # nodes found dead that no nemesis killed (a crash after damage...)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.net.create()
        if self.small_disks:
            for node in self.cluster.nodes:
                mount = node.data_dir / "raft"
                mount.mkdir(parents=True, exist_ok=True)
                _run("mount", "-t", "tmpfs", "-o", f"size={self.small_disks}", "tmpfs", str(mount))
                self._mounts.append(mount)
        self.cluster.start()

    def stop(self) -> None:
        for node in self.cluster.nodes:
            if node.is_alive():
                os.kill(node.pid, signal.SIGCONT)
        self.cluster.__exit__(None, None, None)
        for mount in self._mounts:
            _run("umount", "-l", str(mount), check=False)
        self._mounts.clear()
        self.net.destroy()

    def urls(self) -> list[str]:
        return [n.url for n in self.cluster.nodes]

    def hosts(self) -> list[str]:
        return [f"{n.host}:{n.port}" for n in self.cluster.nodes]

    def node_name(self, i: int) -> str:
        return self.cluster.nodes[i].node_id

    def leader(self) -> int | None:
        try:
            return self.cluster.nodes.index(self.cluster.leader(timeout=5))
        except Exception:  # noqa: BLE001 - no agreed leader right now
            return None

    # ------------------------------------------------------------------ faults

    def kill(self, i: int, children: bool = False) -> None:
        """kill -9 node ``i``; with ``children`` its child processes too (a snapshot being written in a
        forked child outlives its parent and renames the snapshot into place after it died: a
        nemesis that damages the files kills it first, as a power cut would)."""
        node = self.cluster.nodes[i]
        self.note_exits()
        if node.is_alive():
            kids = _children(node.pid) if children else []
            os.kill(node.pid, signal.SIGCONT)  # a paused process dies as well, but be explicit
            node.kill9()
            for pid in kids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _wait_gone(kids)
        self._killed.add(i)

    def start_node(self, i: int) -> None:
        self.note_exits()
        if not self.cluster.nodes[i].is_alive():
            self._killed.discard(i)
            self.cluster.nodes[i].start()

    def note_exits(self) -> None:
        """Record nodes that died by themselves (not killed by a nemesis): e.g. on reading damaged files."""
        for i, node in enumerate(self.cluster.nodes):
            if i not in self._killed and node.proc is not None and node.proc.poll() is not None:
                self.exits.append(f"{node.node_id} exited with status {node.proc.returncode}")
                self._killed.add(i)  # reported once; start_node clears it

    def damage(self, i: int, spec: damages.DamageSpec, rng) -> list[damages.Damage]:
        """Damage node ``i``'s files as ``spec`` says; the node must be down."""
        node = self.cluster.nodes[i]
        if node.is_alive():
            raise RuntimeError(f"{node.node_id} is running: damage only a stopped node")
        return damages.damage_dir(node.data_dir, spec, rng)

    def pause(self, i: int) -> None:
        os.kill(self.cluster.nodes[i].pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        node = self.cluster.nodes[i]
        if node.is_alive():
            os.kill(node.pid, signal.SIGCONT)

    def cut(self, pairs: list[tuple[int, int]]) -> None:
        self.net.cut(pairs)

    def loss(self, i: int, probability: float) -> None:
        _run("ip", "netns", "exec", self.net.namespaces[i], "iptables", "-I", "INPUT", "-m", "statistic",
             "--mode", "random", "--probability", f"{probability:.3f}", "-j", "DROP")
        self._lossy.add(i)

    def heal(self) -> None:
        self.net.heal()
        for i in sorted(self._lossy):
            _run("ip", "netns", "exec", self.net.namespaces[i], "iptables", "-F", "INPUT", check=False)
        self._lossy.clear()

    def restart_all(self) -> None:
        for i in range(self.size):
            self.kill(i)
        for i in range(self.size):
            self.start_node(i)

    def fill_disk(self, i: int, leave: int) -> None:
        """Leave ``leave`` bytes free on node ``i``'s small store filesystem (a ballast file)."""
        if not self._mounts:
            raise Unsupported("no small disks (NetnsBackend(small_disks=...))")
        ballast = self._mounts[i] / "ballast"
        with open(ballast, "ab") as fh:
            todo = os.statvfs(self._mounts[i]).f_bavail * os.statvfs(self._mounts[i]).f_frsize - leave
            chunk = bytes(1 << 20)
            while todo > 0:
                fh.write(chunk[:min(len(chunk), todo)])
                todo -= len(chunk)

    def free_disk(self, i: int) -> None:
        if self._mounts:
            (self._mounts[i] / "ballast").unlink(missing_ok=True)

    def settle(self, timeout: float = 60.0) -> dict:
        """Every node running, caught up, with identical state: the digests."""
        for i in range(self.size):
            self.resume(i)
            self.start_node(i)
        self.cluster.wait_formed(timeout=timeout)
        # A damaged body that the digest's own read finds is repaired from a member a moment later
        # (store/disk/bodies.py): digests taken in between differ (seen once in CI: the read found two
        # damaged bodies at 21:24:19.390, the digest was written at .445, the repair came at .913).
        # Identical state is what the replicas must reach, so differing digests are taken again for
        # up to ``REPAIR_SETTLE`` seconds; still differing, they are returned as they are.
        deadline = time.monotonic() + REPAIR_SETTLE
        while True:
            self.cluster.wait_applied_equal(timeout=timeout)
            digests = {node_id: digest for node_id, (_index, digest) in self.cluster.digests().items()}
            if len(set(digests.values())) <= 1 or time.monotonic() > deadline:
                return digests
            time.sleep(1.0)


class ComposeBackend:
    """The docker-compose cluster; node i is service n<i+1> of project ``project``."""

    name = "compose"

    def __init__(self, compose_file: str = "docker-compose.yml", project: str = "raftmqchaos",
                 size: int = 3, amqp_base: int = 5672, admin_base: int = 15680,
                 environment: dict[str, str] | None = None) -> None:
        """``environment``: RAFTMQ_* settings for every node, in a compose override file next to the
        run (e.g. ``nemesis.DAMAGE_ENVIRONMENT``)."""
        self.compose_file = str(Path(compose_file).resolve())
        self.project = project
        self.size = size
        self.amqp_base, self.admin_base = amqp_base, admin_base
        self._rules: list[list[str]] = []
        self._files = [self.compose_file]
        if environment:
            import json
            import tempfile

            override = Path(tempfile.mkdtemp(prefix="raftmq-compose-")) / "environment.yml"
            services = {f"n{i + 1}": {"environment": dict(environment)} for i in range(size)}
            # JSON is YAML: the override adds to each service's environment (compose merges maps).
            override.write_text(json.dumps({"version": "2.4", "services": services}, indent=1))
            self._files.append(str(override))

    def _compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        files = [arg for path in self._files for arg in ("-f", path)]
        return _run("docker-compose", "-p", self.project, *files, *args, timeout=timeout)

    def container(self, i: int) -> str:
        return f"{self.project}_n{i + 1}_1"

    def address(self, i: int) -> str:
        done = _run("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                    self.container(i))
        return done.stdout.strip()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._compose("up", "-d", "--build")
        self._wait_amqp(range(self.size), timeout=120)
        self.settle(timeout=120)

    def stop(self) -> None:
        self.heal()
        self._compose("down", "-v")

    def urls(self) -> list[str]:
        return [f"amqp://guest:guest@127.0.0.1:{self.amqp_base + i}/%2F" for i in range(self.size)]

    def hosts(self) -> list[str]:
        return [f"127.0.0.1:{self.amqp_base + i}" for i in range(self.size)]

    def node_name(self, i: int) -> str:
        return f"n{i + 1}"

    def _status(self, i: int) -> dict | None:
        from raftmq.ops.admin import admin_stub
        from raftmq.ops.proto import admin_pb2 as pb

        try:
            reply = admin_stub(f"127.0.0.1:{self.admin_base + i}").Status(pb.Empty(), timeout=2)
        except Exception:  # noqa: BLE001 - down, paused or cut off
            return None
        return {"role": reply.role, "leader_node": reply.leader_node, "applied_index": reply.applied_index,
                "ready": reply.ready}

    def leader(self) -> int | None:
        for i in range(self.size):
            st = self._status(i)
            if st and st["role"] == "leader":
                return i
        return None

    def _wait_amqp(self, nodes, timeout: float) -> None:
        from raftmq.ops.local.node import probe_amqp

        deadline = time.monotonic() + timeout
        for i in nodes:
            while not probe_amqp("127.0.0.1", self.amqp_base + i):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.container(i)} does not answer AMQP")
                time.sleep(0.5)

    # ------------------------------------------------------------------ faults

    def kill(self, i: int, children: bool = False) -> None:
        """kill -9 the container's process (its children die with the container's PID namespace), and
        wait until the container has stopped (``docker kill`` returns before)."""
        _run("docker", "kill", "-s", "KILL", self.container(i), check=False)
        _run("docker", "wait", self.container(i), check=False, timeout=60)

    def data_dir(self, i: int) -> Path:
        """The host path of the container's /data volume (root reads it under /var/lib/docker)."""
        done = _run("docker", "inspect", "-f",
                    '{{range .Mounts}}{{if eq .Destination "/data"}}{{.Source}}{{end}}{{end}}', self.container(i))
        return Path(done.stdout.strip())

    def damage(self, i: int, spec: damages.DamageSpec, rng) -> list[damages.Damage]:
        """Damage node ``i``'s files in its data volume; the container must be stopped."""
        state = _run("docker", "inspect", "-f", "{{.State.Running}}", self.container(i)).stdout.strip()
        if state != "false":
            raise RuntimeError(f"{self.container(i)} is running: damage only a stopped node")
        return damages.damage_dir(self.data_dir(i), spec, rng)

    def start_node(self, i: int) -> None:
        _run("docker", "start", self.container(i), timeout=180)
        self._wait_amqp([i], timeout=60)

    def pause(self, i: int) -> None:
        _run("docker", "pause", self.container(i))

    def resume(self, i: int) -> None:
        _run("docker", "unpause", self.container(i), check=False)

    def _rule(self, *spec: str) -> None:
        _run("iptables", "-I", "DOCKER-USER", *spec)
        self._rules.append(list(spec))

    def cut(self, pairs: list[tuple[int, int]]) -> None:
        for a, b in pairs:
            ip_a, ip_b = self.address(a), self.address(b)
            self._rule("-s", ip_a, "-d", ip_b, "-j", "DROP")
            self._rule("-s", ip_b, "-d", ip_a, "-j", "DROP")

    def loss(self, i: int, probability: float) -> None:
        self._rule("-d", self.address(i), "-m", "statistic", "--mode", "random", "--probability",
                   f"{probability:.3f}", "-j", "DROP")

    def heal(self) -> None:
        for spec in reversed(self._rules):
            _run("iptables", "-D", "DOCKER-USER", *spec, check=False)
        self._rules.clear()

    def restart_all(self) -> None:
        for i in range(self.size):
            self.kill(i)
        for i in range(self.size):
            _run("docker", "start", self.container(i))
        self._wait_amqp(range(self.size), timeout=120)

    def fill_disk(self, i: int, leave: int) -> None:
        raise Unsupported("disk-full needs the netns backend (a small filesystem per node)")

    def free_disk(self, i: int) -> None:
        pass

    def settle(self, timeout: float = 120.0) -> dict:
        """Every container running and every node ready at the same applied index (twice in a row).
        No digests here (they are read from the data directories): an empty dict."""
        for i in range(self.size):
            self.resume(i)
            state = _run("docker", "inspect", "-f", "{{.State.Running}}", self.container(i)).stdout.strip()
            if state != "true":
                self.start_node(i)
        deadline = time.monotonic() + timeout
        previous = None
        while time.monotonic() < deadline:
            statuses = [self._status(i) for i in range(self.size)]
            if all(s and s["ready"] for s in statuses):
                indexes = {s["applied_index"] for s in statuses}
                if len(indexes) == 1 and indexes == previous:
                    return {}
                previous = indexes
            time.sleep(0.5)
        raise TimeoutError(f"the compose cluster did not settle: {[self._status(i) for i in range(self.size)]}")
