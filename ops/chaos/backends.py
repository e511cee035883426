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
  With ``groups`` > 1 (issue 34: ``raft_groups``) a node is its main process (the metadata group)
  and one worker process per queue group (node/worker.py), all in the node's namespace: a kill -9
  of the main process must take the workers down (they stop when their link closes: checked, and
  the time they took recorded), a pause stops every process of the node, damage hits one group's
  directory (``<data>/groups/g<N>``), and ``settle`` compares every group's replica digests.
* ``ComposeBackend``: the docker-compose cluster (``docker-compose.yml``); cuts and loss are
  iptables rules in the host's ``DOCKER-USER`` chain, which sees container-to-container traffic
  on the compose bridge (dockerd enables bridge netfilter).  Clients use the published ports.
"""

from __future__ import annotations

import json
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
# Seconds a queue group's worker may take to stop by itself once its node's main process was killed
# (its link closes: node/worker.py); one still running after that is recorded and killed.
WORKER_EXIT_SECONDS = 15.0
WORKER_MODULE = "raftmq.node.worker"


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


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs)."""
    found: list[int] = []
    todo = _children(pid)
    while todo:
        kid = todo.pop(0)
        found.append(kid)
        todo += _children(kid)
    return found


def _is_worker(pid: int) -> bool:
    """Whether ``pid`` is a queue group's worker process (its command line names node/worker.py)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return WORKER_MODULE.encode() in fh.read()
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


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

    def __init__(self, base_dir: str, size: int = 3, extra_config: str = "", small_disks: int = 0,
                 groups: int | None = None) -> None:
        """``small_disks``: give every node's Raft store (<data>/raft) a tmpfs of that many bytes of
        its own, which the ``disk-full`` nemesis fills (0: the stores share the host's disk).
        ``groups``: ``raft_groups`` of every node (issue 34; 1: one Raft group, no workers); by
        default ``RAFTMQ_RAFT_GROUPS`` (the nodes inherit the environment, so the backend must know:
        ``RAFTMQ_RAFT_GROUPS=3 pytest tests/chaos`` runs the chaos tests with groups) or 1."""
        from raftmq.ops.local.cluster import Cluster

        if groups is None:
            groups = int(os.environ.get("RAFTMQ_RAFT_GROUPS") or 1)

        self.net = netns.NetnsNetwork(size)
        if groups > 1:
            extra_config = f"raft_groups = {groups}\n" + extra_config
        self.cluster = Cluster(size, base_dir, network=self.net,
                               extra_config="node_down_after = 2.0\n" + extra_config + "\n" + GUEST_ANYWHERE)
        self.size = size
        self.groups = groups
        self.small_disks = small_disks
        self._paused: dict[int, list[int]] = {}  # node -> the processes a pause stopped (workers too)
        self.worker_exits: list[float] = []  # seconds the workers took to stop after their main was killed
        self.worker_stragglers: list[str] = []  # workers still running WORKER_EXIT_SECONDS after that
        self.group_digests: dict[str, dict[str, str]] = {}  # settle: queue group -> node -> digest
        self.group_applied: dict[str, int] = {}  # settle: group -> the Raft index every replica applied
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
        tree: list[int] = []
        for node in self.cluster.nodes:
            if node.is_alive():
                kids = _descendants(node.pid)
                tree += kids
                _signal([node.pid, *kids], signal.SIGCONT)
        self.cluster.__exit__(None, None, None)
        _signal([pid for pid in tree if _alive(pid)], signal.SIGKILL)  # workers of a node killed last
        _wait_gone(tree)
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

    def group_dir(self, i: int, group: int) -> Path:
        """Node ``i``'s data directory of ``group`` (0: the node's own, the metadata group's)."""
        data = self.cluster.nodes[i].data_dir
        return data if group == 0 else data / "groups" / f"g{group}"

    def group_status(self, i: int, group: int) -> dict | None:
        try:
            return json.loads((self.group_dir(i, group) / "status.json").read_text())
        except (OSError, ValueError):
            return None

    def group_leaders(self) -> dict[int, int | None]:
        """Which node leads each group now (a status at most 2 s old that says so; None: none)."""
        found: dict[int, int | None] = {}
        now = time.time()
        for group in range(self.groups):
            found[group] = None
            for i, node in enumerate(self.cluster.nodes):
                st = self.group_status(i, group)
                if node.is_alive() and st and st.get("role") == "leader" and now - st.get("time", 0) < 2.0:
                    found[group] = i
        return found

    # ------------------------------------------------------------------ faults

    def kill(self, i: int, children: bool = False) -> None:
        """kill -9 node ``i``; with ``children`` every process below it too (a snapshot being written
        in a forked child outlives its parent and renames the snapshot into place after it died: a
        nemesis that damages the files kills it first, as a power cut would).

        Without ``children`` only the main process is killed: its queue groups' workers must stop
        by themselves when their link closes (a node is all its processes).  They are waited for
        (``worker_exits`` records how long they took); one still running after
        ``WORKER_EXIT_SECONDS`` is recorded in ``worker_stragglers`` and killed, so that the node
        can start again on its ports and files."""
        node = self.cluster.nodes[i]
        self.note_exits()
        if node.is_alive():
            tree = _descendants(node.pid)
            workers = [pid for pid in tree if _is_worker(pid)]
            _signal([node.pid, *tree], signal.SIGCONT)  # a paused node dies as well, but be explicit
            self._paused.pop(i, None)
            killed_at = time.monotonic()
            node.kill9()
            if children:
                _signal(tree, signal.SIGKILL)
                _wait_gone(tree)
            elif workers:
                _wait_gone(workers, timeout=WORKER_EXIT_SECONDS)
                left = [pid for pid in workers if _alive(pid)]
                if left:
                    self.worker_stragglers.append(f"{node.node_id}: workers {left} still running "
                                                  f"{WORKER_EXIT_SECONDS:.0f} s after their main process died")
                    _signal(left, signal.SIGKILL)
                    _wait_gone(left)
                else:
                    self.worker_exits.append(round(time.monotonic() - killed_at, 3))
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

    def damage(self, i: int, spec: damages.DamageSpec, rng, group: int = 0) -> list[damages.Damage]:
        """Damage node ``i``'s files of ``group`` as ``spec`` says; the node must be down.  The
        files are named relative to the node's data directory (``groups/g<N>/...`` for a queue group)."""
        node = self.cluster.nodes[i]
        if node.is_alive():
            raise RuntimeError(f"{node.node_id} is running: damage only a stopped node")
        done = damages.damage_dir(self.group_dir(i, group), spec, rng)
        if group:
            for item in done:
                item.file = f"groups/g{group}/{item.file}"
        return done

    def pause(self, i: int) -> None:
        """SIGSTOP every process of node ``i`` (its queue groups' workers first, then the main)."""
        pid = self.cluster.nodes[i].pid
        stopped = [*reversed(_descendants(pid)), pid] if self.groups > 1 else [pid]
        _signal(stopped, signal.SIGSTOP)
        self._paused[i] = stopped

    def resume(self, i: int) -> None:
        node = self.cluster.nodes[i]
        stopped = self._paused.pop(i, [])
        if node.is_alive():
            _signal([pid for pid in stopped if pid != node.pid], signal.SIGCONT)
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
                break
            time.sleep(1.0)
        if self.groups > 1:
            self.group_applied = {"0": (self.cluster.status(self.cluster.nodes[0]) or {}).get("raft_applied", 0)}
        self.group_digests = {str(group): self._settle_group(group, timeout) for group in range(1, self.groups)}
        return digests

    def _settle_group(self, group: int, timeout: float) -> dict[str, str]:
        """Queue group ``group``: a leader, every replica at the same applied index (twice in a row,
        from statuses written since), then the digests, taken again while they differ (as above)."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            since = time.time() - 1.0
            statuses = [self.group_status(i, group) for i in range(self.size)]
            fresh = [s for s in statuses if s and s.get("time", 0) >= since and s.get("ready")]
            applied = {s.get("raft_applied") for s in fresh}
            roles = [s.get("role") for s in fresh]
            if len(fresh) == self.size and len(applied) == 1 and roles.count("leader") == 1:
                if applied == last:
                    self.group_applied[str(group)] = applied.pop()
                    break
                last = applied
            else:
                last = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"queue group {group} did not settle: "
                                   f"{[(s or {}).get('role') for s in statuses]} applied "
                                   f"{[(s or {}).get('raft_applied') for s in statuses]}")
            time.sleep(0.6)
        repair_deadline = time.monotonic() + REPAIR_SETTLE
        while True:
            found = self.cluster.digests(path=f"groups/g{group}/digest.json")
            digests = {node_id: digest for node_id, (_index, digest) in found.items()}
            if len(set(digests.values())) <= 1 or time.monotonic() > repair_deadline:
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
