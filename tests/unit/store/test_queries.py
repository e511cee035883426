"""store/core/queries.py: the read API node/ and ops/ use instead of the model (issue 33).

Each test builds a machine by applying commands (no storage: the queries are pure) and checks what the
queries answer against what was applied, that they answer in the model's order, and that what they
return is a copy: changing it changes nothing in the machine.
"""

from __future__ import annotations

import pytest

from raftmq.store.applier import StoredMachine
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import MemberSet, Op, make
from raftmq.store.core.sessions import session_key
from tests.unit.store.test_features21 import NOW, C, Driver, _driver

HASH = "pbkdf2-sha256$1$c2FsdA==$aGFzaA=="
MS = 1000


@pytest.fixture
def d() -> Driver:
    return _driver(StoredMachine())


def consume(d: Driver, queue: str, tag: str, ch: int, prefetch: int) -> None:
    d.ok(Op.CHANNEL_OPEN, ch=ch)
    d.ok(Op.QOS, prefetch, False, ch=ch)
    d.ok(Op.CONSUME, "/", queue, tag, False, False, {}, ch=ch)


def test_queues_their_numbers_and_the_vhost_totals(d):
    """QueueInfo and QueueDepth carry what was applied: 3 published to q-a, one consumer with prefetch
    1 holding one unacked (2 ready), its bytes, its arguments; queues in declaration order; the vhost's
    totals add them up; unknown names answer None, [], 0 or False."""
    d.declare("q-b", {"x-max-length": 10}, durable=True)
    d.declare("q-a")
    for body in (b"one", b"two", b"three"):
        d.publish("q-a", body)
    consume(d, "q-a", "tag-1", ch=2, prefetch=1)
    m = d.machine
    a = Q.queue(m, "/", "q-a")
    assert a is not None
    assert (a.vhost, a.name, a.durable, a.auto_delete, a.exclusive_owner) == ("/", "q-a", False, False, None)
    assert (a.messages_ready, a.messages_unacknowledged, a.consumers, a.published) == (2, 1, 1, 3)
    assert a.message_bytes_ready == len(b"two") + len(b"three")
    b = Q.queue(m, "/", "q-b")
    assert b is not None and b.durable and b.arguments == {"x-max-length": 10} and b.published == 0
    assert [q.name for q in Q.queues(m, "/")] == ["q-b", "q-a"]
    assert [(q.name, q.messages_ready, q.messages_unacknowledged, q.consumers, q.published)
            for q in Q.queue_depths(m)] == [("q-b", 0, 0, 0, 0), ("q-a", 2, 1, 1, 3)]
    assert [q.qid for q in Q.queue_depths(m, "/")] == [b.qid, a.qid]
    assert Q.queue_name(m, a.qid) == "q-a" and Q.queue_name(m, 999) is None
    assert Q.vhost(m, "/") == Q.VhostInfo("/", 2, len(m.vhosts["/"].exchanges), 1, 2, 1)
    assert Q.vhosts(m) == [Q.vhost(m, "/")] and Q.vhost_names(m) == ["/"]
    assert Q.queue_count(m, "/") == 2 and Q.has_queue(m, "/", "q-a") and Q.has_vhost(m, "/")
    assert Q.queue(m, "/", "nope") is None and Q.queue(m, "nowhere", "q-a") is None
    assert Q.queues(m, "nowhere") == [] and list(Q.queue_depths(m, "nowhere")) == []
    assert Q.queue_count(m, "nowhere") == 0 and not Q.has_queue(m, "nowhere", "q-a")
    assert Q.vhost(m, "nowhere") is None and not Q.has_vhost(m, "nowhere")


def test_results_are_copies_that_cannot_change_the_model(d):
    """A caller changing a result's dicts changes nothing in the machine, and the records themselves
    are immutable (NamedTuples)."""
    d.declare("q", {"x-max-length": 10})
    d.ok(Op.USER_PUT, "alice", HASH, ["monitoring"], False)
    d.ok(Op.PERMISSION_SET, "alice", "/", ".*", ".*", ".*")
    d.ok(Op.LIMITS_SET, "vhost", "/", {"max-queues": 5})
    m = d.machine
    info = Q.queue(m, "/", "q")
    assert info is not None
    info.arguments["x-max-length"] = 0
    alice = Q.user(m, "alice")
    assert alice is not None
    alice.permissions["/"] = ("", "", "")
    Q.vhost_limits(m, "/")["max-queues"] = 0
    Q.members(m)["n9"] = ("x", "y")
    Q.message_stats(m)["published"] = 99
    assert m.vhosts["/"].queues["q"].arguments == {"x-max-length": 10}
    assert m.users["alice"].permissions == {"/": (".*", ".*", ".*")}
    assert m.vhost_limits == {"/": {"max-queues": 5}}
    assert m.members == {} and m.stats["published"] == 0
    with pytest.raises(AttributeError):
        info.name = "other"  # type: ignore[misc]  # the point: a NamedTuple refuses it


def test_exchanges_and_bindings_in_rabbitmqs_order(d):
    """ExchangeInfo tells type, flags, arguments and its number of bindings; bindings come from the
    exchanges in name order, each exchange's in the order they were made, queue and exchange
    destinations told apart; ``source`` limits them to one exchange."""
    d.declare("q1")
    d.declare("q2")
    d.ok(Op.EXCHANGE_DECLARE, "/", "zeta", "topic", False, True, False, False, {"alternate-exchange": "ae"})
    d.ok(Op.EXCHANGE_DECLARE, "/", "alpha", "fanout", False, False, True, True, {})
    d.ok(Op.QUEUE_BIND, "/", "q2", "zeta", "k.#", {})
    d.ok(Op.QUEUE_BIND, "/", "q1", "zeta", "a.*", {"x": 1})
    d.ok(Op.QUEUE_BIND, "/", "q1", "alpha", "", {})
    d.ok(Op.EXCHANGE_BIND, "/", "alpha", "zeta", "e.#", {})  # destination alpha, source zeta
    m = d.machine
    zeta = Q.exchange(m, "/", "zeta")
    assert zeta == Q.ExchangeInfo("/", "zeta", "topic", True, False, False, {"alternate-exchange": "ae"}, 3, 0,
                                  None, None)
    alpha = Q.exchange(m, "/", "alpha")
    assert alpha is not None and (alpha.auto_delete, alpha.internal, alpha.bindings) == (True, True, 1)
    names = [e.name for e in Q.exchanges(m, "/")]
    assert names == list(m.vhosts["/"].exchanges) and names.index("zeta") < names.index("alpha")
    assert Q.exchange_names(m, "/") == set(names) and "zeta" in Q.exchange_names(m, "/")
    assert Q.has_exchange(m, "/", "alpha") and not Q.has_exchange(m, "/", "nope")
    assert Q.exchange(m, "/", "nope") is None and Q.exchange_names(m, "nowhere") == frozenset()
    assert Q.bindings(m, "/") == [
        Q.BindingInfo("/", "alpha", "q1", True, "", {}),
        Q.BindingInfo("/", "zeta", "q2", True, "k.#", {}),
        Q.BindingInfo("/", "zeta", "q1", True, "a.*", {"x": 1}),
        Q.BindingInfo("/", "zeta", "alpha", False, "e.#", {}),
    ]
    assert [b.destination for b in Q.bindings(m, "/", "zeta")] == ["q2", "q1", "alpha"]
    assert Q.bindings(m, "/", "nope") == [] and Q.bindings(m, "nowhere") == []


def test_plugin_exchanges_tell_what_they_hold(d):
    """An x-delayed-message exchange's held messages (also in the counters, with the next due time);
    an x-message-deduplication exchange's cache entries and size (rabbitmq-delayed-message-exchange's
    messages_delayed, the deduplication plugin's cache_info)."""
    d.ok(Op.EXCHANGE_DECLARE, "/", "dx", "x-delayed-message", False, True, False, False, {"x-delayed-type": "direct"})
    d.ok(Op.EXCHANGE_DECLARE, "/", "ddx", "x-message-deduplication", False, True, False, False, {"x-cache-size": 10})
    d.declare("q")
    d.ok(Op.QUEUE_BIND, "/", "q", "dx", "k", {})
    d.ok(Op.QUEUE_BIND, "/", "q", "ddx", "k", {})
    m = d.machine
    assert Q.exchange(m, "/", "ddx").cache_entries is None  # no cache before its first message
    assert Q.next_delayed_due(m) is None
    d.publish("k", b"later", headers={"x-delay": 200}, exchange="dx")
    d.publish("k", b"once", headers={"x-deduplication-header": "a"}, exchange="ddx")
    d.publish("k", b"twice", headers={"x-deduplication-header": "a"}, exchange="ddx")
    delayed, dedup = Q.exchange(m, "/", "dx"), Q.exchange(m, "/", "ddx")
    assert delayed is not None and delayed.messages_delayed == 1 and delayed.cache_entries is None
    assert dedup is not None and (dedup.cache_entries, dedup.cache_size, dedup.messages_delayed) == (1, 10, 0)
    assert Q.counters(m).delayed_messages == 1
    assert Q.next_delayed_due(m) == NOW + 200 * MS
    assert Q.queue(m, "/", "q").messages_ready == 1  # the duplicate was dropped, the delayed one held


def test_consumers_and_channels(d):
    """ConsumerInfo names the consumer's queue, connection and channel, its prefetch, unacked count
    and ack mode; channels() lists a connection's channels by number with their counts and limits."""
    d.declare("q")
    d.declare("other")
    d.publish("q", b"m")
    consume(d, "q", "c-1", ch=3, prefetch=5)
    d.ok(Op.CONSUME, "/", "other", "c-2", True, False, {}, ch=3)
    m = d.machine
    assert list(Q.consumers(m)) == [Q.ConsumerInfo("/", "q", "c-1", C, 3, 5, 1, False, False),
                                    Q.ConsumerInfo("/", "other", "c-2", C, 3, 5, 0, True, False)]
    assert [c.tag for c in Q.consumers(m, "/", "other")] == ["c-2"]
    assert list(Q.consumers(m, "/", "nope")) == [] and list(Q.consumers(m, "nowhere")) == []
    assert Q.channels(m, C) == [Q.ChannelInfo(1, True, 0, 0, 0, 0), Q.ChannelInfo(3, True, 2, 1, 0, 5)]
    assert Q.channel_count(m, C) == 2 and Q.channel_count(m, "nobody") == 0 and Q.channels(m, "nobody") == []


def test_users_permissions_and_limits(d):
    """Replicated users with their tags, loopback flag and permissions; the overlay of a user the
    machine does not manage (a configuration-file user), a cleared vhost as None; vhost and user
    limits, and the names that have any, sorted."""
    d.ok(Op.USER_PUT, "bob", HASH, ["administrator"], True)
    d.ok(Op.USER_PUT, "alice", HASH, ["monitoring", "management"], False)
    d.ok(Op.PERMISSION_SET, "alice", "/", "^a", "^b", "^c")
    d.ok(Op.PERMISSION_SET, "guest", "/", ".*", ".*", ".*")
    d.apply(make(Op.VHOST_ADD, None, None, "v2"))
    d.ok(Op.PERMISSION_SET, "guest", "v2", ".*", ".*", ".*")
    d.ok(Op.PERMISSION_CLEAR, "guest", "v2")
    d.ok(Op.LIMITS_SET, "vhost", "v2", {"max-queues": 3})
    d.ok(Op.LIMITS_SET, "vhost", "/", {"max-connections": 7})
    d.ok(Op.LIMITS_SET, "user", "bob", {"max-channels": 2})
    m = d.machine
    assert Q.users(m) == [Q.UserInfo("bob", HASH, ("administrator",), True, {}),
                          Q.UserInfo("alice", HASH, ("monitoring", "management"), False, {"/": ("^a", "^b", "^c")})]
    assert Q.user(m, "alice") == Q.users(m)[1] and Q.user(m, "guest") is None
    assert Q.has_user(m, "bob") and not Q.has_user(m, "guest")
    overlay = Q.permission_overlay(m, "guest")
    assert overlay["/"] == (".*", ".*", ".*") and overlay.get("v2") is None and "v2" in overlay
    assert Q.permission_overlay(m, "alice") == {}
    assert Q.vhost_names(m) == ["/", "v2"]
    assert Q.vhost_limits(m, "v2") == {"max-queues": 3} and Q.vhost_limits(m, "nowhere") == {}
    assert Q.user_limits(m, "bob") == {"max-channels": 2} and Q.user_limits(m, "alice") == {}
    assert Q.limited_vhosts(m) == ["/", "v2"] and Q.limited_users(m) == ["bob"]
    d.ok(Op.LIMITS_SET, "user", "bob", {"max-channels": None})
    assert Q.limited_users(m) == [] and Q.user_limits(m, "bob") == {}


def test_members_counters_sessions_and_message_stats(d):
    """The replicated member list; the counters as applied (index, audit sequence, internal errors,
    sessions); 1.0 durable links counted per user; the message counters."""
    m = d.machine
    m.apply_batch(NOW, [MemberSet(None, None, "n1", "127.0.0.1:1", "127.0.0.1:5672")], index=41)
    d.declare("q")
    d.publish("q", b"x")
    durable = b"amqp10-link\x00client\x00link-1"
    d.apply(make(Op.SESSION_ATTACH, C, 90, 7, "/", "alice", durable, True))
    d.apply(make(Op.SESSION_ATTACH, C, 91, 8, "/", "alice", b"amqp10:c1:8", True))
    assert Q.members(m) == {"n1": ("127.0.0.1:1", "127.0.0.1:5672")}
    counters = Q.counters(m)
    assert counters == Q.Counters(41, m.event_seq, 0, 0, 2) and counters.event_seq > 0
    assert Q.has_session(m, session_key("/", "alice", durable)) and not Q.has_session(m, "nope")
    assert Q.durable_link_count(m, "alice") == 1 and Q.durable_link_count(m, "bob") == 0
    assert Q.message_stats(m)["published"] == 1
