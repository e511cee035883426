"""Sockets that have not authenticated on the Raft and admin ports are few and short-lived (issue 31, item 4).

Found on main: 300 idle sockets on the Raft port still open after 15 s (and one holding half a
frame), each a descriptor the node's AMQP listeners then lack.  raft/gate.py closes a socket that
has not sent its first sealed frame (the cluster secret's proof, raft/wire.py) within
``raft_handshake_timeout``, keeps at most ``raft_max_unauthenticated`` (the oldest goes), and
closes a connection stopped mid-frame for ``raft_frame_stall_timeout``; an authenticated
connection that is merely quiet is kept, and the members stay connected throughout.  The gRPC
admin port gets grpc core's handshake timeout, idle timeout and connection cap (ops/admin.py).

One 2-node cluster for the module, on 127.0.0.1.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import free_port
from raftmq.raft.wire import NONCE_BYTES, Sealer, admin_utility
from tests.integration.helpers import round_trip, wait_until

pytestmark = pytest.mark.cluster

SECRET = "test-secret-not-for-production"  # ops/local/cluster.py writes this one
HANDSHAKE = 1.0
CAP = 16
STALL = 2.0
ADMIN_MAX = 8
CONFIG = (f"raft_handshake_timeout = {HANDSHAKE}\nraft_max_unauthenticated = {CAP}\n"
          f"raft_frame_stall_timeout = {STALL}\nadmin_handshake_timeout = 1.0\n"
          f"admin_max_connections = {ADMIN_MAX}\n")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(2, tmp_path_factory.mktemp("gate"), extra_config=CONFIG)
    c.admin_ports = []
    for node in c.nodes:
        port = free_port()
        c.admin_ports.append(port)
        node.extra_args = ["--admin-port", str(port)]
    c.start()
    yield c
    c.stop()


def raft_endpoint(cluster: Cluster, node) -> tuple[str, int]:
    host, port = cluster.raft_address(node).rsplit(":", 1)
    return host, int(port)


def is_closed(sock: socket.socket) -> bool:
    """Whether the node closed ``sock`` (EOF or reset); data the node sent is drained."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def sealed_hello(sealer: Sealer) -> bytes:
    """The first frame of raft/wire.py's handshake: a fresh random key sealed under the cluster key."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = sealer._cluster.encrypt(nonce, pickle.dumps(os.urandom(32), 5), None)
    return struct.pack("<I", NONCE_BYTES + len(sealed)) + nonce + sealed


def test_unauthenticated_raft_sockets_are_capped_and_timed_out(cluster):
    """40 silent sockets and one holding half a frame: beyond CAP the oldest are closed at once,
    all are closed within the handshake timeout (plus a sweep), the node's descriptors return to
    their baseline, the log has at most a few lines for it (rate-limited), and meanwhile the
    members stay connected, an authenticated utility request (``status``) is answered and an
    AMQP round trip works."""
    node = cluster.leader()
    other = next(n for n in cluster.nodes if n is not node)
    pid = node.pid
    endpoint = raft_endpoint(cluster, node)
    baseline = open_fds(pid)
    log_start = node.log_path.stat().st_size
    started = time.monotonic()
    socks = [socket.create_connection(endpoint, timeout=5) for _ in range(40)]
    half = socket.create_connection(endpoint, timeout=5)
    half.sendall(struct.pack("<I", 1000) + b"x" * 10)  # a length, then a tenth of the frame
    wait_until(lambda: sum(map(is_closed, socks)) >= 40 - CAP, timeout=HANDSHAKE * 0.8,
               what="the oldest sockets beyond the cap to be closed")
    evicted_early = sum(map(is_closed, socks))
    status = admin_utility(SECRET, 5.0).executeCommand(cluster.raft_address(node), ["status"])
    assert status and status["partner_node_status_server_" + cluster.raft_address(other)] == 2, status
    round_trip(node.url)
    wait_until(lambda: all(map(is_closed, socks)) and is_closed(half), timeout=HANDSHAKE + 3.0,
               what="every unauthenticated socket to be closed")
    took = time.monotonic() - started
    print(f"closed beyond the cap before the timeout: {evicted_early}; all 41 closed after {took:.2f}s "
          f"(handshake timeout {HANDSHAKE}s)")
    for s in [*socks, half]:
        s.close()
    wait_until(lambda: open_fds(pid) <= baseline + 2, timeout=5, what="descriptors back to the baseline")
    status = cluster.fresh_status(node)
    print({k: v for k, v in status.items() if k.startswith("raft_port")})
    assert status["raft_port_evicted"] + status["raft_port_timed_out"] == 41, status
    assert status["raft_port_evicted"] >= 40 - CAP and status["raft_port_unauthenticated"] == 0, status
    assert cluster.raft_address(other) in status["connected_partners"], status
    with open(node.log_path, "rb") as fh:
        fh.seek(log_start)
        text = fh.read().decode(errors="replace")
    lines = [line for line in text.splitlines() if "raft port:" in line]
    assert 1 <= len(lines) <= 4, lines  # 41 closes, one line per kind per 10 s


def test_an_authenticated_quiet_connection_is_kept_and_a_stalled_frame_is_cut(cluster):
    """A socket that proved the secret (its first sealed frame, answered by the node's key) stays
    open past the handshake timeout while it sends nothing; once it stops mid-frame it is closed
    within the stall timeout (plus a sweep)."""
    node = cluster.leader()
    sock = socket.create_connection(raft_endpoint(cluster, node), timeout=5)
    try:
        sock.sendall(sealed_hello(Sealer(SECRET)))
        header = sock.recv(4)
        assert len(header) == 4, "the node did not answer the handshake"
        time.sleep(HANDSHAKE + 1.0)
        assert not is_closed(sock), "an authenticated socket was cut for being quiet"
        sock.setblocking(True)
        sock.sendall(struct.pack("<I", 5000) + b"y" * 100)  # then nothing more
        started = time.monotonic()
        wait_until(lambda: is_closed(sock), timeout=STALL + 3.0, what="the stalled connection to be closed")
        took = time.monotonic() - started
        print(f"stalled mid-frame: closed after {took:.2f}s (stall timeout {STALL}s)")
        assert took >= STALL * 0.9
    finally:
        sock.close()
    status = wait_until(lambda: (s := cluster.fresh_status(node)) and s.get("raft_port_stalled", 0) >= 1 and s,
                        timeout=5, what="raft_port_stalled in status.json")
    assert len(status["connected_partners"]) == 1, status


def test_admin_port_closes_silent_sockets_and_caps_connections(cluster):
    """The gRPC admin port: ADMIN_MAX + 4 silent sockets -- those beyond the cap are refused, the rest
    closed after the 1 s handshake timeout -- and then the admin API answers (``status``)."""
    from tests.support.cli import raftmq

    node = cluster.nodes[0]
    port = cluster.admin_ports[0]
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(ADMIN_MAX + 4)]
    try:
        wait_until(lambda: all(map(is_closed, socks)), timeout=5, what="silent admin sockets to be closed")
    finally:
        for s in socks:
            s.close()
    done = raftmq("admin", "--address", f"127.0.0.1:{port}", "status", timeout=30)
    assert done.returncode == 0 and node.node_id in done.stdout, done.stderr
