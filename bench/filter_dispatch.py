"""The state machine's consume path with and without filtered consumers (issue 37), in process.

``unfiltered``: one consumer without a filter (prefetch 100) takes 200 messages a batch, each acked
-- the path every ordinary consumer uses, which must cost what it did before filters existed.  Run it
against an old checkout and this one side by side::

    for w in /tmp/old .; do (cd $w && .venv/bin/python bench/filter_dispatch.py); done

``selector`` (new code only): the same with a JMS selector matching every other message, and
``deep``: one apply that has to skip a backlog of non-matching messages (bounded by SCAN_LIMIT).
The collector is tuned as a node tunes it (without, a full collection over the backlog lands in the
measured apply and dominates it: 40-50 ms instead of 5).
"""
import gc
import statistics
import time

import raftmq.node.core.formats  # noqa: F401
from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties
from raftmq.store.core import commands as C
from raftmq.store.core import delivery
from raftmq.store.core.machine import StateMachine

NEW = hasattr(delivery, "SCAN_LIMIT")  # this checkout has filtered consumers
gc.set_threshold(50_000, 20, 20)  # as a node runs (node/server.py tune_gc)
if NEW:
    from raftmq.store.core.filters import FILTER_ARGUMENT


def machine(args: dict) -> StateMachine:
    m = StateMachine(None)
    m.apply(1, [C.make(C.Op.VHOST_ADD, None, None, "/"), C.make(C.Op.CHANNEL_OPEN, "c", 1, 1),
                C.make(C.Op.QUEUE_DECLARE, "c", 2, 1, "/", "q", False, False, False, False, {}),
                C.make(C.Op.QOS, "c", 3, 1, 100, False),
                C.make(C.Op.CONSUME, "c", 4, 1, "/", "q", "t", False, False, args)])
    return m


def run(args: dict, props, rounds: int = 40) -> float:
    """Microseconds of apply per message published, delivered and acked; ``props(r, i)`` gives the
    property bytes of message ``i`` of round ``r``."""
    m = machine(args)
    qid = m.vhosts["/"].queues["q"].qid
    times = []
    seq = 1
    for r in range(rounds):
        publishes = [C.make(C.Op.PUBLISH, "c", None, 1, "/", "", "q", False, props(r, i), b"x" * 64,
                            False, 0, None) for i in range(200)]
        t0 = time.process_time()
        delivered = 0
        for i in range(0, 200, 50):
            out = m.apply(10 + r, publishes[i:i + 50], replies=False)
            refs = [[o[4][0], o[4][1]] for o in out.outputs if o[1] == C.OUT_DELIVER]
            delivered += len(refs)
            if refs:
                m.apply(10 + r, [C.make(C.Op.ACK, "c", None, 1, refs)], replies=False)
        times.append((time.process_time() - t0) / 200 * 1e6)
        m.vhosts["/"].queues["q"].ready.take_all()
        seq += 200
    del qid, delivered
    return statistics.median(times)


def amqp10_props(n: int) -> bytes:
    """The stored properties of a 1.0 message with application-properties {k: no, n: n}."""
    from raftmq.protocol.amqp10 import convert
    from raftmq.protocol.amqp10 import performatives as p

    payload = convert.encode([p.Properties(message_id=f"m{n}"), p.ApplicationProperties({"k": "no", "n": n}),
                              p.Data(b"x")])
    return convert.publish_of(payload).properties


def deep(backlog: int, amqp10: bool = False) -> float:
    """Milliseconds of the one apply in which a filtered consumer arrives on ``backlog`` non-matching
    messages, each with its own properties (the scan stops at SCAN_LIMIT entries)."""
    m = machine({})
    m.apply(5, [C.make(C.Op.CANCEL, "c", 5, 1, "t")])
    for i in range(0, backlog, 1000):
        m.apply(6, [C.make(C.Op.PUBLISH, "c", None, 1, "/", "", "q", False,
                           amqp10_props(i + j) if amqp10 else
                           encode_properties(BasicProperties(headers={"k": "no", "n": i + j})), b"x", False, 0,
                           None, 2 if amqp10 else 0) for j in range(1000)], replies=False)
    if NEW:
        from raftmq.store.core.filters import view
        view._cache.clear()  # cold: every view decoded
    gc.collect()
    gc.freeze()  # the backlog is long-lived, as a node's is frozen after start-up or a snapshot install
    t0 = time.process_time()
    m.apply(7, [C.make(C.Op.CONSUME, "c", 8, 1, "/", "q", "f", False, False,
                       {FILTER_ARGUMENT: [["selector", "k = 'yes'"]]})])
    elapsed = (time.process_time() - t0) * 1e3
    gc.unfreeze()
    return elapsed


def plain(r, i):
    return b"\x00\x00"


_coloured = [encode_properties(BasicProperties(headers={"colour": c})) for c in ("red", "green")]


def coloured(r, i):
    return _coloured[i % 2]


def distinct(r, i):
    return encode_properties(BasicProperties(headers={"colour": ("red", "green")[i % 2], "n": r * 200 + i}))


label = "new" if NEW else "old"
print(f"{label}: unfiltered consumer: {run({}, plain):.2f} us/message (publish + deliver + ack)")
print(f"{label}: unfiltered consumer, messages with headers: {run({}, coloured):.2f} us/message")
if NEW:
    sel = {FILTER_ARGUMENT: [["selector", "colour = 'red'"]]}
    print(f"{label}: selector consumer (half match, half left queued): {run(sel, coloured):.2f} us/message")
    print(f"{label}: selector consumer, every message its own properties: {run(sel, distinct):.2f} us/message")
    for n in (10_000, 100_000):
        print(f"{label}: filtered consumer arriving on {n} non-matching 0-9-1 messages: {deep(n):.1f} ms "
              "in one apply")
        print(f"{label}: filtered consumer arriving on {n} non-matching 1.0 messages: {deep(n, True):.1f} ms "
              "in one apply")
