"""A follower's CPU per replicated publish: decode a batch from the log and apply it without replies.

In process, no sockets and no Raft: 200 persistent 256 B publishes into one durable queue per batch,
decoded by ``store.core.commands.decode_batch`` and applied with ``replies=False`` (what every follower
does with every entry).  Runs against any checkout (old code built commands as lists, new as typed
commands), so old and new can be compared side by side::

    for w in /tmp/old .; do (cd $w && .venv/bin/python bench/follower_apply.py); done

A second figure, "with effects", adds what a cluster node does with every entry after apply: the
bodies put into the node's bodies (a dict here) and the outputs' bodies filled -- through
``store/applier.py`` where it exists (issue 33), else the steps ``ClusterLog._drain`` took itself.
"""
import statistics
import time

from raftmq.store.core import commands as C
from raftmq.store.core.machine import StateMachine

try:
    import raftmq.node.core.formats  # noqa
except ImportError:
    pass
new = hasattr(C, "Publish")
def cmd(op, *f):
    return C.make(op, *f) if new else [op, *f]
m = StateMachine(None)
setup = (1, [cmd(C.Op.VHOST_ADD, None, None, "/"), cmd(C.Op.CHANNEL_OPEN, "c", 1, 1),
            cmd(C.Op.QUEUE_DECLARE, "c", 2, 1, "/", "q", False, True, False, False, {})])
m.apply(*setup)
props = b"\x10\x00\x02"  # delivery mode 2
batch = [cmd(C.Op.PUBLISH, "c", 10 + i, 1, "/", "", "q", False, props, b"x" * 256, True, 0, None) for i in range(200)]
blob = C.encode_batch(batch)


def measure(apply_entry, machine) -> list[float]:
    times = []
    for r in range(60):
        t0 = time.process_time()
        for i in range(10):
            apply_entry(2 + r, 10 * r + i)
        times.append((time.process_time() - t0) / 2000 * 1e6)
        machine.vhosts["/"].queues["q"].ready.take_all()
    return times


times = measure(lambda now, _i: m.apply(now, C.decode_batch(blob), replies=False), m)
label = "new" if new else "old"
print(f"{label}: follower decode+apply {statistics.median(times):.2f} us/publish (best {min(times):.2f})")

try:  # issue 33: the applier carries the effects out
    from raftmq.store.applier import Applier

    m2 = StateMachine()
    m2.apply(*setup)
    applier = Applier(m2)

    def with_effects(now: int, seq: int) -> None:
        applier.release(applier.apply_entry(seq, now, "n1.x", seq, blob, False))
except ImportError:  # before: ClusterLog._drain's own steps
    from raftmq.store.disk.bodies import DictBodies, consumer_holds, fill_bodies, upcoming_ids

    m2 = StateMachine(None)
    m2.apply(*setup)
    bodies, upcoming, holds = DictBodies(), upcoming_ids(m2), consumer_holds(m2)

    def with_effects(now: int, seq: int) -> None:
        effects = m2.apply(now, C.decode_batch(blob), seq, ("n1.x", seq), replies=False)
        bodies.put(effects.body_puts)
        if effects.outputs:
            fill_bodies(effects.outputs, bodies, upcoming, None, holds)
        bodies.drop(effects.body_deletes)

times = measure(with_effects, m2)
print(f"{label}: follower decode+apply with effects {statistics.median(times):.2f} us/publish "
      f"(best {min(times):.2f})")
