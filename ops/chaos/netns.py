"""Network namespaces for cluster fault tests: one namespace per node, a bridge between them.

Layout (S is a subnet number so that concurrent runs do not collide)::

    root namespace  rq<S>host 10.99.S.1 ──┐
                                          ├── bridge br0 in namespace rq<S>hub
    namespace rq<S>n1  eth 10.99.S.11 ────┤
    namespace rq<S>n2  eth 10.99.S.12 ────┤
    namespace rq<S>n3  eth 10.99.S.13 ────┘

Nodes run inside their namespace (``ip netns exec``) and bind their address; the test process, in
the root namespace, reaches all of them as a client. ``partition`` cuts Raft traffic between
nodes with blackhole routes (iproute2 only, no iptables needed) while clients still reach every
node; ``isolate`` cuts a node off completely (its link goes down).
"""

from __future__ import annotations

import os
import shutil
import subprocess


def available() -> bool:
    """Root, iproute2, and the kernel lets us make a namespace with a veth pair (containers may not)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"rqprobe{os.getpid() % 100000}"
    try:
        subprocess.run(["ip", "netns", "add", probe], check=True, capture_output=True, timeout=10)
        subprocess.run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
                       check=True, capture_output=True, timeout=10)
        return True
    except (subprocess.SubprocessError, OSError):
        return False
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=10)


class NetnsNetwork:
    def __init__(self, size: int = 3, subnet: int | None = None) -> None:
        self.size = size
        self.subnet = subnet if subnet is not None else 100 + os.getpid() % 100
        s = self.subnet
        self.hub = f"rq{s}hub"
        self.namespaces = [f"rq{s}n{i + 1}" for i in range(size)]
        self.addresses = [f"10.99.{s}.{11 + i}" for i in range(size)]
        self.host_address = f"10.99.{s}.1"
        self._blackholes: set[tuple[int, int]] = set()
        self.created = False

    def create(self) -> NetnsNetwork:
        s = self.subnet
        self.destroy()
        _ip("netns", "add", self.hub)
        self.created = True
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            inner, outer = f"rq{s}n{i + 1}", f"rq{s}h{i + 1}"
            _ip("netns", "add", ns)
            _ip("link", "add", inner, "type", "veth", "peer", "name", outer)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "netns", self.hub)
            _ip("-n", self.hub, "link", "set", outer, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", f"rq{s}host", "type", "veth", "peer", "name", f"rq{s}hb")
        _ip("link", "set", f"rq{s}hb", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", f"rq{s}hb", "master", "br0", "up")
        _ip("addr", "add", f"{self.host_address}/24", "dev", f"rq{s}host")
        _ip("link", "set", f"rq{s}host", "up")
        return self

    def prefix(self, i: int) -> list[str]:
        """The command prefix that runs a process inside node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def partition(self, group: list[int]) -> None:
        """Cut node-to-node traffic between ``group`` and the other nodes (both directions)."""
        others = [j for j in range(self.size) if j not in group]
        self.cut([(i, j) for i in group for j in others])

    def cut(self, pairs: list[tuple[int, int]]) -> None:
        """Cut the traffic between each pair of nodes, both directions (clients still reach all)."""
        for i, j in pairs:
            for a, b in ((i, j), (j, i)):
                if (a, b) not in self._blackholes:
                    _ip("-n", self.namespaces[a], "route", "add", "blackhole", f"{self.addresses[b]}/32")
                    self._blackholes.add((a, b))

    def heal(self) -> None:
        for a, b in sorted(self._blackholes):
            _ip("-n", self.namespaces[a], "route", "del", "blackhole", f"{self.addresses[b]}/32", check=False)
        self._blackholes.clear()

    def destroy(self) -> None:
        s = self.subnet
        _ip("link", "del", f"rq{s}host", check=False)
        for ns in [*self.namespaces, self.hub]:
            _ip("netns", "del", ns, check=False)
        self.created = False

    def __enter__(self) -> NetnsNetwork:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()
