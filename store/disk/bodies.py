"""The node's message bodies: write-behind to the body store, a bounded cache, deletes deferred
to the snapshot after next (issue 18; docs/design.md "Message bodies on disk").

``StateMachine.apply`` records, as effects (``Effects.body_puts`` / ``body_deletes``), the bodies of
messages that became live in a batch and the ids whose last holder went; the node carries them out
here, on every node: the puts before the batch's outputs are sent (deliveries read them, through
``fill_bodies``), the deletes after.  Three rules keep this cheap and safe:

* **Write-behind.** A body waits in memory (``pending``) and is written to LMDB only when pending
  holds more than ``write_behind_bytes`` (oldest first) or at a checkpoint.  A body acked before
  that is never written at all -- the common case while consumers keep up, so a broker without a
  backlog pays no second disk write per message.  The Raft journal is the durable copy meanwhile.
* **A checkpoint before every snapshot** (``checkpoint``): pending bodies go to disk and are
  fsynced before the snapshot is written, because the journal records holding them may be deleted
  once the snapshot exists.
* **Deletes wait one snapshot interval** (in a cluster; a single node has no snapshots and
  deletes at once).  A body deleted after checkpoint k is removed from disk at
  checkpoint k+1.  Until then a restart (snapshot k, then the journal's suffix replayed) finds every
  body snapshot k refers to, and a follower installing snapshot k can still fetch it from this
  node (``store/disk/body_fetch.py``).  A delete of a body still pending just drops it.

What the node holds for bodies (the memory alarm): ``held_bytes`` = cached + pending.

**Damaged bodies** (issue 29; docs/design.md "Damaged bodies").  The store verifies every body it
reads against the CRC32C it was written with and never returns one that fails.  A read that meets
one (``_load``: the cache's misses and read-ahead, which is how every delivery reads a body on
disk) replaces it from a peer there and then (``repairer``: the body fetch over the Raft port,
each fetched body checked against its checksum), writes it back (``BodyStore.repair``) and
returns it, so the delivery that asked simply waited.  Why repair inside the read rather than
make the delivery wait somewhere: a delivery reads its body either in ``fill_bodies`` (while
applying: the node's apply waits, as it does for a catch-up) or in the front end when it writes
it (``body_to_send``), and in both places every later delivery of that channel, session or link
is behind it; blocking the read keeps each front end's order and contract (a body is intact or
the message is gone) unchanged, in three protocols, for a fault that should be rare.  The price:
the loop waits for the fetch (a round trip to a member; at most ``REPAIR_TIMEOUT`` per member
asked, then no member is asked again for ``REPAIR_RETRY_SECONDS``, so a node whose members are
down does not stall at every read).

A body that cannot be repaired (one node, or no member has it intact) is *refused*: not sent.  A
delivery that holds its message (manual ack, 0-10 explicit accept, an unsettled 1.0 link) is
dropped unsent, as a gone one is: its message stays held by that delivery in the model -- not
acked, not lost -- and returns to its queue when the consumer's channel, session or link ends;
logged at ERROR with the message id and queue, counted in ``stats.refused``.  A delivery that
does not hold its message (auto-ack, a basic.get without ack: ``fill_bodies`` removes it from the
outputs, a get is answered as if the queue were empty) cannot keep it queued: it is not sent
either, and the message is lost with the only copy this node could find.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..core.commands import OK, OUT_DELIVER, OUT_REPLY, OUT_TRANSFER, GotMessage, Ok, SessionAttached
from ..core.groups import GroupEcho
from ..core.ready_peek import next_ids
from .body_cache import BodyCache, Loader
from .body_store import BodyStore

log = logging.getLogger(__name__)

#: A member asked to repair a damaged body has this long to answer (the loop waits for it).
REPAIR_TIMEOUT = 2.0
#: After a repair that found no intact copy, reads do not ask members again for this long.
REPAIR_RETRY_SECONDS = 5.0

#: Fetches intact copies of damaged bodies from other members (raft/cluster.py): ids in, the
#: bodies found (each verified against its checksum) out.
Repairer = Callable[[list[int]], dict[int, bytes]]

#: A put's source: the body, or the id of the message whose body it shares (a dead-letter copy).
BodySource = bytes | int


class RemoteBodies(Protocol):
    """Bodies of messages another process applies (issue 34: a queue group's, read by the node's
    main process, node/group_bodies.py), named by a *tagged* id (< 0: the group and the message id
    in it, ``tag_id``), since every group numbers its messages from 1."""

    def for_send(self, tagged: int, following: Callable[[], Iterable[int]] | None,
                 qid: int | None) -> bytes | None: ...

    @property
    def held_bytes(self) -> int: ...


#: Groups a tagged id can name (``tag_id``).
TAG_GROUPS = 256


def tag_id(group: int, msg_id: int) -> int:
    """The id under which the main process knows message ``msg_id`` of queue group ``group`` (> 0):
    negative, so that it never meets an id of its own group's (``Bodies.for_send``)."""
    return -(msg_id * TAG_GROUPS + group)


def untag_id(tagged: int) -> tuple[int, int]:
    """(group, message id) of a ``tag_id``."""
    msg_id, group = divmod(-tagged, TAG_GROUPS)
    return group, msg_id


@dataclass(slots=True)
class BodyEffects:
    """The body side of one applied batch, in apply order (``Effects.body_puts``/``body_deletes``)."""

    puts: list[tuple[int, BodySource]] = field(default_factory=list)  # (message id, body): became live
    deletes: list[int] = field(default_factory=list)  # message ids whose last reference went


@dataclass(slots=True)
class BodyStats:
    written: int = 0  # bodies written to LMDB
    cancelled: int = 0  # bodies acked while pending: never written
    deleted: int = 0  # bodies removed from LMDB
    checkpoints: int = 0
    lost: int = 0  # puts whose shared source this node did not have (logged: a bug or a lost store)
    fetched: int = 0  # bodies fetched from other members after a snapshot install
    gone: int = 0  # deliveries read when sent whose message no longer existed (dropped unsent)
    repaired: int = 0  # damaged bodies replaced by an intact copy from a member
    refused: int = 0  # deliveries not sent because their body was damaged and not repaired


class Bodies:
    """The node's bodies: pending (write-behind), a bounded cache, the LMDB body store.

    ``fallback`` reads bodies the store lacks from elsewhere: a single node's persistent messages
    after a restart are in its durable store's messages table, not here.  ``defer_deletes``: a
    cluster keeps deleted bodies on disk until the checkpoint after next (see the module
    docstring); a single node deletes them at once."""

    def __init__(self, store: BodyStore, cache_bytes: int, write_behind_bytes: int = 16 << 20,
                 fallback: Loader | None = None, defer_deletes: bool = True) -> None:
        self.store = store
        self.fallback = fallback
        self.cache = BodyCache(cache_bytes, self._load)
        self.write_behind_bytes = write_behind_bytes
        self.defer_deletes = defer_deletes
        self._pending: OrderedDict[int, bytes] = OrderedDict()  # oldest first
        self.pending_bytes = 0
        self._deleted_now: list[int] = []  # deleted since the last checkpoint (on disk)
        self._deleted_before: list[int] = []  # deleted between the last two checkpoints
        self.stats = BodyStats()
        self.repairer: Repairer | None = None  # a cluster's members (module docstring)
        self._repair_after = 0.0  # monotonic: no member is asked before (REPAIR_RETRY_SECONDS)
        #: Names a queue for the log of a refused delivery: qid -> name.
        self.queue_name: Callable[[int], str | None] = lambda qid: None
        #: With queue groups, the main process's reads of the groups' bodies (tagged ids, < 0).
        self.remote: RemoteBodies | None = None

    def _load(self, ids: Iterable[int], repair: bool = True) -> dict[int, bytes]:
        ids = list(ids)
        damaged: list[int] = []
        found = self.store.get_many(ids, damaged)
        if damaged and repair:
            found.update(self.repair(damaged))
        if self.fallback is not None:
            rest = [msg_id for msg_id in ids if msg_id not in found]
            if rest:
                found.update(self.fallback(rest))
        return found

    @property
    def damaged(self) -> int:
        """Bodies found damaged on this node (each counted once until replaced)."""
        return self.store.damaged_total

    def repair(self, ids: list[int], wait: bool = False) -> dict[int, bytes]:
        """Replace damaged bodies from members (``repairer``) and return the intact copies found;
        none without a repairer (one node) or while a failed attempt's pause lasts (``wait``:
        the scrubber's thread, which does not care)."""
        if self.repairer is None or not ids or (not wait and time.monotonic() < self._repair_after):
            return {}
        try:
            got = self.repairer(ids)
        except Exception:  # a member answering nonsense must not break the read: the body is refused
            log.exception("repairing %d damaged message bodies failed", len(ids))
            got = {}
        if got:
            replaced = self.store.repair(got.items())
            self.stats.repaired += len(replaced)
            log.warning("repaired %d damaged message bodies from other members", len(replaced))
        if len(got) < len(ids):
            self._repair_after = time.monotonic() + REPAIR_RETRY_SECONDS
            log.error("%d damaged message bodies have no intact copy on any member reached",
                      len(ids) - len(got))
        return got

    def refused(self, msg_id: int, qid: int | None) -> bool:
        """Whether ``msg_id``'s body is damaged here and not repaired: then its delivery is refused
        (logged at ERROR with the message and queue, counted) rather than sent."""
        if msg_id not in self.store.damaged:
            return False
        self.stats.refused += 1
        queue = self.queue_name(qid) if qid is not None else None
        log.error("message %d in queue %s: its body is damaged on this node and no intact copy was "
                  "found: not delivered (it stays held, not acked)", msg_id,
                  repr(queue) if queue is not None else "?")
        return True

    @property
    def held_bytes(self) -> int:
        """Body bytes this node holds in memory: what the memory alarm should count for bodies."""
        held = self.cache.bytes + self.pending_bytes
        if self.remote is not None:
            held += self.remote.held_bytes
        return held

    # ------------------------------------------------------------------ effects of apply

    def carry_out(self, effects: BodyEffects) -> None:
        """One batch's body effects, puts then deletes (when no output of the batch reads them)."""
        self.put(effects.puts)
        self.drop(effects.deletes)

    def put(self, puts: Iterable[tuple[int, BodySource]]) -> None:
        """Bodies of messages that became live (before the batch's outputs are sent)."""
        pending = self._pending
        added = 0
        for msg_id, source in puts:
            if isinstance(source, int):  # shares another message's body (a dead-letter copy)
                shared = self.get(source)
                if shared is None:
                    self.stats.lost += 1
                    log.error("no body for message %d: its copy %d is stored without one", source, msg_id)
                    continue
                body = shared
            else:
                body = source
            previous = pending.get(msg_id)
            if previous is not None:
                added -= len(previous)  # the last apply's body for this id wins (BodyStore._plan)
            pending[msg_id] = body
            added += len(body)
        self.pending_bytes += added
        if self.pending_bytes > self.write_behind_bytes:
            self._write_pending(self.write_behind_bytes // 2)

    def drop(self, deletes: Iterable[int]) -> None:
        """Ids whose last holder went (after the batch's outputs were sent)."""
        pending = self._pending
        for msg_id in deletes:
            body = pending.pop(msg_id, None)
            if body is not None:
                self.pending_bytes -= len(body)
                self.stats.cancelled += 1
            else:
                self.cache.discard(msg_id)
                self._deleted_now.append(msg_id)
        if not self.defer_deletes and len(self._deleted_now) >= 1024:
            self.stats.deleted += self.store.delete_many(self._deleted_now)
            self._deleted_now = []
            self.store.compact()

    def stored_elsewhere(self, ids: Iterable[int]) -> None:
        """Bodies a single node just committed in its durable store's message records: they need
        no copy here (``fallback`` reads them back), so they leave the write-behind queue."""
        pending, cache = self._pending, self.cache
        for msg_id in ids:
            body = pending.pop(msg_id, None)
            if body is not None:
                self.pending_bytes -= len(body)
                cache.admit(msg_id, body)

    def _write_pending(self, keep_bytes: int) -> None:
        """Write the oldest pending bodies until at most ``keep_bytes`` remain pending.

        They do not enter the cache: the cache holds what consumers are about to read
        (``read_ahead``).  Admitting a growing backlog's oldest bodies filled the 256 MiB cache on
        every node while nobody consumed (~480 MB of RSS per node with 5 GB queued, against
        the issue's 400), for a head start that read-ahead gives a consumer anyway."""
        pending, out = self._pending, []
        while pending and self.pending_bytes > keep_bytes:
            msg_id, body = pending.popitem(last=False)
            self.pending_bytes -= len(body)
            out.append((msg_id, body))
        self._commit_written(out)

    def spill(self, ids: Iterable[int]) -> int:
        """Write the pending bodies of ``ids`` now, with every pending body older than them (oldest
        first, as write-behind would: the store's segments stay runs of ids), so that another
        process can read them from the store (issue 34: a queue group's deliveries sent to the main
        process without their bodies, node/group_bodies.py).  Returns the bodies written."""
        pending = self._pending
        want = {msg_id for msg_id in ids if msg_id in pending}
        out = []
        while want and pending:
            msg_id, body = pending.popitem(last=False)
            self.pending_bytes -= len(body)
            out.append((msg_id, body))
            want.discard(msg_id)
        self._commit_written(out)
        return len(out)

    def pending_body(self, msg_id: int) -> bytes | None:
        """The body of ``msg_id`` if it waits in memory to be written (in no store yet)."""
        return self._pending.get(msg_id)

    def _commit_written(self, out: list[tuple[int, bytes]]) -> None:
        if out:
            deletes: list[int] = []
            if not self.defer_deletes:
                deletes, self._deleted_now = self._deleted_now, []
            self.store.commit(out, deletes)
            self.stats.written += len(out)
            self.stats.deleted += len(deletes)

    # ------------------------------------------------------------------ reads (deliveries)

    def get(self, msg_id: int) -> bytes | None:
        body = self._pending.get(msg_id)
        if body is not None:
            return body
        return self.cache.get(msg_id)

    def for_send(self, msg_id: int, following: Callable[[], Iterable[int]] | None = None,
                 qid: int | None = None) -> bytes | None:
        """The body of a delivery being written to its client (``fill_bodies``: left to be read
        when sent).  When it is only on disk, ``following`` -- the ids the front end sends next --
        are read with it in one transaction.  None (counted in ``stats.gone``): no such body; or
        (counted in ``stats.refused``) its body is damaged and could not be repaired: the front
        end drops the delivery unsent either way (module docstring).  A tagged id (< 0, queue
        groups) is another group's message: ``remote`` reads it."""
        if msg_id < 0:
            return self.remote.for_send(msg_id, following, qid) if self.remote is not None else None
        body = self._pending.get(msg_id)
        if body is not None:
            return body
        cache = self.cache
        if following is not None and msg_id not in cache:
            if self.remote is None:
                self.read_ahead([msg_id, *following()])
            else:  # (the next ones may be other groups' messages: tagged ids, < 0)
                self.read_ahead([msg_id, *(i for i in following() if i >= 0)])
        body = cache.get(msg_id)
        if body is None:
            if self.refused(msg_id, qid):
                return None
            self.stats.gone += 1
            log.info("message %d was gone when its delivery was to be sent: not sent", msg_id)
        return body

    def in_memory(self, msg_id: int) -> bool:
        return msg_id in self._pending or msg_id in self.cache

    def read_ahead(self, ids: Iterable[int]) -> int:
        """The next ids a consumer of a queue will be given, in order: load what is only on disk."""
        return self.cache.read_ahead([i for i in ids if i not in self._pending])

    def peek(self, ids: Iterable[int]) -> dict[int, bytes]:
        """Bodies of ``ids`` this node has, without touching the cache (serving another member)."""
        found, rest = {}, []
        for msg_id in ids:
            body = self._pending.get(msg_id)
            if body is None:
                rest.append(msg_id)
            else:
                found[msg_id] = body
        if rest:
            found.update(self._load(rest, repair=False))  # (the Raft thread: no fetch from here)
        return found

    def has(self, msg_id: int) -> bool:
        """Whether this node has an intact body for ``msg_id`` (a damaged one: no, fetch it)."""
        return msg_id in self._pending or msg_id in self.cache or self.store.get(msg_id) is not None

    # ------------------------------------------------------------------ snapshots and restart

    def checkpoint(self) -> None:
        """Before a snapshot is written: every pending body to disk, the deletes of the previous
        interval applied, one fsync.  Runs on the event loop at the snapshot marker, so that the
        snapshot's index and the bodies on disk agree."""
        self._write_pending(0)
        if self._deleted_before:
            self.stats.deleted += self.store.delete_many(self._deleted_before)
        self._deleted_before, self._deleted_now = self._deleted_now, []
        self.store.compact()
        self.store.sync()
        self.stats.checkpoints += 1

    def install(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Bodies fetched from another member after installing a snapshot: straight to disk."""
        items = list(items)
        n = self.store.put_many(items)
        self.store.sync()
        self.stats.fetched += n
        return n

    def sweep(self, live: set[int]) -> int:
        """Delete stored bodies no live message refers to: after a restart loaded a snapshot, the
        deletes that were waiting for a checkpoint when the node stopped.  Returns how many."""
        dead = [msg_id for msg_id in self.store.ids() if msg_id not in live and msg_id not in self._pending]
        if dead:
            self.stats.deleted += self.store.delete_many(dead)
        return len(dead)

    def after_install(self, live: dict[int, int], legacy: Iterable[tuple[int, bytes]] = ()) -> dict[int, int]:
        """The model was replaced by a snapshot (at start, or one from the leader): keep the bodies
        it refers to, forget the others, and return those still missing (id -> size), to fetch.

        ``legacy``: bodies carried by a snapshot of format 1 or 2.  Deletes waiting for a
        checkpoint are dropped: everything not live in the snapshot goes now, and entries after
        it that publish again put their bodies again."""
        keep = [(msg_id, body) for msg_id, body in self._pending.items() if msg_id in live]
        keep.extend((msg_id, body) for msg_id, body in legacy if msg_id in live)
        self._pending.clear()
        self.pending_bytes = 0
        self.cache.clear()
        self._deleted_now, self._deleted_before = [], []
        if keep:
            self.store.put_many(keep)
        self.sweep(set(live))
        self.store.sync()
        return {msg_id: live[msg_id] for msg_id in self.store.missing(live)}

    def clear(self) -> None:
        """Forget every body (a single node at start: its transient bodies did not survive)."""
        self.store.delete_many(self.store.ids())
        self._pending.clear()
        self.pending_bytes = 0
        self.cache.clear()
        self._deleted_now, self._deleted_before = [], []


class DictBodies:
    """Bodies in a dict: for a machine that carries its own effects out (``apply_batch``: tests,
    tools), where nothing is large and nothing must survive."""

    def __init__(self, fallback: Loader | None = None) -> None:
        self.bodies: dict[int, bytes] = {}
        self.fallback = fallback

    def put(self, puts: Iterable[tuple[int, BodySource]]) -> None:
        for msg_id, source in puts:
            body = self.get(source) if isinstance(source, int) else source
            if body is not None:  # a copy of a body this machine never had has none (as in Bodies.put)
                self.bodies[msg_id] = body

    def drop(self, deletes: Iterable[int]) -> None:
        for msg_id in deletes:
            self.bodies.pop(msg_id, None)

    def get(self, msg_id: int) -> bytes | None:
        body = self.bodies.get(msg_id)
        if body is None and self.fallback is not None:
            body = self.fallback([msg_id]).get(msg_id)
        return body

    def in_memory(self, msg_id: int) -> bool:
        return True

    def for_send(self, msg_id: int, following: Callable[[], Iterable[int]] | None = None,
                 qid: int | None = None) -> bytes | None:
        return self.get(msg_id)

    def read_ahead(self, ids: Iterable[int]) -> int:
        return 0


#: The ids a queue (by qid) delivers next, for read-ahead (store/ready_peek.next_ids).
Upcoming = Callable[[int], list[int]]

#: Whether the consumer ``(conn, channel, consumer tag)`` holds what it is assigned until it settles
#: it (manual ack, 0-10 explicit accept of acquired transfers, an unsettled 1.0 link): its deliveries
#: may get their bodies when they are sent.  See ``fill_bodies``.
Holds = Callable[[str, int, str], bool]

#: How many of a queue's next messages a delivery that missed the cache reads ahead.
READ_AHEAD = 64


def upcoming_ids(machine, n: int = READ_AHEAD) -> Upcoming:
    """``Upcoming`` for ``machine``'s queues (read outside apply, on the node's loop; the model's
    dicts are looked up at each call: installing a snapshot replaces them)."""

    def upcoming(qid: int) -> list[int]:
        queue = machine.queues_by_id.get(qid)
        return next_ids(queue.ready, n) if queue is not None else []

    return upcoming


def consumer_holds(machine) -> Holds:
    """``Holds`` for ``machine``'s consumers, read after the batch was applied.  A consumer gone by
    then (cancelled in the same batch) answers False: its deliveries get their bodies at once."""

    def holds(conn: str, number: int, tag: str) -> bool:
        ch = machine.channels.get(conn)
        ch = ch.get(number) if ch is not None else None
        consumer = ch.consumers.get(tag) if ch is not None else None
        return consumer is not None and not consumer.no_ack and not consumer.browse

    return holds


def fill_bodies(outputs: list, bodies: Bodies | DictBodies, upcoming: Upcoming | None = None,
                local: Callable[[str], bool] | None = None, holds: Holds | None = None) -> None:
    """Give the batch's deliveries, transfers and basic.get answers their bodies, in place -- or,
    with ``holds``, leave a delivery whose consumer holds its message to read its body when it is
    sent (``body_to_send``).

    The model holds no bodies: apply's outputs name the message, the node appends its body before
    a front end sees them (a delivery's tuple gets it as its last item, ``GotMessage.body``).
    Deliveries whose bodies are only on disk are read together, with the next ids of their queues
    (read-ahead), so that a consumer working through a backlog reads the store in batches.

    ``local`` (the connections of this node): every node applies every delivery, but only the
    node of its connection sends it; the others read no body for it.

    **Bodies when sent, not when assigned** (``holds`` given: the nodes' logs).  A consumer without
    a prefetch limit that attaches to a backlog is assigned all of it in one apply; most of those
    deliveries then wait on the node, parked behind a full socket (node/writeflow.py) or held
    beyond the client's window (node/amqp091/window.py, the 1.0 link's read-ahead).  Given their
    bodies here, they would read the whole backlog from disk into memory that nothing bounds
    or counts (+95 MB for a 64 MiB backlog in tests/integration/test_backpressure.py).  So:

    * a delivery whose consumer *holds* its message (``holds``: manual ack, 0-10 explicit accept,
      an unsettled 1.0 link) is left as apply made it, without a body item: ``(qid, seq,
      redelivered, Message)``, a transfer ``(transfer_id, qid, seq, redelivered, Message)``; the
      front end reads the body when it writes it (``body_to_send``).  That is safe because the
      unsettled delivery is itself a holder of the message (``Message.live``): its body is not
      deleted before the client settles it, and the client can only settle what it was sent
      (0-9-1 delivery tags and 1.0 delivery ids are given at send time).  What else releases an
      unsettled delivery also makes the front end drop it unsent: channel or connection close,
      basic.cancel and queue deletion (its consumer is cancelled, or for 0-10 its session's
      transfers are dropped with it), basic.recover.  Should a body be gone all the same (a 0-10
      client accepting transfer ids it has not received yet), ``body_to_send`` says None and the
      front end drops that delivery: its message no longer exists;
    * every other delivery gets its body here, as before: auto-ack (0-9-1 no-ack, 0-10
      accept-mode none, a pre-settled 1.0 link) and browse (0-10 not-acquired) deliveries do not
      hold their message, so its body is deleted after this batch's outputs (a single node's
      commit, right after this call, may delete a persistent message's record) or by another
      consumer's ack.  Parked, they count in the memory alarm (``Parking.owned_bytes``), as
      before; so do 0-10 replays and basic.get answers, which are sent at once.

    Misses of deliveries left to be read later are still read ahead here (at most ``READ_AHEAD``
    per queue, into the bounded cache, which the alarm counts), so that a consumer keeping up
    with a backlog on disk reads it in batches; the front ends read ahead the deliveries they
    hold or park when they send them (``Bodies.read_ahead``)."""
    indexes: Sequence[int]
    if local is not None:
        indexes = [i for i, out in enumerate(outputs) if local(out[0])]
    else:
        indexes = range(len(outputs))
    missing: list[int] = []
    qids: list[int] = []
    fill: list[int] = []  # indexes of the outputs given their bodies now
    lazy_misses: dict[int, int] = {}  # qid -> misses of deliveries to be read later, read ahead
    in_memory = bodies.in_memory
    last_key = None  # (conn, channel, tag) of the last delivery: its consumer's answer, memoized
    later = False
    for i in indexes:
        out = outputs[i]
        kind = out[1]
        if kind == OUT_DELIVER:
            message, qid = out[4][3], out[4][0]
        elif kind == OUT_TRANSFER:
            message, qid = out[4][4], out[4][1]
        else:
            if kind == OUT_REPLY:
                fill.append(i)
            continue
        if holds is not None and (last_key is None or out[3] != last_key[2] or out[0] != last_key[0]
                                  or out[2] != last_key[1]):
            last_key = (out[0], out[2], out[3])
            later = holds(out[0], out[2], out[3])
        if not later:
            fill.append(i)
        msg_id = message.id
        if not in_memory(msg_id):
            if later:
                n = lazy_misses.get(qid, 0)
                if n >= READ_AHEAD:
                    continue
                lazy_misses[qid] = n + 1
            missing.append(msg_id)
            qids.append(qid)
    if missing:
        if upcoming is not None:
            for qid in dict.fromkeys(qids):
                missing.extend(upcoming(qid))
        bodies.read_ahead(missing)
    get = bodies.get
    refused: set[int] = set()  # indexes of outputs not sent: their bodies are damaged, not repaired

    def body_of(msg_id: int, qid: int | None) -> bytes | None:
        body = get(msg_id)
        if body is not None:
            return body
        if isinstance(bodies, Bodies) and bodies.refused(msg_id, qid):
            return None
        return _lost(bodies, msg_id)

    for i in fill:
        out = outputs[i]
        kind = out[1]
        if kind == OUT_DELIVER:
            delivery = out[4]
            body = body_of(delivery[3].id, delivery[0])
            if body is None:
                refused.add(i)
                continue
            outputs[i] = (out[0], kind, out[2], out[3], (*delivery, body))
        elif kind == OUT_TRANSFER:
            transfer = out[4]
            body = body_of(transfer[4].id, transfer[1])
            if body is None:
                refused.add(i)
                continue
            outputs[i] = (out[0], kind, out[2], out[3], (*transfer, body))
        else:
            result = out[3]
            if result.__class__ is Ok:
                value = result[1]
                echo = value.__class__ is GroupEcho and value.result[0] == OK
                if echo:
                    # Issue 34: a 0-10 resume answered once the session's transaction across groups
                    # ended (store/core/tx_groups.py): its replay needs its bodies as a direct one.
                    value = value.result[1]
                if value.__class__ is GotMessage and not echo:
                    body = body_of(value.message.id, value.qid)
                    # Refused: answered as an empty queue (a get with ack leaves it held unsent).
                    value = value._replace(body=body) if body is not None else None
                elif value.__class__ is SessionAttached and value.replay:
                    # (transfer_id, destination, qid, seq, Message) -> (..., Message, body)
                    replay = [(*r, body_of(r[4].id, r[2])) for r in value.replay]
                    value = value._replace(replay=[r for r in replay if r[5] is not None])
                else:
                    continue
                if echo:
                    value = GroupEcho(Ok(OK, value))
                outputs[i] = (out[0], kind, out[2], Ok(OK, value), out[4])
    if refused:
        outputs[:] = [out for i, out in enumerate(outputs) if i not in refused]


def body_to_send(bodies: Bodies | DictBodies, message, carried: tuple, at: int,
                 following: Callable[[], Iterable[int]] | None = None, qid: int | None = None) -> bytes | None:
    """The body of a delivery the front end writes now: ``carried[at]`` if ``fill_bodies`` gave it
    one, else read from the node's bodies (``following``: the ids the front end will send next, read
    ahead together when this one is only on disk).  None: the message is gone (see
    ``fill_bodies``), or its body is damaged and could not be repaired (``Bodies.for_send``); the
    caller drops the delivery unsent (``qid`` names its queue in the log)."""
    if len(carried) > at:
        return carried[at]
    return bodies.for_send(message.id, following, qid)


def _lost(bodies: Bodies | DictBodies, msg_id: int) -> bytes:
    """A delivery whose body this node does not have: a bug or a lost body store, never expected
    (a node that installed a snapshot fetches every body it lacks before applying more)."""
    if isinstance(bodies, Bodies):
        bodies.stats.lost += 1
    log.error("message %d has no body on this node: delivered empty", msg_id)
    return b""
