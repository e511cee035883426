"""AuditNote (store/core/audit.py, issue 36): who did what, recorded alike on every replica.

The note is applied like any command: it numbers an event from the replicated ``event_seq`` and
records it with the batch's leader-stamped time, so two replicas applying the same log (one keeping
a history, one not) agree on every sequence number; the event writer keeps each connection's
principal once (the ``connections`` table) and per-message events carry the acting connection.
"""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core import events as CEV
from raftmq.store.core.commands import (
    Ack,
    AuditNote,
    ChannelOpen,
    Consume,
    Publish,
    QueueDeclare,
    VhostAdd,
    decode_batch,
    encode_batch,
)
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk import history as EV
from raftmq.store.disk.event_writer import EventStore

PRINCIPAL = ["alice", "AMQP 0-9-1", "127.0.0.1:50001", "billing-app"]


def _log() -> list[list]:
    """Batches as a leader would propose them: a connection opens (its note first), declares,
    consumes, publishes, acks, is refused an operation, closes; an admin change and a refused login."""
    conn = "n1.x.7"
    return [
        [VhostAdd(None, None, "/")],
        [AuditNote(conn, None, CEV.CONNECTION_OPENED, "/", "", "", "", PRINCIPAL), ChannelOpen(conn, None, 1)],
        [QueueDeclare(conn, None, 1, "/", "q", False, False, False, False, {}),
         Consume(conn, None, 1, "/", "q", "ctag", False, False, {})],
        [Publish(conn, None, 1, "/", "", "q", False, b"\x00\x00", b"hello", False, 0, None)],
        [Ack(conn, None, 1, [[1, 1]])],
        [AuditNote(conn, None, CEV.ACCESS_REFUSED, "/", "secret", "", "queue.declare needs configure",
                   PRINCIPAL)],
        [AuditNote(None, None, CEV.LOGIN_REFUSED, "", "", "", "PLAIN: Login was refused",
                   ["mallory", "", "127.0.0.1", ""])],
        [AuditNote(None, None, CEV.ADMIN_CHANGE, "/", "", "", "set_permissions user=bob vhost=/",
                   ["admin", "http", "127.0.0.1", ""])],
        [AuditNote(conn, None, CEV.CONNECTION_CLOSED, "/", "", "", "", PRINCIPAL)],
    ]


def _apply(machine: StateMachine, batches: list[list]) -> list[list]:
    """Every batch through the log's encoding (as a follower reads it); the events recorded."""
    events: list[list] = []
    for i, batch in enumerate(batches, 1):
        effects = machine.apply(1_000_000 + 1000 * i, decode_batch(encode_batch(batch)), i)
        events += [[*e[:10], None, *e[11:]] for e in effects.events]  # the message object is no record
    return events


def test_same_notes_same_events_on_every_replica_and_one_keeping_no_history_numbers_them_alike():
    """Two recording replicas produce identical events; a replica that keeps no history ends at the
    same event_seq (the numbering is replicated state: a note counts on every node)."""
    a, b, silent = StateMachine(), StateMachine(), StateMachine()
    a.records_events = b.records_events = True
    first, second = _apply(a, _log()), _apply(b, _log())
    _apply(silent, _log())
    assert first == second
    assert a.event_seq == b.event_seq == silent.event_seq == len(first)
    kinds = [CEV.KIND_NAMES[e[2]] for e in first if e[2] not in CEV.DEFINITION_KINDS]
    assert kinds[0] == "connection_opened" and kinds[-1] == "connection_closed"
    assert kinds.index("connection_opened") < kinds.index("published") < kinds.index("acked")
    assert [k for k in kinds if k in ("access_refused", "login_refused", "admin_change")] == \
        ["access_refused", "login_refused", "admin_change"]
    # The time of a note is the batch's (leader-stamped), never a clock of the applying node.
    opened = next(e for e in first if e[2] == CEV.CONNECTION_OPENED)
    assert opened[1] == 1_002_000 and opened[11] == "n1.x.7" and opened[12] == PRINCIPAL


def test_per_message_events_carry_the_acting_connection():
    """publish, deliver and ack name the connection (the join key to its principal); routed does not."""
    m = StateMachine()
    m.records_events = True
    by_kind = {CEV.KIND_NAMES[e[2]]: e for e in _apply(m, _log())}
    for kind in ("published", "delivered", "acked"):
        assert by_kind[kind][11] == "n1.x.7", kind
        assert by_kind[kind][12] is None
    assert by_kind["routed"][11] is None
    refused = by_kind["access_refused"]
    assert refused[4] == "secret" and refused[9] == "queue.declare needs configure"


def test_an_unknown_note_kind_is_refused_and_changes_nothing():
    """Only the issue-36 kinds may be noted: a message kind through a note would forge history."""
    m = StateMachine()
    m.records_events = True
    effects = m.apply(1, [AuditNote("c", 5, CEV.PUBLISHED, "/", "", "", "", [])])
    assert m.event_seq == 0 and not effects.events
    assert effects.outputs[0][3].code == 540


def test_the_writer_keeps_each_principal_once_in_the_connections_table(tmp_path):
    """connections: the principal at open, the close time added at close; events hold the
    connection id and the notes their principal (read back through the history reader)."""
    store = EventStore(str(tmp_path / "events"), "metadata")
    machine = StoredMachine()
    machine.event_sink = store.append
    try:
        for i, batch in enumerate(_log(), 1):
            machine.apply_batch(1_000_000 + 1000 * i, decode_batch(encode_batch(batch)), i)
        assert store.flush()
        connections = store.records("connections")
        assert connections == [["n1.x.7", "alice", "/", "AMQP 0-9-1", "127.0.0.1:50001", "billing-app",
                                1_002_000, 1_009_000]]
        events = store.records()
        assert all(len(e) == len(EV.EVENT_FIELDS) for e in events)
        login = next(e for e in events if e[2] == EV.LOGIN_REFUSED)
        assert login[11] is None and login[12] == ["mallory", "", "127.0.0.1", ""]
        assert next(e for e in events if e[2] == EV.PUBLISHED)[11] == "n1.x.7"
    finally:
        store.close()


def test_trimming_old_events_removes_the_connections_closed_before_them(tmp_path):
    """audit_max_age: once the oldest kept event is younger than a connection's close, its
    connections record goes too (nothing names it any more); an open connection's record stays."""
    store = EventStore(str(tmp_path / "events"), "metadata", max_age=1.0)
    machine = StoredMachine()
    machine.event_sink = store.append
    try:
        note = lambda conn, kind, now: machine.apply_batch(  # noqa: E731
            now, [AuditNote(conn, None, kind, "/", "", "", "", PRINCIPAL)])
        machine.apply_batch(1_000_000, [VhostAdd(None, None, "/")])
        note("old", CEV.CONNECTION_OPENED, 1_000_100)
        note("old", CEV.CONNECTION_CLOSED, 1_000_200)
        note("open", CEV.CONNECTION_OPENED, 1_000_300)
        note("late", CEV.CONNECTION_OPENED, 5_000_000)  # 4 s later: the first ones are past max_age
        note("late", CEV.CONNECTION_CLOSED, 5_000_100)
        assert store.flush()
        assert [c[0] for c in store.records("connections")] == ["late", "old", "open"]
        assert store.compact() > 0
        assert [c[0] for c in store.records("connections")] == ["late", "open"]
    finally:
        store.close()
