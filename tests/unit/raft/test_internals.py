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


def test_repeated_acknowledgements_are_not_sent_again_until_the_repeat_interval():
    """Issue 30: a follower's answer to an AppendEntries that carries only a commit index repeats
    its last acknowledgement; it is skipped for ``repeat_after`` seconds.  A new index, a new term
    or another leader always goes at once, and so does the same answer once the interval passed
    (the leader must hear from its followers more often than its leader_fallback)."""
    from raftmq.raft.replica import RepeatedAcks

    acks = RepeatedAcks(repeat_after=0.03)
    leader, other = object(), object()
    assert not acks.already_sent(leader, 3, 10, now=1.000)  # the entry's acknowledgement: sent
    assert acks.already_sent(leader, 3, 10, now=1.001)  # the same, for the commit index: skipped
    assert not acks.already_sent(leader, 3, 11, now=1.002)  # a new entry
    assert not acks.already_sent(other, 3, 11, now=1.003)  # another leader
    assert not acks.already_sent(other, 4, 11, now=1.004)  # another term
    assert acks.already_sent(other, 4, 11, now=1.020)
    assert not acks.already_sent(other, 4, 11, now=1.040)  # past the interval: sent again
    assert acks.skipped == 2


def test_the_forwarder_comes_first_in_the_members_union():
    """Issue 30: the leader sends AppendEntries to the member that forwarded the latest command
    first; pysyncobj iterates ``otherNodes | readonlyNodes``, so the swapped set's union must
    start with that member and hold every member once."""
    from raftmq.raft.replica import _FirstInUnion

    members = {"a", "b", "c"}
    for first in members:
        union = _FirstInUnion(members, first) | {"r"}
        assert union[0] == first and sorted(union) == ["a", "b", "c", "r"]
    assert _FirstInUnion(members, "b") == members  # still the same set for any other use
