"""Issue 21 in the state machine: the quorum-queue delivery limit and queue-level publisher deduplication.

Delivery limit: RabbitMQ 3.13's quorum queue (deps/rabbit/src/rabbit_fifo_v3.erl ``return_one``):
every return of a delivered message (basic.nack/reject with requeue, channel or connection closed
with it unacked, basic.recover) adds one to its delivery count; a count above ``x-delivery-limit``
dead-letters it with reason ``delivery_limit`` instead of requeueing it; redeliveries carry
``x-delivery-count`` = that count (rabbit_fifo_client sets it once the count exists).

Deduplication: the rabbitmq-message-deduplication plugin's queue interface
(lib/rabbitmq_message_deduplication/rabbit_message_deduplication_queue.ex): a message whose
``x-deduplication-header`` is cached is not enqueued (the publisher is confirmed all the same), and
an entry leaves the cache with its message (ack, auto-ack, drop); raftmq's ``x-cache-size`` bound
and ``x-cache-ttl`` lifetime (store/core/dedup.py).
"""

from __future__ import annotations

import pytest

from raftmq.protocol.amqp091.properties import BasicProperties, decode_properties, encode_properties
from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    ERR,
    OK,
    OUT_DELIVER,
    REJECTED,
    ROUTED,
    Ack,
    ConnectionClose,
    Nack,
    NodeReset,
    Op,
    VhostAdd,
)
from raftmq.store.core.dedup import DEFAULT_CACHE_SIZE, DedupCache, dedup_key
from raftmq.store.core.persistence import PersistenceRecorder
from raftmq.store.disk import history as EV
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import digest, export_model, import_model
from tests.unit.store.test_machine import Driver as MachineDriver

C = "conn-1"
NOW = 1_700_000_000_000_000


class Driver(MachineDriver):
    """test_machine's driver, keeping the audit events the machine records."""

    def __init__(self, machine: StoredMachine) -> None:
        super().__init__(machine, NOW)
        self.events: list[list] = []
        machine.event_sink = lambda _index, events: self.events.extend(events)

    def declare(self, name: str, args: dict | None = None, durable: bool = False):
        return self.call(Op.QUEUE_DECLARE, "/", name, False, durable, False, False, args or {})[0]

    def publish(self, queue: str, body: bytes, headers: dict | None = None, exchange: str = "",
                persistent: bool = False, expiration: int | None = None):
        props = encode_properties(BasicProperties(headers=headers)) if headers is not None else b"\x00\x00"
        return self.ok(Op.PUBLISH, "/", exchange, queue, False, props, body, persistent, 0, expiration)

    def get(self, queue: str, no_ack: bool = True):
        return self.ok(Op.GET, "/", queue, no_ack)[0]

    def bodies(self, queue: str) -> list[bytes]:
        """Drain ``queue`` with basic.get no-ack."""
        got = []
        while (value := self.get(queue)) is not None:
            got.append(value.body)
        return got

    def kinds(self, kind: int) -> list[tuple[str, str]]:
        return [(e[4], e[9]) for e in self.events if e[2] == kind]


def _driver(machine: StoredMachine) -> Driver:
    d = Driver(machine)
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    return d


@pytest.fixture
def d() -> Driver:
    return _driver(StoredMachine())


def deliveries(outputs: list) -> list[tuple]:
    return [o[4] for o in outputs if o[1] == OUT_DELIVER]


def headers_of(message) -> dict:
    return decode_properties(message.properties).headers or {}


def queue(d: Driver, name: str):
    return d.machine.vhosts["/"].queues[name]


# ---------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("args", [
    {"x-delivery-limit": -1}, {"x-delivery-limit": "5"}, {"x-delivery-limit": True}, {"x-delivery-limit": 1.5},
    {"x-message-deduplication": "true"}, {"x-message-deduplication": 1},
    {"x-message-deduplication": True, "x-cache-size": 0}, {"x-message-deduplication": True, "x-cache-size": -3},
    {"x-message-deduplication": True, "x-cache-size": 10_000_001},
    {"x-message-deduplication": True, "x-cache-ttl": 0}, {"x-message-deduplication": True, "x-cache-ttl": "1000"},
])
def test_invalid_arguments_are_refused_with_406_and_leave_no_queue(d, args):
    result = d.declare("q", args)
    assert result[0] == ERR and result[1] == 406, result
    assert "q" not in d.machine.vhosts["/"].queues


def test_valid_arguments_configure_the_queue(d):
    assert d.declare("limited", {"x-delivery-limit": 0})[0] == OK
    assert d.declare("dedup", {"x-message-deduplication": True})[0] == OK
    assert d.declare("sized", {"x-message-deduplication": True, "x-cache-size": 5, "x-cache-ttl": 250})[0] == OK
    assert d.declare("quorum", {"x-queue-type": "quorum"})[0] == OK
    assert d.declare("off", {"x-message-deduplication": False})[0] == OK
    limited, dedup, sized = queue(d, "limited"), queue(d, "dedup"), queue(d, "sized")
    assert (limited.delivery_limit, limited.delivery_header, limited.dedup) == (0, True, None)
    assert (dedup.dedup.size, dedup.dedup.ttl) == (DEFAULT_CACHE_SIZE, None)
    assert (sized.dedup.size, sized.dedup.ttl) == (5, 250_000)  # ttl kept in microseconds
    assert (queue(d, "quorum").delivery_limit, queue(d, "quorum").delivery_header) == (None, True)
    assert queue(d, "off").dedup is None and not queue(d, "off").delivery_header


def test_a_redeclare_with_another_delivery_limit_is_406(d):
    d.declare("q", {"x-delivery-limit": 3})
    assert d.declare("q", {"x-delivery-limit": 3})[0] == OK
    result = d.declare("q", {"x-delivery-limit": 4})
    assert result[0] == ERR and result[1] == 406 and "x-delivery-limit" in result[2]


# ----------------------------------------------------------------------------------- delivery limit


def _consume(d: Driver, name: str, tag: str = "c") -> list[tuple]:
    d.ok(Op.QOS, 1, False)
    return deliveries(d.ok(Op.CONSUME, "/", name, tag, False, False, {})[1])


def _nack(d: Driver, delivery: tuple, requeue: bool = True) -> list[tuple]:
    qid, seq = delivery[0], delivery[1]
    return deliveries(d.apply(Nack(C, None, 1, [[qid, seq]], requeue)))


def test_requeues_count_until_the_limit_then_the_message_is_dead_lettered(d):
    """x-delivery-limit 2: three deliveries (x-delivery-count absent, 1, 2), the third return
    dead-letters it with reason delivery_limit: x-death and x-first-death-* as for any reason."""
    d.declare("dlq")
    d.declare("q", {"x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    d.publish("q", b"poison", headers={"app": "x"})
    seen = []
    got = _consume(d, "q")
    while got:
        (delivery,) = got
        seen.append((delivery[2], headers_of(delivery[3]).get("x-delivery-count")))
        assert headers_of(delivery[3])["app"] == "x"
        got = _nack(d, delivery)
    assert seen == [(False, None), (True, 1), (True, 2)]
    assert len(queue(d, "q").ready) == 0 and queue(d, "q").unacked_count == 0
    got = d.get("dlq")
    dead = got.message
    headers = headers_of(dead)
    (death,) = headers["x-death"]
    assert (death["reason"], death["queue"], death["count"], death["exchange"]) == ("delivery_limit", "q", 1, "")
    assert headers["x-first-death-reason"] == "delivery_limit" and headers["x-first-death-queue"] == "q"
    assert "x-delivery-count" not in headers  # the copy is a new message, as RabbitMQ 3.13 publishes it
    assert got.body == b"poison"
    assert ("q", "delivery_limit") in d.kinds(EV.DROPPED)
    assert ("q", "delivery_limit->") in d.kinds(EV.DEAD_LETTERED)


def test_limit_zero_allows_one_delivery_and_without_a_dlx_the_message_is_dropped(d):
    d.declare("q", {"x-delivery-limit": 0})
    d.publish("q", b"once")
    (delivery,) = _consume(d, "q")
    assert "x-delivery-count" not in headers_of(delivery[3])
    assert _nack(d, delivery) == []
    assert len(queue(d, "q").ready) == 0 and d.machine.message_bytes == 0
    assert d.kinds(EV.DROPPED) == [("q", "delivery_limit")]
    assert d.kinds(EV.DEAD_LETTERED) == []
    assert d.machine.stats["delivery_limited"] == 1


def test_nack_without_requeue_is_rejected_not_delivery_limited(d):
    d.declare("dlq")
    d.declare("q", {"x-delivery-limit": 5, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    d.publish("q", b"m")
    (delivery,) = _consume(d, "q")
    _nack(d, delivery, requeue=False)
    (death,) = headers_of(d.get("dlq")[3])["x-death"]
    assert death["reason"] == "rejected"


def test_channel_close_connection_close_and_recover_each_count_as_a_return(d):
    d.declare("q", {"x-delivery-limit": 2})
    d.publish("q", b"m")
    counts = []
    value = d.get("q", no_ack=False)  # delivery 1
    counts.append(headers_of(value[3]).get("x-delivery-count"))
    d.ok(Op.RECOVER, True)  # return 1
    value = d.get("q", no_ack=False)
    counts.append(headers_of(value[3]).get("x-delivery-count"))
    d.ok(Op.CHANNEL_CLOSE)  # return 2
    d.ok(Op.CHANNEL_OPEN)
    value = d.get("q", no_ack=False)
    counts.append(headers_of(value[3]).get("x-delivery-count"))
    assert counts == [None, 1, 2]
    d.apply(ConnectionClose(C, None))  # return 3 > 2: gone
    d.ok(Op.CHANNEL_OPEN)
    assert d.get("q") is None
    assert d.kinds(EV.DROPPED) == [("q", "delivery_limit")]


def test_a_read_ahead_taken_back_unsent_does_not_count(d):
    """Op.NACK with ``unsent`` (node/amqp091/window.py): the client never saw it."""
    d.declare("q", {"x-delivery-limit": 0})
    d.publish("q", b"m")
    (delivery,) = _consume(d, "q")
    d.ok(Op.CANCEL, "c")
    d.apply(Nack(C, None, 1, [[delivery[0], delivery[1]]], True, True))
    value = d.get("q")
    assert value is not None and value[2] is False and "x-delivery-count" not in headers_of(value[3])


def test_the_header_belongs_to_the_delivery_not_the_shared_message(d):
    """A fanout message sits in two queues: the count of one queue's entry is not the other's."""
    d.declare("a", {"x-delivery-limit": 5})
    d.declare("b")
    d.ok(Op.QUEUE_BIND, "/", "a", "amq.fanout", "", {})
    d.ok(Op.QUEUE_BIND, "/", "b", "amq.fanout", "", {})
    d.publish("", b"m", exchange="amq.fanout")
    value = d.get("a", no_ack=False)
    d.ok(Op.RECOVER, True)
    again = d.get("a")
    assert headers_of(again[3])["x-delivery-count"] == 1
    assert again[3] is not value[3] and headers_of(value[3]) == {}
    assert headers_of(d.get("b")[3]) == {}


def test_quorum_type_carries_the_count_without_a_limit_and_classic_queues_carry_none(d):
    d.declare("qq", {"x-queue-type": "quorum"})
    d.declare("cq")
    for name in ("qq", "cq"):
        d.publish(name, b"m")
        for _ in range(30):
            assert d.get(name, no_ack=False) is not None
            d.ok(Op.RECOVER, True)
    assert headers_of(d.get("qq")[3])["x-delivery-count"] == 30
    value = d.get("cq")
    assert value[2] is True and "x-delivery-count" not in headers_of(value[3])


def test_a_single_node_restart_counts_the_delivery_in_flight(tmp_path):
    """The stored delivery count includes the delivery the restart cut off, as RabbitMQ counts a
    consumer that went down: with limit 0 the message is dead-lettered, not delivered again."""
    path = str(tmp_path / "lmdb")
    first = _driver(StoredMachine(DurableStore(path)))
    first.declare("dlq", durable=True)
    first.declare("q", {"x-delivery-limit": 0, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"},
                  durable=True)
    first.publish("q", b"m", persistent=True)
    assert first.get("q", no_ack=False) is not None
    first.machine.store.close()
    second = _driver(StoredMachine(DurableStore(path)))
    assert second.get("q") is None
    (death,) = headers_of(second.get("dlq")[3])["x-death"]
    assert death["reason"] == "delivery_limit"


# ------------------------------------------------------------------------------------ deduplication


H = "x-deduplication-header"


def test_a_duplicate_is_confirmed_and_not_enqueued_and_a_message_without_the_header_always_is(d):
    d.declare("q", {"x-message-deduplication": True})
    assert d.publish("q", b"1", headers={H: "order-1"})[0] == ROUTED
    assert d.publish("q", b"1 again", headers={H: "order-1"})[0] == ROUTED  # the confirm still comes
    assert d.publish("q", b"2", headers={H: "order-2"})[0] == ROUTED
    d.publish("q", b"plain")
    d.publish("q", b"plain")
    d.publish("q", b"other header", headers={"x-other": "order-1"})
    assert d.bodies("q") == [b"1", b"2", b"plain", b"plain", b"other header"]
    assert d.kinds(EV.DEDUPLICATED) == [("q", "queue")]
    assert d.machine.stats["deduplicated"] == 1  # raftmq_messages_deduplicated_total (ops/metrics.py)


def test_header_values_compare_by_type_and_text_equals_its_bytes():
    def key(value):
        return dedup_key(encode_properties(BasicProperties(headers={H: value})))

    assert len({key(1), key(True), key("1"), key(1.0)}) == 4
    assert key("abc") == key(b"abc")
    assert key(None) is None and key([1]) is None and key({"a": 1}) is None
    assert dedup_key(b"\x00\x00") is None


def test_the_plugin_rule_an_entry_leaves_with_its_message(d):
    """Acked, auto-acked, rejected, purged: the same header is enqueued again afterwards;
    requeued (still in the queue): still a duplicate."""
    d.declare("q", {"x-message-deduplication": True})
    d.publish("q", b"a", headers={H: "k"})
    value = d.get("q", no_ack=False)
    assert d.publish("q", b"a2", headers={H: "k"})[0] == ROUTED  # delivered, unacked: still present
    d.ok(Op.RECOVER, True)
    d.publish("q", b"a3", headers={H: "k"})
    value = d.get("q", no_ack=False)
    d.apply(Ack(C, None, 1, [[value[0], value[1]]]))
    assert d.get("q") is None
    d.publish("q", b"b", headers={H: "k"})  # acked: enqueued again
    assert d.bodies("q") == [b"b"]  # auto-ack get
    d.publish("q", b"c", headers={H: "k"})
    value = d.get("q", no_ack=False)
    d.apply(Nack(C, None, 1, [[value[0], value[1]]], False))  # rejected
    d.publish("q", b"d", headers={H: "k"})
    assert d.ok(Op.QUEUE_PURGE, "/", "q")[0] == 1
    d.publish("q", b"e", headers={H: "k"})
    assert d.bodies("q") == [b"e"]
    assert d.kinds(EV.DEDUPLICATED) == [("q", "queue"), ("q", "queue")]


def test_a_full_cache_evicts_its_oldest_entry(d):
    d.declare("q", {"x-message-deduplication": True, "x-cache-size": 2})
    for k in ("k1", "k2", "k3"):  # k3 evicts k1
        d.publish("q", k.encode(), headers={H: k})
    d.publish("q", b"k1 again", headers={H: "k1"})  # accepted: k1 was evicted (and evicts k2)
    d.publish("q", b"k3 again", headers={H: "k3"})  # still cached
    cache = queue(d, "q").dedup
    assert list(cache.entries) == ["k3", "k1"]
    assert d.bodies("q") == [b"k1", b"k2", b"k3", b"k1 again"]
    assert not cache.entries and not cache.owners  # every message left: so did every entry


def test_cache_ttl_keeps_an_entry_after_its_message_is_consumed_until_it_expires(d):
    d.declare("q", {"x-message-deduplication": True, "x-cache-ttl": 100})
    d.publish("q", b"first", headers={H: "k"})
    assert d.bodies("q") == [b"first"]
    d.now += 99_999
    d.publish("q", b"resend", headers={H: "k"})  # 99.999 ms later: still a duplicate
    assert d.bodies("q") == []
    d.now += 1  # 100 ms after insertion: expired (the plugin: expiration <= now)
    d.publish("q", b"later", headers={H: "k"})
    assert d.bodies("q") == [b"later"]


def test_expired_entries_are_swept_oldest_first_when_new_ones_arrive(d):
    d.declare("q", {"x-message-deduplication": True, "x-cache-ttl": 10})
    for i in range(5):
        d.publish("q", b"m", headers={H: i})
        d.now += 4_000
    # Inserted at 0, 4, 8, 12, 16 ms; now 20 ms: entries of 0..8 ms have expired.
    d.publish("q", b"m", headers={H: "new"})
    assert list(queue(d, "q").dedup.entries) == [("i", 3), ("i", 4), "new"]


def test_an_expired_message_takes_its_entry_along(d):
    d.declare("q", {"x-message-deduplication": True, "x-message-ttl": 50})
    d.publish("q", b"old", headers={H: "k"})
    d.now += 50_000
    d.publish("q", b"dup", headers={H: "k"})  # not yet expired (expiry is strictly after the TTL)
    d.now += 1
    d.publish("q", b"new", headers={H: "k"})  # expired, even before a tick removed it
    assert d.bodies("q") == [b"new"]


def test_a_message_refused_by_reject_publish_is_not_cached_and_duplicates_do_not_fill_the_queue(d):
    d.declare("q", {"x-message-deduplication": True, "x-max-length": 1, "x-overflow": "reject-publish"})
    assert d.publish("q", b"a", headers={H: "a"})[0] == ROUTED
    assert d.publish("q", b"a", headers={H: "a"})[0] == ROUTED  # a duplicate, not a refusal
    assert d.publish("q", b"b", headers={H: "b"})[0] == REJECTED
    assert list(queue(d, "q").dedup.entries) == ["a"]


def test_only_deduplicating_queues_deduplicate_a_fanout(d):
    d.declare("dedup", {"x-message-deduplication": True})
    d.declare("plain")
    for name in ("dedup", "plain"):
        d.ok(Op.QUEUE_BIND, "/", name, "amq.fanout", "", {})
    for _ in range(3):
        assert d.publish("", b"m", headers={H: "k"}, exchange="amq.fanout")[0] == ROUTED
    assert (len(queue(d, "dedup").ready), len(queue(d, "plain").ready)) == (1, 3)


def test_the_cache_is_in_the_snapshot_and_the_digest(d):
    d.declare("q", {"x-message-deduplication": True, "x-cache-ttl": 1000, "x-delivery-limit": 3})
    d.publish("q", b"a", headers={H: "a"})
    assert d.bodies("q") == [b"a"]  # consumed: only the cache remembers "a"
    copy = StoredMachine()
    import_model(copy, export_model(d.machine))
    assert digest(copy) == digest(d.machine)
    assert copy.vhosts["/"].queues["q"].delivery_limit == 3
    twin = Driver(copy)  # the same resend applied to both: dropped by both
    for driver in (d, twin):
        driver.publish("q", b"a", headers={H: "a"})
    assert digest(copy) == digest(d.machine) and d.bodies("q") == twin.bodies("q") == []
    before = digest(d.machine)
    queue(d, "q").dedup.entries.clear()
    assert digest(d.machine) != before


def test_a_single_node_restart_rebuilds_the_cache_from_the_queued_messages(tmp_path):
    path = str(tmp_path / "lmdb")
    first = _driver(StoredMachine(DurableStore(path)))
    first.declare("q", {"x-message-deduplication": True}, durable=True)
    first.publish("q", b"kept", headers={H: "k"}, persistent=True)
    first.machine.store.close()
    second = _driver(StoredMachine(DurableStore(path)))
    assert second.publish("q", b"resend", headers={H: "k"})[0] == ROUTED
    assert second.bodies("q") == [b"kept"]


def test_a_stored_queue_with_an_argument_now_invalid_still_loads(tmp_path):
    """Before issue 21 x-delivery-limit was stored unread: a -1 must not stop the node loading."""
    path = str(tmp_path / "lmdb")
    first = _driver(StoredMachine(DurableStore(path)))
    first.declare("q", {"x-max-length": 3}, durable=True)
    recorder = PersistenceRecorder()  # the record an older raftmq wrote for the same declare
    recorder.put_queue("/", "q", queue(first, "q").qid, False, {"x-max-length": 3, "x-delivery-limit": -1})
    first.machine.store.commit(recorder.ops, (first.machine.next_qid, first.machine.next_msg_id))
    first.machine.store.close()
    loaded = StoredMachine(DurableStore(path)).vhosts["/"].queues["q"]
    assert (loaded.delivery_limit, loaded.max_length, loaded.arguments["x-delivery-limit"]) == (None, 3, -1)


def test_dedup_cache_unit_rules():
    cache = DedupCache(size=3, ttl=None)
    cache.add("a", 1, 0, None)
    cache.add("b", 2, 0, 500)
    assert cache.seen("a", 10**9) and cache.seen("b", 500) and not cache.seen("b", 501)
    assert "b" not in cache.entries and 2 not in cache.owners  # the expired entry went on lookup
    cache.forget(1)
    assert not cache.seen("a", 0) and cache.owners == {}
    cache.add("c", 3, 0, None)
    cache.add("c", 4, 0, None)  # a second message with a key already cached (after an eviction)
    cache.forget(3)  # the first one leaving does not take the second one's entry
    assert cache.seen("c", 0)


def test_an_amqp010_resume_replays_a_redelivery_with_the_count_it_was_sent_with():
    """Transfers replayed on resume (store/core/sessions.py) carry the x-delivery-count of their first
    sending: the entry's count has grown by that delivery since."""
    from raftmq.store.core.sessions import SETTLE_RELEASE_REDELIVERED, UNLIMITED
    from tests.unit.store.test_sessions import attach, machine_with_queue

    m = machine_with_queue()
    a, _ = attach(m, "n1.x.1")
    a.call(Op.SESSION_TIMEOUT, 60)
    a.command(Op.QUEUE_DECLARE, "/", "q", False, True, False, False, {"x-delivery-limit": 5})
    a.command(Op.PUBLISH, "/", "", "q", False, b"\x00\x00", b"m", True, 0, None)
    a.command(Op.MESSAGE_SUBSCRIBE, "/", "q", "dest", False, False, {})
    a.command(Op.MESSAGE_FLOW, "dest", 0, 2)
    a.command(Op.MESSAGE_FLOW, "dest", 1, UNLIMITED)
    a.command(Op.MESSAGE_SETTLE, [[0, 0]], SETTLE_RELEASE_REDELIVERED)
    sent = [(o[4][0], headers_of(o[4][4]).get("x-delivery-count")) for o in a.transfers()]
    assert sent == [(0, None), (1, 1)]
    m.apply_batch(NOW, [NodeReset(None, None, "n1", None)])
    _b, result = attach(m, "n2.y.1")
    replay = result.value.replay
    assert [(t[0], headers_of(t[4]).get("x-delivery-count")) for t in replay] == [(1, 1)]


def test_an_amqp010_browser_sees_the_count_of_a_redelivered_message():
    from raftmq.store.core.sessions import UNLIMITED
    from tests.unit.store.test_sessions import attach

    d = _driver(StoredMachine())
    d.declare("q", {"x-delivery-limit": 5})
    d.publish("q", b"m")
    assert d.get("q", no_ack=False) is not None
    d.ok(Op.RECOVER, True)  # back in the queue with a count of 1
    b, _ = attach(d.machine, "n1.x.1")
    b.command(Op.MESSAGE_SUBSCRIBE, "/", "q", "browser", False, False, {}, True)  # acquire-mode not-acquired
    b.command(Op.MESSAGE_FLOW, "browser", 0, UNLIMITED)
    b.command(Op.MESSAGE_FLOW, "browser", 1, UNLIMITED)
    (transfer,) = b.transfers()
    assert transfer[4][3] is True and headers_of(transfer[4][4])["x-delivery-count"] == 1
