"""0-10 and 1.0 transactions across queue groups (issue 34, session 21), without processes: three
groups' machines (two replicas each) driven through the router, the reply join and the
transaction forwarder (the harness of test_group_routing.py).

What is checked (docs/design.md "Transactions across groups", store/core/tx_groups.py):

- 0-10 tx.commit (spec class tx, L6280ff: "This command commits all messages published and
  accepted in the current transaction ... the commit will not be completed until all preceding
  commands which it affects have been completed"): a session's commit over queues of two groups is
  one ``SESSION_COMMAND`` around a ``TxBegin`` to every group; its transfers and accepts commit
  together, and its completion comes once, after every group applied the decision.
- A refusal in one group (an accepted transfer whose queue was deleted) aborts every group:
  nothing is published or accepted, and the commit fails (406 precondition-failed, an execution
  exception, 0-10 3.4.1.3 / error codes).
- Session resume exactly-once (0-10 3.5.4 replay, 3.6.2 re-attach; the idempotence barrier of
  3.2.4): a session re-attached while its commit is deciding is answered once the commit ended,
  complete with the commit's id if it committed and without it if it aborted.
- A session detached between begin and prepare still commits (the participants find the
  session by its key, not by its old connection).
- 1.0 (part 4, 4.4.2 retirement, 4.4.4.1 "the resource MUST NOT allow the successful discharge"
  when its work cannot be done): a discharge's settlements over two groups are held at prepare
  and settled at commit; one whose delivery is gone refuses and nothing is applied.
"""

from __future__ import annotations

from test_group_routing import C, Groups

from raftmq.store.core.commands import (
    ERR,
    OK,
    OUT_REPLY,
    OUT_TRANSFER,
    ROUTED,
    MessageFlow,
    MessageSettle,
    MessageStop,
    MessageSubscribe,
    Op,
    Publish,
    QueueDelete,
    SessionAttach,
    SessionAttached,
    SessionCommand,
    SessionDetach,
    SessionTimeout,
    TxBegin,
    TxCommit,
)
from raftmq.store.core.group_sessions import transfer_group
from raftmq.store.core.groups import PLACEMENT_ARGUMENT
from raftmq.store.core.ranges import contains

UNLIMITED = 0xFFFFFFFF
S = 5  # the session's channel
C2 = "n1.1.2"  # the connection a resumed session comes back on
ACCEPT = 0


def attach(g: Groups, conn: str = C, force: bool = False) -> int:
    return g.request(lambda t: SessionAttach(conn, t, S, "/", "guest", b"s1", force))


def command(g: Groups, command_id: int, inner, conn: str = C) -> int:
    return g.request(lambda t: SessionCommand(conn, t, S, command_id, inner))


def publish(key: str, body: bytes) -> Publish:
    return Publish(C, None, S, "/", "", key, False, b"", body, True, None, None)


def accept(transfer_id: int, conn: str = C) -> MessageSettle:
    return MessageSettle(conn, None, S, [[transfer_id, transfer_id]], ACCEPT)


def queue(g: Groups, name: str):
    return g.m(int(name[1])).vhosts["/"].queues[name]


def setup() -> tuple[Groups, int, int]:
    """Queues q1 (group 1) and q2 (group 2), one message in each, a session subscribed to both
    (commands 0-2, 10-12), each delivered, then the subscriptions stopped (20, 21): the transfer ids
    of the two deliveries (of group 1 and group 2)."""
    g = Groups(3)
    g.setup()
    g.declare("q1", **{PLACEMENT_ARGUMENT: 1})
    g.declare("q2", **{PLACEMENT_ARGUMENT: 2})
    g.publish("", "q1", b"old-1")
    g.publish("", "q2", b"old-2")
    attach(g)
    g.run()
    g.request(lambda t: SessionTimeout(C, t, S, 60))
    g.run()
    for i, (q, d) in enumerate((("q1", "d1"), ("q2", "d2"))):
        command(g, 10 * i, MessageSubscribe(None, None, None, "/", q, d, False, False, {}))
        command(g, 10 * i + 1, MessageFlow(None, None, None, d, 0, UNLIMITED))
        command(g, 10 * i + 2, MessageFlow(None, None, None, d, 1, UNLIMITED))
        g.run()
    for i, d in enumerate(("d1", "d2")):  # no more credit: what the tests publish or return stays ready
        command(g, 20 + i, MessageStop(None, None, None, d))
    g.run()
    transfers = [out[4] for out in g.outputs if out[1] == OUT_TRANSFER]
    ids = {transfer_group(transfer[0], 3): transfer[0] for transfer in transfers}
    assert set(ids) == {1, 2}
    OLD.clear()
    OLD.update(transfer[4].id for transfer in transfers)
    return g, ids[1], ids[2]


OLD: set[int] = set()  # the message ids of setup's two deliveries


def ready(g: Groups, name: str) -> list[str]:
    """``name``'s ready messages: "old" (setup's delivery back in the queue) or "new"."""
    return ["old" if e.message.id in OLD else "new" for e in queue(g, name).ready.entries()]


def the_commit(t1: int, t2: int) -> TxCommit:
    """What the 0-10 front end buffers: two transfers to queues of groups 1 and 2, two accepts."""
    return TxCommit(None, None, None, [publish("q1", b"new-1"), publish("q2", b"new-2"), accept(t1), accept(t2)])


def replies_to(g: Groups, token: int) -> list:
    return [out for out in g.outputs if out[1] == OUT_REPLY and out[2] == token]


def step(g: Groups, groups: tuple[int, ...]) -> None:
    """Apply only the given groups' pending log entries, once (both replicas), no forwarding."""
    g.apply_pending(groups)


def no_transaction_left(g: Groups) -> bool:
    return all(not g.m(i).tx_coord and not g.m(i).tx_held for i in range(3))


def test_a_session_commit_across_two_groups_is_a_tx_begin_in_every_groups_session_command():
    """The router turns the session's cross-group TxCommit into SESSION_COMMAND(TxBegin) to every
    group: the metadata group coordinates, each group keeps the command id in its barrier."""
    g, t1, t2 = setup()
    routed = g.router.route(SessionCommand(C, 99, S, 30, the_commit(t1, t2)))
    assert [grp for grp, _ in routed] == [0, 1, 2]
    assert all(part.command_id == 30 and isinstance(part.inner, TxBegin) for _grp, part in routed)
    assert [p[0] for p in routed[0][1].inner.parts] == [1, 2]


def test_a_session_commit_across_two_groups_commits_whole_and_completes_once_after_the_decision():
    """Both transfers are stored and both accepted messages are gone for good; the commit's
    answer comes out of the join once (OK), after every participant applied the decision; every
    group's barrier holds the commit's id; nothing of the protocol is left; replicas identical."""
    g, t1, t2 = setup()
    t = command(g, 30, the_commit(t1, t2))
    step(g, (0, 1, 2))  # the TxBegin in the metadata group, the barrier entries elsewhere
    assert t not in g.replies and g.m(0).tx_coord  # pending: no answer before the decision
    g.run()
    assert len(replies_to(g, t)) == 1 and g.replies[t][0] == OK
    q1, q2 = queue(g, "q1"), queue(g, "q2")
    assert ready(g, "q1") == ["new"] and ready(g, "q2") == ["new"]
    assert q1.unacked_count == 0 and q2.unacked_count == 0  # the accepted ones gone
    for i in range(3):
        s = next(iter(g.m(i).sessions.values()))
        assert contains(s.completed, 30) and not s.transfers
    assert no_transaction_left(g) and not g.join.pending
    g.check_replicas()


def test_an_accept_of_a_deleted_queues_message_aborts_every_group_and_the_commit_fails():
    """q1 is deleted (another channel) before the commit: group 1 refuses its part (406), the
    coordinator aborts, group 2 drops its held transfer and returns its held accept's message;
    the commit fails once with 406; the metadata group's barrier no longer holds the commit's id
    (a resume would not report it complete)."""
    g, t1, t2 = setup()
    t = g.request(lambda t: QueueDelete(C, t, 1, "/", "q1", False, False))
    g.run()
    assert g.replies[t][0] == OK
    t = command(g, 30, the_commit(t1, t2))
    g.run()
    assert len(replies_to(g, t)) == 1 and g.replies[t][0] == ERR and g.replies[t][1] == 406
    q2 = queue(g, "q2")
    assert ready(g, "q2") == ["old"] and q2.unacked_count == 0  # old-2 back, new-2 never stored
    assert not contains(next(iter(g.m(0).sessions.values())).completed, 30)
    assert no_transaction_left(g)
    g.check_replicas()


def test_a_resume_while_the_commit_is_deciding_is_answered_after_it_with_the_commit_complete():
    """The client's connection drops after the TxBegin was applied; it re-attaches (force) on
    another connection before the participants prepared: the attach's answer waits for the
    transaction's end, and then reports the commit's id complete (it committed: the client must
    not replay it as lost); the commit's own answer went to the old connection, once."""
    g, t1, t2 = setup()
    t = command(g, 30, the_commit(t1, t2))
    step(g, (0, 1, 2))
    g.submit(SessionDetach(C, None, S))
    step(g, (0, 1, 2))
    a = attach(g, C2, force=True)
    step(g, (0, 1, 2))
    assert a not in g.replies  # group 0 holds it: the transaction is deciding
    g.run()
    status, attached = g.replies[a]
    assert status == OK and isinstance(attached, SessionAttached) and attached.resumed
    assert contains(attached.completed, 30)
    assert len(replies_to(g, t)) == 1 and g.replies[t][0] == OK
    assert ready(g, "q1") == ["new"] and ready(g, "q2") == ["new"]
    assert no_transaction_left(g) and not g.join.pending
    g.check_replicas()


def test_a_resume_while_an_aborting_commit_decides_reports_it_not_complete():
    """As above, but group 1's part is refused (its queue deleted): the resumed session's
    completed set lacks the commit's id, so the client replays it (as lost: the front end fails
    it) and nothing of it was applied."""
    g, t1, t2 = setup()
    g.request(lambda t: QueueDelete(C, t, 1, "/", "q1", False, False))
    g.run()
    command(g, 30, the_commit(t1, t2))
    step(g, (0, 1, 2))
    a = attach(g, C2, force=True)
    g.run()
    status, attached = g.replies[a]
    assert status == OK and attached.resumed and not contains(attached.completed, 30)
    assert contains(attached.completed, 21)  # (the commands before it stay complete)
    assert ready(g, "q2") == ["old"]  # old-2 returned, new-2 never stored
    assert no_transaction_left(g)
    g.check_replicas()


def test_a_session_detached_between_begin_and_prepare_still_commits():
    """The participants prepare on the session found by its key: detached (its connection gone),
    it still holds its deliveries, and the transaction commits whole."""
    g, t1, t2 = setup()
    t = command(g, 30, the_commit(t1, t2))
    step(g, (0, 1, 2))
    g.submit(SessionDetach(C, None, S))
    step(g, (0, 1, 2))
    assert all(C not in g.m(i).channels or S not in g.m(i).channels[C] for i in range(3))
    g.run()
    assert g.replies[t][0] == OK
    q1, q2 = queue(g, "q1"), queue(g, "q2")
    assert ready(g, "q1") == ["new"] and ready(g, "q2") == ["new"]
    assert q1.unacked_count == 0 and q2.unacked_count == 0
    assert no_transaction_left(g)
    g.check_replicas()


def test_a_discharge_with_settlements_in_two_groups_holds_them_at_prepare_and_settles_at_commit():
    """A 1.0 discharge is a TxCommit on the coordinator's core session (not a session command):
    a publish and settlements of transfers numbered by groups 1 and 2 (the links' core session).
    The settled deliveries leave the session at prepare (a detach then cannot requeue them) and
    are accepted at commit; the discharge is answered once."""
    g, t1, t2 = setup()
    ops = [publish("q2", b"new-2"), MessageSettle(C, None, S, [[t1, t1], [t2, t2]], ACCEPT)]
    t = g.request(lambda t: TxCommit(C, t, S, ops))
    routed_op = g.logs[0][-1].op
    assert routed_op == Op.TX_BEGIN
    g.run()
    assert len(replies_to(g, t)) == 1 and g.replies[t] == (OK, [ROUTED])
    q1, q2 = queue(g, "q1"), queue(g, "q2")
    assert ready(g, "q1") == [] and q1.unacked_count == 0 and ready(g, "q2") == ["new"] and q2.unacked_count == 0
    assert no_transaction_left(g)
    g.check_replicas()


def test_a_discharge_whose_settled_delivery_is_gone_refuses_and_applies_nothing():
    """1.0 4.4.4.1: the work cannot be done (q1 deleted: its transfer's delivery is gone): group 1
    refuses, the publish to q2 is dropped and q2's held delivery goes back to the queue."""
    g, t1, t2 = setup()
    t = g.request(lambda t: QueueDelete(C, t, 1, "/", "q1", False, False))
    g.run()
    ops = [publish("q2", b"new-2"), MessageSettle(C, None, S, [[t1, t1], [t2, t2]], ACCEPT)]
    t = g.request(lambda t: TxCommit(C, t, S, ops))
    g.run()
    assert g.replies[t][0] == ERR and g.replies[t][1] == 406
    q2 = queue(g, "q2")
    assert ready(g, "q2") == ["old"] and q2.unacked_count == 0
    assert no_transaction_left(g)
    g.check_replicas()


def test_a_committed_commit_whose_barrier_entry_one_group_lost_is_still_complete_on_resume():
    """Group 1's copy of the commit's SESSION_COMMAND is lost (a leader change in group 1): the
    groups' barriers no longer all hold the id, but the metadata group committed it and says so
    (``tx_decided``): the resume's joined answer reports it complete, so the client does not
    replay a commit that happened as a lost one.  Once the client says known-completed, the
    metadata group forgets it.  (The commit's own answer never comes: the join waits for group 1's
    reply, as for any session command lost in one group; the client fails over and resumes.)"""
    from raftmq.store.core.commands import SessionKnownCompleted

    g, t1, t2 = setup()
    t = command(g, 30, the_commit(t1, t2))
    g.logs[1] = [cmd for cmd in g.logs[1] if cmd.op != Op.SESSION_COMMAND]  # lost in group 1
    g.run()
    assert t not in g.replies  # (the join still waits for group 1: the client will fail over)
    assert ready(g, "q1") == ["new"] and ready(g, "q2") == ["new"] and no_transaction_left(g)
    assert not contains(next(iter(g.m(1).sessions.values())).completed, 30)
    a = attach(g, C2, force=True)
    g.run()
    status, attached = g.replies[a]
    assert status == OK and attached.resumed and contains(attached.completed, 30)
    assert g.m(0).tx_decided
    g.request(lambda t: SessionKnownCompleted(C2, t, S, [[30, 30]]))
    g.run()
    assert not g.m(0).tx_decided
    g.check_replicas()


def test_an_echoed_resume_answer_gets_its_replays_bodies():
    """The resume answered after a transaction (a ``GroupEcho`` around the ``SessionAttached``)
    replays unsettled transfers as a direct answer does: store/disk/bodies.py ``fill_bodies``
    gives each replayed transfer its body."""
    from raftmq.store.core.commands import GroupEcho, Ok, SessionAttached
    from raftmq.store.core.model import Message
    from raftmq.store.disk.bodies import DictBodies, fill_bodies

    message = Message(7, "", "q", b"", 4, True, 0, 0, 0, 0)
    attached = SessionAttached(True, [[0, 3]], [(2, "d", 1, 5, message)], False, [])
    outputs = [(C, OUT_REPLY, 9, Ok(OK, GroupEcho(Ok(OK, attached))), S)]
    bodies = DictBodies()
    bodies.put([(7, b"body")])
    fill_bodies(outputs, bodies)
    echo = outputs[0][3][1]
    assert isinstance(echo, GroupEcho) and echo.result[1].replay == [(2, "d", 1, 5, message, b"body")]


def test_a_session_transaction_record_survives_a_snapshot_and_one_from_before_session_21_loads():
    """The metadata group's record of a 0-10 commit deciding (its session's key, command id and a
    waiting resume) goes through a snapshot (store/disk/snapshot.py) unchanged: same digest; a
    record pickled before those fields existed loads with their defaults (TxCoord.__setstate__)."""
    import pickle

    from raftmq.store.core.machine import StateMachine
    from raftmq.store.core.tx_groups import TxCoord
    from raftmq.store.disk.snapshot import digest, export_model, import_model

    g, t1, t2 = setup()
    command(g, 30, the_commit(t1, t2))
    step(g, (0, 1, 2))
    attach(g, C2, force=True)
    step(g, (0,))
    rec = next(iter(g.m(0).tx_coord.values()))
    assert rec.session is not None and rec.command_id == 30 and rec.waiters
    copy = StateMachine()
    import_model(copy, export_model(g.m(0)))
    assert digest(copy) == digest(g.m(0))
    _none, state = rec.__getstate__()
    old = {k: v for k, v in state.items() if k not in ("session", "command_id", "waiters")}
    loaded = pickle.loads(pickle.dumps(TxCoord("c", 1, None, 0, {})))
    loaded.__setstate__((None, old))
    assert (loaded.session, loaded.command_id, loaded.waiters) == (None, -1, []) and loaded.parts == rec.parts


def test_a_session_commit_with_a_part_in_the_metadata_group_commits_there_too():
    """A queue a 0-10 session declares lives in the metadata group (docs/design.md): a commit
    over it and q2 (group 2) has the coordinator as a participant too; all three queues'
    work commits together, once."""
    g, t1, t2 = setup()
    g.declare("q0", **{PLACEMENT_ARGUMENT: 0})
    commit = TxCommit(None, None, None, [publish("q0", b"new-0"), publish("q2", b"new-2"), accept(t1), accept(t2)])
    routed = g.router.route(SessionCommand(C, 99, S, 30, commit))
    assert [p[0] for p in routed[0][1].inner.parts] == [0, 1, 2]
    t = command(g, 30, commit)
    g.run()
    assert len(replies_to(g, t)) == 1 and g.replies[t][0] == OK
    assert ready(g, "q2") == ["new"] and len(g.m(0).vhosts["/"].queues["q0"].ready) == 1
    assert queue(g, "q1").unacked_count == 0 and queue(g, "q2").unacked_count == 0
    assert no_transaction_left(g)
    g.check_replicas()
