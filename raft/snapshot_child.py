"""Write a Raft snapshot in a forked child that holds none of the node's sockets.

The child is a frozen copy-on-write image of the model: it pickles it into a new LMDB file and
leaves with ``os._exit``.  It used to keep every descriptor it inherited while doing so -- the
listening AMQP and Raft sockets and every client connection.  Seen in bench/backlog.py (issue 18):
a node killed -9 while its child wrote a 300 MB model could not be started again ("address already
in use", exit 1) until the child finished, 5 s later, and the clients' sockets to the dead node
stayed open as long.  So the child closes every descriptor but stdin/stdout/stderr first.  It
needs none of them: ``write_snapshot`` opens its own file, and the parent's LMDB environments
must never be touched in a child anyway (/work/shared/notes/pysyncobj.md, trap 2); closing a
descriptor releases only the child's own locks, and it holds none.
"""

from __future__ import annotations

import os

from raftmq.store.snapshot import write_snapshot


def fork_snapshot(path: str, machine: object, meta: bytes) -> int:
    """Fork a child that writes ``machine``'s snapshot to ``path`` and exits 0 (1 on failure).
    Returns the child's pid to the parent."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        write_snapshot(path, machine, meta)
        code = 0
    finally:
        os._exit(code)
