"""Apply cost per publish when every publish is delivered: the outputs' hot path (issue 33).

In process, no sockets, no Raft, no store: a queue with one consumer (prefetch 0, so it always has
room), and batches of 200 publishes with confirm tokens followed by one ack of the 200 deliveries.
Each batch is decoded from its log encoding (``decode_batch``), applied, and its outputs given
their bodies (``fill_bodies``, what the node does before the front ends see them).  Two figures,
µs per publish (median of rounds, CPU time):

- ``leader``: ``replies=True`` -- a confirm (``OUT_REPLY``) and a delivery (``OUT_DELIVER``) per
  publish, bodies filled in;
- ``follower``: ``replies=False`` -- the delivery outputs only (every node applies every delivery),
  with ``local`` saying none of the connections is this node's (so no body is read).

Runs against any checkout after the store split (store/core/), to compare old and new in
alternating rounds::

    for i in 1 2 3; do for w in /work/main .; do (cd $w && .venv/bin/python bench/apply_deliver.py); done; done
"""

from __future__ import annotations

import argparse
import statistics
import time

from raftmq.store.core.commands import (
    Ack,
    ChannelOpen,
    Consume,
    Publish,
    QueueDeclare,
    VhostAdd,
    decode_batch,
    encode_batch,
)
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.bodies import DictBodies, fill_bodies

NOW = 1_700_000_000_000_000
CONN = "n1.boot.1"
BATCH = 200


def machine() -> StateMachine:
    m = StateMachine()
    m.apply(NOW, [VhostAdd(None, None, "/"), ChannelOpen(CONN, None, 1),
                  QueueDeclare(CONN, None, 1, "/", "q", False, True, False, False, {}),
                  Consume(CONN, 1, 1, "/", "q", "ctag", False, False, {})])
    return m


def one_round(m: StateMachine, bodies: DictBodies, blobs: list[bytes], leader: bool) -> float:
    """CPU µs per publish over ``blobs`` (each a batch of publishes and the ack of the previous)."""
    local = None if leader else (lambda conn: False)
    started = time.process_time()
    for i, blob in enumerate(blobs):
        effects = m.apply(NOW + i, decode_batch(blob), replies=leader)
        bodies.put(effects.body_puts)
        fill_bodies(effects.outputs, bodies, local=local)
        bodies.drop(effects.body_deletes)
    return (time.process_time() - started) / (len(blobs) * BATCH) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batches", type=int, default=25, help="batches of 200 publishes per round")
    args = parser.parse_args()
    props = b"\x10\x00\x02"  # delivery mode 2
    figures = {}
    for mode in ("leader", "follower"):
        m, bodies = machine(), DictBodies()
        ch = m.channels[CONN][1]
        times = []
        for r in range(args.rounds):
            blobs = []
            for b in range(args.batches):
                base = (r * args.batches + b) * BATCH
                batch: list = [Publish(CONN, base + i, 1, "/", "", "q", False, props, b"x" * 256, True, 0, None)
                               for i in range(BATCH)]
                blobs.append(encode_batch(batch))
            times.append(one_round(m, bodies, blobs, mode == "leader"))
            # Ack what this round delivered (not measured): the next round starts from an empty channel.
            refs = [list(key) for key in ch.unacked]
            m.apply(NOW, [Ack(CONN, None, 1, refs)], replies=False)
            assert not ch.unacked and len(m.vhosts["/"].queues["q"].ready) == 0
        figures[mode] = (statistics.median(times), min(times))
    print("apply+fill_bodies, µs/publish (each delivered):  "
          + "  ".join(f"{mode} {med:.2f} (best {best:.2f})" for mode, (med, best) in figures.items()))


if __name__ == "__main__":
    main()
