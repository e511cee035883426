"""Committed entries reach the sink no faster than it applies them (``APPLY_AHEAD`` at most waiting).

pysyncobj handed every committed entry over in one tick: a node restarting on a long journal held
all of it in memory at once.  Real pysyncobj, a real journal, a single node restarting on it.
"""

from __future__ import annotations

import time

from raftmq.ops.local.node import free_port
from raftmq.raft.journal import AppendJournal
from raftmq.raft.replica import _BATCH_HEAD, APPLY_AHEAD, BATCH_COMMAND, ENTRY, Replica

ENTRIES = 3 * APPLY_AHEAD + 10


def batch(seq: int) -> bytes:
    origin = b"n1"
    return _BATCH_HEAD.pack(BATCH_COMMAND, 0, seq, len(origin)) + origin + b"blob-%d" % seq


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_restart_hands_the_journal_over_as_the_sink_applies_it(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    journal = AppendJournal(str(tmp_path / "raft" / "journal"))
    journal.add(b"\x01", 1, 1)  # pysyncobj's first no-op
    for index in range(2, ENTRIES + 2):
        journal.add(batch(index), index, 1)
    journal.setRaftCommitIndex(ENTRIES + 1)
    journal.setCurrentTerm(1, None)
    journal.flush()
    journal._destroy()

    items: list[tuple] = []
    applied = [0]  # how many of items the "loop" has applied
    replica = Replica(address, [], str(tmp_path / "raft"), "secret", sink=items.append,
                      sink_backlog=lambda: len(items) - applied[0])
    try:
        wait_until(lambda: len(items) >= APPLY_AHEAD)
        time.sleep(0.3)  # many ticks: none may hand over more while nothing is applied
        assert len(items) == APPLY_AHEAD
        while len(items) < ENTRIES:
            applied[0] = len(items)
            seen = len(items)
            wait_until(lambda: len(items) > seen)  # noqa: B023 - read at once
            assert len(items) - applied[0] <= APPLY_AHEAD
        applied[0] = len(items)
        entries = [item for item in items if item[0] == ENTRY]
        assert [item[1] for item in entries] == list(range(2, ENTRIES + 2))  # in order, each once
        assert [bytes(item[5]) for item in entries[:2]] == [b"blob-2", b"blob-3"]
    finally:
        replica.destroy_synchronous()
