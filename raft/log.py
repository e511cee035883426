"""The seam between the broker and its log: what ``LocalLog`` (one node) and ``ClusterLog`` (Raft) offer.

The broker, the status file, the admin API and the metrics read a log only through this interface
-- never through a log's internals (pysyncobj's object, the journal) -- so that a third log (another
Raft library, a test double for unit tests of the broker) plugs in without touching them, and so
that pysyncobj's private attributes are used in ``raft/`` alone (listed in ``raft/replica.py``).

The contract: ``submit`` queues a command for the next batch; the log applies batches to the state
machine in log order and hands each batch's outputs to the broker's callback in that order, once
they are durable (fsynced on this node, or committed by a Raft majority).

A log knows nothing of the broker: commands are opaque to it, and it reaches the state machine
only through ``MachineHost`` (implemented by ``store/applier.py``, which carries a batch's effects
out in one documented order) and reads snapshot files only through ``SnapshotFormat``.  Nothing in
``raft/`` imports ``store/``, ``node/`` or ``ops/`` (tests/unit/test_import_graph.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from raftmq.integrity import Damage

OutputsCallback = Callable[[list], None]
Command = Any  # opaque to the log: the state machine's typed command (a tuple; see submit's size)


class Applied(Protocol):
    """An applied batch, as the log handles it."""

    outputs: list  # for the broker's callback, once durable
    sync_needed: bool  # one node: the outputs wait for an fsync of the machine's storage
    commands: int


class PeerRequests(Protocol):
    """Requests between members over the Raft port (the log's transport), for the machine's own
    use (message bodies fetched after a snapshot install, damaged bodies repaired)."""

    def serve(self, name: str, handler: Callable[[bytes], bytes]) -> None:
        """Answer requests named ``name`` with ``handler`` (called in the Raft thread)."""
        ...

    def askers(self, name: str, timeout: float) -> list[Callable[[bytes], bytes]]:
        """One function per other member that sends it a request and returns the answer
        (``PeerRequestFailed`` when it does not answer)."""
        ...


class SnapshotFormat(Protocol):
    """The snapshot file as the log needs it: the log's own ``meta`` inside, and checks."""

    def read_meta(self, path: str) -> bytes:
        """The meta the log wrote with the snapshot (raftmq.versions.FormatTooNew for a newer
        format, raftmq.integrity.SnapshotDamaged for a file that fails its check)."""
        ...

    def check(self, path: str) -> None:
        """Read the whole file, raising SnapshotDamaged if any of it fails its check."""
        ...

    def verify(self, path: str) -> list[Damage]:
        """Every damaged place of the file (the scrubber)."""
        ...


class MachineHost(Protocol):
    """The state machine and its storage, as a log drives them (``store.applier.Applier``)."""

    is_local: Callable[[str], bool] | None
    snapshot_format: SnapshotFormat

    def apply(self, now: int, commands: list, index: int | None = None,
              batch_id: tuple[str, int] | None = None, replies: bool = True) -> Applied: ...

    def apply_entry(self, index: int, now: int, origin: str, seq: int, blob: bytes, replies: bool) -> Applied:
        """A committed entry (``encode``'s blob)."""
        ...

    def release(self, applied: Any) -> None:
        """After the batch's outputs went out."""
        ...

    def encode(self, commands: list) -> bytes: ...

    @property
    def syncs(self) -> bool:
        """One node: the machine's storage needs ``sync`` before outputs that promised durability."""
        ...

    def sync(self) -> None: ...

    def close(self) -> None: ...

    @property
    def applied_index(self) -> int: ...

    def start(self, peers: PeerRequests) -> None:
        """A cluster has started: the machine may serve and send requests to other members."""
        ...

    def compaction_floor(self) -> int: ...

    def checkpoint(self) -> None:
        """Before a snapshot: what it refers to is on disk."""
        ...

    def write_snapshot(self, path: str, meta: bytes) -> None: ...

    def install_snapshot(self, path: str) -> dict[int, int]:
        """Install the snapshot at ``path`` (the file goes); what the machine must fetch before the
        next entry is applied (empty: nothing)."""
        ...

    def fetch_missing(self, needed: dict[int, int], peers: PeerRequests) -> None:
        """Blocking, in a worker thread: fetch what ``install_snapshot`` said is missing."""
        ...


@dataclass(frozen=True, slots=True)
class RaftStatus:
    """A replicated log's view of the cluster, read in one go (for status, admin and metrics)."""

    term: int
    commit_index: int
    applied_index: int  # Raft index applied by this node
    journal_entries: int
    journal_bytes: int
    journal_reads: int  # entries read back from disk (no longer kept in memory)
    journal_flushes: int
    connected_partners: tuple[str, ...]  # Raft addresses this node currently talks to
    member_addresses: tuple[str, ...]  # the Raft configuration, this node included
    majority_lost: int  # times this node stopped leading for want of a majority
    batches_proposed: int
    commands_proposed: int
    commit_latency_total: float  # seconds, over this node's own batches
    commit_latency_count: int
    lags: dict[str, int] = field(default_factory=dict)  # leader only: member -> entries behind commit
    # Pre-vote rounds this node started and won, pre-votes it granted and refused (raft/prevote.py).
    prevote: tuple[int, int, int, int] = (0, 0, 0, 0)
    # Issue 29 (raft/repair.py): while this node's storage lost entries it may have acknowledged,
    # {"until", "reason", "votes_withheld"}: it takes part in no election until repaired.
    repair: dict | None = None
    snapshots_damaged: int = 0  # snapshots found damaged at start and set aside
    # The storage scrubber (raft/scrub.py): passes, bytes verified, damage found, the last one.
    scrub: tuple[int, int, int, str] = (0, 0, 0, "")
    # The Raft port's gate (raft/gate.py): unauthenticated sockets open now, and sockets closed for
    # not authenticating in time, for more unauthenticated ones beyond the cap, for stalling mid-frame.
    peer_gate: tuple[int, int, int, int] = (0, 0, 0, 0)
    # The last snapshots written or loaded, newest last: (time.time(), index, bytes or None, how).
    snapshots: tuple[tuple[float, int, int | None, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Compaction:
    """The result of a forced snapshot: the journal now starts after ``snapshot_index``."""

    snapshot_index: int
    journal_entries: int


class StorageFailed(Exception):
    """Raised by ``MachineHost.apply`` when the machine's storage refused a batch (a full disk,
    EIO): the batch is applied in memory and cannot be undone, so the log stops the node."""


class NotReplicated(Exception):
    """An operation that only a replicated log has (a single node keeps its state in LMDB)."""


class Log(Protocol):
    """What the broker needs from its log; ``LocalLog`` and ``ClusterLog`` implement it."""

    batches_applied: int
    commands_applied: int
    # Called with True when queued proposals pass the log's high-water mark, False once they drain
    # (publishers stop being read meanwhile); a log that never backs up never calls it.
    on_throttle: Callable[[bool], None] | None

    def start(self, loop: asyncio.AbstractEventLoop) -> None: ...

    def close(self) -> None: ...

    def submit(self, command: Command, deferrable: bool = False, size: int = 0) -> None: ...

    @property
    def is_leader(self) -> bool:
        """This node sequences the log (always, for a single node)."""
        ...

    @property
    def leader(self) -> str | None:
        """The leader's Raft address (None for a single node, or while there is no reachable leader)."""
        ...

    @property
    def ready(self) -> bool:
        """Client operations can make progress: a leader, and everything committed applied here."""
        ...

    @property
    def backlog(self) -> int:
        """Batches submitted and not yet released to the broker."""
        ...

    def raft_status(self) -> RaftStatus | None:
        """The replicated log's status; None for a single node."""
        ...

    def compact(self, timeout: float = 60.0) -> Compaction:
        """Snapshot at the applied index and cut the journal to it (blocking; not from the loop).

        Raises NotReplicated on a single node, TimeoutError when no snapshot is taken in time."""
        ...
