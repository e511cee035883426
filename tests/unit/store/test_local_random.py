"""RabbitMQ 4's x-local-random exchange in the state machine (store/core/exchange_types.py): one bound queue
per message, chosen by a hash of the message id -- the same on every replica, spread over the queues;
bindings only to queues with an empty key (RabbitMQ's rabbit_exchange_type_local_random)."""

from __future__ import annotations

from collections import Counter

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import ERR, OUT_REPLY, Op, VhostAdd, make
from raftmq.store.core.exchange_types import pick_local_random

NOW = 1_700_000_000_000_000
C = "n1.admin.1"


def call(m: StoredMachine, op, *args):
    out = m.apply_batch(NOW, [make(op, C, 1, 1, *args)])
    return next(o[3] for o in out if o[1] == OUT_REPLY)


def machine(queues: int) -> StoredMachine:
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    call(m, Op.CHANNEL_OPEN)
    assert call(m, Op.EXCHANGE_DECLARE, "/", "lr", "x-local-random", False, True, False, False, {})[0] != ERR
    for i in range(queues):
        call(m, Op.QUEUE_DECLARE, "/", f"q{i}", False, True, False, False, {})
        assert call(m, Op.QUEUE_BIND, "/", f"q{i}", "lr", "", {})[0] != ERR
    return m


def test_each_message_goes_to_exactly_one_queue_spread_over_all():
    m = machine(4)
    for i in range(400):
        call(m, Op.PUBLISH, "/", "lr", "any-key", False, b"\x00\x00", b"%d" % i, False, 0, None)
    counts = Counter({name: len(q.ready) for name, q in m.vhosts["/"].queues.items()})
    assert sum(counts.values()) == 400
    assert all(60 <= n <= 140 for n in counts.values()), counts  # hashed ids: near 100 each


def test_two_replicas_route_alike():
    """Determinism: the choice is a function of the replicated state (the message id), not a random draw."""
    first, second = machine(3), machine(3)
    for m in (first, second):
        for i in range(50):
            call(m, Op.PUBLISH, "/", "lr", "", False, b"\x00\x00", b"%d" % i, False, 0, None)
    assert [[e.message.id for e in q.ready.entries()] for q in first.vhosts["/"].queues.values()] == \
        [[e.message.id for e in q.ready.entries()] for q in second.vhosts["/"].queues.values()]


def test_bindings_need_an_empty_key_and_a_queue():
    m = machine(1)
    refused = call(m, Op.QUEUE_BIND, "/", "q0", "lr", "key", {})
    assert refused[0] == ERR and refused[1] == 406 and "Non empty binding" in refused[2]
    call(m, Op.CHANNEL_OPEN)
    call(m, Op.EXCHANGE_DECLARE, "/", "other", "fanout", False, True, False, False, {})
    refused = call(m, Op.EXCHANGE_BIND, "/", "other", "lr", "", {})
    assert refused[0] == ERR and refused[1] == 406


def test_no_binding_is_unroutable_and_one_is_always_chosen():
    assert pick_local_random([], 7) == []
    assert pick_local_random(["only"], 7) == ["only"]
    assert {pick_local_random(["a", "b"], i)[0] for i in range(20)} == {"a", "b"}
