"""raft/ relies on pysyncobj's private names (listed in replica.PYSYNCOBJ_INTERNALS): an upgrade
of pysyncobj that renames one must fail here, not silently in a running cluster."""

from __future__ import annotations

import inspect
import pathlib
import re

from pysyncobj import syncobj, tcp_connection, tcp_server, transport, utility

from raftmq.raft import gate, replica, wire

CLASSES = {"SyncObj": syncobj, "TcpConnection": tcp_connection, "TcpUtility": utility, "TcpServer": tcp_server}


def test_every_private_name_raft_uses_exists_in_the_installed_pysyncobj():
    for cls, names in replica.PYSYNCOBJ_INTERNALS.items():
        source = inspect.getsource(CLASSES[cls])
        for name in names:
            assert re.search(rf"\b(self\.__{name}\b|def __{name}\()", source), f"{cls}.__{name} is gone"


def test_the_list_names_every_private_name_used_in_raft():
    listed = {f"_{cls}__{name}" for cls, names in replica.PYSYNCOBJ_INTERNALS.items() for name in names}
    used = set()
    for module in (replica, wire, gate):
        used |= set(re.findall(r"_(?:SyncObj|TcpConnection|TcpUtility|TcpServer)__[A-Za-z]+",
                               pathlib.Path(module.__file__).read_text()))
    assert used == listed, (sorted(used - listed), sorted(listed - used))


def test_the_transport_names_the_gate_uses_exist():
    """raft/gate.py reads TCPTransport's single-underscore names: they must still be there."""
    source = inspect.getsource(transport.TCPTransport)
    for name in ("_server", "_connections", "_unknownConnections", "_onNewIncomingConnection"):
        assert re.search(rf"\bself\.{name}\b", source), f"TCPTransport.{name} is gone"
