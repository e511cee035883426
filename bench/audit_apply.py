"""The audit history's cost per message with ``audit_retention = "metadata"``, in process (issue 36).

A state machine applies batches as a follower does (decoded from the log's encoding, no replies)
and hands each batch's events to a real ``EventStore`` writing LMDB in its own thread: 200
publishes by one connection into a queue with a consumer (published, routed, delivered: three
events each), then one ack batch (acked).  Printed per message: the applying thread's CPU
(``time.thread_time``: apply plus handing the events over, the part that delays the broker), the
whole process's CPU until the writer has written everything (apply + writer thread), and the
history's bytes per event.  Uses only APIs both sides of issue 36 have, so old and new run side
by side::

    for w in /work/main /work/wt-audit1; do (cd $w && .venv/bin/python /work/wt-audit1/bench/audit_apply.py); done
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from raftmq.store.applier import StoredMachine
from raftmq.store.core import commands as C
from raftmq.store.disk.event_writer import EventStore

try:
    import raftmq.node.core.formats  # noqa: F401  (property codecs, as the node loads them)
except ImportError:
    pass

BATCH = 200
CONN = "n1.18c0ffee1234.17"  # a connection id as the node makes them (node id, boot stamp, number)


def run(rounds: int) -> tuple[float, float, float, int]:
    with tempfile.TemporaryDirectory(prefix="audit-apply-") as tmp:
        store = EventStore(os.path.join(tmp, "events"), "metadata")
        m = StoredMachine()
        m.event_sink = store.append
        now = 1_000_000
        m.apply_batch(now, [C.VhostAdd(None, None, "/"), C.ChannelOpen(CONN, None, 1),
                            C.QueueDeclare(CONN, None, 1, "/", "q", False, True, False, False, {}),
                            C.Qos(CONN, None, 1, 0, False),
                            C.Consume(CONN, None, 1, "/", "q", "ctag", False, False, {})], 1)
        props = b"\x10\x00\x02"
        publishes = C.encode_batch([C.Publish(CONN, None, 1, "/", "", "q", False, props, b"x" * 256, True, 0, None)
                                    for _ in range(BATCH)])
        store.flush()
        thread_us, process_us = [], []
        index, tag = 1, 0
        for _r in range(rounds):
            p0, t0 = time.process_time(), time.thread_time()
            now += 1000
            index += 1
            m.apply_batch(now, C.decode_batch(publishes), index, replies=False)
            refs = [[1, tag + i + 1] for i in range(BATCH)]
            tag += BATCH
            now += 1000
            index += 1
            m.apply_batch(now, C.decode_batch(C.encode_batch([C.Ack(CONN, None, 1, refs)])), index, replies=False)
            thread_us.append((time.thread_time() - t0) / BATCH * 1e6)
            store.flush()
            process_us.append((time.process_time() - p0) / BATCH * 1e6)
        info = store.info()
        per_event = store.live_bytes() / max(1, info.events)
        events = info.events
        store.close()
    return statistics.median(thread_us), statistics.median(process_us), per_event, events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    label = "new" if hasattr(C, "AuditNote") else "old"
    for _ in range(args.repeat):
        apply_us, total_us, per_event, events = run(args.rounds)
        print(f"{label}: apply thread {apply_us:.2f} us/msg, process incl. writer {total_us:.2f} us/msg, "
              f"history {per_event:.1f} B/event ({events} events)", flush=True)


if __name__ == "__main__":
    main()
