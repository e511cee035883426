"""The replicated log: the same contract as ``LocalLog`` (``submit``; outputs in log order), over Raft.

Commands submitted during one event-loop iteration become one batch, proposed as one Raft entry
(group commit: one pysyncobj command carries every connection's operations of that iteration).
While a batch is in flight (proposed, not yet applied), new commands accumulate into the next one,
which is proposed when the batch in flight is applied -- or at once if it already carries
``pipeline_min_bytes``, up to ``max_in_flight`` batches.  Every batch has a fixed cost on all three
nodes, whatever it carries: about ten Raft messages, an fsync per node, and a wake-up of every
node's two threads.  On a machine shared with clients that cost is CPU taken from them: with
publisher confirms (window 1,000) and every small batch pipelined (10 commands a batch, 8 in
flight), the client spent 12-16 % of its time waiting for a CPU against 6-8 % with RabbitMQ.
Pipelining only batches worth it halved the batches and raised confirmed publishes by ~8 %;
a flood of publishes still fills batches fast enough to keep several in flight.

A small batch that carries a command someone waits for (not deferrable) is proposed at once while
fewer than ``urgent_in_flight`` (2) batches are in flight: the lone client of issue 30 otherwise
waited a whole commit behind a batch it had no part in (a consumer's settlement, another client's
publish).  A flood of such commands is still grouped: beyond two in flight they wait as before.

A command submitted as *deferrable* (a consumer's acks while its node still holds read-ahead for
it; a publish from a publisher that already has several unconfirmed: nobody waits for it alone)
may wait up to ``defer_seconds`` for company when nothing else is pending, unless the pending
commands already carry ``pipeline_min_bytes``; any other command ends the wait at once, so the
order of commands never changes.  Consuming through a follower, that cut the batches by a third
(630 -> 420 per 100k messages); publishing with confirms (aio-pika, window 1,000) it halved them
(~1,050 -> ~620 per 20k messages) and the client, preempted less, confirmed ~14 % more.

Committed entries arrive from pysyncobj's tick thread and are applied here, in the asyncio loop, in
log order; the loop is the only thread that touches the state machine.  The tick thread queues them
and wakes the loop once, at the end of its tick (``_wake``): woken at the first entry, the loop took
the GIL from the tick thread in the middle of the tick, while the leader still had the AppendEntries
carrying the commit index to send.  Outputs go to the broker as
soon as the entry is applied: commit in Raft means a majority has it fsynced (see ``replica.py``), so
a confirm sent now survives the loss of any minority of nodes.

Every batch carries (origin, sequence).  pysyncobj may report an error for an entry that did commit
(leader change, timeouts), so a batch whose application this node has not seen after an error, a
leader change or ``retry_after`` seconds is proposed again with the same id; the state machine
applies an id once.  A follower forwards its batches to the leader without asking for pysyncobj's
per-command reply (see ``_propose``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import NoReturn

from raftmq.integrity import SnapshotDamaged
from raftmq.versions import EXIT_FORMAT_TOO_NEW, FormatTooNew

from . import peer_requests
from .log import Command, Compaction, MachineHost, OutputsCallback, RaftStatus
from .replica import ENTRY, INSTALL, SNAPSHOT, Replica, raft_clock
from .snapshot_child import fork_snapshot

log = logging.getLogger(__name__)


def stop_for_newer_format(where: str, exc: FormatTooNew) -> NoReturn:
    """Applying past what this node cannot read would make it diverge from the others: stop loudly."""
    log.critical("stopping: %s: %s", where, exc)
    raise SystemExit(EXIT_FORMAT_TOO_NEW) from exc


class ClusterLog:
    """The Raft log (implements ``raft.log.Log``)."""

    def __init__(self, machine: MachineHost, on_outputs: OutputsCallback, *, origin: str,
                 self_address: str, partners: list[str], data_dir: str, secret: str,
                 max_in_flight: int = 8, pipeline_min_bytes: int = 64 << 10, defer_seconds: float = 0.002,
                 urgent_in_flight: int = 2,
                 retry_after: float = 5.0, use_fork: bool = True,
                 max_batch_bytes: int = 1 << 20, high_water_bytes: int = 16 << 20,
                 clock: Callable[[], int] = time.time_ns, in_loop: bool = False, **replica_options) -> None:
        # The state machine and its storage (store/applier.py): the log hands it committed entries
        # and snapshots, and knows nothing else of it.
        self.machine = machine
        self._catching_up = False  # the machine fetches what a snapshot install left out: entries wait
        self._partners = partners
        self._secret = secret
        self._on_outputs = on_outputs
        self.origin = origin
        self._clock = clock
        self.max_in_flight = max_in_flight
        self.pipeline_min_bytes = pipeline_min_bytes
        # A small batch with a command someone waits for (not deferrable) does not wait for the
        # batches in flight while fewer than this many are: a publish behind a consumer's
        # settlement (1.0, 0-10) or behind another client's lone publish waited a whole commit.
        self.urgent_in_flight = urgent_in_flight
        self.defer_seconds = defer_seconds
        # A batch is one Raft entry: pickled, compressed and encrypted in pysyncobj's tick thread
        # for every follower.  Multi-megabyte entries (large messages under load) held that thread
        # long enough to miss heartbeats and flap the leadership, so batches are cut at this size.
        self.max_batch_bytes = max_batch_bytes
        # Back-pressure: commands waiting for a proposal slot past ``high_water_bytes`` (bodies
        # mostly) throttle publishers (on_throttle(True)) until half of it is proposed.
        self.high_water_bytes = high_water_bytes
        self.throttled = False
        self.on_throttle: Callable[[bool], None] | None = None
        self._pending_sizes: list[int] = []
        self._pending_bytes = 0
        self.retry_after = retry_after
        self.use_fork = use_fork
        self._pending: list[Command] = []
        self._scheduled = False
        self._urgent = False  # a pending command that is not deferrable
        self._defer_handle: asyncio.TimerHandle | None = None
        self._seq = 0
        self._in_flight: dict[int, tuple[float, int, bytes]] = {}  # seq -> (proposed at, now, blob)
        self._inbox: deque[tuple] = deque()
        self._unannounced = False  # entries queued by the tick thread since the loop was last woken
        # Both set by start(), which comes before anything that uses them (declared, not assigned:
        # nothing is scheduled before there is a loop).
        self._schedule_drain: Callable[[Callable[[], None]], object]
        self._loop: asyncio.AbstractEventLoop
        self._retry_handle: asyncio.TimerHandle | None = None
        self.batches_applied = 0
        self.commands_applied = 0
        self.batches_proposed = 0
        self.commands_proposed = 0
        self.commit_latency_total = 0.0  # seconds, over this node's own batches
        self.commit_latency_count = 0
        self.on_leader_change: Callable[[], None] | None = None
        self._address = self_address
        self._args = (self_address, partners, data_dir, secret)
        self._replica_options = replica_options
        # raft_in_loop (raft/loop_tick.py): pysyncobj ticks in this loop, not in a thread of its own.
        self.in_loop = in_loop
        self.replica: Replica | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start Raft (its tick thread); committed entries will flow into ``loop``."""
        self._loop = loop
        if self.in_loop:
            log.info("raft_in_loop: pysyncobj ticks in the event loop (no tick thread)")
        self._schedule_drain = loop.call_soon if self.in_loop else loop.call_soon_threadsafe
        self.replica = Replica(*self._args, sink=self._from_raft, sink_backlog=self._inbox.__len__,
                               sink_wake=self._wake, snapshot_format=self.machine.snapshot_format,
                               loop=loop if self.in_loop else None, **self._replica_options)
        # See Replica.compaction_floor (the machine's: at most 1 GiB of journal).
        self.replica.compaction_floor = self.machine.compaction_floor
        self.replica.on_leader_changed = lambda: loop.call_soon_threadsafe(self._leader_changed)
        self.machine.start(self)  # requests between members for the machine (PeerRequests)
        self._retry_handle = loop.call_later(self.retry_after, self._retry_stale)

    def close(self) -> None:
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        if self.replica is not None:
            self.replica.scrubber.stop()
            self.replica.destroy()
            self.replica.journal.flush()

    # ------------------------------------------------------------------ status

    @property
    def is_leader(self) -> bool:
        return self.replica is not None and self.replica.is_leader

    @property
    def leader(self) -> str | None:
        """The leader's Raft address, or None when there is none *reachable*.

        A follower cut off from everyone keeps pysyncobj's idea of the last leader (it starts no
        election while it is connected to no one), so a leader only counts while this node sees a
        majority.
        """
        r = self.replica
        if r is None or not r.hasQuorum:
            return None
        return r.leader_address

    @property
    def _started(self) -> Replica:
        """The replica, for what runs only once ``start`` made it."""
        if self.replica is None:
            raise RuntimeError("the Raft log is not started")
        return self.replica

    @property
    def ready(self) -> bool:
        """This node has a leader and has applied everything the leader told it was committed."""
        return self.leader is not None and self._started.isReady()

    @property
    def backlog(self) -> int:
        return len(self._in_flight)

    def raft_status(self) -> RaftStatus | None:
        r = self.replica
        if r is None:
            return None
        journal = r.journal
        return RaftStatus(
            term=r.raftCurrentTerm, commit_index=r.commit_index, applied_index=r.last_applied,
            journal_entries=len(journal), journal_bytes=journal.size_bytes, journal_reads=journal.reads,
            journal_flushes=journal.flushes, connected_partners=tuple(r.connected_partners()),
            member_addresses=tuple(r.member_addresses()), majority_lost=r.majority_lost,
            batches_proposed=self.batches_proposed, commands_proposed=self.commands_proposed,
            commit_latency_total=self.commit_latency_total, commit_latency_count=self.commit_latency_count,
            lags=r.member_lags() if r.is_leader else {},
            prevote=(r.prevote_rounds, r.prevote_won, r.prevote_granted, r.prevote_refused),
            repair=None if r.repair is None else {"until": r.repair.until, "reason": r.repair.reason,
                                                  "votes_withheld": r.repair.votes_withheld},
            snapshots_damaged=r.snapshot_damaged,
            scrub=(r.scrubber.passes, r.scrubber.bytes, r.damage_found, r.last_damage),
            peer_gate=(r.gate.unauthenticated, r.gate.timed_out, r.gate.evicted, r.gate.stalled),
            snapshots=tuple(r.recent_snapshots))

    def compact(self, timeout: float = 60.0) -> Compaction:
        """Blocking (the admin API's worker thread): force a snapshot at the applied index and wait
        until the journal starts at it."""
        r = self._started
        target = r.last_applied
        r.forceLogCompaction()
        deadline = time.monotonic() + timeout
        while True:
            try:
                head, snapshot_index, entries = r.journal[0][1], r.journal[1][1], len(r.journal)
            except IndexError:  # the tick thread is rewriting the journal right now
                head = snapshot_index = entries = 0
            if head >= target - 1 and entries:
                return Compaction(snapshot_index=snapshot_index, journal_entries=entries)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no snapshot at index {target} within {timeout:.0f} s")
            time.sleep(0.05)

    # ------------------------------------------------------------------ proposing

    def submit(self, command: Command, deferrable: bool = False, size: int = 0) -> None:
        """Queue ``command`` for the next batch.  ``deferrable``: it may wait a few milliseconds
        for other commands to share its batch (see the module docstring).  ``size``: its bytes
        (bodies, mostly) if the caller knows them, else counted here."""
        self._pending.append(command)
        if not deferrable:
            self._urgent = True
        if not size:
            size = 32
            for item in command:
                if item.__class__ is bytes:
                    size += len(item)
        self._pending_sizes.append(size)
        self._pending_bytes += size
        if self._pending_bytes > self.high_water_bytes and not self.throttled:
            self._throttle(True)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._propose_pending)

    def _propose_pending(self) -> None:
        self._scheduled = False
        in_flight = len(self._in_flight)
        if not self._pending or in_flight >= self.max_in_flight:
            return
        if self._pending_bytes < self.pipeline_min_bytes:  # a small batch: worth waiting for
            if in_flight and (not self._urgent or in_flight >= self.urgent_in_flight):
                return  # proposed when the batch in flight is applied (_drain), or once it is bigger
            if not self._urgent and self.defer_seconds > 0:
                if self._defer_handle is None:
                    self._defer_handle = self._loop.call_later(self.defer_seconds, self._deferred_due)
                return
        batch = self._take_batch()
        blob = self.machine.encode(batch)
        self._seq += 1
        now_us = self._clock() // 1000
        self._in_flight[self._seq] = (time.monotonic(), now_us, blob)
        self.batches_proposed += 1
        self.commands_proposed += len(batch)
        self._propose(self._seq, now_us, blob)

    def _deferred_due(self) -> None:
        self._defer_handle = None
        self._urgent = True  # waited long enough
        self._propose_pending()

    def _take_batch(self) -> list:
        """The pending commands up to ``max_batch_bytes`` (at least one), in order."""
        sizes = self._pending_sizes
        total, count, cap = 0, 0, self.max_batch_bytes
        for size in sizes:
            if count and total + size > cap:
                break
            total += size
            count += 1
        if count == len(sizes):
            batch, self._pending, self._pending_sizes = self._pending, [], []
            self._urgent = False
            if self._defer_handle is not None:
                self._defer_handle.cancel()
                self._defer_handle = None
        else:
            batch, self._pending = self._pending[:count], self._pending[count:]
            del sizes[:count]
            self._scheduled = True  # the rest goes as soon as there is room in flight
            self._loop.call_soon(self._propose_pending)
        self._pending_bytes -= total
        if self.throttled and self._pending_bytes < self.high_water_bytes // 2:
            self._throttle(False)
        return batch

    def _throttle(self, on: bool) -> None:
        self.throttled = on
        if self.on_throttle is not None:
            self.on_throttle(on)

    def _propose(self, seq: int, now_us: int, blob: bytes) -> None:
        """Hand a batch to Raft.  On a follower that knows its leader, without a callback: the
        leader then sends no ``apply_command_response`` (one message fewer per batch, which the
        leader sent *before* the batch's AppendEntries).  What that callback reported is covered
        otherwise: a batch lost with a leader change is proposed again by ``_leader_changed``; one
        lost otherwise, after ``retry_after`` (``_retry_stale``), as before."""
        replica = self._started
        if not replica.is_leader and replica.leader_address is not None:
            replica.propose(now_us, self.origin, seq, blob, None)
            return
        loop = self._loop

        def done(_result, error) -> None:  # tick thread
            if error:
                loop.call_soon_threadsafe(self._failed, seq, error)

        replica.propose(now_us, self.origin, seq, blob, done)

    def _leader_changed(self) -> None:
        """Propose every batch in flight again (the state machine applies a batch id once)."""
        self._propose_again()

    def _failed(self, seq: int, error: int) -> None:
        entry = self._in_flight.get(seq)
        if entry is None:
            return  # applied after all
        log.debug("batch %s: pysyncobj error %s, proposing again", seq, error)
        self._in_flight[seq] = (time.monotonic(), entry[1], entry[2])
        self._loop.call_later(0.05, self._repropose, seq)

    def _repropose(self, seq: int) -> None:
        entry = self._in_flight.get(seq)
        if entry is not None:
            self._propose(seq, entry[1], entry[2])

    def _retry_stale(self) -> None:
        self._propose_again(older_than=self.retry_after)
        self._retry_handle = self._loop.call_later(1.0, self._retry_stale)

    def _propose_again(self, older_than: float | None = None) -> None:
        """Propose again the batches in flight proposed more than ``older_than`` seconds ago (all
        of them with None), with the same id."""
        now = time.monotonic()
        for seq, (at, now_us, blob) in list(self._in_flight.items()):
            if older_than is None or now - at > older_than:
                self._in_flight[seq] = (now, now_us, blob)
                self._propose(seq, now_us, blob)

    # ------------------------------------------------------------------ applying

    def _from_raft(self, item: tuple) -> None:
        """Tick thread: queue a committed entry or marker for the loop, preserving order.

        The loop is woken at the end of the tick (``_wake``), not here: woken now, it would compete
        for the GIL with the rest of the tick -- on the leader, the AppendEntries that carry the
        commit index to the followers, whose clients wait for it.  Except on the leader for its
        own batches: their clients are here, and the commit messages are not on their path (woken
        at the end of the tick, the leader's loop started 0.39 instead of 0.14 ms after the
        hand-off, stage tracer, client on the leader).
        """
        self._inbox.append(item)
        if item[0] == ENTRY and item[3] == self.origin and self._started.is_leader:
            self._unannounced = False
            self._loop.call_soon_threadsafe(self._drain)
        else:
            self._unannounced = True

    def _wake(self) -> None:
        """End of a tick (before its journal flush, which releases the GIL): wake the loop for the
        entries queued during the tick.  With raft_in_loop the tick runs in the loop itself, so
        ``_schedule_drain`` is a plain call_soon (no self-pipe write): applied in the next
        iteration, after the tick."""
        if self._unannounced:
            self._unannounced = False
            self._schedule_drain(self._drain)

    def _drain(self) -> None:
        inbox = self._inbox
        machine = self.machine
        while inbox and not self._catching_up:
            item = inbox[0]
            kind = item[0]
            if kind == ENTRY:
                _, index, now, origin, seq, blob = item
                own = origin == self.origin
                try:
                    applied = machine.apply_entry(index, now, origin, seq, blob, replies=own)
                except FormatTooNew as exc:
                    stop_for_newer_format(f"Raft entry {index}", exc)
                self.batches_applied += 1
                self.commands_applied += applied.commands
                if own:
                    flight = self._in_flight.pop(seq, None)
                    if flight is not None:
                        self.commit_latency_total += time.monotonic() - flight[0]
                        self.commit_latency_count += 1
                        if self._pending and not self._scheduled:
                            self._scheduled = True
                            self._loop.call_soon(self._propose_pending)
                if applied.outputs:
                    self._on_outputs(applied.outputs)
                machine.release(applied)
            elif kind == SNAPSHOT:
                self._take_snapshot(item[2], item[3])
            elif kind == INSTALL:
                try:
                    self._install(item[2])
                except FormatTooNew as exc:
                    stop_for_newer_format("a snapshot from the leader", exc)
                except SnapshotDamaged as exc:
                    # Never installed: the node stops, and at its restart the damaged file is set
                    # aside and the node is a learner until a leader sends an intact one (issue 29).
                    log.critical("stopping: %s", exc)
                    raise SystemExit(70) from exc
            inbox.popleft()

    def _take_snapshot(self, path: str, meta: bytes) -> None:
        replica = self._started
        machine = self.machine
        reached = raft_clock()
        machine.checkpoint()
        checkpoint = raft_clock() - reached
        if self.use_fork:  # a frozen copy of the machine, written by a child without our sockets
            pid = fork_snapshot(lambda: machine.write_snapshot(path, meta))
            replica.snapshot_started(pid, reached=reached, checkpoint=checkpoint)
            return
        try:
            machine.write_snapshot(path, meta)
            replica.snapshot_started(None, ok=True, reached=reached, checkpoint=checkpoint)
        except Exception:
            log.exception("snapshot failed")
            replica.snapshot_started(None, ok=False, reached=reached, checkpoint=checkpoint)

    def _install(self, path: str) -> None:
        missing = self.machine.install_snapshot(path)
        gc.freeze()  # the installed model is long-lived: out of every later collection (node/server.py)
        log.info("installed snapshot at index %s", self.machine.applied_index)
        if missing:
            # Entries after the snapshot need these: the machine fetches them before any is
            # applied (in a thread: other members answer over the Raft port, which needs our loop free).
            self._catching_up = True
            log.info("fetching %d message bodies from other members", len(missing))
            self._loop.run_in_executor(None, self._fetch_missing, missing)

    def _fetch_missing(self, needed: dict[int, int]) -> None:
        try:
            self.machine.fetch_missing(needed, self)
        finally:
            self._loop.call_soon_threadsafe(self._caught_up)

    # ------------------------------------------------------------------ PeerRequests

    def serve(self, name: str, handler: Callable[[bytes], bytes]) -> None:
        peer_requests.serve(self._started, name, handler)

    def askers(self, name: str, timeout: float) -> list[Callable[[bytes], bytes]]:
        return [peer_requests.ask(self._secret, address, name, timeout) for address in self._partners]

    def _caught_up(self) -> None:
        self._catching_up = False
        self._drain()
