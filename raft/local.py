"""The single-node log: group commit into the state machine, replies released after fsync.

This is the same contract the Raft log offers (``submit(command)``; outputs handed to a callback in
log order), for a cluster of one. Commands submitted during one event-loop iteration become one
batch: every connection's data received in that iteration is applied in one LMDB transaction, with
no timer added to anyone's latency (group commit). A batch that promised durability (a confirm, a
durable declare) has its outputs held back until an fsync that covers it completes; later batches
wait behind it so that every connection sees its outputs in log order. The fsync runs in a worker
thread while the loop keeps applying new batches, and one fsync covers every batch committed
before it started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from .log import (
    Applied,
    Command,
    Compaction,
    MachineHost,
    NotReplicated,
    OutputsCallback,
    RaftStatus,
    StorageFailed,
)

log = logging.getLogger(__name__)


class LocalLog:
    """The log of a cluster of one (implements ``raft.log.Log``)."""

    def __init__(self, machine: MachineHost, on_outputs: OutputsCallback,
                 clock: Callable[[], int] = time.time_ns) -> None:
        # The state machine and its storage (store/applier.py): it applies a batch and carries
        # its effects out; this log decides when the outputs may go.
        self.machine = machine
        self._on_outputs = on_outputs
        self._clock = clock
        self._pending: list[Command] = []
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch_no = 0
        self._synced_upto = 0
        self._sync_wanted_upto = 0
        self._syncing = False
        self._held: deque[tuple[int, Applied]] = deque()  # (fsync needed, the batch)
        self.batches_applied = 0
        # Called with a reason just before the node stops because its disk failed (_fail_stop).
        self.on_fatal: Callable[[str], None] | None = None
        self.commands_applied = 0
        self.on_throttle: Callable[[bool], None] | None = None  # never called: nothing queues up here

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def close(self) -> None:
        self.machine.close()

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def leader(self) -> str | None:
        return None

    @property
    def ready(self) -> bool:
        return True

    def raft_status(self) -> RaftStatus | None:
        return None

    def compact(self, timeout: float = 60.0) -> Compaction:
        raise NotReplicated("a single node keeps no Raft log: its state is in LMDB (raftmq snapshot copies it)")

    @property
    def backlog(self) -> int:
        """Batches applied but not yet released (waiting for an fsync)."""
        return len(self._held)

    @property
    def idle(self) -> bool:
        """Nothing submitted is waiting to be applied or released."""
        return not self._pending and not self._held and not self._syncing

    def submit(self, command: Command, deferrable: bool = False, size: int = 0) -> None:
        """Queue ``command`` for the next batch (``deferrable`` and ``size`` matter only in a cluster)."""
        self._pending.append(command)
        if not self._scheduled:
            self._scheduled = True
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        if not batch:
            return
        now_us = self._clock() // 1000
        try:
            applied = self.machine.apply(now_us, batch)
        except StorageFailed as exc:
            self._fail_stop("the LMDB commit of a batch failed", exc)
        self.batches_applied += 1
        self.commands_applied += applied.commands
        self._batch_no += 1
        needs = self._batch_no if applied.sync_needed else 0
        if needs:
            self._sync_wanted_upto = self._batch_no
        if not self._held and needs == 0:
            if applied.outputs:
                self._on_outputs(applied.outputs)
            self.machine.release(applied)
            return
        self._held.append((needs, applied))
        self._start_sync()
        self._release()

    def _fail_stop(self, what: str, exc: BaseException) -> None:
        """The disk refused a write (full, EIO): stop the node loudly rather than diverge.

        The batch was applied to the in-memory model but not to LMDB, and apply cannot be undone,
        so memory and disk now disagree; carrying on would answer clients from a state a restart
        does not have. Its outputs (and those of every batch still waiting for an fsync) are never
        released, so nothing is confirmed that is not on disk; ``on_fatal`` closes every client
        connection (541) so that no publisher waits for an answer, and the process exits with 70.
        A restart rebuilds the model from LMDB, which holds exactly what was confirmed and more.
        """
        log.critical("%s: %r; stopping the node (the state on disk is what a restart serves)", what, exc)
        self._held.clear()
        self._pending.clear()
        if self.on_fatal is not None:
            try:
                self.on_fatal(f"{what}: {exc}")
            except Exception:
                log.exception("closing client connections before stopping failed")
        raise SystemExit(70)

    def _release(self) -> None:
        while self._held and self._held[0][0] <= self._synced_upto:
            _, applied = self._held.popleft()
            if applied.outputs:
                self._on_outputs(applied.outputs)
            self.machine.release(applied)

    def _start_sync(self) -> None:
        if self._syncing or self._sync_wanted_upto <= self._synced_upto or not self.machine.syncs:
            if not self.machine.syncs:
                self._synced_upto = self._sync_wanted_upto
            return
        self._syncing = True
        target = self._batch_no
        loop = self._loop
        if loop is None:  # (set by start() or the first submit, before any batch: never here)
            loop = self._loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self.machine.sync)
        future.add_done_callback(lambda f: self._sync_done(f, target))

    def _sync_done(self, future: asyncio.Future, target: int) -> None:
        self._syncing = False
        exc = future.exception()
        if exc is not None:
            self._fail_stop("fsync of the LMDB environment failed", exc)
        self._synced_upto = max(self._synced_upto, target)
        self._release()
        self._start_sync()
