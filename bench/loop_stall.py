"""raft_in_loop (raft/loop_tick.py): what a stall of the leader's event loop does to its leadership.

With pysyncobj ticking in the event loop, anything that holds the loop (a long apply, a snapshot's
checkpoint, a body repair waiting on another member, a slow fsync) also holds the leader's
heartbeats.  Three Replicas, each in its own thread with its own asyncio loop (one process, real
loopback TCP, the default election timeout 0.25-0.5 s); the leader's loop is blocked with
``time.sleep(S)`` (which releases the GIL, so the others run on) for each S given, three times
each, and the leader, the term and the pre-vote rounds are printed after each stall.  Bounded: 20 s
to elect, then (S + 3 s) per trial.  Usage::

    .venv/bin/python bench/loop_stall.py 0.1 0.2 0.3 0.6 1.2
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time

from raftmq.ops.local.node import free_port
from raftmq.raft.replica import Replica
from raftmq.store.core.machine import StateMachine  # noqa: F401 (imported before the snapshot module, as the node does)


def main() -> None:
    stalls = [float(x) for x in sys.argv[1:]] or [0.1, 0.3]
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    tmp = tempfile.mkdtemp(prefix="loop-stall-")
    loops: list[asyncio.AbstractEventLoop | None] = [None] * 3
    replicas: list[Replica | None] = [None] * 3

    def run(i: int) -> None:
        loop = loops[i] = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        replicas[i] = Replica(addresses[i], [a for a in addresses if a != addresses[i]], f"{tmp}/n{i}", "secret",
                              sink=lambda _item: None, loop=loop)
        loop.run_forever()

    for i in range(3):
        threading.Thread(target=run, args=(i,), daemon=True).start()

    def leader() -> int | None:
        leading = [i for i, r in enumerate(replicas) if r is not None and r.is_leader]
        return leading[0] if len(leading) == 1 else None

    deadline = time.monotonic() + 20
    while leader() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if leader() is None:
        raise SystemExit("no leader within 20 s")
    for stall in stalls:
        for _ in range(3):
            time.sleep(1.5)
            current = leader()
            if current is None:
                continue
            term = replicas[current].raftCurrentTerm
            loops[current].call_soon_threadsafe(time.sleep, stall)
            time.sleep(stall + 1.5)
            print(f"stall {stall:.2f} s on leader n{current}: leader after n{leader()}, term {term} -> "
                  f"{max(r.raftCurrentTerm for r in replicas)}, pre-vote rounds {[r.prevote_rounds for r in replicas]}",
                  flush=True)


if __name__ == "__main__":
    main()
