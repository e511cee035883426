"""Issue 21's plugin exchange types in the state machine (store/core/delayed.py, store/core/exchange_dedup.py).

Delayed: rabbitmq-delayed-message-exchange (src/rabbit_exchange_type_delayed_message.erl): an
``x-delay`` of ``0 < D <= 2^32-1`` ms holds the message and routes it ``D`` ms later through the
``x-delayed-type`` matching; anything else routes at once; ``route/2`` answers no queue for a held
message (so mandatory returns it); rabbit_delayed_message_utils converts a string or float delay and
sets ``x-delay`` to ``-D`` on the held message.  Here the delay runs on the batch's stamped time.

Deduplication exchange: rabbitmq-message-deduplication (rabbit_message_deduplication_exchange.ex):
``x-cache-size`` required, ``x-cache-ttl`` optional, a message's ``x-cache-ttl`` header overrides it;
a duplicate is not routed; the exchange routes to all of its bindings.
"""

from __future__ import annotations

import pytest

from raftmq.protocol.amqp091.properties import BasicProperties, decode_properties, encode_properties
from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import ERR, REJECTED, ROUTED, UNROUTABLE, Op, Tick, VhostAdd
from raftmq.store.core.delayed import MAX_DELAY_MS, delay_of
from raftmq.store.disk import history as EV
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import digest, export_model, import_model, live_bodies
from tests.unit.store.test_features21 import NOW, Driver

MS = 1000


def _driver(machine: StoredMachine) -> Driver:
    d = Driver(machine)
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    return d


@pytest.fixture
def d() -> Driver:
    return _driver(StoredMachine())


def delayed_exchange(d: Driver, name: str = "dx", inner: str = "direct") -> None:
    d.ok(Op.EXCHANGE_DECLARE, "/", name, "x-delayed-message", False, True, False, False, {"x-delayed-type": inner})


def bound_queue(d: Driver, queue: str, exchange: str = "dx", key: str = "k", args: dict | None = None) -> None:
    d.declare(queue)
    d.ok(Op.QUEUE_BIND, "/", queue, exchange, key, args or {})


def tick(d: Driver, at: int) -> None:
    d.now = at
    d.apply(Tick(None, None))


def ready(d: Driver, queue: str) -> int:
    return len(d.machine.vhosts["/"].queues[queue].ready)


def props(headers: dict) -> bytes:
    return encode_properties(BasicProperties(headers=headers))


@pytest.mark.parametrize(("value", "expected"), [
    (5000, 5000), ("5000", 5000), (b"250", 250), (12.9, 12), (MAX_DELAY_MS, MAX_DELAY_MS),
    (0, None), (-10, None), (MAX_DELAY_MS + 1, None), ("soon", None), (True, None), ([1], None), (None, None),
])
def test_delay_header_is_read_as_the_plugin_reads_it(value, expected):
    assert delay_of(props({"x-delay": value})) == expected


def test_no_header_is_no_delay():
    assert delay_of(b"\x00\x00") is None
    assert delay_of(props({"other": 1})) is None


def test_a_delayed_message_is_held_until_its_time_then_routed_with_x_delay_negated(d):
    delayed_exchange(d)
    bound_queue(d, "q")
    outcome, _ = d.publish("k", b"late", headers={"x-delay": 200}, exchange="dx")
    assert outcome == UNROUTABLE  # no queue now: mandatory returns it (the plugin's route/2 gives [])
    assert ready(d, "q") == 0 and len(d.machine.delayed) == 1
    assert d.machine.message_bytes == 4  # held bodies count toward the memory alarm
    assert d.machine.next_deadline() == NOW + 200 * MS
    assert d.machine.next_expiry_due()
    tick(d, NOW + 199 * MS)
    assert ready(d, "q") == 0  # not before the delay
    tick(d, NOW + 200 * MS)
    assert ready(d, "q") == 1 and len(d.machine.delayed) == 0 and d.machine.message_bytes == 4
    got = d.get("q")
    message = got.message
    assert got.body == b"late"
    assert decode_properties(message.properties).headers["x-delay"] == -200
    assert d.machine.stats["delayed"] == 1 and d.machine.stats["delay_released"] == 1
    assert d.kinds(EV.DELAYED) == [("", "200")]
    assert d.kinds(EV.DELAY_RELEASED) == [("", "0")]
    assert d.machine.next_deadline() is None


def test_messages_are_released_in_due_order_and_ties_in_publish_order(d):
    delayed_exchange(d)
    bound_queue(d, "q")
    for body, delay in ((b"c", 300), (b"a", 100), (b"b1", 200), (b"b2", 200)):
        d.publish("k", body, headers={"x-delay": delay}, exchange="dx")
    tick(d, NOW + 1000 * MS)
    assert d.bodies("q") == [b"a", b"b1", b"b2", b"c"]


@pytest.mark.parametrize("headers", [None, {"x-delay": -5}, {"x-delay": 0}, {"x-delay": "x"},
                                     {"x-delay": MAX_DELAY_MS + 1}])
def test_without_a_valid_delay_the_message_is_routed_at_once(d, headers):
    delayed_exchange(d)
    bound_queue(d, "q")
    outcome, _ = d.publish("k", b"now", headers=headers, exchange="dx")
    assert outcome == ROUTED
    assert d.bodies("q") == [b"now"] and len(d.machine.delayed) == 0


@pytest.mark.parametrize(("inner", "key", "binding_key", "args", "headers"), [
    ("direct", "a.b", "a.b", {}, {}),
    ("topic", "a.b", "a.*", {}, {}),
    ("fanout", "anything", "", {}, {}),
    ("headers", "", "", {"x-match": "all", "kind": "x"}, {"kind": "x"}),
])
def test_each_delayed_type_routes_as_its_type_after_the_delay(d, inner, key, binding_key, args, headers):
    delayed_exchange(d, inner=inner)
    bound_queue(d, "hit", key=binding_key, args=args)
    d.declare("miss")
    d.ok(Op.QUEUE_BIND, "/", "miss", "dx", "zzz", {"x-match": "all", "kind": "y"} if inner == "headers" else {})
    d.publish(key, b"m", headers={"x-delay": 10, **headers}, exchange="dx")
    tick(d, NOW + 10 * MS)
    assert d.bodies("hit") == [b"m"]
    if inner != "fanout":
        assert d.bodies("miss") == []


@pytest.mark.parametrize(("args", "code"), [
    ({}, 406), ({"x-delayed-type": "x-delayed-message"}, 406), ({"x-delayed-type": 5}, 406),
    ({"x-delayed-type": "nope"}, 503),
])
def test_a_delayed_exchange_needs_an_existing_x_delayed_type(d, args, code):
    result, _ = d.call(Op.EXCHANGE_DECLARE, "/", "bad", "x-delayed-message", False, True, False, False, args)
    assert result[0] == ERR and result[1] == code
    assert "bad" not in d.machine.vhosts["/"].exchanges


def test_beyond_the_limit_a_delayed_publish_is_rejected(d):
    d.machine.delayed_limit = 2
    delayed_exchange(d)
    bound_queue(d, "q")
    outcomes = [d.publish("k", b"%d" % i, headers={"x-delay": 50}, exchange="dx")[0] for i in range(3)]
    assert outcomes == [UNROUTABLE, UNROUTABLE, REJECTED]  # REJECTED: basic.nack in confirm mode
    assert d.machine.stats["delay_refused"] == 1
    assert d.kinds(EV.DROPPED) == [("", "delayed-limit 2")]
    tick(d, NOW + 50 * MS)
    assert d.bodies("q") == [b"0", b"1"]


def test_a_held_message_of_a_deleted_exchange_is_dropped_at_its_time(d):
    delayed_exchange(d)
    bound_queue(d, "q")
    d.publish("k", b"m", headers={"x-delay": 10}, exchange="dx")
    d.ok(Op.EXCHANGE_DELETE, "/", "dx", False)
    tick(d, NOW + 10 * MS)
    assert len(d.machine.delayed) == 0
    assert d.kinds(EV.DROPPED) == [("", "delayed exchange deleted")]


def test_per_message_ttl_starts_when_the_message_is_released(d):
    delayed_exchange(d)
    bound_queue(d, "q")
    d.publish("k", b"m", headers={"x-delay": 100}, exchange="dx", expiration=50)
    tick(d, NOW + 100 * MS)
    tick(d, NOW + 140 * MS)
    assert d.bodies("q") == [b"m"]


def test_held_messages_travel_in_snapshots_and_the_digest(d):
    delayed_exchange(d)
    bound_queue(d, "q")
    d.publish("k", b"m", headers={"x-delay": 100}, exchange="dx")
    other = _driver(StoredMachine())
    import_model(other.machine, export_model(d.machine))
    assert digest(other.machine) == digest(d.machine)
    # Held messages' bodies are fetched by a joining node like queued ones (body_fetch.py).
    assert live_bodies(other.machine) == live_bodies(d.machine) != {}
    other.machine.own_bodies.put([(i, d.machine.own_bodies.get(i)) for i in live_bodies(other.machine)])
    d.publish("k", b"n", headers={"x-delay": 100}, exchange="dx")
    assert digest(other.machine) != digest(d.machine)
    tick(other, NOW + 100 * MS)
    assert other.bodies("q") == [b"m"]


def test_held_messages_survive_a_single_node_restart(tmp_path):
    path = str(tmp_path / "lmdb")
    d = _driver(StoredMachine(DurableStore(path)))
    d.ok(Op.EXCHANGE_DECLARE, "/", "dx", "x-delayed-message", False, True, False, False, {"x-delayed-type": "direct"})
    d.declare("q", durable=True)
    d.ok(Op.QUEUE_BIND, "/", "q", "dx", "k", {})
    d.publish("k", b"transient", headers={"x-delay": 100}, exchange="dx")
    d.publish("k", b"persistent", headers={"x-delay": 50}, exchange="dx", persistent=True)
    d.publish("k", b"released", headers={"x-delay": 10}, exchange="dx", persistent=True)
    tick(d, NOW + 10 * MS)
    d.machine.store.close()
    again = StoredMachine(DurableStore(path))
    assert len(again.delayed) == 2 and again.next_deadline() == NOW + 50 * MS
    assert again.message_bytes == len(b"transient") + len(b"persistent") + len(b"released")
    e = Driver(again)
    e.ok(Op.CHANNEL_OPEN)
    tick(e, NOW + 100 * MS)
    assert e.bodies("q") == [b"released", b"persistent", b"transient"]
    again.store.close()
    third = StoredMachine(DurableStore(path))
    assert len(third.delayed) == 0  # released ones left the store's delayed table
    third.store.close()


# ------------------------------------------------------------------ deduplication exchange

def dedup_exchange(d: Driver, args: dict) -> None:
    d.ok(Op.EXCHANGE_DECLARE, "/", "ddx", "x-message-deduplication", False, True, False, False, args)
    for q in ("q1", "q2"):
        d.declare(q)
        d.ok(Op.QUEUE_BIND, "/", q, "ddx", f"key-{q}", {})


H = "x-deduplication-header"


def test_the_dedup_exchange_routes_to_every_binding_once_per_header_value(d):
    dedup_exchange(d, {"x-cache-size": 10})
    outcomes = [d.publish("rk", body, headers=h, exchange="ddx")[0]
                for body, h in ((b"a", {H: "1"}), (b"dup", {H: "1"}), (b"b", {H: "2"}), (b"plain", {}), (b"plain", {}))]
    assert outcomes == [ROUTED, UNROUTABLE, ROUTED, ROUTED, ROUTED]
    assert d.bodies("q1") == [b"a", b"b", b"plain", b"plain"]
    assert d.bodies("q2") == [b"a", b"b", b"plain", b"plain"]
    assert d.machine.stats["deduplicated"] == 1
    assert d.kinds(EV.DEDUPLICATED) == [("", "exchange")]


def test_the_dedup_exchange_cache_evicts_the_oldest_when_full(d):
    dedup_exchange(d, {"x-cache-size": 2})
    for key in ("a", "b", "c", "a", "c"):
        d.publish("rk", key.encode(), headers={H: key}, exchange="ddx")
    assert d.bodies("q1") == [b"a", b"b", b"c", b"a"]


def test_exchange_and_message_cache_ttl_expire_entries_by_stamped_time(d):
    dedup_exchange(d, {"x-cache-size": 10, "x-cache-ttl": 100})
    d.publish("rk", b"a", headers={H: "a"}, exchange="ddx")
    d.publish("rk", b"b", headers={H: "b", "x-cache-ttl": 1000}, exchange="ddx")
    d.now = NOW + 99 * MS
    d.publish("rk", b"a-dup", headers={H: "a"}, exchange="ddx")
    d.now = NOW + 100 * MS
    d.publish("rk", b"a-again", headers={H: "a"}, exchange="ddx")
    d.publish("rk", b"b-dup", headers={H: "b"}, exchange="ddx")
    d.now = NOW + 1000 * MS
    d.publish("rk", b"b-again", headers={H: "b"}, exchange="ddx")
    assert d.bodies("q1") == [b"a", b"b", b"a-again", b"b-again"]


@pytest.mark.parametrize("args", [{}, {"x-cache-size": 0}, {"x-cache-size": "many"},
                                  {"x-cache-size": 5, "x-cache-ttl": -1},
                                  {"x-cache-size": 5, "x-cache-persistence": "tape"}])
def test_a_dedup_exchange_needs_a_positive_cache_size(d, args):
    result, _ = d.call(Op.EXCHANGE_DECLARE, "/", "bad", "x-message-deduplication", False, True, False, False, args)
    assert result[0] == ERR and result[1] == 406


def test_the_exchange_cache_is_replicated_state_and_goes_with_the_exchange(d):
    dedup_exchange(d, {"x-cache-size": "10"})
    d.publish("rk", b"a", headers={H: "a"}, exchange="ddx")
    other = _driver(StoredMachine())
    import_model(other.machine, export_model(d.machine))
    assert digest(other.machine) == digest(d.machine)
    # Held messages' bodies are fetched by a joining node like queued ones (body_fetch.py).
    assert live_bodies(other.machine) == live_bodies(d.machine) != {}
    other.machine.own_bodies.put([(i, d.machine.own_bodies.get(i)) for i in live_bodies(other.machine)])
    assert other.publish("rk", b"dup", headers={H: "a"}, exchange="ddx")[0] == UNROUTABLE
    d.ok(Op.EXCHANGE_DELETE, "/", "ddx", False)
    assert d.machine.exchange_caches == {}
