"""The forked snapshot writer holds none of the node's sockets (raft/snapshot_child.py).

Found by bench/backlog.py (issue 18): a node killed -9 while its snapshot child was writing could
not be restarted ("address already in use") until the child finished."""

from __future__ import annotations

import os
import socket
import time

from raftmq.raft.snapshot_child import fork_snapshot
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.snapshot import read_snapshot, write_snapshot


class SlowModel:
    """A model whose export takes a while, so the child is still writing when we look."""

    def __init__(self) -> None:
        self._machine = StateMachine()

    def __getattr__(self, name: str):
        if name == "vhosts":
            time.sleep(1.5)
        return getattr(self._machine, name)


def bind_within(port: int, seconds: float) -> bool:
    """Bind and listen on ``port`` (as a restarted node does), retrying for ``seconds``: the
    child closes its copies of the descriptors a moment after the fork."""
    deadline = time.monotonic() + seconds
    while True:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        finally:
            sock.close()


def test_the_port_is_free_while_the_child_writes(tmp_path):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    path = str(tmp_path / "snapshot.lmdb")
    pid = fork_snapshot(lambda: write_snapshot(path, SlowModel(), b"meta"))
    try:
        listener.close()  # the node dies; a new one binds the same port while the child still writes
        assert bind_within(port, 1.0), "the child kept the listening socket"
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the child should still be writing"
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    meta, model = read_snapshot(path)
    assert meta == b"meta" and model
