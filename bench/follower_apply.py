"""A follower's CPU per replicated publish: decode a batch from the log and apply it without replies.

In process, no sockets and no Raft: 200 persistent 256 B publishes into one durable queue per batch,
decoded by ``store.commands.decode_batch`` and applied with ``replies=False`` (what every follower
does with every entry).  Runs against any checkout (old code built commands as lists, new as typed
commands), so old and new can be compared side by side::

    for w in /tmp/old .; do (cd $w && .venv/bin/python bench/follower_apply.py); done
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
m.apply(1, [cmd(C.Op.VHOST_ADD, None, None, "/"), cmd(C.Op.CHANNEL_OPEN, "c", 1, 1),
            cmd(C.Op.QUEUE_DECLARE, "c", 2, 1, "/", "q", False, True, False, False, {})])
props = b"\x10\x00\x02"  # delivery mode 2
batch = [cmd(C.Op.PUBLISH, "c", 10 + i, 1, "/", "", "q", False, props, b"x" * 256, True, 0, None) for i in range(200)]
blob = C.encode_batch(batch)
times = []
for r in range(60):
    t0 = time.process_time()
    for _ in range(10):
        m.apply(2 + r, C.decode_batch(blob), replies=False)
    times.append((time.process_time() - t0) / 2000 * 1e6)
    m.vhosts["/"].queues["q"].ready.take_all()
print(f"{'new' if new else 'old'}: follower decode+apply {statistics.median(times):.2f} us/publish (best {min(times):.2f})")
