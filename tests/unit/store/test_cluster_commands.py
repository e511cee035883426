"""State machine commands used by the cluster: batch dedup, node reset, members, time, snapshots."""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    OUT_CLOSE,
    OUT_DELIVER,
    Ack,
    ChannelOpen,
    Consume,
    ExchangeDeclare,
    MemberRemove,
    MemberSet,
    NodeReset,
    Publish,
    QueueBind,
    QueueDeclare,
    VhostAdd,
)
from raftmq.store.disk.snapshot import digest, export_model, import_model

NOW = 1_700_000_000_000_000


def setup_machine() -> StoredMachine:
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    return m


def consume_one(m: StoredMachine, conn: str) -> list:
    """A consumer on ``conn`` holding one unacked delivery of queue q."""
    return m.apply_batch(NOW, [
        ChannelOpen(conn, 1, 1),
        QueueDeclare(conn, 2, 1, "/", "q", False, True, False, False, {}),
        Consume(conn, 3, 1, "/", "q", "ctag", False, False, {}),
        Publish(conn, None, 1, "/", "", "q", False, b"\x00\x00", b"hello", True, 0, None),
    ])


def test_a_retried_batch_is_applied_once():
    m = setup_machine()
    publish = [ChannelOpen("n1.a.1", 1, 1),
               QueueDeclare("n1.a.1", 2, 1, "/", "q", False, True, False, False, {}),
               Publish("n1.a.1", None, 1, "/", "", "q", False, b"\x00\x00", b"m", True, 0, None)]
    first = m.apply_batch(NOW, publish, 10, ("n1.a", 1))
    assert first
    assert m.apply_batch(NOW, publish, 11, ("n1.a", 1)) == []  # the same batch again: a no-op
    assert len(m.vhosts["/"].queues["q"].ready) == 1
    assert m.applied_index == 11


def test_node_reset_releases_the_dead_nodes_deliveries():
    m = setup_machine()
    outputs = consume_one(m, "n2.old.1")
    assert [o for o in outputs if o[1] == OUT_DELIVER]
    queue = m.vhosts["/"].queues["q"]
    assert len(queue.ready) == 0 and queue.unacked_count == 1
    out = m.apply_batch(NOW, [NodeReset(None, None, "n2", None)])
    assert out[0][:3] == ("n2.old.1", OUT_CLOSE, 320)
    assert len(queue.ready) == 1 and queue.unacked_count == 0
    assert queue.ready.peek().delivery_count == 1  # redelivered=true when delivered again
    assert "n2.old.1" not in m.channels


def test_restart_reset_keeps_the_new_incarnation_and_forgets_old_dedup_windows():
    m = setup_machine()
    m.apply_batch(NOW, [ChannelOpen("n2.old.1", 1, 1)], 1, ("n2.old", 1))
    m.apply_batch(NOW, [ChannelOpen("n2.new.1", 1, 1)], 2, ("n2.new", 1))
    m.apply_batch(NOW, [NodeReset(None, None, "n2", "n2.new")])
    assert "n2.old.1" not in m.channels and "n2.new.1" in m.channels
    assert set(m.applied_batches) == {"n2.new"}


def test_time_never_goes_backwards():
    m = setup_machine()
    m.apply_batch(NOW + 5_000_000, [])
    m.apply_batch(NOW, [])  # a proposer with a slower clock
    assert m._now == NOW + 5_000_000


def test_members_and_removal():
    m = setup_machine()
    m.apply_batch(NOW, [MemberSet(None, None, "n1", "127.0.0.1:1", "127.0.0.1:5672"),
                        MemberSet(None, None, "n2", "127.0.0.1:2", "127.0.0.1:5673")])
    consume_one(m, "n2.b.1")
    m.apply_batch(NOW, [MemberRemove(None, None, "n2")])
    assert list(m.members) == ["n1"]
    assert "n2.b.1" not in m.channels


def test_snapshot_round_trip_keeps_every_detail():
    m = setup_machine()
    consume_one(m, "n1.a.1")
    m.apply_batch(NOW, [Publish("n1.a.1", None, 1, "/", "", "q", False, b"\x00\x00", b"second", False, 0,
                         None)], 7, ("n1.a", 9))
    copy = StoredMachine()
    import_model(copy, export_model(m))
    assert digest(copy) == digest(m)
    # Both continue identically: an ack frees credit and the same message goes to the consumer.
    batch = [Ack("n1.a.1", None, 1, [[m.vhosts["/"].queues["q"].qid, 1]])]
    assert repr(copy.apply_batch(NOW, batch)) == repr(m.apply_batch(NOW, batch))
    assert digest(copy) == digest(m)
    assert copy.apply_batch(NOW, [], 8, ("n1.a", 9)) == []  # the dedup window travelled too


def test_amq_failover_updates_bound_exclusive_queues():
    """0-10 11.1.2.3: an update on bind and whenever the failover candidates change."""
    from raftmq.protocol.amqp091.properties import decode_properties
    from raftmq.store.core.commands import ERR, OUT_REPLY

    m = setup_machine()
    m.apply_batch(NOW, [MemberSet(None, None, "n1", "127.0.0.1:1", "127.0.0.1:5672")])
    out = m.apply_batch(NOW, [
        ChannelOpen("c", 1, 1),
        QueueDeclare("c", 2, 1, "/", "shared", False, False, False, False, {}),
        QueueBind("c", 3, 1, "/", "shared", "amq.failover", "", {}),
    ])
    assert next(o[3] for o in out if o[1] == OUT_REPLY and o[2] == 3)[:2] == (ERR, 530)
    m.apply_batch(NOW, [
        ChannelOpen("c", 4, 2),
        QueueDeclare("c", 5, 2, "/", "mine", False, False, True, False, {}),
        QueueBind("c", 6, 2, "/", "mine", "amq.failover", "", {}),
    ])
    queue = m.vhosts["/"].queues["mine"]
    assert len(queue.ready) == 1
    m.apply_batch(NOW, [MemberSet(None, None, "n2", "127.0.0.1:2", "127.0.0.1:5673")])
    m.apply_batch(NOW, [MemberSet(None, None, "n2", "127.0.0.1:2", "127.0.0.1:5673")])  # no change
    assert len(queue.ready) == 2
    queue.ready.pop()
    update = queue.ready.pop().message
    assert update.size == 0
    assert decode_properties(update.properties).headers == {
        "amq.failover": ["amqp:tcp:127.0.0.1:5672", "amqp:tcp:127.0.0.1:5673"]}
    out = m.apply_batch(NOW, [ExchangeDeclare("c", 9, 2, "/", "my-failover", "failover", False, False,
                               False, False, {})])
    assert next(o[3] for o in out if o[1] == OUT_REPLY and o[2] == 9)[:2] == (ERR, 530)
