"""The applier: the one place where a batch meets the state machine and its effects are carried out.

A log (``raft/local.py`` for one node, ``raft/cluster.py`` for Raft) decides *when* a batch is
applied and *when* its outputs may leave (after an fsync, after a majority committed); it knows
nothing of the broker.  The applier decides *what* applying means, in this order, the same for every
log:

1. ``machine.apply`` (pure: the model changes, the effects are returned, no I/O);
2. the batch's new bodies into the node's body store (``effects.body_puts``): the outputs read them,
   and so do the single node's message records and the audit events;
3. bodies filled into the outputs bound for this node's connections (``fill_bodies``), before the
   commit below, which may delete a record an output still reads;
4. a single node's LMDB mirror committed (``effects.persistence``, one write transaction per batch),
   and the bodies it now holds marked as stored elsewhere;
5. the audit events handed to the history (``history``);
6. -- the log releases the outputs to the connections when its durability rule allows --
7. ``release``: the bodies the batch deleted are dropped, only after the outputs went out (a
   delivery in them may still read its body).

A failure in steps 2-5 (a full disk, EIO) raises ``StorageFailed``: the model changed and cannot be
rolled back, so the log stops the node rather than diverge (``LocalLog._fail_stop``).

``StoredMachine`` is a machine that carries its own effects out through an applier, for tests, tools
and benchmarks that drive a machine without a log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftmq.raft.log import StorageFailed

from .core.commands import decode_batch, encode_batch
from .core.effects import PUT_WITH_BODY, Effects
from .core.machine import StateMachine
from .disk.bodies import REPAIR_TIMEOUT, Bodies, DictBodies, consumer_holds, fill_bodies, upcoming_ids
from .disk.body_fetch import PEER_REQUEST, catch_up, fetch_intact, serve
from .disk.durable import DurableStore
from .disk.snapshot import import_model, live_bodies, read_snapshot, verify_snapshot, write_snapshot

if TYPE_CHECKING:  # the interfaces this module implements (raft/ imports nothing from here)
    from raftmq.raft.log import PeerRequests

log = logging.getLogger(__name__)

# history(index, events), or history(index, events, chain) when it has ``takes_chain`` set (the
# node's EventStore.append: the chain's step of the batch, store/core/effects.py ``chain``).
History = Callable[..., None]
FETCH_FOR = 120.0  # seconds: bodies missing after an install are asked for again until then
FETCH_TIMEOUT = 10.0  # seconds for one member's answer


@dataclass(slots=True)
class Applied:
    """What a log does with an applied batch: release ``outputs`` when durable, then ``release``."""

    outputs: list
    body_deletes: list[int]
    sync_needed: bool  # a single node's batch promised durability: hold its outputs until an fsync
    commands: int


class Applier:
    """Applies batches to ``machine`` and carries their effects out (see the module docstring)."""

    def __init__(self, machine: StateMachine, bodies: Bodies | DictBodies | None = None,
                 durable: DurableStore | None = None, history: History | None = None,
                 lazy_bodies: bool = True) -> None:
        self.machine = machine
        self.bodies: Bodies | DictBodies = bodies if bodies is not None else DictBodies()
        self.durable = durable  # a single node's LMDB mirror; None in a cluster
        self.history = history
        self._history_chain = bool(getattr(history, "takes_chain", False))
        # Whether a connection id is this node's: only those outputs get their bodies (fill_bodies).
        # None: every output (tests without a broker).
        self.is_local: Callable[[str], bool] | None = None
        # A node's deliveries read their queues' next bodies ahead, and those to consumers that hold
        # their messages read their bodies only when sent (fill_bodies); without ``lazy_bodies``
        # every output gets its body at once (StoredMachine: tests and tools read them).
        self._upcoming = upcoming_ids(machine) if lazy_bodies else None
        self._holds = consumer_holds(machine) if lazy_bodies else None
        self.snapshot_format = SnapshotFiles()

    def set_history(self, history: History | None) -> None:
        """Where audit events go (the node's EventStore); None: the machine records none."""
        self.history = history
        self._history_chain = bool(getattr(history, "takes_chain", False))
        self.machine.records_events = history is not None

    # ------------------------------------------------------------------ applying

    def apply(self, now: int, commands: list, index: int | None = None,
              batch_id: tuple[str, int] | None = None, replies: bool = True) -> Applied:
        return self.carry_out(self.machine.apply(now, commands, index, batch_id, replies), len(commands))

    def carry_out(self, effects: Effects, commands: int = 0) -> Applied:
        """Steps 2-5 of the module docstring for the effects of one ``machine.apply``."""
        outputs = effects.outputs
        bodies = self.bodies
        try:
            bodies.put(effects.body_puts)
            if outputs:
                fill_bodies(outputs, bodies, self._upcoming, self.is_local, self._holds)
            durable = self.durable
            if durable is not None and (effects.persistence or effects.index is not None):
                machine = self.machine
                durable.commit(effects.persistence, (machine.next_qid, machine.next_msg_id), effects.index,
                               bodies.get)
                if effects.persistence and isinstance(bodies, Bodies):
                    # Persistent messages in durable queues: their bodies are in the message records now.
                    bodies.stored_elsewhere([op[5] for op in effects.persistence
                                             if op[0] == PUT_WITH_BODY and op[1] == "messages"])
            if effects.events and self.history is not None:
                if self._history_chain:
                    self.history(effects.index, effects.events, effects.chain)
                else:
                    self.history(effects.index, effects.events)
        except Exception as exc:
            raise StorageFailed(f"carrying out a batch failed: {exc!r}") from exc
        return Applied(outputs, effects.body_deletes, effects.sync_needed, commands)

    def apply_entry(self, index: int, now: int, origin: str, seq: int, blob: bytes, replies: bool) -> Applied:
        """A committed Raft entry: a batch encoded by ``encode`` (FormatTooNew from a newer raftmq)."""
        return self.apply(now, decode_batch(blob), index, (origin, seq), replies)

    def release(self, applied: Applied) -> None:
        """After the batch's outputs went out: drop the bodies it deleted."""
        if applied.body_deletes:
            self.bodies.drop(applied.body_deletes)

    @staticmethod
    def encode(commands: list) -> bytes:
        return encode_batch(commands)

    # ------------------------------------------------------------------ durability (one node)

    def sync(self) -> None:
        """fsync the single node's LMDB mirror (a worker thread)."""
        if self.durable is not None:
            self.durable.sync()

    @property
    def syncs(self) -> bool:
        return self.durable is not None

    def close(self) -> None:
        if self.durable is not None:
            self.durable.sync()
            self.durable.close()

    # ------------------------------------------------------------------ a cluster's members

    def start(self, peers: PeerRequests) -> None:
        """Members that installed a snapshot ask this node for bodies; damaged bodies here are
        replaced from the members' intact copies (store/disk/bodies.py "Damaged bodies")."""
        bodies = self.bodies
        if not isinstance(bodies, Bodies):
            return
        peers.serve(PEER_REQUEST, lambda request: serve(bodies, request))

        def repair(ids: list[int]) -> dict[int, bytes]:
            # On the loop while the delivery that read the body waits, or in the scrubber's thread.
            return fetch_intact(ids, peers.askers(PEER_REQUEST, REPAIR_TIMEOUT), bodies.store.expected_crc)

        bodies.repairer = repair

    def fetch_missing(self, needed: dict[int, int], peers: PeerRequests) -> None:
        """Worker thread: ask the other members for ``needed`` (id -> size) until none is missing
        (a member may be down or still restarting: asked again for up to FETCH_FOR seconds)."""
        bodies = self.bodies
        assert isinstance(bodies, Bodies)
        deadline = time.monotonic() + FETCH_FOR
        fetched = 0
        try:
            while True:
                report = catch_up(bodies, needed, peers.askers(PEER_REQUEST, FETCH_TIMEOUT))
                fetched += report.fetched
                needed = {i: needed[i] for i in report.still_missing}
                if not needed or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
        except Exception:  # noqa: BLE001 - the log must go on applying whatever happened here
            log.exception("fetching message bodies failed")
        if needed:
            log.error("%d message bodies could not be fetched from any member", len(needed))
        log.info("fetched %d message bodies", fetched)

    # ------------------------------------------------------------------ snapshots (a cluster)

    def compaction_floor(self) -> int:
        """Journal bytes worth keeping before a snapshot (see Replica.compaction_floor)."""
        return min(self.machine.message_bytes // 4, 1 << 30)

    def checkpoint(self) -> None:
        """Every body a snapshot refers to on disk before the snapshot lets the journal go."""
        if isinstance(self.bodies, Bodies):
            self.bodies.checkpoint()

    def write_snapshot(self, path: str, meta: bytes) -> None:
        """Write the model at the applied index to ``path`` with the log's ``meta`` (the log may
        call this in a forked child: a frozen copy of the model)."""
        write_snapshot(path, self.machine, meta)

    def install_snapshot(self, path: str) -> dict[int, int]:
        """Replace the model with the snapshot at ``path`` (the file is the log's private link: it
        goes); the bodies the node lacks now (id -> size), to be fetched from other members."""
        _, model = read_snapshot(path)
        assert model is not None  # read with its model
        legacy = import_model(self.machine, model)
        os.unlink(path)
        bodies = self.bodies
        if not isinstance(bodies, Bodies):
            bodies.put(legacy)
            return {}
        return bodies.after_install(live_bodies(self.machine), legacy)

    @property
    def applied_index(self) -> int:
        return self.machine.applied_index


class SnapshotFiles:
    """The snapshot file format as the Raft log needs it (``raft.log.SnapshotFormat``)."""

    @staticmethod
    def read_meta(path: str) -> bytes:
        return read_snapshot(path, with_model=False)[0]

    @staticmethod
    def check(path: str) -> None:
        read_snapshot(path)

    verify = staticmethod(verify_snapshot)


class StoredMachine(StateMachine):
    """A state machine that carries its own effects out (tests, tools, benchmarks): its bodies in a
    dict, optionally a single node's LMDB mirror loaded at construction, events to ``event_sink``."""

    def __init__(self, store: DurableStore | None = None) -> None:
        super().__init__(persistent=store is not None)
        self.store = store
        self.own_bodies = DictBodies()
        self._event_sink: History | None = None
        if store is not None:
            self.restore(store.load())
            self.own_bodies.fallback = store.message_bodies
            self.own_bodies.put(self.loaded_bodies)
        self.applier = Applier(self, self.own_bodies, store, None, lazy_bodies=False)

    @property
    def event_sink(self) -> History | None:
        return self._event_sink

    @event_sink.setter
    def event_sink(self, sink: History | None) -> None:
        self._event_sink = sink
        self.applier.set_history(sink)

    def apply_batch(self, now: int, commands: list, index: int | None = None,
                    batch_id: tuple[str, int] | None = None, replies: bool = True) -> list:
        """Apply and carry out at once; the outputs."""
        applied = self.applier.apply(now, commands, index, batch_id, replies)
        self.applier.release(applied)
        return applied.outputs
