"""AMQP 0-10 sessions in the state machine (spec 3.1-3.6): resume anywhere, exactly-once, replay."""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import (
    ERR,
    OUT_REPLY,
    OUT_SESSION_DETACHED,
    OUT_TRANSFER,
    ConnectionClose,
    Duplicate,
    NodeReset,
    Op,
    SessionAttached,
    SessionBusy,
    Tick,
    VhostAdd,
    make,
)
from raftmq.store.core.sessions import SETTLE_ACCEPT, SETTLE_RELEASE_REDELIVERED, UNLIMITED

NOW = 1_700_000_000_000_000
NAME = b"session-1"


class Client:
    def __init__(self, machine: StoredMachine, conn: str, ch: int = 1) -> None:
        self.m, self.conn, self.ch = machine, conn, ch
        self.token = 0
        self.next_id = 0
        self.outputs: list = []

    def call(self, op, *args, now=NOW):
        self.token += 1
        out = self.m.apply_batch(now, [make(op, self.conn, self.token, self.ch, *args)])
        self.outputs += out
        return next(o[3] for o in out if o[1] == OUT_REPLY and o[2] == self.token)

    def command(self, op, *args, command_id=None):
        """A model command through the session layer (ids are assigned like a front end does)."""
        if command_id is None:
            command_id, self.next_id = self.next_id, self.next_id + 1
        return self.call(Op.SESSION_COMMAND, command_id, make(op, self.conn, None, self.ch, *args))

    def transfers(self):
        return [o for o in self.outputs if o[1] == OUT_TRANSFER]


def machine_with_queue() -> StoredMachine:
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    return m


def attach(m, conn, force=False):
    c = Client(m, conn)
    return c, c.call(Op.SESSION_ATTACH, "/", "guest", NAME, force)


def test_a_new_session_then_busy_then_forced_resume():
    m = machine_with_queue()
    a, result = attach(m, "n1.x.1")
    assert result.value.__class__ is SessionAttached and not result.value.resumed
    a.call(Op.SESSION_TIMEOUT, 60)
    _, busy = attach(m, "n2.y.1")
    assert busy.value == SessionBusy()  # 3.5.1: an attachment is exclusive
    b, forced = attach(m, "n2.y.1", force=True)
    assert forced.value.__class__ is SessionAttached and forced.value.resumed
    assert any(o[1] == OUT_SESSION_DETACHED and o[0] == "n1.x.1" for o in b.outputs)


def test_forcing_a_zero_timeout_session_starts_a_new_one():
    """session.request-timeout (L4587ff) and 3.6.4: state with timeout 0 does not outlive a detach,
    and taking over an attachment detaches it -- so the forced attach gets a new session (as
    qpid.messaging expects when it re-attaches after failover and numbers its commands from 0)."""
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.command(Op.QUEUE_DECLARE, "/", "q", False, True, False, False, {})  # command 0 completed
    b, forced = attach(m, "n2.y.1", force=True)
    assert (forced.value.resumed, forced.value.completed) == (False, [])
    assert any(o[1] == OUT_SESSION_DETACHED and o[0] == "n1.x.1" for o in b.outputs)


def test_replayed_commands_are_applied_once():
    """3.5.2: the idempotence barrier; a client replaying after failover publishes once."""
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 60)
    a.command(Op.QUEUE_DECLARE, "/", "q", False, True, False, False, {})
    publish = (Op.PUBLISH, "/", "", "q", False, b"\x00\x00", b"once", True, 0, None)
    a.command(*publish)  # id 1
    # The node dies; the client resumes on another node and replays command 1 (it never saw it completed).
    m.apply_batch(NOW, [NodeReset(None, None, "n1", None)])
    b, result = attach(m, "n2.y.1", force=True)
    assert result.value.completed == [[0, 1]]  # completed ids the server holds: the client need replay nothing
    assert b.command(*publish, command_id=1).value == Duplicate()
    assert len(m.vhosts["/"].queues["q"].ready) == 1


def test_deliveries_are_numbered_replayed_on_resume_and_settled_by_id():
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 60)
    a.command(Op.QUEUE_DECLARE, "/", "q", False, True, False, False, {})
    for body in (b"m0", b"m1", b"m2"):
        a.command(Op.PUBLISH, "/", "", "q", False, b"\x00\x00", body, True, 0, None)
    a.command(Op.MESSAGE_SUBSCRIBE, "/", "q", "dest", False, False, {})
    assert a.transfers() == []  # no credit yet
    a.command(Op.MESSAGE_FLOW, "dest", 0, 2)
    a.command(Op.MESSAGE_FLOW, "dest", 1, UNLIMITED)
    sent = a.transfers()
    assert [(o[4][0], o[4][5]) for o in sent] == [(0, b"m0"), (1, b"m1")]  # credit 2
    a.command(Op.MESSAGE_SETTLE, [[0, 0]], SETTLE_ACCEPT)
    # The node dies before transfer 1 is accepted; the session is resumed elsewhere.
    m.apply_batch(NOW, [NodeReset(None, None, "n1", None)])
    assert "dest" in m.sessions[next(iter(m.sessions))].channel.consumers  # subscriptions survive
    b, result = attach(m, "n2.y.1")
    replay = result.value.replay
    assert [(t[0], t[1], t[5]) for t in replay] == [(1, "dest", b"m1")]
    b.command(Op.MESSAGE_SETTLE, [[1, 1]], SETTLE_RELEASE_REDELIVERED, command_id=100)
    b.command(Op.MESSAGE_FLOW, "dest", 0, 5, command_id=101)
    later = [(o[4][0], o[4][3], o[4][5]) for o in b.transfers()]
    assert later == [(2, True, b"m1"), (3, False, b"m2")]  # new ids; m1 redelivered


def test_detached_session_expires_after_its_timeout_and_requeues():
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 5)
    a.command(Op.QUEUE_DECLARE, "/", "q", False, True, False, False, {})
    a.command(Op.PUBLISH, "/", "", "q", False, b"\x00\x00", b"x", True, 0, None)
    a.command(Op.MESSAGE_SUBSCRIBE, "/", "q", "d", False, False, {})
    a.command(Op.MESSAGE_FLOW, "d", 0, UNLIMITED)
    a.command(Op.MESSAGE_FLOW, "d", 1, UNLIMITED)
    assert len(a.transfers()) == 1
    m.apply_batch(NOW, [ConnectionClose("n1.x.1", None)])
    assert m.sessions and m.next_expiry_due()
    m.apply_batch(NOW + 4_000_000, [Tick(None, None)])
    assert m.sessions  # not yet
    m.apply_batch(NOW + 5_000_000, [Tick(None, None)])
    assert not m.sessions
    queue = m.vhosts["/"].queues["q"]
    assert len(queue.ready) == 1 and queue.ready.peek().delivery_count == 1


def test_an_execution_error_destroys_the_session():
    """3.4.1.3: an exception destroys the session state."""
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 60)
    result = a.command(Op.QUEUE_DECLARE, "/", "missing", True, False, False, False, {})  # passive: 404
    assert result[0] == ERR and result[1] == 404
    assert not m.sessions


def test_known_completed_prunes_the_barrier():
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    for _ in range(5):
        a.command(Op.QOS, 0, False)
    session = next(iter(m.sessions.values()))
    assert session.completed == [[0, 4]]
    a.call(Op.SESSION_KNOWN_COMPLETED, [[0, 2]])
    assert session.completed == [[3, 4]]


def test_ranges():
    r: list[list[int]] = []
    for lo, hi in ((5, 7), (1, 2), (3, 4), (10, 10)):
        rs.add(r, lo, hi)
    assert r == [[1, 7], [10, 10]]
    rs.remove(r, 3, 5)
    assert r == [[1, 2], [6, 7], [10, 10]]
    assert rs.contains(r, 6) and not rs.contains(r, 4)
    assert list(rs.ids([[1, 3]])) == [1, 2, 3]
    assert rs.from_ids([3, 1, 2, 7]) == [[1, 3], [7, 7]]


def test_exclusive_queues_belong_to_the_session_and_survive_its_failover():
    """0-10 queue.declare exclusive: exclusive to the session, so a resumed session keeps it."""
    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 60)
    a.command(Op.QUEUE_DECLARE, "/", "mine", False, False, True, False, {})
    other = Client(m, "n3.z.1")
    other.call(Op.CHANNEL_OPEN)
    assert other.call(Op.QUEUE_DECLARE, "/", "mine", True, False, False, False, {})[:2] == (ERR, 405)
    m.apply_batch(NOW, [NodeReset(None, None, "n1", None)])
    b, _ = attach(m, "n2.y.1", force=True)
    assert b.command(Op.QUEUE_DECLARE, "/", "mine", True, False, False, False, {}, command_id=10)[0] == 0
    b.call(Op.SESSION_TIMEOUT, 0)
    b.call(Op.SESSION_DETACH)  # timeout 0: the session ends, and its exclusive queue with it
    assert "mine" not in m.vhosts["/"].queues


def test_next_deadline_is_the_earliest_expiry():
    m = machine_with_queue()
    assert m.next_deadline() is None
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 30)
    m.apply_batch(NOW, [ConnectionClose("n1.x.1", None)])
    assert m.next_deadline() == NOW + 30_000_000
    c = Client(m, "n2.y.1")
    c.call(Op.CHANNEL_OPEN)
    c.call(Op.QUEUE_DECLARE, "/", "ttl", False, False, False, False, {"x-message-ttl": 1000})
    c.call(Op.PUBLISH, "/", "", "ttl", False, b"\x00\x00", b"x", False, 0, None)
    assert m.next_deadline() == NOW + 1_000_000 + 1
