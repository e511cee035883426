"""Stage hooks on a running ``ClusterLog`` for the round-trip tracer (``raftmq/trace.py``, issue 30).

Installed only when ``trace_stages`` is on, by wrapping attributes of the live objects (the log,
its replica, pysyncobj's transport, the journal, the state machine): with tracing off nothing here
runs and the path is byte for byte the untraced code, which is the only way to be sure the tracer
costs nothing then.  Each wrapper records one event and calls what it wraps, unchanged.

What is recorded where (``who``, ``a``, ``b``, ``c`` of each event, see ``raftmq/trace.py``):

* loop: ``submit`` / ``propose`` (origin, seq) -- ``ClusterLog.submit`` and ``_propose``; the
  ``rx`` of the batch's first command (stamped by ``Tracer.on_rx`` on the client socket) goes out
  with them.  ``apply`` / ``applied`` (origin, seq, index) around ``StateMachine.apply``;
  ``outputs`` / ``written`` around the outputs callback (bodies filled before it; the front ends
  write to their sockets inside it).
* tick thread: ``forward`` / ``cmd_recv`` (origin, seq) for ``apply_command`` sent or received;
  ``ae_send`` / ``ae_recv`` (peer, first index, last index, commit index); ``ack_send`` /
  ``ack_recv`` (peer, index acknowledged); ``append`` (origin, seq, index) as the journal gets an
  entry; ``flushed`` (index, ns spent writing and syncing) after each fdatasync; ``commit``
  (index) as the commit index rises; ``handoff`` (origin, seq, index) as a committed entry goes
  to the loop.

Sends are stamped as they are handed to the transport (stamped after, the peer's receipt could come
first: it runs on another core), a follower's acknowledgement after its flush barrier (the barrier's
flush is done by the hook, first; the barrier then finds nothing to flush); receipts as pysyncobj
is handed the decoded message.  ``written`` is the start of the first connection write among a
batch's outputs (``Tracer.on_flush``, installed on each client connection): stamped after the
outputs, the client could read the delivery first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftmq.trace import (
    ACK_RECV,
    ACK_SEND,
    AE_RECV,
    AE_SEND,
    APPEND,
    APPLIED,
    APPLY,
    CMD_RECV,
    COMMIT,
    FLUSHED,
    FORWARD,
    HANDOFF,
    OUTPUTS,
    PROPOSE,
    RX,
    SUBMIT,
    WRITTEN,
    Tracer,
)

from .replica import _BATCH_HEAD, BATCH_COMMAND, ENTRY

if TYPE_CHECKING:
    from pysyncobj.node import TCPNode

    from .cluster import ClusterLog
    from .journal import AppendJournal
    from .log import Applied, Command
    from .replica import Replica


def batch_key(command: bytes | memoryview | None) -> tuple[str, int] | None:
    """(origin, seq) of a batch command as pysyncobj carries it, None for its own commands."""
    if not command or command[0] != BATCH_COMMAND:
        return None
    _, _, seq, length = _BATCH_HEAD.unpack_from(command)
    start = _BATCH_HEAD.size
    return bytes(command[start:start + length]).decode(), seq


def install(log: ClusterLog, tracer: Tracer) -> None:
    """Hook ``tracer`` into a started ``log`` (its replica exists)."""
    replica = log.replica
    if replica is None:
        raise RuntimeError("the stage tracer hooks into a started log (it has no replica yet)")
    tracer.address = log._address
    tracer.origin = log.origin
    _hook_loop(log, tracer)
    _hook_transport(replica, tracer)
    _hook_journal(replica.journal, tracer)
    sink = replica._sink

    def traced_sink(item: tuple) -> None:
        if item[0] == ENTRY:
            tracer.add(HANDOFF, item[3], item[4], item[1])
        sink(item)

    replica._sink = traced_sink


def _hook_loop(log: ClusterLog, tracer: Tracer) -> None:
    clock = tracer.clock
    submit, propose, machine = log.submit, log._propose, log.machine
    apply, on_outputs = machine.apply, log._on_outputs

    def traced_submit(command: Command, deferrable: bool = False, size: int = 0) -> None:
        if not log._pending:  # the first command of the next batch
            tracer.batch_rx, tracer.last_rx = tracer.last_rx, 0
            tracer.batch_submit = clock()
        submit(command, deferrable, size)

    def traced_propose(seq: int, now_us: int, blob: bytes) -> None:
        origin = log.origin
        if tracer.batch_submit:
            if tracer.batch_rx:
                tracer.add(RX, origin, seq, ts=tracer.batch_rx)
            tracer.add(SUBMIT, origin, seq, ts=tracer.batch_submit)
            tracer.batch_rx = tracer.batch_submit = 0
        tracer.add(PROPOSE, origin, seq)
        propose(seq, now_us, blob)

    def traced_apply(now: int, commands: list, index: int | None = None, batch_id: tuple[str, int] | None = None,
                     replies: bool = True) -> Applied:
        origin, seq = batch_id or ("", 0)
        tracer.add(APPLY, origin, seq, index or 0)
        effects = apply(now, commands, index, batch_id, replies=replies)
        tracer.add(APPLIED, origin, seq, index or 0)
        tracer.current = (origin, seq, index or 0)
        return effects

    def traced_outputs(outputs: list) -> None:
        origin, seq, index = tracer.current
        tracer.add(OUTPUTS, origin, seq, index)
        tracer.flushing = 0
        on_outputs(outputs)
        if tracer.flushing:  # (outputs for other nodes' connections only: none written here)
            tracer.add(WRITTEN, origin, seq, index, ts=tracer.flushing)

    # Instance attributes shadowing the methods, on purpose (module docstring: the untraced path
    # stays the untraced code); the checker forbids assigning to a method, which is what a hook is.
    log.submit = traced_submit  # type: ignore[method-assign]
    log._propose = traced_propose  # type: ignore[method-assign]
    machine.apply = traced_apply  # type: ignore[method-assign]
    log._on_outputs = traced_outputs


def _entries_span(message: dict) -> tuple[int, int]:
    entries = message.get("entries")
    if not entries:
        return 0, 0
    return entries[0][1], entries[-1][1]


def _hook_transport(replica: Replica, tracer: Tracer) -> None:
    transport = replica._SyncObj__transport
    send = transport.send
    received = transport._onMessageReceivedCallback
    journal = replica.journal

    def traced_send(node: TCPNode, message: object) -> bool:
        if not isinstance(message, dict):
            return send(node, message)
        kind = message.get("type")
        if kind == "append_entries":
            first, last = _entries_span(message)
            tracer.add(AE_SEND, node.address, first, last, message.get("commit_index", 0))
        elif kind == "next_node_idx":
            if journal.dirty:
                journal.flush()  # the send barrier's own flush (Replica), done first so that it is stamped first
            if message.get("success"):
                tracer.add(ACK_SEND, node.address, message["next_node_idx"] - 1)
        elif kind == "apply_command":
            key = batch_key(message.get("command"))
            if key is not None:
                tracer.add(FORWARD, key[0], key[1])
        return send(node, message)

    def traced_received(node: TCPNode, message: object) -> None:
        if not isinstance(message, dict):
            received(node, message)
            return
        kind = message.get("type")
        if kind == "append_entries":
            first, last = _entries_span(message)
            tracer.add(AE_RECV, node.address, first, last, message.get("commit_index", 0))
        elif kind == "next_node_idx":
            if message.get("success"):
                tracer.add(ACK_RECV, node.address, message["next_node_idx"] - 1)
        elif kind == "apply_command":
            key = batch_key(message.get("command"))
            if key is not None:
                tracer.add(CMD_RECV, key[0], key[1])
        received(node, message)

    transport.send = traced_send
    transport.setOnMessageReceivedCallback(traced_received)


def _hook_journal(journal: AppendJournal, tracer: Tracer) -> None:
    add, flush, set_commit = journal.add, journal.flush, journal.setRaftCommitIndex
    committed = [journal.getRaftCommitIndex()]

    def traced_add(command: bytes, idx: int, term: int) -> None:
        add(command, idx, term)
        key = batch_key(command)
        if key is not None:
            tracer.add(APPEND, key[0], key[1], idx)

    def traced_flush() -> None:
        if not journal.dirty:
            flush()
            return
        start = tracer.clock()
        flush()
        end = tracer.clock()
        if journal._entries:
            tracer.add(FLUSHED, "", journal._entries[-1][1], end - start, ts=end)

    def traced_set_commit(raftCommitIndex: int) -> None:  # noqa: N803 (the name of what it wraps)
        set_commit(raftCommitIndex)
        if raftCommitIndex > committed[0]:
            committed[0] = raftCommitIndex
            tracer.add(COMMIT, "", raftCommitIndex)

    # (instance attributes shadowing the methods, on purpose: see _hook_loop)
    journal.add = traced_add  # type: ignore[method-assign]
    journal.flush = traced_flush  # type: ignore[method-assign]
    journal.setRaftCommitIndex = traced_set_commit  # type: ignore[method-assign]
