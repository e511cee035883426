"""Write a Raft snapshot in a forked child that holds none of the node's sockets.

The child is a frozen copy-on-write image of the model: it pickles it into a new LMDB file and
leaves with ``os._exit``.  It used to keep every descriptor it inherited while doing so -- the
listening AMQP and Raft sockets and every client connection.  Seen in bench/backlog.py (issue 18):
a node killed -9 while its child wrote a 300 MB model could not be started again ("address already
in use", exit 1) until the child finished, 5 s later, and the clients' sockets to the dead node
stayed open as long.  So the child closes its copies of every socket first: it needs none of them
(``write_snapshot`` opens its own file).  Only sockets: closing every descriptor also closed the
epoll descriptor of gRPC's event engine (the admin API), whose fork support runs in the child and
aborted it ("epoll_wait error: Bad file descriptor", exit by SIGABRT), so no snapshot was ever
written on a node serving gRPC (tests/cluster/test_admin.py found it).
"""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

from raftmq.store.disk.snapshot import write_snapshot

if TYPE_CHECKING:  # (the type only: the child pickles whatever model the parent holds)
    from raftmq.store.core.machine import StateMachine


def fork_snapshot(path: str, machine: StateMachine, meta: bytes) -> int:
    """Fork a child that writes ``machine``'s snapshot to ``path`` and exits 0 (1 on failure).
    Returns the child's pid to the parent."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _close_sockets()
        write_snapshot(path, machine, meta)
        code = 0
    finally:
        os._exit(code)


def _close_sockets() -> None:
    """Close this process's copies of every socket (listening, Raft, clients)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:
            pass  # the directory's own descriptor, already gone
