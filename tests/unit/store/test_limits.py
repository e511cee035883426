"""Vhost and user limits in the state machine (store/core/limits.py, issue 31 item 7).

What is checked: LIMITS_SET sets and clears values (None) and keeps the others; max-queues refuses
the declare of a new queue at the count (406 with RabbitMQ's text, rabbit_amqqueue:
check_vhost_queue_limit) while re-declaring an existing queue, a passive declare and declares in
other vhosts go on; 0 allows none, a negative value none is enforced; exclusive and server-named
queues count; a deleted queue frees its place; bad scopes, names and values and an unknown vhost are
refused with nothing changed; the limits go with their vhost (VHOST_DELETE) and their user
(USER_DELETE); two machines on the same log agree (digest), a snapshot carries the limits and one
written before them loads as "no limits"; a single node's LMDB mirror keeps them over a restart.
"""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import ERR, OK, LimitsSet, Op, VhostAdd, VhostDelete
from raftmq.store.core.limits import limit_of
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import MODEL_FIELDS, digest, export_model, import_model
from tests.unit.store.test_machine import Driver

C = "conn-1"  # the Driver's default connection
HASH = "pbkdf2-sha256$1$c2FsdA==$aGFzaA=="


def driver(machine: StoredMachine | None = None) -> Driver:
    d = Driver(machine or StoredMachine())
    d.apply(VhostAdd(None, None, "/"), VhostAdd(None, None, "v"))
    d.ok(Op.CHANNEL_OPEN, conn=C)
    return d


def set_limits(d: Driver, scope: str, name: str, **limits):
    return d.call(Op.LIMITS_SET, scope, name, {k.replace("_", "-"): v for k, v in limits.items()})[0]


def declare(d: Driver, name: str, vhost: str = "/", passive=False, exclusive=False, server_named=False):
    return d.call(Op.QUEUE_DECLARE, vhost, name, passive, False, exclusive, False, {}, server_named)[0]


def test_set_merges_and_none_clears():
    d = driver()
    assert set_limits(d, "vhost", "/", max_queues=3)[0] == OK
    assert set_limits(d, "vhost", "/", max_connections=-1)[0] == OK
    assert d.machine.vhost_limits == {"/": {"max-queues": 3, "max-connections": -1}}
    assert limit_of(d.machine.vhost_limits["/"], "max-connections") is None  # negative: no limit
    assert set_limits(d, "vhost", "/", max_queues=None)[0] == OK
    assert d.machine.vhost_limits == {"/": {"max-connections": -1}}
    assert set_limits(d, "vhost", "/", max_connections=None)[0] == OK
    assert d.machine.vhost_limits == {}
    assert set_limits(d, "user", "guest", max_channels=5, max_connections=2)[0] == OK
    assert d.machine.user_limits == {"guest": {"max-channels": 5, "max-connections": 2}}


def test_max_queues_refuses_new_queues_only():
    d = driver()
    set_limits(d, "vhost", "/", max_queues=2)
    assert declare(d, "a")[0] == OK
    assert declare(d, "amq.gen-x", exclusive=True, server_named=True)[0] == OK  # counts too
    refused = declare(d, "c")
    assert refused[0] == ERR and refused[1] == 406
    assert refused[2] == "PRECONDITION_FAILED - cannot declare queue 'c': queue limit in vhost '/' (2) is reached"
    assert "c" not in d.machine.vhosts["/"].queues
    d.ok(Op.CHANNEL_OPEN, conn=C, ch=2)  # the refusal closed channel 1 (a channel exception)
    assert d.call(Op.QUEUE_DECLARE, "/", "a", False, False, False, False, {}, conn=C, ch=2)[0][0] == OK
    assert d.call(Op.QUEUE_DECLARE, "/", "a", True, False, False, False, {}, conn=C, ch=2)[0][0] == OK
    assert d.call(Op.QUEUE_DECLARE, "v", "c", False, False, False, False, {}, conn=C, ch=2)[0][0] == OK
    assert d.call(Op.QUEUE_DELETE, "/", "a", False, False, conn=C, ch=2)[0][0] == OK
    assert d.call(Op.QUEUE_DECLARE, "/", "c", False, False, False, False, {}, conn=C, ch=2)[0][0] == OK


def test_refusals_are_told_to_the_node():
    """``on_refused`` (the node's hook for counting and logging) hears each max-queues refusal with
    the issuing connection; the refusal is the same without it."""
    d = driver()
    heard = []
    d.machine.limit_commands.on_refused = lambda conn, text: heard.append((conn, text))
    set_limits(d, "vhost", "/", max_queues=0)
    assert declare(d, "q")[1] == 406
    assert heard == [(C, "cannot declare queue 'q': queue limit in vhost '/' (0) is reached")]


def test_zero_allows_none_and_negative_is_unlimited():
    d = driver()
    set_limits(d, "vhost", "v", max_queues=0)
    assert declare(d, "q", vhost="v")[1] == 406
    d.ok(Op.CHANNEL_OPEN, conn=C, ch=2)
    set_limits(d, "vhost", "v", max_queues=-1)
    for i in range(5):
        assert d.call(Op.QUEUE_DECLARE, "v", f"q{i}", False, False, False, False, {}, conn=C, ch=2)[0][0] == OK


def test_bad_changes_are_refused_and_change_nothing():
    d = driver()
    before = digest(d.machine)
    for scope, name, limits, code in (
        ("vhost", "nope", {"max-queues": 1}, 404),
        ("vhost", "/", {"max-channels": 1}, 406),  # a user limit
        ("user", "guest", {"max-queues": 1}, 406),  # a vhost limit
        ("user", "guest", {"max-channels": "7"}, 406),
        ("user", "guest", {"max-channels": True}, 406),
        ("cluster", "x", {}, 406),
    ):
        result = d.call(Op.LIMITS_SET, scope, name, limits, ch=None)[0]
        assert result[0] == ERR and result[1] == code, result
    assert digest(d.machine) == before


def test_limits_go_with_their_vhost_and_user():
    d = driver()
    d.ok(Op.USER_PUT, "alice", HASH, [], False, conn=C)
    set_limits(d, "vhost", "v", max_queues=1)
    set_limits(d, "user", "alice", max_connections=1)
    set_limits(d, "user", "guest", max_connections=4)  # a configuration-file user
    d.apply(VhostDelete(C, None, "v"))
    d.ok(Op.USER_DELETE, "alice", conn=C)
    assert d.machine.vhost_limits == {} and d.machine.user_limits == {"guest": {"max-connections": 4}}
    d.apply(VhostAdd(None, None, "v"))
    assert declare(d, "again", vhost="v")[0] == OK  # a new vhost of the same name starts without


def test_replicas_agree_and_snapshots_carry_limits():
    a, b = driver(), driver()
    for d in (a, b):
        set_limits(d, "vhost", "/", max_queues=1, max_connections=10)
        set_limits(d, "user", "guest", max_channels=3)
        declare(d, "one")
        declare(d, "two")
    assert digest(a.machine) == digest(b.machine)
    c = StoredMachine()
    import_model(c, export_model(a.machine))
    assert c.vhost_limits == {"/": {"max-connections": 10, "max-queues": 1}}
    assert c.user_limits == {"guest": {"max-channels": 3}}
    assert digest(c) == digest(a.machine)
    set_limits(b, "user", "guest", max_channels=4)
    assert digest(a.machine) != digest(b.machine)  # limits are part of the compared state


def test_older_snapshot_loads_as_no_limits():
    """A model pickled without the two fields (as a snapshot of an older raftmq) keeps the
    initial empty limits (import_model skips absent fields)."""
    assert "vhost_limits" in MODEL_FIELDS and "user_limits" in MODEL_FIELDS
    old = driver()
    blob_fields = [f for f in MODEL_FIELDS if f not in ("vhost_limits", "user_limits")]
    import raftmq.store.disk.snapshot as snapshot
    saved = snapshot.MODEL_FIELDS
    snapshot.MODEL_FIELDS = tuple(blob_fields)
    try:
        blob = export_model(old.machine)
    finally:
        snapshot.MODEL_FIELDS = saved
    fresh = StoredMachine()
    import_model(fresh, blob)
    assert fresh.vhost_limits == {} and fresh.user_limits == {}
    assert set(fresh.vhosts) == {"/", "v"}


def test_lmdb_keeps_limits_over_a_restart(tmp_path):
    path = str(tmp_path / "lmdb")
    d = driver(StoredMachine(DurableStore(path)))
    set_limits(d, "vhost", "v", max_queues=7, max_connections=0)
    set_limits(d, "user", "guest", max_channels=3)
    set_limits(d, "user", "bob", max_connections=1)
    set_limits(d, "user", "bob", max_connections=None)  # cleared: the key goes
    d.machine.store.close()
    again = StoredMachine(DurableStore(path))
    assert again.vhost_limits == {"v": {"max-queues": 7, "max-connections": 0}}
    assert again.user_limits == {"guest": {"max-channels": 3}}
    d = Driver(again)
    d.apply(LimitsSet(C, None, None, "vhost", "v", {"max-queues": None}), VhostDelete(C, None, "v"))
    again.store.close()
    third = StoredMachine(DurableStore(path))
    assert third.vhost_limits == {} and third.user_limits == {"guest": {"max-channels": 3}}
    third.store.close()
