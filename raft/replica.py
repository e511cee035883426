"""pysyncobj, made safe for a broker: durable journal, send barrier, snapshots of the whole model.

``Replica`` is the only pysyncobj subclass. It runs pysyncobj's tick thread and hands every
committed entry, in log order, to a *sink* (``ClusterLog``, which applies it in the asyncio loop).
What it changes in pysyncobj's behaviour, and why (see shared/notes/pysyncobj.md):

* **Journal**: :class:`raft.journal.AppendJournal` instead of the mmap ``FileJournal`` that never
  fsyncs.  Term and vote are fsynced when they change.
* **Durability barriers**: a follower's acknowledgement (``next_node_idx``) is sent only after the
  journal is flushed (fsynced), so a follower never acknowledges entries it could lose.  The
  leader flushes at the end of every tick, before the next tick counts its own copy toward a
  majority; its AppendEntries go out *before* its own fsync, so the leader's and the followers'
  fsyncs overlap (Raft allows this: the leader's copy only counts once it is durable).  An
  acknowledgement that repeats the last one (the answer to an AppendEntries carrying only a commit
  index) is not sent again for ``ACK_REPEAT_AFTER`` (:class:`RepeatedAcks`).  Term and
  vote are fsynced as soon as they change, before any vote or message reflecting them is sent.
* **Snapshots**: pysyncobj's serializer hooks, made asynchronous with ``serializeChecker``.  The
  hook only posts a marker into the ordered entry stream; the loop reaches it with the state at
  exactly that index and writes the snapshot (forked child, copy-on-write, so the loop does not
  stall); the checker reports completion and pysyncobj then truncates the journal.  Installing a
  snapshot received from the leader posts an *install* marker the same way.
* **Transport**: binds to the configured address only; frames are pickle protocol 5 sealed with
  AES-GCM under keys derived from the cluster secret (:mod:`raft.wire`), instead of pysyncobj's
  protocol-2 pickle + zlib + Fernet, which was most of the Raft thread's time.
* **Commands**: a batch is proposed as one raw command (type byte ``BATCH_COMMAND``, a small
  header, the msgpack blob) rather than through ``@replicated``, whose protocol-2 pickle turned
  every body into latin-1 text on the way in and back on every apply.
* **In the loop** (``loop=``, config ``raft_in_loop``; :mod:`raft.loop_tick`): no tick thread;
  the asyncio loop watches pysyncobj's sockets and calls ``doTick`` (issue 30's experiment).
  pysyncobj's poller is swapped like its journal (``createPoller`` during the constructor) and its
  pipe notifier's ``notify`` (a proposal) asks the loop for a tick instead of writing to a pipe.
* **Pre-vote** (:mod:`raft.prevote`): a follower whose election timer fires asks for pre-votes
  at term + 1 before raising its term, so a node that comes back from a restart or a partition
  cannot depose a leader that still reaches a majority.

pysyncobj has no extension points for most of this, so ``Replica`` (and :mod:`raft.wire`) use
its private names.  Every one is listed in :data:`PYSYNCOBJ_INTERNALS` (a unit test checks that
the installed pysyncobj still has them); nothing outside ``raft/`` should use any.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

import msgpack
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj import syncobj as _syncobj_module
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode
from pysyncobj.syncobj import _RAFT_STATE

from raftmq.integrity import Damage, SnapshotDamaged
from raftmq.versions import EXIT_FORMAT_TOO_NEW, FormatTooNew

from . import gate, prevote, wire
from .gate import PeerGate
from .journal import AppendJournal
from .log import SnapshotFormat
from .loop_tick import AsyncioPoller, LoopTicker
from .repair import Repair
from .scrub import StorageScrubber, scrub_segment

log = logging.getLogger(__name__)

_JOURNAL_HOOK = threading.Lock()

# The private names of pysyncobj (0.3.17 as installed) that raft/ reads, writes or overrides,
# by class.  tests/unit/raft/test_internals.py checks that each still exists.
PYSYNCOBJ_INTERNALS = {
    "SyncObj": (
        # read
        "connectedNodes", "otherNodes", "raftState", "raftNextIndex", "raftCommitIndex",
        "raftLastApplied", "raftMatchIndex", "newAppendEntriesTime", "transferInProgress",
        "transport", "generateRaftTimeout", "raftLeader",
        # written
        "otherNodes",  # swapped for an ordered copy during sendAppendEntries (forwarder first)
        "raftElectionDeadline",  # held while isolated; set past to campaign after a won pre-vote
        "raftCommitIndex",  # lowered during applyLogEntries (a cap on entries handed over per tick)
        # overridden
        "onMessageReceived", "setState", "doApplyCommand", "applyLogEntries", "onLeaderChanged",
        "sendAppendEntries",
        # raft_in_loop (raft/loop_tick.py): a proposal's wake-up becomes a tick request
        "pipeNotifier",
    ),
    "TcpConnection": (  # raft/wire.py
        "socket", "fileno", "poller", "readBuffer", "writeBuffer", "trySendBuffer",
        "processConnection", "processSend", "processRead", "processParseMessage",
    ),
    "TcpUtility": ("connection",),  # raft/wire.py: admin_utility
    "TcpServer": (  # raft/gate.py (which also reads TcpConnection's socket and readBuffer, and
        # TCPTransport's _server, _connections, _unknownConnections, _onNewIncomingConnection)
        "onNewConnectionCallback", "onNewConnection", "socket", "poller", "sendBufferSize", "recvBufferSize",
        "connectionTimeout", "keepalive",
    ),
}

# Messages that tell the leader "I have these entries": never sent before the entries are on disk.
ACKNOWLEDGEMENTS = frozenset(("next_node_idx",))



class _KeptSuffixFilter(logging.Filter):
    """pysyncobj logs "truncating already-applied log entries" before *asking* the journal to
    truncate; :class:`AppendJournal` keeps a suffix that cannot conflict and logs a real conflict
    itself, so the line would cry wolf."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("truncating already-applied log entries")


logging.getLogger("pysyncobj.syncobj").addFilter(_KeptSuffixFilter())

# Items handed to the sink, in log order.
ENTRY, SNAPSHOT, INSTALL = 0, 1, 2

# A group-commit batch in the log: this type byte (pysyncobj's own command types are 0-3), then
# the proposer's clock (µs), its sequence number and origin length, the origin, the blob.
BATCH_COMMAND = 0x10
_BATCH_HEAD = struct.Struct("<BqQH")

# Committed entries handed to the sink and not yet applied by it, at most (see
# Replica._SyncObj__applyLogEntries): an entry is a batch of up to 1 MiB.
APPLY_AHEAD = 64

# A follower answers every AppendEntries, also those that carry only the leader's commit index
# (one after every committed entry): an answer the leader already has is sent again only after
# this long (see RepeatedAcks).
ACK_REPEAT_AFTER = 0.03


class RepeatedAcks:
    """Which successful acknowledgements a follower need not send (they repeat the last one).

    After each committed entry the leader sends every follower an AppendEntries with only the new
    commit index, and pysyncobj answers each with the same ``next_node_idx`` success it sent for
    the entry: two of the ten Raft messages of a lone publish through a follower, each pickled,
    sealed and sent here and read, opened and handled by the leader's tick thread (the busiest
    thread on the commit path).  The leader learns nothing from them but that the follower is
    alive, which it only needs more often than ``leader_fallback`` (1 s): the same answer to the
    same leader in the same term is sent again only ``ACK_REPEAT_AFTER`` seconds after the last,
    more often than heartbeats (``append_entries_period``, 50 ms) come.  Anything new (a higher
    index, another term or leader), a failure or a reset always goes at once.  A lost answer
    (the connection dropped) costs at most ``ACK_REPEAT_AFTER`` of delay: the next heartbeat's
    answer repeats it.
    """

    def __init__(self, repeat_after: float = ACK_REPEAT_AFTER) -> None:
        self.repeat_after = repeat_after
        self._last: dict[object, tuple[int, int, float]] = {}  # node -> (term, next index, sent at)
        self.skipped = 0

    def already_sent(self, node: object, term: int, next_index: int, now: float) -> bool:
        """True: skip this acknowledgement; False: send it (it is recorded as sent)."""
        last = self._last.get(node)
        if last is not None and last[0] == term and last[1] == next_index and now - last[2] < self.repeat_after:
            self.skipped += 1
            return True
        self._last[node] = (term, next_index, now)
        return False


# A message every member sends every other connected member, so that no link is ever idle.
RECENT_SNAPSHOTS = 8  # snapshots remembered for the management UI (recent_snapshots)

KEEPALIVE = "raftmq_keepalive"
KEEPALIVE_PERIOD = 1.0
_KEEPALIVE_MESSAGE = {"type": KEEPALIVE}

wire.install()
gate.install()

# pysyncobj's clock (CLOCK_MONOTONIC_RAW here, not time.monotonic's): times compared with its own.
raft_clock = _syncobj_module.monotonicTime


class _FirstInUnion(set):
    """A set of members whose union (``|``, as pysyncobj's sendAppendEntries takes it) is a list
    with ``first`` at its head (see Replica._SyncObj__sendAppendEntries)."""

    def __init__(self, nodes: set, first: object) -> None:
        super().__init__(nodes)
        self.first = first

    def __or__(self, other: object) -> list:  # type: ignore[override]
        union = set(self) | set(other)  # type: ignore[call-overload]
        union.discard(self.first)
        return [self.first, *union]


class NoSnapshots:
    """The snapshot format of a replica given none (tests that never snapshot)."""

    def read_meta(self, path: str) -> bytes:
        raise RuntimeError(f"a snapshot file at {path}, and no snapshot format to read it")

    def check(self, path: str) -> None:
        self.read_meta(path)

    def verify(self, path: str) -> list[Damage]:
        return []


class Replica(SyncObj):
    # pysyncobj's private state that this class reads and writes (SyncObj's ``self.__name``, mangled).
    # pysyncobj has no type information: these declare what its code assigns them (syncobj.py), so
    # that the checker does not infer them from our assignments.
    _SyncObj__raftCommitIndex: int
    _SyncObj__raftLastApplied: int
    _SyncObj__otherNodes: set[TCPNode]  # (swapped for a _FirstInUnion, a set, while sending)

    def __init__(self, self_address: str, partners: list[str], data_dir: str, secret: str,
                 sink: Callable[[tuple], None], *, bind_address: str | None = None,
                 snapshot_entries: int = 20_000, snapshot_seconds: float = 600.0,
                 snapshot_bytes: int = 256 << 20,
                 append_entries_period: float = 0.05, tick_period: float = 0.02,
                 election_timeout: tuple[float, float] = (0.25, 0.5), batch_append_entries: bool = False,
                 message_bytes: int = 4 << 20, leader_fallback: float = 1.0, pre_vote: bool = True,
                 on_state_changed: Callable[[int, int], None] | None = None,
                 sink_backlog: Callable[[], int] | None = None, sink_wake: Callable[[], None] | None = None,
                 scrub_bytes_per_second: int = 8 << 20,
                 peer_gate: dict | None = None, loop: asyncio.AbstractEventLoop | None = None,
                 snapshot_format: SnapshotFormat | None = None) -> None:
        # The state machine's snapshot files (store/applier.py SnapshotFiles): the log reads its meta
        # from them and checks them, nothing else.  None: a replica that never snapshots (tests).
        self.snapshot_format: SnapshotFormat = snapshot_format or NoSnapshots()
        # raft_in_loop: pysyncobj runs in ``loop`` (this thread), not in a tick thread of its own.
        self.ticker: LoopTicker | None = None
        self._loop_poller: AsyncioPoller | None = None
        if loop is not None:
            self.ticker = LoopTicker(loop, self.doTick, tick_period)
            self._loop_poller = AsyncioPoller(loop, self.ticker.request, self.ticker.arm)
        os.makedirs(data_dir, exist_ok=True)
        self.data_dir = data_dir
        self.snapshot_path = os.path.join(data_dir, "snapshot.lmdb")
        self._sink = sink
        self.on_leader_changed: Callable[[], object] | None = None  # tick thread (see _SyncObj__onLeaderChanged)
        self.sink_backlog = sink_backlog  # entries handed to the sink and not yet applied
        self._snapshot_state = SERIALIZER_STATE.NOT_SERIALIZING
        self._snapshot_pid: int | None = None
        self._snapshot_asked = (0, 0.0)  # (index, monotonic time) of the snapshot last asked for
        # When the loop reached that snapshot's marker, and how long the bodies' checkpoint took
        # there: the "written in" log line splits the snapshot's time into its phases.
        self._snapshot_reached = (0.0, 0.0)
        self.majority_lost = 0  # times this node stopped leading in its own term (see __setState)
        self._led_term = -1
        self._installs = 0
        # The last snapshots this node wrote or installed, newest last: (time.time(), Raft index,
        # file bytes or None, "written" | "loaded").  For the management UI's Cluster page
        # (issue 35); node-local observation like the counters around it.
        self.recent_snapshots: deque[tuple[float, int, int | None, str]] = deque(maxlen=RECENT_SNAPSHOTS)
        self.snapshot_damaged = 0  # snapshots found damaged and set aside (issue 29)
        self.snapshot_bytes = snapshot_bytes
        # A floor under snapshot_bytes that grows with the model (ClusterLog: a quarter of the bytes
        # queued).  A snapshot's cost grows with the messages it holds; compacting every
        # snapshot_bytes whatever the backlog made that cost per published message grow with
        # the backlog too: 59 snapshots of up to 5.6 s while 5 GB of 4 KB messages were queued,
        # their child processes competing with the nodes for two cores (docs/benchmarks.md).
        self.compaction_floor: Callable[[], int] | None = None
        # Pre-vote (raft/prevote.py).  The lease: a node that heard from a leader within the
        # minimum election timeout refuses pre-votes.
        self.pre_vote = pre_vote
        self._lease = election_timeout[0]
        self._leader_heard_at: float | None = None
        self._forwarder = None  # on the leader: the member whose apply_command came last
        self._pre_vote_round: prevote.PreVoteRound | None = None
        self._won_pre_vote = False
        self._term_ahead_of_leader = False
        self.prevote_rounds = 0  # rounds this node started (its election timer fired)
        self.prevote_won = 0  # rounds that won a majority (a real election followed)
        self.prevote_granted = 0  # pre-votes this node granted to others
        self.prevote_refused = 0  # ... and refused
        self.journal = AppendJournal(os.path.join(data_dir, "journal"))
        self._check_snapshot_at_start()
        pending = self.journal.repair
        # Issue 29 (raft/repair.py): a node whose disk lost entries it may have acknowledged is a
        # learner until it has them again: no campaign, votes only by the log it held before.
        self.repair: Repair | None = Repair(
            int(pending["until"]), str(pending["reason"]),
            int(pending.get("until_term", self.journal.getCurrentTerm()))) if pending else None
        if self.repair is not None:
            log.error("storage damaged (%s): this node takes part in no election until it has caught up "
                      "with a leader past entry %d", self.repair.reason, self.repair.until)
        self._align_journal_with_snapshot()
        self._sealer = wire.Sealer(secret) if secret else None
        conf = SyncObjConf(
            password=None,  # pysyncobj's Fernet: replaced by raft.wire (see the ``encryptor`` property)
            bindAddress=bind_address or self_address,
            fullDumpFile=self.snapshot_path,
            serializer=self._serialize,
            deserializer=self._deserialize,
            serializeChecker=self._check_serializing,
            logCompactionMinEntries=snapshot_entries,
            logCompactionMinTime=snapshot_seconds,
            appendEntriesPeriod=append_entries_period,
            # Each Raft entry is already a group-commit batch, so entries are few and large: send
            # them at once (latency ~ network + fsync) instead of on pysyncobj's batching timer.
            appendEntriesUseBatch=batch_append_entries,
            appendEntriesBatchSizeBytes=message_bytes,
            autoTickPeriod=tick_period,
            raftMinTimeout=election_timeout[0],
            raftMaxTimeout=election_timeout[1],
            connectionTimeout=max(3.5, election_timeout[1]),
            # Check quorum: a leader that has heard from no majority for this long steps down
            # (pysyncobj's default, 30 s, kept a cut-off leader's clients waiting that long).
            leaderFallbackTimeout=leader_fallback,
            connectionRetryTime=1.0,
            dynamicMembershipChange=True,
            commandsWaitLeader=True,
            onStateChanged=on_state_changed,
            autoTick=loop is None,
        )
        # pysyncobj builds its journal inside __init__ from a module-level factory: swap the
        # factory for the duration of the constructor (serialised by a lock).
        with _JOURNAL_HOOK:
            original = _syncobj_module.createJournal
            original_poller = _syncobj_module.createPoller
            _syncobj_module.createJournal = lambda _path: self.journal
            if self._loop_poller is not None:
                _syncobj_module.createPoller = lambda _kind: self._loop_poller
            try:
                super().__init__(self_address, partners, conf)
            finally:
                _syncobj_module.createJournal = original
                _syncobj_module.createPoller = original_poller
        if self.ticker is not None:
            notifier = getattr(self, "_SyncObj__pipeNotifier", None)
            if notifier is not None:  # (only without appendEntriesUseBatch)
                notifier.notify = self.ticker.request
        transport = self._SyncObj__transport
        unsafe_send = transport.send
        journal = self.journal

        repeats = self.repeated_acks = RepeatedAcks()

        def send(node: TCPNode, message: object) -> bool:
            if isinstance(message, dict) and message.get("type") in ACKNOWLEDGEMENTS:
                if journal.dirty:
                    journal.flush()
                if message.get("success") and not message.get("reset") and repeats.already_sent(
                        node, self.raftCurrentTerm, message["next_node_idx"], _syncobj_module.monotonicTime()):
                    return True
            return unsafe_send(node, message)

        transport.send = send
        # Unauthenticated and stalled sockets on the Raft port are closed (raft/gate.py, issue 31).
        self.gate = PeerGate(transport, **(peer_gate or {}))
        self.addOnTickCallback(self.gate.tick)
        self._next_keepalive = 0.0
        self.addOnTickCallback(self._keep_links_warm)
        self.damage_found = 0  # damaged places the scrubber found on this running node (issue 29)
        self.last_damage = ""
        self._scrub_reports: list = []  # from the scrubber's thread to the tick (list.append is atomic)
        self.scrubber = StorageScrubber(self.journal.scrub_targets, self.snapshot_path, self.snapshot_format.verify,
                                        self._scrub_reports.append, scrub_bytes_per_second)
        self.journal.on_read_damage = self._scrub_reports.append
        self.addOnTickCallback(self._handle_scrub_reports)
        # Last, in this order: the loop is woken for the entries committed in this tick just
        # before the tick thread sleeps or flushes (both release the GIL, which the loop then
        # takes at once: woken earlier, it waited for the rest of the tick).
        if sink_wake is not None:
            self.addOnTickCallback(sink_wake)
        self.addOnTickCallback(self._flush_journal)
        self.scrubber.start()
        if self.ticker is not None:
            self.ticker.request()

    def destroy(self) -> None:
        """Stop Raft.  In the loop (``raft_in_loop``), pysyncobj closes its sockets right here
        (no tick thread to do it later): the ticker stops first, then the loop forgets the
        descriptors."""
        if self.ticker is not None:
            self.ticker.stop()
        super().destroy()
        if self._loop_poller is not None:
            self._loop_poller.close()

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803 (pysyncobj's names)
        """Hold the election clock while this node is connected to no one.

        pysyncobj starts an election at the first tick after the deadline on which the node is
        connected to anyone.  A node that starts (or comes back from a partition) after its
        deadline has passed therefore campaigns the instant its first connection comes up, before
        the sitting leader's first heartbeat can arrive -- and, with a log as long as everyone's,
        wins and deposes a healthy leader.  Restarting the clock while isolated makes such a node
        wait one election timeout for a heartbeat first, as a freshly started follower should.
        (That was not enough: under load a returning node still timed out before a heartbeat
        reached it, issue 17.  One way: its link to the other follower comes up first, and the
        leader's, if the leader is the one to dial, is retried only once a second.  Pre-vote,
        decided here when the deadline passes -- :meth:`_on_election_timeout` -- keeps any such
        node from deposing a live leader.)

        Also: compact the log once the journal holds ``snapshot_bytes``.  pysyncobj counts only
        entries and time, and an entry is a batch of up to ``max_batch_bytes`` (1 MiB): 20,000
        entries of large messages would be gigabytes on disk, and as much to replay at a restart.
        Not while this node is applying a long stretch of committed entries (a restart replaying
        its journal): the model is about to change by all of them, and the floor below, read from
        the model, is still the old one.  Seen at 5 GB queued: a restarted node asked for a
        snapshot at once, whose marker then waited 1.95 s behind the replay.

        And: sleep no later than the next timer.  pysyncobj looks at its election deadline and
        heartbeat time only when a tick runs, so with a 20 ms tick an election started up to 20 ms
        late -- and two followers whose random timeouts fell into the same 20 ms both campaigned
        and split the vote (leader kill to first confirm: p50 389 ms, max 787 ms over 10 kills,
        against p50 333 ms, max 447 ms with a 5 ms tick, which costs an idle node twice the CPU).
        """
        if (self.snapshot_bytes and self.journal.size_bytes > self.snapshot_bytes
                and self._snapshot_state == SERIALIZER_STATE.NOT_SERIALIZING
                and self._SyncObj__raftCommitIndex - self._SyncObj__raftLastApplied <= APPLY_AHEAD
                and (self.compaction_floor is None or self.journal.size_bytes > self.compaction_floor())):
            self.forceLogCompaction()
        now = _syncobj_module.monotonicTime()
        may_campaign = False
        if self.repair is not None:
            self._check_repair()
        if self.repair is not None:
            # A learner never campaigns (raft/repair.py): its timer is held, like an isolated node's.
            self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        elif not self._SyncObj__connectedNodes and self._SyncObj__otherNodes:
            self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        elif (self._SyncObj__raftElectionDeadline < now and self.selfNode is not None
              and self._SyncObj__raftState != _RAFT_STATE.LEADER):
            may_campaign = self._on_election_timeout(now)
        leading = self._isLeader()
        due = self._SyncObj__newAppendEntriesTime if leading else self._SyncObj__raftElectionDeadline
        if now < due < now + timeToWait:  # (a deadline already past is pysyncobj's to act on)
            timeToWait = due - now + 0.0002  # just past it: the tick then sees it due
        if not self.pre_vote or may_campaign or leading:
            super()._onTick(timeToWait)
            return
        # pysyncobj checks the deadline again, a moment later: a deadline that passes in between
        # (the thread preempted under load, or due within microseconds) would let it campaign
        # without a pre-vote -- seen with a follower whose timer is shorter than the heartbeat.
        # Hold its deadline through this tick; one that passes is the next tick's, pre-vote first.
        held = self._SyncObj__raftElectionDeadline
        self._SyncObj__raftElectionDeadline = math.inf
        try:
            super()._onTick(timeToWait)
        finally:
            if self._SyncObj__raftElectionDeadline == math.inf:  # (a message may have reset it)
                self._SyncObj__raftElectionDeadline = held

    def _SyncObj__setState(self, newState: int) -> None:  # noqa: N802, N803 (pysyncobj's names)
        """Count the times this node stops leading for want of a majority.

        A leader deposed by a higher term (a vote request, another leader's AppendEntries) adopts
        that term first; one that heard from no majority for ``leader_fallback`` steps down in its
        own term.  The broker then closes its clients at once (node/broker.py).
        """
        if (self._SyncObj__raftState == _RAFT_STATE.LEADER and newState != _RAFT_STATE.LEADER
                and self.raftCurrentTerm == self._led_term):
            self.majority_lost += 1
        if newState == _RAFT_STATE.LEADER:
            self._led_term = self.raftCurrentTerm
        super()._SyncObj__setState(newState)

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 (pysyncobj's name)
        """Send to the member that forwarded the latest command first.

        pysyncobj sends AppendEntries member by member in the order of a set, which hash
        randomisation fixes when the leader starts.  The member that forwarded a command has the
        client waiting for its commit: with the commit index sent to the other follower first, it
        reached the client's node 0.129 ms after the commit instead of 0.032 ms (issue 30, stage
        tracer, 500 round trips each way).  The set is swapped, for this call only, for one whose
        union with the read-only members iterates in that order (nothing else reads it meanwhile:
        the tick thread is the only one in pysyncobj).
        """
        nodes = self._SyncObj__otherNodes
        first = self._forwarder
        if first is None or first not in nodes or len(nodes) < 2:
            super()._SyncObj__sendAppendEntries()
            return
        self._SyncObj__otherNodes = _FirstInUnion(nodes, first)
        try:
            super()._SyncObj__sendAppendEntries()
        finally:
            self._SyncObj__otherNodes = nodes

    def _SyncObj__onLeaderChanged(self) -> None:  # noqa: N802 (pysyncobj's name)
        """This node became a candidate or heard from a new leader: tell ``on_leader_changed``
        (ClusterLog proposes its batches in flight again: one forwarded to the old leader may
        never commit, and nobody else would say so)."""
        super()._SyncObj__onLeaderChanged()
        if self.on_leader_changed is not None:
            self.on_leader_changed()

    def _SyncObj__onMessageReceived(self, node: TCPNode, message: dict) -> None:  # noqa: N802 (pysyncobj's name)
        """Keep the leader's nextIndex for a follower from moving back on a successful reply.

        The leader sends entries as they are appended, without waiting for replies (pipelining),
        and advances nextIndex past what it sent.  pysyncobj then set nextIndex to the index a
        reply acknowledged -- the reply to an *earlier* AppendEntries -- so every entry still in
        flight was sent again at the next period (the journal skips the copies, but each was
        pickled, sealed and sent once more per follower).  Raft only moves nextIndex back on a
        rejection, which pysyncobj marks ``reset``.

        And: an AppendEntries that carries no ``prevLogIdx`` (the leader is sending a snapshot,
        chunk by chunk, or has none ready yet) does not move this follower's commit index.
        pysyncobj set it to ``min(leader's commit, own last index)`` after every such message,
        although nothing in it matched this node's log against the leader's: a node restarted
        with entries the cluster never committed (appended as a leader that then died) applied
        them as soon as the leader began sending it a snapshot, before the snapshot replaced
        the model.  Raft (§5.3) advances a follower's commit index only over entries that a
        successful consistency check has matched.  Seen as a chaos run's replica whose body
        store held, under a message id, the body of a message the cluster never had (the
        snapshot install replaced the model but kept that node's bodies); the node's outputs
        for those entries (confirms, deliveries) went out too.
        """
        kind = message.get("type")
        if kind == KEEPALIVE:
            return  # reading it was the point (see _keep_links_warm)
        if self.repair is not None and (kind == "timeout_now" or (kind == "request_vote" and not self.repair.may_vote_for(
                message["last_log_term"], message["last_log_index"], self.journal[-1][2:0:-1]))):
            self.repair.votes_withheld += kind == "request_vote"
            log.debug("storage damaged: %s from %s ignored (candidate behind what this node held)", kind, node.id)
            return
        if kind == prevote.PRE_VOTE:
            self._answer_pre_vote(node, message)
            return
        if kind == prevote.PRE_VOTE_REPLY:
            self._count_pre_vote(node, message)
            return
        if kind == "append_entries":
            self._heard_append_entries(message["term"])
            if self.repair is not None and message["term"] >= self.raftCurrentTerm:
                self.repair.heard_leader(message["term"], message.get("commit_index", 0))
            if "prevLogIdx" not in message and message.get("commit_index", 0) > self._SyncObj__raftCommitIndex:
                message = dict(message, commit_index=self._SyncObj__raftCommitIndex)
        if kind == "apply_command":
            self._forwarder = node
        if kind == "next_node_idx" and message.get("success") and not message.get("reset"):
            next_index = self._SyncObj__raftNextIndex
            sent_up_to = next_index.get(node)
            super()._SyncObj__onMessageReceived(node, message)
            if sent_up_to is not None and next_index.get(node, sent_up_to) < sent_up_to:
                next_index[node] = sent_up_to
            return
        super()._SyncObj__onMessageReceived(node, message)

    # ------------------------------------------------------------------ pre-vote (raft/prevote.py)

    def _on_election_timeout(self, now: float) -> bool:
        """The election timer fired: True if pysyncobj may campaign in this tick.

        Ask for pre-votes instead, and restart the timer: if the round fails (a leader is alive,
        or this log is behind), the node asks again at the next timeout, and the leader's next
        AppendEntries resets the timer and ends the round.  A won round sets the deadline in the
        past (:meth:`_count_pre_vote`), and the next tick lets pysyncobj campaign.
        """
        step = prevote.at_election_timeout(
            enabled=self.pre_vote, others=len(self._SyncObj__otherNodes),
            transfer=self._SyncObj__transferInProgress, won_pre_vote=self._won_pre_vote,
            term_ahead_of_leader=self._term_ahead_of_leader)
        self._won_pre_vote = False
        self._pre_vote_round = None
        if step is prevote.Step.ELECT:
            return True
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        term = self.raftCurrentTerm + 1
        self._pre_vote_round = prevote.PreVoteRound(term)
        self.prevote_rounds += 1
        _entry, last_index, last_term = self.journal[-1]
        request = {"type": prevote.PRE_VOTE, "term": term,
                   "last_log_index": last_index, "last_log_term": last_term}
        transport = self._SyncObj__transport
        for node in self._SyncObj__otherNodes:
            transport.send(node, request)
        return False

    def _answer_pre_vote(self, node: TCPNode, message: dict) -> None:
        """Grant or refuse a pre-vote; nothing about this node changes either way."""
        if self.selfNode is None:
            return
        _entry, last_index, last_term = self.journal[-1]
        heard = self._leader_heard_at
        voter = prevote.Voter(
            term=self.raftCurrentTerm, last_log_term=last_term, last_log_index=last_index,
            is_leader=self._isLeader(), lease=self._lease,
            leader_heard_ago=None if heard is None else _syncobj_module.monotonicTime() - heard)
        refusal = prevote.pre_vote_refusal(voter, message["term"], message["last_log_term"],
                                           message["last_log_index"])
        if self.repair is not None and refusal is None and not self.repair.may_vote_for(
                message["last_log_term"], message["last_log_index"], (last_term, last_index)):
            refusal = "storage damaged: the candidate is behind what this node held"
            self.repair.votes_withheld += 1
        if refusal is None:
            self.prevote_granted += 1
        else:
            self.prevote_refused += 1
            log.debug("pre-vote for term %d refused to %s: %s", message["term"], node.id, refusal)
        self._SyncObj__transport.send(node, {"type": prevote.PRE_VOTE_REPLY, "term": message["term"],
                                             "granted": refusal is None})

    def _count_pre_vote(self, node: TCPNode, message: dict) -> None:
        pending = self._pre_vote_round
        if pending is None or not message.get("granted"):
            return
        if self._isLeader() or pending.term != self.raftCurrentTerm + 1:
            self._pre_vote_round = None  # our term moved since the round started: it is over
            return
        pending.grant(node.id, message["term"])
        if pending.won({n.id for n in self._SyncObj__otherNodes}):
            self._pre_vote_round = None
            self._won_pre_vote = True
            self.prevote_won += 1
            log.info("pre-vote for term %d won (%s): starting an election", pending.term,
                     ", ".join(sorted(pending.granted)))
            self._SyncObj__raftElectionDeadline = 0.0  # the next tick campaigns

    def _check_repair(self) -> None:
        """A learner that has everything it may have acknowledged votes again (raft/repair.py)."""
        repair = self.repair
        leader = self._SyncObj__raftLeader
        if repair is None or leader is None:
            return
        following = self._SyncObj__raftState == _RAFT_STATE.FOLLOWER
        if repair.done(following=following, current_term=self.raftCurrentTerm,
                       commit_index=self._SyncObj__raftCommitIndex, last_log_term=self.journal[-1][2]):
            self.journal.repaired()
            self.repair = None
            log.warning("storage repaired: this node holds every entry up to %d again (commit index %d, "
                        "leader %s, term %d); it takes part in elections again", repair.until,
                        self._SyncObj__raftCommitIndex, leader.address, self.raftCurrentTerm)

    def _handle_scrub_reports(self) -> None:
        """Damage the scrubber found: checked again here (the tick thread is the journal's only
        writer, so a segment cut or compacted meanwhile is not mistaken for damage), logged,
        counted, and repaired by a new snapshot: it replaces a damaged snapshot file and drops the
        journal's records up to the applied index, so no one needs a damaged committed record."""
        if not self._scrub_reports:
            return
        reports = self._scrub_reports
        while reports:
            damage = reports.pop(0)  # (copying then clearing lost a report appended in between)
            if damage.store == "snapshot":
                still = self.snapshot_format.verify(damage.path) if os.path.exists(damage.path) else []
            else:
                limits = dict(self.journal.scrub_targets())
                still = [d for d in [scrub_segment(damage.path, limits[damage.path])] if d] \
                    if damage.path in limits else []
            if not still:
                continue
            self.damage_found += 1
            self.last_damage = str(still[0])
            log.error("scrubber: %s; taking a snapshot so that nothing needs it", still[0])
            if self._snapshot_state == SERIALIZER_STATE.NOT_SERIALIZING:
                self.forceLogCompaction()

    def _check_snapshot_at_start(self) -> None:
        """A damaged snapshot is set aside before pysyncobj reads it, and so is the journal.

        The journal was compacted to the snapshot: without the snapshot's state its entries cannot
        be applied, and pysyncobj would clear them anyway.  The node starts empty, keeps its term
        and vote, and is a learner (raft/repair.py) until the leader has sent it a snapshot and
        the entries up to the highest index it held.
        """
        if not os.path.exists(self.snapshot_path):
            return
        try:
            self.snapshot_format.check(self.snapshot_path)
        except SnapshotDamaged as exc:
            aside = f"{self.snapshot_path}.damaged"
            os.replace(self.snapshot_path, aside)
            log.error("%s; set aside as %s", exc, aside)
            self.journal.lost_base(f"snapshot damaged ({exc.what})")
            self.snapshot_damaged += 1

    def _heard_append_entries(self, term: int) -> None:
        """A current leader's AppendEntries renews the lease and ends any pre-vote round; one
        from a leader behind our term means only a real election can bring this node back."""
        if term >= self.raftCurrentTerm:
            self._leader_heard_at = _syncobj_module.monotonicTime()
            self._pre_vote_round = None
            self._won_pre_vote = False
            self._term_ahead_of_leader = False
        else:
            self._term_ahead_of_leader = True

    def getStatus(self) -> dict:  # noqa: N802 (pysyncobj's name; also `raftmq cluster status`)
        status = super().getStatus()
        status.update(pre_vote=self.pre_vote, prevote_rounds=self.prevote_rounds,
                      prevote_won=self.prevote_won, prevote_granted=self.prevote_granted,
                      prevote_refused=self.prevote_refused)
        return status

    def _keep_links_warm(self) -> None:
        """Send every connected member a small message every KEEPALIVE_PERIOD seconds.

        pysyncobj closes a connection on which nothing was read for ``connectionTimeout`` (3.5 s),
        and checks it only when the connection is next used.  Followers never talk to each other
        while there is a leader, so after a leader died, the first vote request between the two
        followers found their link idle, closed it and was lost.  The candidate then waited a whole
        election timeout to try again (seen with the vote messages logged: the term went up by two
        and the first confirm came 600-880 ms after the kill instead of 300-450 ms).
        """
        now = _syncobj_module.monotonicTime()
        if now < self._next_keepalive:
            return
        self._next_keepalive = now + KEEPALIVE_PERIOD
        transport = self._SyncObj__transport
        for node in list(self._SyncObj__connectedNodes):
            transport.send(node, _KEEPALIVE_MESSAGE)

    def _flush_journal(self) -> None:
        if self.journal.dirty:
            self.journal.flush()

    @property
    def encryptor(self) -> wire.Sealer | None:
        """What pysyncobj's transport hands every connection: raft.wire's sealer, not Fernet."""
        return self._sealer

    # ------------------------------------------------------------------ batches in the log

    def propose(self, now: int, origin: str, seq: int, blob: bytes,
                callback: Callable[[object, int], None] | None) -> None:
        """Append a batch to the log (through the leader); ``callback(result, error)`` as pysyncobj's
        (None: no reply wanted, see ClusterLog._propose)."""
        origin_bytes = origin.encode()
        head = _BATCH_HEAD.pack(BATCH_COMMAND, now, seq, len(origin_bytes))
        self._applyCommand(b"".join((head, origin_bytes, blob)), callback)

    def _SyncObj__applyLogEntries(self) -> bool:  # noqa: N802 (pysyncobj's name)
        """Hand committed entries to the sink at most until it holds ``APPLY_AHEAD`` unapplied.

        pysyncobj read every entry between the last applied and the commit index from the
        journal and handed them all over in one tick: a node restarting on a journal of 512 MB
        (a 2 GB backlog: compaction waits for a quarter of the bytes queued) put all of it into
        the loop's inbox at once, and held 876-931 MB of RSS after the restart against ~440 MB on
        the other nodes (bench/backlog.py).  The loop applies no faster for having them queued, so the rest
        waits in the journal for the next ticks.  Capped by lowering the commit index pysyncobj
        sees during the call (only this thread uses it meanwhile).
        """
        backlog = self.sink_backlog() if self.sink_backlog is not None else 0
        commit = self._SyncObj__raftCommitIndex
        cap = self._SyncObj__raftLastApplied + max(0, APPLY_AHEAD - backlog)
        if commit <= cap:
            return super()._SyncObj__applyLogEntries()
        self._SyncObj__raftCommitIndex = cap
        try:
            return super()._SyncObj__applyLogEntries()
        finally:
            self._SyncObj__raftCommitIndex = commit

    def _SyncObj__doApplyCommand(self, command: bytes) -> object:  # noqa: N802 (pysyncobj's name)
        """Runs in the tick thread once an entry is committed: pass a batch on, in order."""
        if command[0] != BATCH_COMMAND:
            return super()._SyncObj__doApplyCommand(command)
        _, now, seq, origin_length = _BATCH_HEAD.unpack_from(command)
        start = _BATCH_HEAD.size + origin_length
        origin = command[_BATCH_HEAD.size:start].decode()
        index = self._SyncObj__raftLastApplied + 1
        self._sink((ENTRY, index, now, origin, seq, memoryview(command)[start:]))
        return None

    # ------------------------------------------------------------------ status

    @property
    def last_applied(self) -> int:
        return self._SyncObj__raftLastApplied

    @property
    def commit_index(self) -> int:
        return self._SyncObj__raftCommitIndex

    @property
    def leader_address(self) -> str | None:
        leader = self._getLeader()
        return leader.address if leader is not None else None

    @property
    def is_leader(self) -> bool:
        return self._isLeader()

    def match_indexes(self) -> dict[str, int]:
        """On the leader: per member Raft address, the highest entry it has acknowledged."""
        return {node.address: index for node, index in dict(self._SyncObj__raftMatchIndex).items()}

    def connected_partners(self) -> list[str]:
        return [n.address for n in self.otherNodes if self.isNodeConnected(n)]

    def member_addresses(self) -> list[str]:
        """Raft addresses of the current configuration, this node included."""
        return sorted([self.selfNode.address, *(n.address for n in self.otherNodes)])

    def member_lags(self) -> dict[str, int]:
        """On the leader: per member Raft address, committed entries it has not acknowledged yet."""
        commit = self.commit_index
        return {address: max(0, commit - index) for address, index in self.match_indexes().items()}

    # ------------------------------------------------------------------ snapshots

    def _serialize(self, _tmp_path: str, data: tuple) -> None:
        """pysyncobj wants a snapshot at its last applied entry: ask the loop (ordered marker).

        ``data`` is (last applied entry, the entry before it, cluster members). We do not create
        pysyncobj's temporary file; pysyncobj's own rename then fails harmlessly and it waits for
        :meth:`_check_serializing`, which is the real completion signal.
        """
        last, before, cluster = data
        meta = msgpack.packb([list(last), list(before), sorted(n.address for n in cluster)], use_bin_type=True)
        self._snapshot_state = SERIALIZER_STATE.SERIALIZING
        self._snapshot_pid = None
        self._snapshot_asked = (last[1], _syncobj_module.monotonicTime())
        self._sink((SNAPSHOT, last[1], self.snapshot_path, meta))

    def snapshot_started(self, pid: int | None, ok: bool = True, *, reached: float = 0.0,
                         checkpoint: float = 0.0) -> None:
        """Called from the loop: the snapshot child was forked (``pid``), or written in-process.
        ``reached``: the monotonic time at which the loop reached the marker; ``checkpoint``: the
        seconds the bodies' checkpoint took before the fork."""
        self._snapshot_reached = (reached, checkpoint)
        if pid is None:
            self._snapshot_state = SERIALIZER_STATE.SUCCESS if ok else SERIALIZER_STATE.FAILED
        else:
            self._snapshot_pid = pid

    def _check_serializing(self) -> int:
        state = self._snapshot_state
        if state == SERIALIZER_STATE.SERIALIZING and self._snapshot_pid is not None:
            try:
                pid, status = os.waitpid(self._snapshot_pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self._snapshot_pid, 1
            if pid:
                state = SERIALIZER_STATE.SUCCESS if status == 0 else SERIALIZER_STATE.FAILED
                if state == SERIALIZER_STATE.FAILED:
                    log.error("snapshot child exited with status %s", status)
                else:
                    index, asked = self._snapshot_asked
                    reached, checkpoint = self._snapshot_reached
                    now = _syncobj_module.monotonicTime()
                    waited = max(0.0, reached - asked) if reached else 0.0
                    log.info("snapshot at index %d written in %.2f s (marker reached after %.2f s, "
                             "bodies checkpoint %.2f s, child %.2f s)", index, now - asked, waited,
                             checkpoint, now - reached - checkpoint if reached else 0.0)
                    self._saw_snapshot(index, self.snapshot_path, "written")
                self._snapshot_pid = None
        if state in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
            self._snapshot_state = SERIALIZER_STATE.NOT_SERIALIZING
        return state

    def _saw_snapshot(self, index: int, path: str, how: str) -> None:
        try:
            size: int | None = os.path.getsize(path)
        except OSError:
            size = None
        self.recent_snapshots.append((time.time(), index, size, how))

    def _align_journal_with_snapshot(self) -> None:
        """Compact the journal up to our snapshot if a crash came between the two.

        A snapshot is renamed into place first and the journal is compacted to it afterwards (at a
        later tick).  At start, pysyncobj keeps the journal only if its first two entries are the
        snapshot's last two; otherwise it *clears* it -- and a node killed between the rename and
        the compaction lost every entry after the snapshot, committed ones included.  With two
        such nodes a full-cluster restart elected a leader without them and overwrote them (seen
        in chaos runs: 0-10 transfers completed in the last ~100 ms before kill -9 of every node
        were gone).  Dropping the journal's head up to the snapshot here makes the check pass and
        keeps the suffix; a journal that does not contain the snapshot's entries is left to
        pysyncobj (the snapshot is then ahead of it, and clearing is right).
        """
        if not os.path.exists(self.snapshot_path):
            return
        meta = self.snapshot_format.read_meta(self.snapshot_path)
        last, before, _members = msgpack.unpackb(meta, raw=False)
        journal = self.journal
        if len(journal) < 2:
            return
        pos = before[1] - journal[0][1]
        if 0 < pos < len(journal) - 1 and journal[pos] == tuple(before) and journal[pos + 1] == tuple(last):
            log.info("journal compacted to the snapshot at index %d at start (the node stopped in between)",
                     last[1])
            journal.deleteEntriesTo(pos)

    def _deserialize(self, path: str) -> tuple:
        """Load a snapshot (ours at start, or one just received from the leader).

        The model is installed by the loop, in order with the entries: hand it a private hard link
        so that a later snapshot replacing ``path`` cannot change the file under it.
        """
        try:
            meta = self.snapshot_format.read_meta(path)
        except FormatTooNew as exc:
            # The tick thread cannot stop the process by raising: a node that cannot read its
            # leader's snapshot must not go on (nor take part in elections) -- leave at once; the
            # journal is on disk (send barrier), as after a crash.
            log.critical("stopping: %s", exc)
            logging.shutdown()
            os._exit(EXIT_FORMAT_TOO_NEW)
        last, before, members = msgpack.unpackb(meta, raw=False)
        self._installs += 1
        private = os.path.join(self.data_dir, f"install.{self._installs}.lmdb")
        if os.path.exists(private):
            os.unlink(private)
        os.link(path, private)
        self._saw_snapshot(last[1], path, "loaded")  # ours at start, or the leader's
        self._sink((INSTALL, last[1], private))
        return (tuple(last), tuple(before), {TCPNode(a) for a in members})
