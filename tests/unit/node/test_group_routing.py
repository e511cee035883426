"""Queue groups (issue 34) without processes: several state machines, one per group, driven through
node/groups.py's router, reply join and outbox forwarding, as a node drives them through their logs.

``Groups`` below is the harness: each group's "log" is a list of commands applied in batches, the
forwarder runs between batches (proposing the metadata outbox to the queue groups and the queue
groups' deletions to the metadata group, resending what is still unapplied, as a forwarder that
does not know what is in flight does), and every group has a second replica fed the same batches,
whose digest must stay equal (determinism).  Client-visible replies come out of the join.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from raftmq.node.groups import GroupRouter, ReplyJoin, forward_entries, gone_entries
from raftmq.node.tx_forward import TxForwarder
from raftmq.store.core.commands import (
    OK,
    OUT_DELIVER,
    OUT_GROUP_REPORT,
    OUT_REPLY,
    REJECTED,
    ROUTED,
    UNROUTABLE,
    Ack,
    ChannelOpen,
    ConnectionClose,
    Consume,
    DeclaredQueue,
    ExchangeDeclare,
    GoneTrim,
    GroupsSet,
    MetaTrim,
    Publish,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    TxCommit,
    VhostAdd,
)
from raftmq.store.core.groups import PLACEMENT_ARGUMENT
from raftmq.store.core.machine import StateMachine
from raftmq.store.core.tx_groups import participant_report
from raftmq.store.disk.snapshot import digest

C = "n1.1.1"  # a client connection id


class Groups:
    def __init__(self, count: int, existing: StateMachine | None = None) -> None:
        self.count = count
        self.replicas: list[tuple[StateMachine, StateMachine]] = []
        for g in range(count):
            a, b = StateMachine(), StateMachine()
            if g == 0 and existing is not None:
                a = existing
                b = _copy(existing)
            a.group = b.group = g
            self.replicas.append((a, b))
        self.logs: list[list] = [[] for _ in range(count)]
        self.router = GroupRouter(lambda: self.replicas[0][0], count)
        self.join = ReplyJoin()
        self.replies: dict[int, tuple] = {}
        self.outputs: list[tuple] = []
        self.now = 1_000_000
        self.tokens = iter(range(1, 1_000_000))
        self.tx = TxForwarder()
        self.log0([GroupsSet(None, None, count)])

    def m(self, g: int) -> StateMachine:
        return self.replicas[g][0]

    def log0(self, commands: list) -> None:
        self.logs[0].extend(commands)

    def submit(self, command) -> int | None:
        routed = self.router.route(command)
        assert not isinstance(routed, tuple) or isinstance(routed, list), routed
        self.join.expect(command.conn, command.token, command.op, len(routed), getattr(command, "channel", None))
        for g, part in routed:
            self.logs[g].append(part)
        return command.token

    def request(self, make) -> int:
        token = next(self.tokens)
        self.submit(make(token))
        return token

    def apply_pending(self, groups: Iterable[int]) -> bool:
        """Apply the given groups' pending log entries once (both replicas), no forwarding; their
        replies through the join.  Whether any group had entries."""
        busy = False
        for g in groups:
            batch, self.logs[g] = self.logs[g], []
            if not batch:
                continue
            busy = True
            self.now += 1000
            a, b = self.replicas[g]
            effects = a.apply(self.now, batch)
            b.apply(self.now, batch, replies=False)
            for out in effects.outputs:
                if out[1] == OUT_REPLY:
                    out = self.join.take(out)
                    if out is None:
                        continue
                    self.replies[out[2]] = out[3]
                self.outputs.append(out)
        return busy

    def run(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            busy = self.apply_pending(range(self.count))
            busy = self.forward() or busy
            if not busy:
                return
        raise AssertionError("groups did not settle")

    def forward(self) -> bool:
        moved = False
        meta = self.m(0)
        for g in range(1, self.count):
            group = self.m(g)
            entries = forward_entries(meta, group)
            if entries:
                self.logs[g].extend(entries)
                moved = True
            gone = gone_entries(meta, group)
            if gone:
                self.logs[0].extend(gone)
                moved = True
            taken = meta.gone_applied.get(g, 0)
            if group.gone_outbox and group.gone_outbox[0][0] <= taken:
                self.logs[g].append(GoneTrim(None, None, taken))
                moved = True
        reports = {g: participant_report(self.m(g)) for g in range(self.count)}
        for g, command in self.tx.sends(meta, reports, forget=not moved):
            self.logs[g].append(command)
            moved = True
        applied = min((self.m(g).meta_applied for g in range(1, self.count)), default=0)
        if meta.meta_outbox and meta.meta_outbox[0][0] <= applied:
            self.logs[0].append(MetaTrim(None, None, applied))
            moved = True
        return moved

    def check_replicas(self) -> None:
        for g, (a, b) in enumerate(self.replicas):
            assert digest(a) == digest(b), f"group {g}'s replicas differ"

    # -- client operations
    def setup(self) -> None:
        self.log0([VhostAdd(None, None, "/")])
        self.run()
        self.request(lambda t: ChannelOpen(C, t, 1))
        self.run()

    def declare(self, name: str, **args) -> tuple:
        t = self.request(lambda t: QueueDeclare(C, t, 1, "/", name, False, True, False,
                                                args.pop("auto_delete", False), args))
        self.run()
        return self.replies[t]

    def publish(self, exchange: str, key: str, body: bytes = b"x") -> tuple:
        t = self.request(lambda t: Publish(C, t, 1, "/", exchange, key, False, b"", body, True, None, None))
        self.run()
        return self.replies[t]


def _copy(m: StateMachine) -> StateMachine:
    from raftmq.store.disk.snapshot import export_model, import_model

    copy = StateMachine()
    import_model(copy, export_model(m))
    return copy


def queue_groups(g: Groups, name: str) -> list[int]:
    return [g.m(i).vhosts["/"].queues[name].group for i in range(g.count)]


def test_queues_are_placed_in_the_queue_groups_by_count_and_known_as_stubs_everywhere():
    """The metadata group places each new queue in the queue group with fewest queues (ties to the
    lowest) and every group learns it, with the same id and group (docs/design.md, issue 34)."""
    g = Groups(3)
    g.setup()
    for name in ("a", "b", "c", "d"):
        assert g.declare(name) == (OK, DeclaredQueue(name, 0, 0))
    assert [queue_groups(g, n)[0] for n in "abcd"] == [1, 2, 1, 2]
    for name in "abcd":
        ids = {g.m(i).vhosts["/"].queues[name].qid for i in range(3)}
        assert len(ids) == 1 and len(set(queue_groups(g, name))) == 1
    assert g.declare("pinned", **{PLACEMENT_ARGUMENT: 0}) == (OK, DeclaredQueue("pinned", 0, 0))
    assert queue_groups(g, "pinned") == [0, 0, 0]
    g.check_replicas()


def test_a_publish_to_queues_of_two_groups_is_confirmed_once_after_both_and_stored_by_each():
    """A fanout to queues of groups 1 and 2: each group stores its own copy, the client gets one
    confirm (ROUTED) once both committed; deliveries come from the queue's own group and acks go
    back to it."""
    g = Groups(3)
    g.setup()
    g.declare("a")
    g.declare("b")
    t = g.request(lambda t: ExchangeDeclare(C, t, 1, "/", "fan", "fanout", False, True, False, False, {}))
    g.run()
    assert g.replies[t][0] == OK
    for q in "ab":
        t = g.request(lambda t, q=q: QueueBind(C, t, 1, "/", q, "fan", "", {}))
        g.run()
        assert g.replies[t][0] == OK
    assert g.publish("fan", "") == (OK, ROUTED)
    assert [len(g.m(i).vhosts["/"].queues["a"].ready) for i in range(3)] == [0, 1, 0]
    assert [len(g.m(i).vhosts["/"].queues["b"].ready) for i in range(3)] == [0, 0, 1]
    t = g.request(lambda t: Consume(C, t, 1, "/", "b", "ctag", False, False, {}))
    g.run()
    assert g.replies[t] == (OK, "ctag")
    delivered = [out for out in g.outputs if out[1] == OUT_DELIVER]
    assert len(delivered) == 1 and delivered[0][3] == "ctag"
    qid, seq = delivered[0][4][0], delivered[0][4][1]
    t = g.request(lambda t: Ack(C, t, 1, [[qid, seq]]))
    g.run()
    assert g.replies[t][0] == OK
    assert g.m(2).vhosts["/"].queues["b"].unacked_count == 0
    g.check_replicas()


def test_unroutable_and_one_group_publishes_answer_as_one_group_would():
    g = Groups(3)
    g.setup()
    g.declare("a")
    assert g.publish("", "nowhere") == (OK, UNROUTABLE)
    assert g.publish("", "a") == (OK, ROUTED)
    g.declare("full", **{"x-max-length": 0, "x-overflow": "reject-publish"})
    assert g.publish("", "full") == (OK, REJECTED)


def test_a_declare_reply_waits_for_every_group_and_a_redeclare_reports_the_owner_s_counts():
    """declare-ok comes after every group applied the declare (a client may use the queue in any
    group at once); a redeclare's message count is the queue's own group's, not a stub's 0."""
    g = Groups(3)
    g.setup()
    t = g.request(lambda t: QueueDeclare(C, t, 1, "/", "q", False, True, False, False, {}))
    # Only the metadata group's batch: the reply is held while the queue groups owe theirs.
    batch, g.logs[0] = g.logs[0], []
    effects = g.m(0).apply(g.now + 1, batch)
    g.replicas[0][1].apply(g.now + 1, batch, replies=False)
    assert [g.join.take(o) for o in effects.outputs if o[1] == OUT_REPLY] == [None]
    g.forward()
    g.run()
    assert g.replies[t] == (OK, DeclaredQueue("q", 0, 0))
    g.publish("", "q")
    g.publish("", "q")
    assert g.declare("q") == (OK, DeclaredQueue("q", 2, 0))
    g.check_replicas()


def test_a_queue_deleted_by_its_group_is_forgotten_everywhere_and_a_new_one_of_that_name_survives():
    """queue.delete goes to the queue's group; its deletion flows back through the metadata group
    to every group (by queue id), and the client is answered once all have it; a queue declared
    again at once under that name is a new queue (new id) that the old deletion does not touch."""
    g = Groups(3)
    g.setup()
    g.declare("q")
    g.publish("", "q")
    old = g.m(0).vhosts["/"].queues["q"].qid
    t = g.request(lambda t: QueueDelete(C, t, 1, "/", "q", False, False))
    g.run()
    assert g.replies[t] == (OK, 1)
    assert all("q" not in g.m(i).vhosts["/"].queues for i in range(3))
    assert g.declare("q") == (OK, DeclaredQueue("q", 0, 0))
    new = g.m(0).vhosts["/"].queues["q"].qid
    assert new != old and all(g.m(i).vhosts["/"].queues["q"].qid == new for i in range(3))
    g.check_replicas()


def test_an_auto_delete_queue_goes_everywhere_when_its_last_consumer_leaves():
    g = Groups(3)
    g.setup()
    g.declare("tmp", auto_delete=True)
    owner = queue_groups(g, "tmp")[0]
    t = g.request(lambda t: Consume(C, t, 1, "/", "tmp", "c1", True, False, {}))
    g.run()
    assert g.replies[t][0] == OK
    g.submit(ConnectionClose(C, None))
    g.run()
    assert owner != 0 and all("tmp" not in g.m(i).vhosts["/"].queues for i in range(3))
    assert not g.m(owner).gone_outbox and not g.m(0).meta_outbox  # trimmed once taken in everywhere
    g.check_replicas()


def test_groups_added_to_an_existing_topology_start_from_a_replay_of_it():
    """A metadata group with queues, exchanges and bindings from before (one group, an older data
    directory) gets queue groups: they start with its topology (the outbox's first entries replay
    it), its queues stay in group 0, new queues go to the new groups."""
    old = Groups(1)
    old.setup()
    old.declare("kept")
    old.request(lambda t: ExchangeDeclare(C, t, 1, "/", "topic1", "topic", False, True, False, False, {}))
    old.run()
    old.request(lambda t: QueueBind(C, t, 1, "/", "kept", "topic1", "a.*", {}))
    old.run()
    old.publish("topic1", "a.b")
    g = Groups(3, existing=old.m(0))
    g.run()
    for i in (1, 2):
        m = g.m(i)
        assert m.vhosts["/"].queues["kept"].group == 0
        assert [b.routing_key for b in m.vhosts["/"].exchanges["topic1"].bindings] == ["a.*"]
    g.request(lambda t: ChannelOpen(C, t, 2))
    g.run()
    assert g.declare("new") == (OK, DeclaredQueue("new", 0, 0))
    assert queue_groups(g, "new") == [1, 1, 1]
    assert g.publish("topic1", "a.c") == (OK, ROUTED)
    assert len(g.m(0).vhosts["/"].queues["kept"].ready) == 2
    g.check_replicas()


def test_a_transaction_within_one_group_is_one_tx_commit_in_that_group():
    """One group's transaction is routed as it is, one ``TxCommit`` in its group's log (no
    coordinator, no change of path from one group)."""
    g = Groups(3)
    g.setup()
    g.declare("a")
    pub = Publish(C, None, 1, "/", "", "a", False, b"", b"x", True, None, None)
    assert g.router.route(TxCommit(C, 9, 1, [pub, pub])) == [(1, TxCommit(C, 9, 1, [pub, pub]))]
    t = g.request(lambda t: TxCommit(C, t, 1, [pub, pub]))
    g.run()
    assert g.replies[t] == (OK, [ROUTED, ROUTED]) and len(g.m(1).vhosts["/"].queues["a"].ready) == 2
    assert not g.m(0).tx_coord and g.m(0).tx_next == 0


@pytest.mark.parametrize("count", [1, 2])
def test_one_group_and_two_groups_answer_a_client_alike(count):
    """The same client session against 1 and 2 groups: the same replies (the join makes several
    groups look like one)."""
    g = Groups(count)
    g.setup()
    replies = [g.declare("x"), g.publish("", "x"), g.publish("", "none"), g.declare("x")]
    assert replies == [(OK, DeclaredQueue("x", 0, 0)), (OK, ROUTED), (OK, UNROUTABLE),
                       (OK, DeclaredQueue("x", 1, 0))]


def test_a_batch_reports_its_outbox_positions_as_its_last_output_only_when_they_moved():
    """A queue group's deletion leaves its outbox only once the batch that made it is released
    (durable and answered): the positions the forwarder acts on are the batch's own output
    (``OUT_GROUP_REPORT``, last), not a read of a machine that may have applied later batches.
    (A forced report read mid-fsync once sent QueueGone ahead of the delete's own reply: the
    client's delete-ok lost its message count.)"""
    g = Groups(3)
    g.setup()
    g.declare("q")
    m = g.m(g.m(0).vhosts["/"].queues["q"].group)
    effects = m.apply(g.now + 1, [QueueDelete(C, 99, 1, "/", "q", False, False)])
    last = effects.outputs[-1]
    assert last[0] is None and last[1] == OUT_GROUP_REPORT
    assert [(seq, conn, token) for seq, _qid, conn, token in last[2].gone] == [(1, C, 99)]
    # Nothing moved: no report.
    effects = m.apply(g.now + 2, [ChannelOpen(C, None, 2)])
    assert all(out[1] != OUT_GROUP_REPORT for out in effects.outputs)



def test_remembered_routes_follow_every_topology_change_and_headers_routes_are_not_remembered():
    """The router remembers a publish's groups per (vhost, exchange, key) only while the view's
    topology is the same (its metadata sequence): a binding added to a queue of another group is
    routed to at once; a headers exchange's route reads the message, so it is never remembered."""
    g = Groups(3)
    g.setup()
    g.declare("a")
    g.declare("b")
    g.request(lambda t: ExchangeDeclare(C, t, 1, "/", "fan", "fanout", False, True, False, False, {}))
    g.run()
    g.request(lambda t: QueueBind(C, t, 1, "/", "a", "fan", "", {}))
    g.run()
    probe = Publish(C, None, 1, "/", "fan", "", False, b"", b"x", True, None, None)
    assert g.router.publish_groups(probe) == [1]
    assert g.router.publish_groups(probe) == [1]  # (remembered)
    g.request(lambda t: QueueBind(C, t, 1, "/", "b", "fan", "", {}))
    g.run()
    assert g.router.publish_groups(probe) == [1, 2]
    assert g.publish("fan", "") == (OK, ROUTED)
    assert [len(g.m(i).vhosts["/"].queues[q].ready) for i, q in ((1, "a"), (2, "b"))] == [1, 1]
    g.request(lambda t: QueueBind(C, t, 1, "/", "b", "amq.headers", "", {"x-match": "any", "k": "v"}))
    g.run()
    headers = Publish(C, None, 1, "/", "amq.headers", "", False, b"", b"x", True, None, None)
    assert g.router.publish_groups(headers) == [0]  # (no headers: routed nowhere, answered by group 0)
    assert ("/", "amq.headers", "") not in g.router._routes


def test_an_echo_that_comes_before_the_reply_announcing_it_waits_for_it():
    """In a cluster each group's replica on the client's node applies at its own pace: the
    metadata group's answer to a deletion it took in (an echo) can reach the join before the
    queue's group's own delete reply, which carries the count (AMQP 0-9-1 queue.delete-ok
    message-count) and announces the echoes.  The join waits for both, in either order (a 3-node
    bench/groups.py run failed to encode delete-ok with a None count before)."""
    from raftmq.store.core.commands import Ok, Op
    from raftmq.store.core.groups import GroupEcho, GroupPending

    join = ReplyJoin()
    join.expect(C, 7, Op.QUEUE_DELETE, 1, 1)
    echo = (C, OUT_REPLY, 7, Ok(OK, GroupEcho(Ok(OK, None))), None)
    assert join.take(echo) is None
    assert join.take((C, OUT_REPLY, 7, Ok(OK, GroupPending(5, 3)), None)) is None
    assert join.take(echo) is None
    assert join.take(echo) == (C, OUT_REPLY, 7, Ok(OK, 5), 1)
    assert not join.pending
