"""Users and permissions in the state machine: replicated commands, kept in LMDB and in snapshots."""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import ERR, Op, VhostAdd
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import digest, export_model, import_model
from tests.unit.store.test_machine import Driver

HASH = "pbkdf2-sha256$1$c2FsdA==$aGFzaA=="


def machine_with_vhost(path) -> Driver:
    d = Driver(StoredMachine(DurableStore(str(path))))
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    return d


def test_put_set_clear_delete(tmp_path):
    d = machine_with_vhost(tmp_path / "lmdb")
    d.ok(Op.USER_PUT, "alice", HASH, ["monitoring"], False)
    d.ok(Op.PERMISSION_SET, "alice", "/", "^alice-.*", ".*", ".*")
    alice = d.machine.users["alice"]
    assert alice.tags == ["monitoring"] and alice.permissions == {"/": ("^alice-.*", ".*", ".*")}
    d.ok(Op.USER_PUT, "alice", HASH + "x", [], True)  # a new password keeps the permissions
    assert d.machine.users["alice"].permissions == {"/": ("^alice-.*", ".*", ".*")}
    assert d.machine.users["alice"].loopback_only
    d.ok(Op.PERMISSION_CLEAR, "alice", "/")
    assert d.machine.users["alice"].permissions == {}
    d.ok(Op.USER_DELETE, "alice")
    assert "alice" not in d.machine.users


def test_unknown_user_or_vhost_is_404(tmp_path):
    """USER_DELETE of an unknown user and PERMISSION_SET on an unknown vhost are 404.  PERMISSION_SET
    for a name that is not a managed user goes to the overlay (configuration-file users, which the
    machine cannot know: the admin API checks the name), not to ``users``."""
    d = machine_with_vhost(tmp_path / "lmdb")
    result, _ = d.call(Op.USER_DELETE, "nobody")
    assert result[0] == ERR and result[1] == 404
    d.ok(Op.PERMISSION_SET, "guest", "/", ".*", ".*", ".*")
    assert "guest" not in d.machine.users
    assert d.machine.permission_overlay == {"guest": {"/": (".*", ".*", ".*")}}
    result, _ = d.call(Op.PERMISSION_SET, "guest", "no-such-vhost", ".*", ".*", ".*")
    assert result[0] == ERR and result[1] == 404 and "vhost" in result[2]
    d.ok(Op.USER_PUT, "bob", HASH, [], False)
    result, _ = d.call(Op.PERMISSION_SET, "bob", "no-such-vhost", ".*", ".*", ".*")
    assert result[0] == ERR and result[1] == 404 and "vhost" in result[2]


def test_users_survive_a_restart_and_travel_in_snapshots(tmp_path):
    path = tmp_path / "lmdb"
    d = machine_with_vhost(path)
    d.ok(Op.USER_PUT, "carol", HASH, ["administrator"], False)
    d.ok(Op.PERMISSION_SET, "carol", "/", "", "^in$", "^out$")
    follower = StoredMachine()
    import_model(follower, export_model(d.machine))
    assert digest(follower) == digest(d.machine)
    d.ok(Op.USER_PUT, "dave", HASH, [], False)
    assert digest(follower) != digest(d.machine)  # users are part of the replicated state
    d.ok(Op.USER_DELETE, "dave")

    d.machine.store.close()
    again = StoredMachine(DurableStore(str(path)))
    assert list(again.users) == ["carol"]
    assert again.users["carol"].permissions == {"/": ("", "^in$", "^out$")}
    assert again.users["carol"].tags == ["administrator"]
