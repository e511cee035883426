"""VHOST_DELETE and the permission overlay of configuration-file users, in the state machine.

What is checked: deleting a vhost removes its queues (messages released, consumers cancelled with
OUT_CANCEL, unacknowledged deliveries dropped), exchanges, bindings and every user's permissions on
it, emits the definition audit events of those deletes and one OUT_VHOST_CLOSED output (320), and
leaves other vhosts alone; an unknown vhost is 404; two machines applying the same log end in the
same state (digest) with the same outputs; the state travels in a snapshot; a single node's LMDB
mirror reflects the delete after a restart (the vhost, its durable queue, exchange and binding, its
messages and the permissions are gone; the overlay of another vhost survives).
"""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    ERR,
    OK,
    OUT_CANCEL,
    OUT_REPLY,
    OUT_VHOST_CLOSED,
    Op,
    VhostAdd,
    VhostDelete,
    make,
)
from raftmq.store.disk import history as EV
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import digest, export_model, import_model
from tests.unit.store.test_machine import NOW, Driver

HASH = "pbkdf2-sha256$1$c2FsdA==$aGFzaA=="
C = "n1.boot.1"


def populated(machine: StoredMachine) -> tuple[Driver, list]:
    """Vhosts "/" and "v"; in "v" a durable queue with a persistent message, a consumer holding it
    unacked, a second ready message, a durable exchange bound to the queue, an exclusive queue;
    permissions on both vhosts for a managed user and (overlay) for a configuration-file user."""
    d = Driver(machine)
    events: list = []
    machine.event_sink = lambda _index, batch: events.extend(batch)
    d.apply(VhostAdd(None, None, "/"), VhostAdd(None, None, "v"))
    d.ok(Op.CHANNEL_OPEN, conn=C)
    d.ok(Op.QUEUE_DECLARE, "v", "q", False, True, False, False, {}, conn=C)
    d.ok(Op.QUEUE_DECLARE, "v", "excl", False, False, True, False, {}, conn=C)
    d.ok(Op.QUEUE_DECLARE, "/", "keep", False, True, False, False, {}, conn=C)
    d.ok(Op.EXCHANGE_DECLARE, "v", "x", "direct", False, True, False, False, {}, conn=C)
    d.ok(Op.QUEUE_BIND, "v", "q", "x", "k", {}, conn=C)
    for body in (b"one", b"two"):
        d.ok(Op.PUBLISH, "v", "x", "k", False, b"\x00\x00", body, True, 0, None, conn=C)
    d.ok(Op.PUBLISH, "/", "", "keep", False, b"\x00\x00", b"kept", True, 0, None, conn=C)
    d.ok(Op.QOS, 1, False, conn=C)
    d.ok(Op.CONSUME, "v", "q", "ctag", False, False, {}, conn=C)
    d.ok(Op.USER_PUT, "alice", HASH, [], False, conn=C)
    for user in ("alice", "guest"):  # guest: not a managed user, so the overlay
        d.ok(Op.PERMISSION_SET, user, "v", ".*", ".*", ".*", conn=C)
        d.ok(Op.PERMISSION_SET, user, "/", "^a", "^b", "^c", conn=C)
    return d, events


def delete(d: Driver, name: str):
    d.token += 1
    outputs = d.apply(VhostDelete(C, d.token, name))
    reply = [o for o in outputs if o[1] == OUT_REPLY and o[2] == d.token]
    return reply[0][3], outputs


def test_delete_removes_everything_in_the_vhost(tmp_path):
    d, events = populated(StoredMachine(DurableStore(str(tmp_path / "lmdb"))))
    m = d.machine
    assert m.vhosts["v"].queues["q"].unacked_count == 1
    events.clear()
    result, outputs = delete(d, "v")
    assert result[0] == OK
    assert "v" not in m.vhosts and set(m.vhosts) == {"/"}
    assert (C, OUT_CANCEL, 1, "ctag") in outputs
    assert (None, OUT_VHOST_CLOSED, "v", 320, "CONNECTION_FORCED - vhost 'v' is deleted") in outputs
    assert not m.channels[C][1].unacked and not m.channels[C][1].consumers
    assert [q.name for q in m.queues_by_id.values()] == ["keep"]
    assert not m.exclusive_queues.get(C)
    assert all(key[0] != "v" for key in m.inbound)
    assert m.users["alice"].permissions == {"/": ("^a", "^b", "^c")}
    assert m.permission_overlay == {"guest": {"/": ("^a", "^b", "^c")}}
    assert m.message_bytes == len(b"kept")
    kinds = [(e[2], e[3], e[4] or e[6]) for e in events]
    assert (EV.QUEUE_DELETED, "v", "q") in kinds and (EV.QUEUE_DELETED, "v", "excl") in kinds
    assert (EV.EXCHANGE_DELETED, "v", "x") in kinds and (EV.UNBOUND, "v", "q") in kinds
    assert sum(1 for e in events if e[2] == EV.DELETED) == 2  # the unacked and the ready message
    # The other vhost still works.
    assert d.ok(Op.GET, "/", "keep", True, conn=C)[0].body == b"kept"
    # Gone is gone: 404 again; commands on it are refused as for any unknown vhost.
    result, _ = delete(d, "v")
    assert result[0] == ERR and result[1] == 404
    result, _ = d.call(Op.QUEUE_DECLARE, "v", "q", False, True, False, False, {}, conn=C)
    assert result[0] == ERR and result[1] == 530


def test_unknown_vhost_is_404_and_changes_nothing():
    d, _ = populated(StoredMachine())
    before = digest(d.machine)
    result, outputs = delete(d, "nope")
    assert result == (ERR, 404, "NOT_FOUND - no vhost 'nope'")  # the code's name is prefixed
    assert not [o for o in outputs if o[1] == OUT_VHOST_CLOSED]
    assert digest(d.machine) == before


def test_two_machines_agree_and_snapshots_carry_it():
    """The same log on two machines: the same digest and outputs after the delete; a snapshot taken
    after it restores the same state (overlay included) on a fresh machine."""
    a, _ = populated(StoredMachine())
    b = Driver(StoredMachine())
    for now, commands in a.log:
        b.machine.apply_batch(now, commands)
    assert digest(a.machine) == digest(b.machine)
    _, out_a = delete(a, "v")
    out_b = b.machine.apply_batch(NOW, a.log[-1][1])
    assert digest(a.machine) == digest(b.machine)
    assert [o[:3] for o in out_a] == [o[:3] for o in out_b]
    follower = StoredMachine()
    import_model(follower, export_model(a.machine))
    assert digest(follower) == digest(a.machine)
    assert follower.permission_overlay == {"guest": {"/": ("^a", "^b", "^c")}}
    assert set(follower.vhosts) == {"/"}


def test_overlay_changes_the_digest_and_clear_is_a_tombstone():
    d, _ = populated(StoredMachine())
    before = digest(d.machine)
    d.ok(Op.PERMISSION_CLEAR, "guest", "/", conn=C)
    assert d.machine.permission_overlay["guest"]["/"] is None  # hides the file's permission on /
    assert digest(d.machine) != before
    d.ok(Op.USER_PUT, "guest", HASH, [], False, conn=C)  # a managed guest replaces the file's...
    d.ok(Op.USER_DELETE, "guest", conn=C)  # ...and deleting it drops its permissions, overlay too
    assert "guest" not in d.machine.permission_overlay


def test_lmdb_restart_after_delete(tmp_path):
    path = str(tmp_path / "lmdb")
    d, _ = populated(StoredMachine(DurableStore(path)))
    d.ok(Op.PERMISSION_CLEAR, "guest", "/", conn=C)
    d.ok(Op.PERMISSION_SET, "guest", "v", "^c$", "^w$", "^r$", conn=C)
    d.machine.store.close()
    again = StoredMachine(DurableStore(path))
    assert set(again.vhosts) == {"/", "v"} and again.vhosts["v"].queues["q"].durable
    assert again.permission_overlay == {"guest": {"v": ("^c$", "^w$", "^r$"), "/": None}}
    d = Driver(again)
    d.apply(make(Op.CHANNEL_OPEN, C, None, 1))
    result, _ = delete(d, "v")
    assert result[0] == OK
    again.store.close()
    third = StoredMachine(DurableStore(path))
    assert set(third.vhosts) == {"/"}
    assert [(q.vhost, q.name) for q in third.queues_by_id.values()] == [("/", "keep")]
    assert third.users["alice"].permissions == {"/": ("^a", "^b", "^c")}
    assert third.permission_overlay == {"guest": {"/": None}}
    assert third.message_bytes == len(b"kept")
    assert sum(len(q.ready) for q in third.queues_by_id.values()) == 1
    third.store.close()
