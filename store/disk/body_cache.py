"""A bounded cache of message bodies, with read-ahead for consumers reading a queue in order.

The memory a node spends on bodies must be set by configuration, not by the backlog (issue 18):
``limit`` bytes at most, always (a body larger than the limit is never cached).  Least recently
used bodies go first.

Two admission rules make a backlog cheap to consume:

* ``admit`` (a body a single node has just committed in its durable store) never evicts: it
  takes only free room.  A cluster node's write-behind does not admit what it writes: the
  cache is for what consumers read next.
* ``read_ahead`` (the next ids of a queue, in delivery order) loads the missing ones from the
  store in one transaction, in key order (ids grow with publication), evicting older entries,
  but stops when the cache is full of entries it has itself just brought in: reading further
  ahead would push out what the consumer needs first.

``bytes`` is what the memory alarm counts for bodies (node/broker.py memory_held).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

#: Reads many bodies at once (``BodyStore.get_many`` or anything with its contract).
Loader = Callable[[Iterable[int]], dict[int, bytes]]


class BodyCache:
    __slots__ = ("limit", "_load", "_entries", "bytes", "hits", "misses", "loaded", "evicted")

    def __init__(self, limit: int, load: Loader) -> None:
        self.limit = limit
        self._load = load
        self._entries: OrderedDict[int, bytes] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.hits = 0  # get() answered from memory
        self.misses = 0  # get() that had to read the store
        self.loaded = 0  # bodies read from the store (misses and read-ahead)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, msg_id: int) -> bool:
        return msg_id in self._entries

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0

    def get(self, msg_id: int) -> bytes | None:
        """The body of ``msg_id`` (None if the store has none); a miss reads it and caches it."""
        body = self._entries.get(msg_id)
        if body is not None:
            self._entries.move_to_end(msg_id)
            self.hits += 1
            return body
        self.misses += 1
        body = self._load((msg_id,)).get(msg_id)
        if body is not None:
            self.loaded += 1
            self._insert(msg_id, body)
        return body

    def admit(self, msg_id: int, body: bytes) -> bool:
        """Cache a body just published if it fits in the free room (no eviction)."""
        if msg_id in self._entries or self.bytes + len(body) > self.limit:
            return False
        self._entries[msg_id] = body
        self.bytes += len(body)
        return True

    def read_ahead(self, ids: Iterable[int]) -> int:
        """Bring the bodies of ``ids`` (next in delivery order) in; returns how many were loaded.

        Already cached ids are refreshed (they are about to be used), missing ones read from the
        store in one call.  Stops at the first id that would have to evict a body this call brought
        in or refreshed."""
        wanted: dict[int, None] = {}  # (ordered, without repeats)
        refreshed = 0
        for msg_id in ids:
            if msg_id in self._entries:
                self._entries.move_to_end(msg_id)
                refreshed += 1
            else:
                wanted[msg_id] = None
        if not wanted:
            return 0
        found = self._load(wanted)
        evictable = len(self._entries) - refreshed  # entries older than this call's
        loaded = 0
        for msg_id in wanted:
            body = found.get(msg_id)
            if body is None:
                continue
            size = len(body)
            if size > self.limit:
                continue
            # Room is made from the least recently used entries that predate this call only.
            while self.bytes + size > self.limit and evictable > 0:
                self._evict_oldest()
                evictable -= 1
            if self.bytes + size > self.limit:
                break
            self._entries[msg_id] = body
            self.bytes += size
            loaded += 1
        self.loaded += loaded
        return loaded

    def take(self, msg_id: int) -> bytes | None:
        """The body of ``msg_id`` if cached, leaving the cache (a body read for one send only: the
        main process's copies of queue groups' bodies, node/group_bodies.py); no store read."""
        body = self._entries.pop(msg_id, None)
        if body is not None:
            self.bytes -= len(body)
            self.hits += 1
        return body

    def discard(self, msg_id: int) -> None:
        """Forget a body (its message was acked, dropped or deleted)."""
        body = self._entries.pop(msg_id, None)
        if body is not None:
            self.bytes -= len(body)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _insert(self, msg_id: int, body: bytes) -> None:
        size = len(body)
        if size > self.limit:
            return
        while self.bytes + size > self.limit:
            self._evict_oldest()
        self._entries[msg_id] = body
        self.bytes += size

    def _evict_oldest(self) -> None:
        _, body = self._entries.popitem(last=False)
        self.bytes -= len(body)
        self.evicted += 1
