"""Transactions across queue groups (issue 34): the two-phase commit of store/core/tx_groups.py,
driven on three groups' machines (two replicas each) through the router, the reply join and the
forwarder (node/tx_forward.py), without processes: the harness of test_group_routing.py.

AMQP 0-9-1 reference 1.9 (class tx): "all publish and ack requests issued within a transaction
will complete successfully or none of them will" -- which the spec only asks for a single queue
("Transactions that cover multiple queues may be non-atomic"); raftmq keeps it across queues and
across groups, and that is what is checked here.  A part a group cannot commit (an ack whose
delivery is gone there) is refused with 406 (reference, constants: "precondition-failed ... some
precondition failed"), and then every group aborts.
"""

from __future__ import annotations

from test_group_routing import C, Groups

from raftmq.node.tx_forward import TxForwarder
from raftmq.store.core.commands import (
    ERR,
    OK,
    ROUTED,
    UNROUTABLE,
    Ack,
    ChannelClose,
    Get,
    Op,
    Publish,
    QueueDelete,
    TxBegin,
    TxCommit,
)
from raftmq.store.core.groups import PLACEMENT_ARGUMENT
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.snapshot import digest, export_model, import_model


def pub(queue: str, body: bytes = b"x") -> Publish:
    return Publish(C, None, 1, "/", "", queue, False, b"", body, True, None, None)


def three_queues() -> Groups:
    """Queues a (group 1), b (group 2), c (group 1) and z (group 0); one message in c got (unacked)."""
    g = Groups(3)
    g.setup()
    g.declare("a", **{PLACEMENT_ARGUMENT: 1})
    g.declare("b", **{PLACEMENT_ARGUMENT: 2})
    g.declare("c", **{PLACEMENT_ARGUMENT: 1})
    g.declare("z", **{PLACEMENT_ARGUMENT: 0})
    g.publish("", "c", b"to-ack")
    return g


def get(g: Groups, queue: str) -> tuple:
    t = g.request(lambda t: Get(C, t, 1, "/", queue, False))
    g.run()
    value = g.replies[t][1]
    return (value.qid, value.seq)


def ready(g: Groups, queue: str) -> list[int]:
    return [len(g.m(i).vhosts["/"].queues[queue].ready) for i in range(g.count)]


def step(g: Groups, groups: tuple[int, ...]) -> None:
    """Apply only the given groups' pending log entries, once (both replicas), no forwarding."""
    g.apply_pending(groups)


def test_a_transaction_over_three_groups_commits_all_and_answers_once_after_every_group():
    """Publishes to a (group 1) and b (group 2) and the ack of a message of c: the router makes
    one TxBegin for the metadata group; the client's answer comes once every participant applied
    the decision, with the publishes' outcomes in order; every replica agrees (digest)."""
    g = three_queues()
    ref = get(g, "c")
    ops = [pub("a"), pub("b"), pub("nowhere"), Ack(C, None, 1, [list(ref)])]
    routed = g.router.route(TxCommit(C, 7, 1, ops))
    assert len(routed) == 1 and routed[0][0] == 0 and isinstance(routed[0][1], TxBegin)
    assert [part[0] for part in routed[0][1].parts] == [0, 1, 2]  # the unroutable publish: group 0
    t = g.request(lambda t: TxCommit(C, t, 1, ops))
    g.run()
    assert g.replies[t] == (OK, [ROUTED, ROUTED, UNROUTABLE])
    assert ready(g, "a") == [0, 1, 0] and ready(g, "b") == [0, 0, 1]
    assert g.m(1).vhosts["/"].queues["c"].unacked_count == 0 and ready(g, "c") == [0, 0, 0]
    for i in range(3):  # everything forgotten once answered
        assert not g.m(i).tx_coord and not g.m(i).tx_held
    g.check_replicas()


def test_nothing_is_visible_before_the_decision_and_a_prepared_ack_cannot_be_redelivered():
    """Between prepare and finish, the publishes are held (not in their queues) and the acked
    delivery is out of its channel: the channel's close then requeues nothing of it, and the
    transaction still commits whole (its publishes applied on a lent channel)."""
    g = three_queues()
    ref = get(g, "c")
    t = g.request(lambda t: TxCommit(C, t, 1, [pub("a"), pub("b"), Ack(C, None, 1, [list(ref)])]))
    step(g, (0,))  # TxBegin
    g.forward()  # the prepares
    step(g, (1, 2))
    assert all(g.m(i).tx_held for i in (1, 2)) and ready(g, "a") == [0, 0, 0] and ready(g, "b") == [0, 0, 0]
    c = g.m(1).vhosts["/"].queues["c"]
    assert c.unacked_count == 0 and len(c.ready) == 0  # held by the transaction, not the channel
    g.check_replicas()
    g.submit(ChannelClose(C, None, 1))  # the client closes its channel meanwhile: nothing requeued
    g.run()
    assert g.replies[t] == (OK, [ROUTED, ROUTED])
    assert ready(g, "a") == [0, 1, 0] and ready(g, "c") == [0, 0, 0] and c.unacked_count == 0
    g.check_replicas()


def test_a_refusing_participant_aborts_every_group_and_its_held_deliveries_return():
    """Group 1 cannot ack (c was deleted: the delivery is unknown there): it refuses, the
    coordinator decides abort, group 2 drops its held publish; nothing of the transaction is in
    any queue, the client gets the refusal (406), and group 2's held ack of b's message returns."""
    g = three_queues()
    g.publish("", "b", b"b1")
    ref_c = get(g, "c")
    ref_b = get(g, "b")
    t = g.request(lambda t: QueueDelete(C, t, 1, "/", "c", False, False))
    g.run()
    assert g.replies[t][0] == OK
    t = g.request(lambda t: TxCommit(C, t, 1, [pub("a"), pub("b"), Ack(C, None, 1, [list(ref_c), list(ref_b)])]))
    g.run()
    assert g.replies[t][0] == ERR and g.replies[t][1] == 406
    assert ready(g, "a") == [0, 0, 0]
    b = g.m(2).vhosts["/"].queues["b"]
    assert len(b.ready) == 1 and b.unacked_count == 0  # the held delivery went back, nothing published
    for i in range(3):
        assert not g.m(i).tx_coord and not g.m(i).tx_held
    g.check_replicas()


def test_a_participant_whose_channel_closed_before_prepare_refuses():
    g = three_queues()
    t = g.request(lambda t: TxCommit(C, t, 1, [pub("a"), pub("b")]))
    step(g, (0,))
    g.forward()
    g.logs[1].insert(0, ChannelClose(C, None, 1))  # group 1 applies the close before its prepare
    g.run()
    assert g.replies[t][0] == ERR and g.replies[t][1] == 504
    assert ready(g, "a") == [0, 0, 0] and ready(g, "b") == [0, 0, 0]
    g.check_replicas()


def test_a_coordinator_crash_between_prepare_and_decide_is_resent_by_the_next_leader():
    """The participants prepared and their votes were proposed to the metadata group, but its
    leader died: the proposals are lost and the new leader's forwarder (a new TxForwarder, knowing
    nothing) reads the replicated records and sends the votes again; the prepares sent twice are
    applied once (their sequence numbers)."""
    g = three_queues()
    t = g.request(lambda t: TxCommit(C, t, 1, [pub("a"), pub("b")]))
    step(g, (0,))
    g.forward()
    prepares = [list(g.logs[1]), list(g.logs[2])]
    step(g, (1, 2))
    g.forward()
    assert [c.op for c in g.logs[0]] == [Op.TX_VOTE, Op.TX_VOTE]
    g.logs[0].clear()  # lost with the leader
    g.tx = TxForwarder()  # the new leader's forwarder
    g.logs[1].extend(prepares[0])  # and a duplicate of the prepares (an ambiguous retry)
    g.logs[2].extend(prepares[1])
    g.run()
    assert g.replies[t] == (OK, [ROUTED, ROUTED])
    assert ready(g, "a") == [0, 1, 0] and ready(g, "b") == [0, 0, 1]  # once each
    g.check_replicas()


def test_a_decision_lost_before_the_participants_applied_it_is_sent_again():
    """The metadata group decided (commit), the TxFinish proposals were lost: the decision is in
    the metadata group's state, so the forwarder sends it again; a duplicate finish is a no-op."""
    g = three_queues()
    t = g.request(lambda t: TxCommit(C, t, 1, [pub("a"), pub("b")]))
    for _ in range(2):
        step(g, (0, 1, 2))
        g.forward()
    step(g, (0,))  # the votes: decided
    txid = next(iter(g.m(0).tx_coord))
    assert g.m(0).tx_coord[txid].decision == 1
    g.forward()
    finishes = [list(g.logs[1]), list(g.logs[2])]
    assert [c.op for c in finishes[0] + finishes[1]] == [Op.TX_FINISH, Op.TX_FINISH]
    g.logs[1].clear()
    step(g, (2,))
    g.logs[2].extend(finishes[1])  # group 2 gets its finish twice
    g.tx.clear()  # a second passes
    g.run()
    assert g.replies[t] == (OK, [ROUTED, ROUTED])
    assert ready(g, "a") == [0, 1, 0] and ready(g, "b") == [0, 0, 1]
    g.check_replicas()


def test_a_prepared_part_survives_a_snapshot_and_commits_from_it():
    """A participant's replica installs a snapshot taken while it holds a prepared part (publish
    bodies and the acked delivery): it has the same digest and applies the decision alike."""
    g = three_queues()
    ref = get(g, "c")
    t = g.request(lambda t: TxCommit(C, t, 1, [pub("a", b"held body"), pub("b"), Ack(C, None, 1, [list(ref)])]))
    step(g, (0,))
    g.forward()
    step(g, (1, 2))
    a, _b = g.replicas[1]
    restored = StateMachine()
    import_model(restored, export_model(a))
    restored.group = 1
    assert digest(restored) == digest(a)
    g.replicas[1] = (a, restored)
    g.run()
    assert g.replies[t] == (OK, [ROUTED, ROUTED])
    g.check_replicas()
    held = g.m(1).vhosts["/"].queues["a"].ready.peek()
    assert held is not None and held.message.size == len(b"held body")


def test_the_metadata_group_as_a_participant_and_two_transactions_in_flight():
    """Queue z lives in the metadata group: it is a participant like the others; two
    transactions in flight at once each commit, in their own order per group."""
    g = three_queues()
    t1 = g.request(lambda t: TxCommit(C, t, 1, [pub("z"), pub("a")]))
    t2 = g.request(lambda t: TxCommit(C, t, 1, [pub("a"), pub("b"), pub("z")]))
    g.run()
    assert g.replies[t1] == (OK, [ROUTED, ROUTED]) and g.replies[t2] == (OK, [ROUTED, ROUTED, ROUTED])
    assert ready(g, "z") == [2, 0, 0] and ready(g, "a") == [0, 2, 0] and ready(g, "b") == [0, 0, 1]
    g.check_replicas()


def test_the_two_phase_commands_travel_through_the_log_with_their_nested_operations():
    """TxBegin and TxPrepare carry commands (publishes with bodies, acks): a batch of them comes
    back out of the log's encoding typed, nested commands included (store/core/commands.py)."""
    from raftmq.store.core.commands import TxPrepare, decode_batch, encode_batch

    g = three_queues()
    ops = [pub("a", b"\x00body"), pub("b"), Ack(C, None, 1, [[3, 1]])]
    begin = g.router.route(TxCommit(C, 5, 1, ops))[0][1]
    prepare = TxPrepare(None, None, 1, 1, C, 1, ops[:1] + ops[2:], [0])
    assert decode_batch(encode_batch([begin, prepare])) == [begin, prepare]


def test_a_single_node_s_mirror_keeps_the_coordinator_s_and_the_participants_records():
    """A single node has no snapshots: each group's transaction state goes to its LMDB mirror
    (meta key ``tx``, msgpack) and comes back at restore; a held delivery's entry, which the
    mirror's queue table still holds (restore queues it again), is taken back out of the queue.
    Checked: the state packed, unpacked and restored into each machine gives the same digest."""
    import msgpack

    from raftmq.store.core.persistence import pack
    from raftmq.store.core.tx_groups import persisted_state, restore_state

    g = three_queues()
    ref = get(g, "c")
    g.request(lambda t: TxCommit(C, t, 1, [pub("a", b"held"), pub("b"), Ack(C, None, 1, [list(ref)])]))
    step(g, (0,))
    g.forward()
    step(g, (1, 2))
    assert g.m(0).tx_coord and g.m(1).tx_held[1].settles
    for i in range(3):
        m = g.m(i)
        blob = msgpack.unpackb(pack(persisted_state(m)), raw=False, strict_map_key=False)
        copy = StateMachine()
        import_model(copy, export_model(m))
        copy.group = i
        for rec in copy.tx_held.values():  # as the mirror has them: queued again at restart
            for _op, _rq, _un, queue, entry in rec.settles:
                queue.ready.append(entry)
                queue.ready_bytes += entry.message.size
        copy.tx_next, copy.tx_part_seq, copy.tx_coord, copy.tx_prep_applied, copy.tx_held = 0, {}, {}, 0, {}
        restore_state(copy, blob)
        assert digest(copy) == digest(m), f"group {i}"
