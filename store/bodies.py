"""The node's message bodies: write-behind to the body store, a bounded cache, deletes deferred
to the snapshot after next (issue 18; docs/design.md "Message bodies on disk").

``StateMachine.apply`` would record, as effects (``BodyEffects``), the bodies of messages that
became live in a batch and the ids whose last reference went; the node carries them out here after
the batch is applied, on every node.  Three rules keep this cheap and safe:

* **Write-behind.** A body waits in memory (``pending``) and is written to LMDB only when pending
  holds more than ``write_behind_bytes`` (oldest first) or at a checkpoint.  A body acked before
  that is never written at all -- the common case while consumers keep up, so a broker without a
  backlog pays no second disk write per message.  The Raft journal is the durable copy meanwhile.
* **A checkpoint before every snapshot** (``checkpoint``): pending bodies go to disk and are
  fsynced before the snapshot is written, because the journal records holding them may be deleted
  once the snapshot exists.
* **Deletes wait one snapshot interval.**  A body deleted after checkpoint k is removed from disk at
  checkpoint k+1.  Until then a restart (snapshot k, then the journal's suffix replayed) finds every
  body snapshot k refers to, and a follower installing snapshot k can still fetch it from this
  node (``store/body_fetch.py``).  A delete of a body still pending just drops it.

What the node holds for bodies (the memory alarm): ``held_bytes`` = cached + pending.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .body_cache import BodyCache
from .body_store import BodyStore


@dataclass(slots=True)
class BodyEffects:
    """The body side of one applied batch, in apply order."""

    puts: list[tuple[int, bytes]] = field(default_factory=list)  # (message id, body): became live
    deletes: list[int] = field(default_factory=list)  # message ids whose last reference went


@dataclass(slots=True)
class BodyStats:
    written: int = 0  # bodies written to LMDB
    cancelled: int = 0  # bodies acked while pending: never written
    deleted: int = 0  # bodies removed from LMDB
    checkpoints: int = 0


class Bodies:
    def __init__(self, store: BodyStore, cache_bytes: int, write_behind_bytes: int = 16 << 20) -> None:
        self.store = store
        self.cache = BodyCache(cache_bytes, store.get_many)
        self.write_behind_bytes = write_behind_bytes
        self._pending: OrderedDict[int, bytes] = OrderedDict()  # oldest first
        self.pending_bytes = 0
        self._deleted_now: list[int] = []  # deleted since the last checkpoint (on disk)
        self._deleted_before: list[int] = []  # deleted between the last two checkpoints
        self.stats = BodyStats()

    @property
    def held_bytes(self) -> int:
        """Body bytes this node holds in memory: what the memory alarm should count for bodies."""
        return self.cache.bytes + self.pending_bytes

    # ------------------------------------------------------------------ effects of apply

    def carry_out(self, effects: BodyEffects) -> None:
        """One batch's body effects, after apply (on the event loop, no fsync)."""
        pending = self._pending
        for msg_id, body in effects.puts:
            if msg_id not in pending:
                pending[msg_id] = body
                self.pending_bytes += len(body)
        for msg_id in effects.deletes:
            body = pending.pop(msg_id, None)
            if body is not None:
                self.pending_bytes -= len(body)
                self.stats.cancelled += 1
            else:
                self.cache.discard(msg_id)
                self._deleted_now.append(msg_id)
        if self.pending_bytes > self.write_behind_bytes:
            self._write_pending(self.write_behind_bytes // 2)

    def _write_pending(self, keep_bytes: int) -> None:
        """Write the oldest pending bodies until at most ``keep_bytes`` remain pending; those
        written enter the cache if it has free room (they are the oldest: consumed first)."""
        pending, out = self._pending, []
        while pending and self.pending_bytes > keep_bytes:
            msg_id, body = pending.popitem(last=False)
            self.pending_bytes -= len(body)
            out.append((msg_id, body))
        if out:
            self.store.put_many(out)
            self.stats.written += len(out)
            for msg_id, body in out:
                self.cache.admit(msg_id, body)

    # ------------------------------------------------------------------ reads (deliveries)

    def get(self, msg_id: int) -> bytes | None:
        body = self._pending.get(msg_id)
        if body is not None:
            return body
        return self.cache.get(msg_id)

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
            found.update(self.store.get_many(rest))
        return found

    def has(self, msg_id: int) -> bool:
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
        self.store.sync()
        self.stats.checkpoints += 1

    def install(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Bodies fetched from another member after installing a snapshot: straight to disk."""
        items = list(items)
        n = self.store.put_many(items)
        self.store.sync()
        return n

    def sweep(self, live: set[int]) -> int:
        """After a restart (snapshot + journal replay): delete stored bodies no live message refers
        to (deletes that were waiting for a checkpoint when the node stopped).  Returns how many."""
        dead = [msg_id for msg_id in self.store.ids() if msg_id not in live and msg_id not in self._pending]
        if dead:
            self.stats.deleted += self.store.delete_many(dead)
        return len(dead)
