"""AMQP 0-10 sessions and 1.0 links' core sessions with queue groups (issue 34, session 20), without
processes: three groups' state machines driven through node/groups.py's router and reply join
(the harness of test_group_routing.py), every group with a second replica whose digest must agree.

What store/core/group_sessions.py promises (docs/design.md "Sessions and links with queue groups"):
a session is a replica in every group; each group records every command id in its barrier and
executes its part; transfer ids of group g are g mod G; a resume is told complete only what every
group applied, so a command lost in one group is replayed and applied there once (0-10 spec 3.5.4
replay, 3.6.2 re-attach; the idempotence barrier of 3.2.4).
"""

from __future__ import annotations

from raftmq.store.core.commands import (
    OK,
    OUT_TRANSFER,
    ROUTED,
    Duplicate,
    ExchangeDeclare,
    MessageFlow,
    MessageSettle,
    MessageSubscribe,
    Op,
    Publish,
    QueueBind,
    SessionAttach,
    SessionAttached,
    SessionCommand,
    TxCommit,
)
from raftmq.store.core.group_sessions import intersect, transfer_group
from raftmq.store.core.groups import PLACEMENT_ARGUMENT
from raftmq.store.core.ranges import contains
from tests.unit.node.test_group_routing import C, Groups

UNLIMITED = 0xFFFFFFFF
S = 5  # the session's channel


def session(g: Groups, force: bool = False) -> tuple:
    t = g.request(lambda t: SessionAttach(C, t, S, "/", "guest", b"s1", force))
    g.run()
    return g.replies[t]


def command(g: Groups, command_id: int, inner) -> tuple:
    t = g.request(lambda t: SessionCommand(C, t, S, command_id, inner))
    g.run()
    return g.replies[t]


def publish(exchange: str, key: str, body: bytes) -> Publish:
    return Publish(None, None, None, "/", exchange, key, False, b"", body, True, None, None)


def setup() -> Groups:
    g = Groups(3)
    g.setup()
    g.declare("q1", **{PLACEMENT_ARGUMENT: 1})
    g.declare("q2", **{PLACEMENT_ARGUMENT: 2})
    return g


def test_a_session_is_in_every_group_and_its_subscription_and_transfers_in_the_queues_group():
    """Attach answers once (joined); a subscription to a queue of group 2 exists in group 2 alone; a
    0-10 transfer to it completes routed and is delivered with an id of group 2 (2 mod 3); the accept
    (sent to every group) settles it in group 2; every group's barrier holds every command id; the
    replicas of each group stay identical."""
    g = setup()
    status, attached = session(g)
    assert status == OK and isinstance(attached, SessionAttached) and not attached.resumed
    assert all(g.m(i).sessions for i in range(3))
    assert command(g, 0, MessageSubscribe(None, None, None, "/", "q2", "d", False, False, {}))[0] == OK
    assert command(g, 1, MessageFlow(None, None, None, "d", 0, UNLIMITED))[0] == OK
    assert command(g, 2, MessageFlow(None, None, None, "d", 1, UNLIMITED))[0] == OK
    assert [bool(g.m(i).channels.get(C, {}).get(S) and g.m(i).channels[C][S].consumers) for i in range(3)] \
        == [False, False, True]
    assert command(g, 3, publish("", "q2", b"m")) == (OK, ROUTED)
    transfers = [out for out in g.outputs if out[1] == OUT_TRANSFER]
    assert len(transfers) == 1 and transfer_group(transfers[0][4][0], 3) == 2
    transfer_id = transfers[0][4][0]
    assert command(g, 4, MessageSettle(None, None, None, [[transfer_id, transfer_id]], 0))[0] == OK
    assert len(g.m(2).vhosts["/"].queues["q2"].ready) == 0 and not g.m(2).sessions[next(iter(g.m(2).sessions))].transfers
    for i in range(3):
        completed = next(iter(g.m(i).sessions.values())).completed
        assert all(contains(completed, n) for n in range(5)), (i, completed)
    g.check_replicas()


def test_a_command_lost_in_one_group_is_not_complete_on_resume_and_its_replay_applies_once_each():
    """A transfer to a fanout over queues of groups 1 and 2 reaches group 1's log but is lost before
    group 2's (a leader change): the re-attach (force) reports complete the intersection of the
    groups' barriers, without it; the client replays it under the same id: group 1 answers
    Duplicate, group 2 stores it; each queue holds the message once, the join answers routed."""
    g = setup()
    t = g.request(lambda t: ExchangeDeclare(C, t, 1, "/", "fan", "fanout", False, True, False, False, {}))
    g.run()
    for q in ("q1", "q2"):
        t = g.request(lambda t, q=q: QueueBind(C, t, 1, "/", q, "fan", "", {}))
        g.run()
        assert g.replies[t][0] == OK
    session(g)
    assert command(g, 0, publish("fan", "", b"first")) == (OK, ROUTED)
    g.submit(SessionCommand(C, None, S, 1, publish("fan", "", b"second")))
    g.logs[2] = [c for c in g.logs[2] if c.op != Op.SESSION_COMMAND]  # lost in group 2
    g.run()
    status, attached = session(g, force=True)
    assert status == OK and attached.resumed and attached.completed == [[0, 0]]
    assert command(g, 1, publish("fan", "", b"second")) == (OK, ROUTED)
    q1, q2 = g.m(1).vhosts["/"].queues["q1"], g.m(2).vhosts["/"].queues["q2"]
    assert len(q1.ready) == 2 and len(q2.ready) == 2
    status, attached = session(g, force=True)
    assert attached.completed == [[0, 1]]
    assert command(g, 1, publish("fan", "", b"second")) == (OK, Duplicate())  # every group had it
    assert len(q1.ready) == 2 and len(q2.ready) == 2
    g.check_replicas()


def test_a_link_subscription_goes_to_its_queues_group_and_so_do_its_credit_and_settlements():
    """A 1.0 link's core session: MESSAGE_SUBSCRIBE (not wrapped) goes to the queue's group only,
    its credit after it; a settlement's ids go to the groups that numbered them (id mod 3); credit
    for a subscription the router never saw goes to every group, each ignoring it where it has no
    such subscription (no 404)."""
    g = setup()
    session(g)
    router = g.router
    sub = MessageSubscribe(C, None, S, "/", "q1", "l5", False, False, {})
    assert [grp for grp, _ in router.route(sub)] == [1]
    assert [grp for grp, _ in router.route(MessageFlow(C, None, S, "l5", 0, 10))] == [1]
    assert [grp for grp, _ in router.route(MessageFlow(C, None, S, "other", 0, 10))] == [0, 1, 2]
    split = router.route(MessageSettle(C, None, S, [[1, 5]], 0))
    assert [(grp, part.ranges) for grp, part in split] == [(0, [[3, 3]]), (1, [[1, 1], [4, 4]]), (2, [[2, 2], [5, 5]])]
    t = g.request(lambda t: MessageFlow(C, t, S, "unknown", 0, 10))
    g.run()
    assert g.replies[t][0] == OK
    g.check_replicas()


def test_a_session_transaction_within_one_group_commits_there_as_one_command():
    """A 0-10 tx.commit whose transfers go to one group's queue is one TxCommit in that group's log,
    as with one group (across groups: tests/unit/node/test_tx_groups_sessions.py)."""
    g = setup()
    session(g)
    within = TxCommit(None, None, None, [publish("", "q2", b"a"), publish("", "q2", b"b")])
    assert {part.inner.op for _grp, part in g.router.route(SessionCommand(C, 1, S, 0, within))} == {Op.TX_COMMIT}
    assert command(g, 0, within)[0] == OK
    assert len(g.m(2).vhosts["/"].queues["q2"].ready) == 2
    g.check_replicas()


def test_intersect_of_completed_ranges():
    assert intersect([[0, 5], [8, 9]], [[0, 2], [4, 8]]) == [[0, 2], [4, 5], [8, 8]]
    assert intersect([], [[0, 3]]) == []
    assert intersect([[0, 3]], [[0, 3]]) == [[0, 3]]


def test_a_session_queue_delete_completes_once_every_group_forgot_the_queue():
    """0-10 queue.delete in a session (queue-exists rule, L7832ff) of a queue of group 1 and of one the
    session declared (metadata group): each completes, once every group has forgotten the queue
    (the other groups' answers join the session command's), as a 0-9-1 delete-ok does."""
    from raftmq.store.core.commands import QueueDeclare, QueueDelete

    g = setup()
    session(g)
    assert command(g, 0, QueueDelete(None, None, None, "/", "q1", False, False))[0] == OK
    assert all("q1" not in g.m(i).vhosts["/"].queues for i in range(3))
    assert command(g, 1, QueueDeclare(None, None, None, "/", "mine", False, True, False, False, {}))[0] == OK
    assert [g.m(i).vhosts["/"].queues["mine"].group for i in range(3)] == [0, 0, 0]
    assert command(g, 2, QueueDelete(None, None, None, "/", "mine", False, False))[0] == OK
    assert all("mine" not in g.m(i).vhosts["/"].queues for i in range(3))
    assert not g.join.pending
    g.check_replicas()
