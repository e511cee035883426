"""The broker state machine applied directly: routing, delivery, acks, durability, determinism."""

from __future__ import annotations

import pytest

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    ERR,
    OK,
    OUT_CANCEL,
    OUT_DELIVER,
    OUT_REPLY,
    REJECTED,
    ROUTED,
    UNROUTABLE,
    Ack,
    ChannelOpen,
    ConnectionClose,
    Consume,
    Nack,
    Op,
    Publish,
    QueueDeclare,
    Tick,
    VhostAdd,
    decode_batch,
    encode_batch,
    make,
)
from raftmq.store.disk import history as EV
from raftmq.store.disk.durable import DurableStore

C = "conn-1"
NOW = 1_700_000_000_000_000


class Driver:
    """Issues commands the way a front end would and keeps the outputs."""

    def __init__(self, machine: StoredMachine, now: int = NOW) -> None:
        self.machine = machine
        self.now = now
        self.token = 0
        self.log: list[list] = []

    def apply(self, *commands) -> list:
        self.log.append((self.now, list(commands)))
        return self.machine.apply_batch(self.now, list(commands))

    def call(self, op: Op, *args, conn: str = C, ch: int = 1):
        self.token += 1
        outputs = self.apply(make(op, conn, self.token, ch, *args))
        replies = [o for o in outputs if o[1] == OUT_REPLY and o[2] == self.token]
        assert len(replies) == 1, outputs
        return replies[0][3], outputs

    def ok(self, op: Op, *args, **kw):
        result, outputs = self.call(op, *args, **kw)
        assert result[0] == OK, result
        return result[1], outputs

    def publish(self, exchange: str, key: str, body: bytes, persistent=False, priority=0, expiration=None,
                conn=C, ch=1):
        return self.ok(Op.PUBLISH, "/", exchange, key, False, b"\x00\x00", body, persistent, priority,
                       expiration, conn=conn, ch=ch)


@pytest.fixture
def driver(tmp_path):
    machine = StoredMachine(DurableStore(str(tmp_path / "lmdb")))
    d = Driver(machine)
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    return d


def deliveries(outputs):
    return [o for o in outputs if o[1] == OUT_DELIVER]


def declare(d, name, durable=False, exclusive=False, auto_delete=False, args=None, conn=C):
    return d.ok(Op.QUEUE_DECLARE, "/", name, False, durable, exclusive, auto_delete, args or {}, conn=conn)[0]


def test_publish_to_default_exchange_and_get(driver):
    assert declare(driver, "q") == ("q", 0, 0)
    assert driver.publish("", "q", b"hello")[0] == ROUTED
    assert driver.publish("", "nowhere", b"x")[0] == UNROUTABLE
    value, _ = driver.ok(Op.GET, "/", "q", True)
    qid, seq, redelivered, message, remaining, body = value
    assert body == b"hello" and message.size == 5 and not redelivered and remaining == 0
    assert driver.ok(Op.GET, "/", "q", True)[0] is None


def test_consumer_round_robin_and_prefetch(driver):
    declare(driver, "q")
    driver.ok(Op.CHANNEL_OPEN, ch=2)
    driver.ok(Op.QOS, 2, False, ch=1)
    driver.ok(Op.QOS, 2, False, ch=2)
    driver.ok(Op.CONSUME, "/", "q", "c1", False, False, {}, ch=1)
    driver.ok(Op.CONSUME, "/", "q", "c2", False, False, {}, ch=2)
    got = []
    for i in range(6):
        _, outputs = driver.publish("", "q", b"%d" % i)
        got += [(o[3], o[4][4]) for o in deliveries(outputs)]
    # Two consumers, prefetch 2 each: four deliveries alternate, two messages wait.
    assert got == [("c1", b"0"), ("c2", b"1"), ("c1", b"2"), ("c2", b"3")]
    queue = driver.machine.vhosts["/"].queues["q"]
    assert len(queue.ready) == 2
    # Acking one of c1's messages frees one credit: the next message goes to c1.
    first_qid, first_seq = queue.qid, 1
    outputs = driver.apply(Ack(C, None, 1, [[first_qid, first_seq]]))
    assert [(o[3], o[4][4]) for o in deliveries(outputs)] == [("c1", b"4")]



def test_a_single_consumer_takes_a_backlog_up_to_its_prefetch_in_queue_order(driver):
    """The dispatcher hands a lone consumer a run of messages (Consumer.room); the limits are
    the same as one by one: per-consumer prefetch, then the channel-wide one (basic.qos
    global), and an expired message is dead and uses no credit."""
    declare(driver, "q", args={"x-message-ttl": 100})
    for i in range(10):
        driver.publish("", "q", b"%d" % i)
        if i == 2:
            driver.now += 150_000  # messages 0-2 are expired from here on
    driver.ok(Op.QOS, 4, False)
    _, outputs = driver.ok(Op.CONSUME, "/", "q", "c1", False, False, {})
    assert [o[4][4] for o in deliveries(outputs)] == [b"3", b"4", b"5", b"6"]
    queue = driver.machine.vhosts["/"].queues["q"]
    assert len(queue.ready) == 3 and queue.unacked_count == 4
    # A channel-wide prefetch of 2 (basic.qos global=true) binds once it is below the consumer's.
    _, outputs = driver.ok(Op.QOS, 2, True)
    assert deliveries(outputs) == []
    outputs = driver.apply(Ack(C, None, 1, [[queue.qid, seq] for seq in (4, 5, 6, 7)]))
    assert [o[4][4] for o in deliveries(outputs)] == [b"7", b"8"]
    assert len(queue.ready) == 1 and queue.unacked_count == 2

def test_nack_requeue_keeps_position_and_sets_redelivered(driver):
    declare(driver, "q")
    for i in range(3):
        driver.publish("", "q", b"%d" % i)
    driver.ok(Op.QOS, 1, False)
    _, outputs = driver.ok(Op.CONSUME, "/", "q", "c", False, False, {})
    (first,) = deliveries(outputs)
    qid, seq, redelivered, message, body = first[4]
    assert body == b"0" and not redelivered
    outputs = driver.apply(Nack(C, None, 1, [[qid, seq]], True))
    (again,) = deliveries(outputs)
    assert again[4][4] == b"0" and again[4][2] is True


def test_reject_without_requeue_dead_letters(driver):
    declare(driver, "dlq")
    declare(driver, "q", args={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    driver.publish("", "q", b"bad")
    value, _ = driver.ok(Op.GET, "/", "q", False)
    qid, seq = value[0], value[1]
    driver.apply(Nack(C, None, 1, [[qid, seq]], False))
    dead, _ = driver.ok(Op.GET, "/", "dlq", True)
    assert dead.body == b"bad"


def test_channel_close_requeues_unacked(driver):
    declare(driver, "q")
    driver.publish("", "q", b"m")
    driver.ok(Op.GET, "/", "q", False)
    assert driver.ok(Op.GET, "/", "q", True)[0] is None
    driver.ok(Op.CHANNEL_CLOSE)
    driver.ok(Op.CHANNEL_OPEN)
    value, _ = driver.ok(Op.GET, "/", "q", True)
    assert value.body == b"m" and value[2] is True  # redelivered


def test_errors_close_the_channel(driver):
    result, _ = driver.call(Op.QUEUE_DECLARE, "/", "missing", True, False, False, False, {})
    assert result[0] == ERR and result[1] == 404
    assert result[2] == "NOT_FOUND - no queue 'missing' in vhost '/'"
    # The channel is gone in the core: the next command on it is refused.
    result, _ = driver.call(Op.QUEUE_DECLARE, "/", "q", False, False, False, False, {})
    assert result[0] == ERR and result[1] == 504


def test_exclusive_queue_locked_and_deleted_with_connection(driver):
    declare(driver, "ex", exclusive=True)
    driver.ok(Op.CHANNEL_OPEN, conn="conn-2")
    result, _ = driver.call(Op.QUEUE_DECLARE, "/", "ex", True, False, False, False, {}, conn="conn-2")
    assert result[1] == 405
    driver.apply(ConnectionClose(C, None))
    assert "ex" not in driver.machine.vhosts["/"].queues


def test_queue_delete_cancels_consumers(driver):
    declare(driver, "q")
    driver.ok(Op.CONSUME, "/", "q", "c", False, False, {})
    count, outputs = driver.ok(Op.QUEUE_DELETE, "/", "q", False, False)
    assert count == 0
    assert [(o[1], o[3]) for o in outputs if o[1] == OUT_CANCEL] == [(OUT_CANCEL, "c")]


def test_max_length_drop_head_and_reject_publish(driver):
    declare(driver, "dh", args={"x-max-length": 2})
    for i in range(4):
        driver.publish("", "dh", b"%d" % i)
    bodies = [driver.ok(Op.GET, "/", "dh", True)[0].body for _ in range(2)]
    assert bodies == [b"2", b"3"]
    declare(driver, "rp", args={"x-max-length": 1, "x-overflow": "reject-publish"})
    assert driver.publish("", "rp", b"a")[0] == ROUTED
    assert driver.publish("", "rp", b"b")[0] == REJECTED


def test_priority_queue_orders_by_priority_then_fifo(driver):
    declare(driver, "p", args={"x-max-priority": 5})
    for body, prio in ((b"low1", 1), (b"high", 9), (b"mid", 3), (b"low2", 1), (b"none", 0)):
        driver.publish("", "p", body, priority=prio)
    got = [driver.ok(Op.GET, "/", "p", True)[0].body for _ in range(5)]
    assert got == [b"high", b"mid", b"low1", b"low2", b"none"]


def test_ttl_expiry_on_tick(driver):
    declare(driver, "t", args={"x-message-ttl": 100})
    driver.publish("", "t", b"old")
    driver.now += 50_000
    driver.publish("", "t", b"young")
    driver.now += 60_000  # first is 110 ms old, second 60 ms
    driver.apply(Tick(None, None))
    got = driver.ok(Op.GET, "/", "t", True)[0]
    assert got.body == b"young"


def test_persistent_messages_survive_reload_transient_do_not(tmp_path):
    path = str(tmp_path / "lmdb")
    store = DurableStore(path)
    d = Driver(StoredMachine(store))
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    declare(d, "durable", durable=True)
    declare(d, "transient")
    d.ok(Op.EXCHANGE_DECLARE, "/", "dx", "fanout", False, True, False, False, {})
    d.ok(Op.QUEUE_BIND, "/", "durable", "dx", "", {})
    for i in range(5):
        d.publish("dx", "", b"p%d" % i, persistent=True)
    d.publish("dx", "", b"t", persistent=False)
    d.publish("", "transient", b"x", persistent=True)
    value, _ = d.ok(Op.GET, "/", "durable", False)  # delivered, not acked: redelivered after restart
    store.close()

    again = StoredMachine(DurableStore(path))
    vhost = again.vhosts["/"]
    assert "transient" not in vhost.queues
    assert [b.destination for b in vhost.exchanges["dx"].bindings] == ["durable"]
    d2 = Driver(again)
    d2.ok(Op.CHANNEL_OPEN)
    got = [d2.ok(Op.GET, "/", "durable", True)[0] for _ in range(5)]
    assert [g.body for g in got] == [b"p0", b"p1", b"p2", b"p3", b"p4"]
    assert [g[2] for g in got] == [True, False, False, False, False]
    assert d2.ok(Op.GET, "/", "durable", True)[0] is None


def _scenario(d: Driver) -> None:
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    declare(d, "a", durable=True)
    declare(d, "b", durable=True, args={"x-max-length": 3})
    d.ok(Op.EXCHANGE_DECLARE, "/", "t", "topic", False, True, False, False, {})
    d.ok(Op.QUEUE_BIND, "/", "a", "t", "x.#", {})
    d.ok(Op.QUEUE_BIND, "/", "b", "t", "*.y", {})
    d.ok(Op.CONSUME, "/", "a", "c", False, False, {})
    for i in range(10):
        d.publish("t", "x.y" if i % 2 else "x.z", b"%d" % i, persistent=True)
        d.now += 1000


def test_same_commands_give_same_state_and_outputs(tmp_path):
    """Determinism: the property Raft replication relies on (design.md, the state machine)."""
    first = Driver(StoredMachine(DurableStore(str(tmp_path / "one"))))
    _scenario(first)
    second = Driver(StoredMachine(DurableStore(str(tmp_path / "two"))))
    outputs = []
    for now, batch in first.log:
        # Replay through msgpack, as the Raft log will carry it.
        decoded = decode_batch(encode_batch(batch))
        outputs.append(second.machine.apply_batch(now, decoded))
    assert first.machine.store.digest() == second.machine.store.digest()
    delivered = [o[4][4] for batch in outputs for o in batch if o[1] == OUT_DELIVER]
    assert delivered == [b"%d" % i for i in range(10)]


def deleting_machine(with_history: bool, max_priority: int = 0) -> tuple[Driver, list]:
    """A store-less machine (a cluster node's) with a queue holding fresh and requeued messages."""
    recorded: list = []
    machine = StoredMachine()
    if with_history:
        machine.event_sink = lambda _index, events: recorded.extend(events)
    d = Driver(machine)
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    declare(d, "q", args={"x-max-priority": max_priority} if max_priority else None)
    for i in range(6):
        d.ok(Op.PUBLISH, "/", "", "q", False, b"\x00\x00", b"x" * (i + 1), False, i % 3, None)
    value, _ = d.ok(Op.GET, "/", "q", False)
    d.apply(Nack(C, None, 1, [[value[0], value[1]]], True))  # requeued: back at its position
    return d, recorded


@pytest.mark.parametrize("max_priority", [0, 2], ids=["plain", "priority"])
def test_deleting_a_queue_releases_every_message_alike_with_and_without_history(max_priority):
    """Deleting a queue takes every ready message, requeued ones included: the byte count returns to
    zero and the event numbering (replicated state) is the same whether a node keeps history or not;
    with history each message gets one DELETED event."""
    plain, _ = deleting_machine(False, max_priority)
    kept, recorded = deleting_machine(True, max_priority)
    for d in (plain, kept):
        assert d.machine.message_bytes == sum(range(1, 7))
        count, _ = d.ok(Op.QUEUE_DELETE, "/", "q", False, False)
        assert count == 6
        assert d.machine.message_bytes == 0
        assert "q" not in d.machine.vhosts["/"].queues
    assert plain.machine.event_seq == kept.machine.event_seq
    deleted = [e for e in recorded if e[2] == EV.DELETED]
    assert sorted(e[10].size for e in deleted) == [1, 2, 3, 4, 5, 6]


def test_publishes_to_a_queue_without_consumers_are_delivered_once_one_comes(driver):
    """Publishing into a queue nobody consumes skips the dispatch pass; a consumer that comes later
    gets every message in order, and one that is there already gets each message as it arrives."""
    declare(driver, "q")
    for i in range(3):
        driver.publish("", "q", b"%d" % i)
    _, outputs = driver.ok(Op.CONSUME, "/", "q", "c", True, False, {})
    assert [o[4][4] for o in deliveries(outputs)] == [b"0", b"1", b"2"]
    _, outputs = driver.publish("", "q", b"3")
    assert [o[4][4] for o in deliveries(outputs)] == [b"3"]


def test_a_batch_applied_without_replies_changes_the_state_alike_and_keeps_deliveries():
    """Another node's batch is applied with replies=False (its connections are all elsewhere):
    no OUT_REPLY, but the same deliveries to consumers and the same model."""
    machines = []
    for replies in (True, False):
        machine = StoredMachine()
        machine.apply_batch(NOW, [VhostAdd(None, None, "/"), ChannelOpen("local", 1, 1),
                                  ChannelOpen("remote", 2, 1)])
        machine.apply_batch(NOW, [QueueDeclare("local", 3, 1, "/", "q", False, False, False, False, {}),
                                  Consume("local", 4, 1, "/", "q", "c", True, False, {})])
        outputs = machine.apply_batch(NOW, [
            Publish("remote", 5, 1, "/", "", "q", False, b"\x00\x00", b"m", False, 0, None),
            Publish("remote", 6, 1, "/", "nowhere", "q", False, b"\x00\x00", b"n", False, 0, None),
        ], replies=replies)
        kinds = [(o[0], o[1]) for o in outputs]
        if replies:
            assert kinds == [("remote", OUT_REPLY), ("local", OUT_DELIVER), ("remote", OUT_REPLY)]
            assert outputs[2][3][:2] == (ERR, 404)
        else:
            assert kinds == [("local", OUT_DELIVER)]
        machines.append(machine)
    assert machines[0].event_seq == machines[1].event_seq
    assert machines[0].channels.keys() == machines[1].channels.keys()  # the 404 closed the remote channel in both
    assert 1 not in machines[1].channels.get("remote", {})


def test_auto_ack_consumer_with_node_credit_is_assigned_only_its_credit(driver):
    """store/delivery.AUTOACK_CREDIT (node/amqp091/autoack.py): an auto-ack Consume carrying the node's
    credit argument is assigned that many messages of a backlog, in queue order, and the rest stay
    queued; SessionWindowCredit tops it up (the next ones in order), and is dropped without an error
    once the consumer is gone.  Without the argument an auto-ack consumer takes the whole backlog."""
    from raftmq.store.core.commands import SessionWindowCredit
    from raftmq.store.core.delivery import AUTOACK_CREDIT

    declare(driver, "q")
    for i in range(10):
        driver.publish("", "q", b"%d" % i)
    _, outputs = driver.ok(Op.CONSUME, "/", "q", "c1", True, False, {AUTOACK_CREDIT: 3})
    assert [o[4][4] for o in deliveries(outputs)] == [b"0", b"1", b"2"]
    queue = driver.machine.vhosts["/"].queues["q"]
    assert len(queue.ready) == 7
    outputs = driver.apply(SessionWindowCredit(C, None, 1, "c1", 2, 0))
    assert [o[4][4] for o in deliveries(outputs)] == [b"3", b"4"]
    assert len(queue.ready) == 5
    driver.ok(Op.CANCEL, "c1")
    outputs = driver.apply(SessionWindowCredit(C, None, 1, "c1", 2, 0))
    assert not [o for o in outputs if o[1] == OUT_REPLY]  # no error for a top-up racing a cancel
    _, outputs = driver.ok(Op.CONSUME, "/", "q", "c2", True, False, {})
    assert [o[4][4] for o in deliveries(outputs)] == [b"5", b"6", b"7", b"8", b"9"]


def test_queue_counts_deliveries_gets_and_acks_per_queue(driver):
    """Per-queue deliver/get and ack counts behind RabbitMQ's queue message_stats rates (issue 35;
    machine.queue_counts, ops/http/rates.py): a consumer's deliveries and a basic.get count as
    deliver_get of their queue only, an ack counts for the acked message's queue, and the counts
    go with the queue when it is deleted."""
    from raftmq.store.core import queries as Q

    declare(driver, "a")
    declare(driver, "b")
    qa = driver.machine.vhosts["/"].queues["a"].qid
    qb = driver.machine.vhosts["/"].queues["b"].qid
    for i in range(3):
        driver.publish("", "a", b"%d" % i)
    driver.publish("", "b", b"x")
    _, outputs = driver.ok(Op.CONSUME, "/", "a", "c1", False, False, {})
    assert len(deliveries(outputs)) == 3
    driver.ok(Op.GET, "/", "b", True)  # no_ack: delivered, nothing to ack
    assert Q.queue_counts(driver.machine, qa) == (3, 0)
    assert Q.queue_counts(driver.machine, qb) == (1, 0)
    driver.apply(Ack(C, None, 1, [[qa, 1], [qa, 2]]))
    assert Q.queue_counts(driver.machine, qa) == (3, 2)
    assert Q.all_queue_counts(driver.machine) == {qa: (3, 2), qb: (1, 0)}
    driver.ok(Op.QUEUE_DELETE, "/", "b", False, False)
    assert Q.queue_counts(driver.machine, qb) == (0, 0) and qb not in driver.machine.queue_counts
