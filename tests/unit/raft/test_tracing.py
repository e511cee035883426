"""The tracer's hooks on a real ClusterLog (raft/tracing.py, issue 30): one member, real pysyncobj,
real journal; the cluster test (tests/cluster/test_trace_stages.py) covers the messages between
members.

Checked: with the hooks installed a batch leaves its stages in order under its (origin, seq) and
Raft index, and the log still commits and applies it; without them (the default) nothing of the
tracer is on the path.
"""

from __future__ import annotations

import asyncio
import time

from raftmq.ops.local.node import free_port
from raftmq.raft.cluster import ClusterLog
from raftmq.raft.replica import _BATCH_HEAD, BATCH_COMMAND
from raftmq.raft.tracing import batch_key, install
from raftmq.store.applier import Applier
from raftmq.store.core.commands import QueueDeclare, VhostAdd
from raftmq.store.core.machine import StateMachine
from raftmq.trace import (
    APPEND,
    APPLIED,
    APPLY,
    COMMIT,
    FLUSHED,
    HANDOFF,
    OUTPUTS,
    PROPOSE,
    RX,
    SUBMIT,
    Tracer,
)


def run_until(loop: asyncio.AbstractEventLoop, predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        loop.run_until_complete(asyncio.sleep(0.01))


def declare(token: int) -> QueueDeclare:
    return QueueDeclare("n1.boot.1", token, 1, "/", f"q{token}", False, True, False, False, {})


def test_batch_key_reads_the_batch_header_and_ignores_pysyncobj_commands():
    origin = b"n3.abc"
    command = _BATCH_HEAD.pack(BATCH_COMMAND, 123, 77, len(origin)) + origin + b"blob"
    assert batch_key(command) == ("n3.abc", 77)
    assert batch_key(memoryview(command)) == ("n3.abc", 77)
    assert batch_key(b"\x01") is None and batch_key(b"") is None


def test_a_traced_single_member_log_records_every_local_stage_in_order(tmp_path):
    loop = asyncio.new_event_loop()
    outputs: list = []
    log = ClusterLog(Applier(StateMachine()), outputs.extend, origin="n1.boot", self_address=f"127.0.0.1:{free_port()}",
                     partners=[], data_dir=str(tmp_path / "raft"), secret="s", use_fork=False)
    try:
        log.start(loop)
        run_until(loop, lambda: log.is_leader)
        tracer = Tracer("n1")
        install(log, tracer)
        tracer.last_rx = tracer.clock()  # as Tracer.on_rx does for a client socket read
        log.submit(VhostAdd(None, None, "/"))
        log.submit(declare(1))
        run_until(loop, lambda: any(o[0] == "n1.boot.1" for o in outputs))
        events = list(tracer.events)
        stages = [e[1] for e in events if e[2] in ("", "n1.boot")]
        for stage in (RX, SUBMIT, PROPOSE, APPEND, FLUSHED, COMMIT, HANDOFF, APPLY, APPLIED, OUTPUTS):
            assert stage in stages, stage
        # The declaring batch, by its (origin, seq): in chain order on one clock.
        seq = next(e[3] for e in events if e[1] == PROPOSE)
        first = {}
        for e in events:
            if e[2] == "n1.boot" and e[3] == seq:
                first.setdefault(e[1], e)
        order = [RX, SUBMIT, PROPOSE, APPEND, HANDOFF, APPLY, APPLIED, OUTPUTS]
        assert [first[s][0] for s in order] == sorted(first[s][0] for s in order)
        index = first[APPEND][4]
        assert index and first[HANDOFF][4] == first[APPLY][4] == index
        flushed = next(e for e in events if e[1] == FLUSHED and e[3] >= index)
        committed = next(e for e in events if e[1] == COMMIT and e[3] >= index)
        assert first[APPEND][0] <= flushed[0] <= committed[0] <= first[HANDOFF][0]
        assert flushed[4] > 0  # the time the write and fdatasync took
        assert log.machine.applied_index >= index
    finally:
        log.close()
        loop.close()


def test_tracing_off_installs_nothing(tmp_path):
    """The default: the log's, journal's and transport's methods are the classes' own."""
    loop = asyncio.new_event_loop()
    log = ClusterLog(Applier(StateMachine()), lambda outputs: None, origin="n1.boot",
                     self_address=f"127.0.0.1:{free_port()}", partners=[], data_dir=str(tmp_path / "raft"),
                     secret="s", use_fork=False)
    try:
        log.start(loop)
        for obj, name in ((log, "submit"), (log, "_propose"), (log, "_on_outputs"), (log.machine, "apply"),
                          (log.replica.journal, "add"), (log.replica.journal, "flush")):
            assert name not in vars(obj) or name == "_on_outputs", (obj, name)
        assert log._on_outputs.__name__ == "<lambda>"
    finally:
        log.close()
        loop.close()
