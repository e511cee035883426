"""Queue-level publisher deduplication: the cache of ``x-deduplication-header`` values a queue has seen.

Compatible with the queue interface of the rabbitmq-message-deduplication plugin (queue argument
``x-message-deduplication: true``, message header ``x-deduplication-header``): a message whose header
value is in the queue's cache is not enqueued again, and its publisher is still confirmed.  The cache
is replicated state like the rest of the model: it changes only inside ``StateMachine.apply``, by
leader-stamped time, in a deterministic order (an insertion-ordered ``OrderedDict``), and it travels
in snapshots (it hangs off its ``Queue``) and is covered by the digest.

Two lifetimes for an entry (docs/design.md, "Publisher deduplication"):

* without ``x-cache-ttl`` (the plugin's queue-level rule): an entry lives while its message is in the
  queue -- ready or delivered and not yet settled -- and leaves when the message does (acked,
  auto-ack delivered, rejected, dead-lettered, expired, dropped by a length limit, purged);
* with ``x-cache-ttl`` (ms; a raftmq extension, the plugin has it for exchanges only): an entry lives
  that long after it was inserted, whether or not its message was consumed meanwhile, so that a
  resend after a lost confirm is dropped even when the first copy has already been consumed.

Either way ``x-cache-size`` bounds the number of entries (``DEFAULT_CACHE_SIZE`` if not given); when
full, the oldest entry is evicted first (the plugin evicts an unspecified one: Mnesia's first key).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .message import headers_of

HEADER = "x-deduplication-header"
_HEADER_BYTES = HEADER.encode()
DEFAULT_CACHE_SIZE = 100_000  # entries per queue when x-cache-size is not given
MAX_CACHE_SIZE = 10_000_000  # a larger x-cache-size is refused (406): every replica holds the cache


def dedup_key(properties: bytes, format: int = 0) -> object | None:
    """The cache key of a message's ``x-deduplication-header``, or None (not deduplicated).

    A string and the same bytes are one key (the plugin compares Erlang binaries); other scalars keep
    their type (``1``, ``True`` and ``"1"`` are three keys).  A missing or void header, a list or a
    table is not deduplicated (the plugin ignores list and table values too).
    """
    if _HEADER_BYTES not in properties:
        return None  # the common case, without decoding anything
    headers = headers_of(properties, format)
    if HEADER not in headers:
        return None
    value = headers[HEADER]
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return ("x", bytes(value))
    if isinstance(value, bool):
        return ("t", value)
    if isinstance(value, int):
        return ("i", int(value))
    if isinstance(value, float):
        return ("f", value)
    if value is None or isinstance(value, (list, tuple, dict)):
        return None
    return ("s", str(value))  # decimal.Decimal


@dataclass(slots=True, eq=False)
class DedupCache:
    """One queue's deduplication cache.

    ``entries`` maps a key to ``(valid_until, message_id)``: the key counts as seen while the batch
    time is below ``valid_until`` (None: no time limit).  ``owners`` (message id -> key) is the
    reverse index of ``entries`` when entries follow their messages (``ttl`` None), so that a message
    leaving the queue forgets its key without decoding its headers again.
    """

    size: int = DEFAULT_CACHE_SIZE
    ttl: int | None = None  # microseconds; None: an entry lives as long as its message is queued
    entries: OrderedDict = field(default_factory=OrderedDict)
    owners: dict[int, object] = field(default_factory=dict)

    def seen(self, key: object, now: int) -> bool:
        """True if ``key`` is in the cache at time ``now`` (an expired entry is removed here)."""
        item = self.entries.get(key)
        if item is None:
            return False
        until = item[0]
        if until is None or now < until:
            return True
        self._remove(key, item[1])
        return False

    def add(self, key: object, message_id: int, now: int, expires_at: int | None,
            ttl: int | None = None) -> None:
        """Record ``key`` for a message just enqueued (``expires_at``: the message's own expiry, if
        any; an entry that follows its message ends with it).  ``ttl`` (microseconds) overrides the
        cache's for this entry: an exchange's per-message ``x-cache-ttl`` (store/core/exchange_dedup.py);
        entries of mixed lifetimes are then removed when found expired, not only from the front."""
        entries = self.entries
        if ttl is None:
            ttl = self.ttl
        until: int | None
        if ttl is not None:
            until = now + ttl
            # Same TTL for every entry and a time that never goes back: the oldest expire first.
            while entries:
                first, (first_until, first_id) = next(iter(entries.items()))
                if first_until is None or first_until > now:
                    break
                self._remove(first, first_id)
        else:
            until = expires_at + 1 if expires_at is not None else None  # expiry is strictly after
        old = entries.pop(key, None)  # an expired leftover of the same key
        if old is not None:
            self.owners.pop(old[1], None)
        while len(entries) >= self.size:
            evicted, (_until, evicted_id) = entries.popitem(last=False)
            self.owners.pop(evicted_id, None)
        entries[key] = (until, message_id)
        if self.ttl is None:
            self.owners[message_id] = key

    def forget(self, message_id: int) -> None:
        """The message left the queue: its key leaves the cache (entries without a TTL only)."""
        key = self.owners.pop(message_id, None)
        if key is not None:
            item = self.entries.get(key)
            if item is not None and item[1] == message_id:
                del self.entries[key]

    def _remove(self, key: object, message_id: int) -> None:
        del self.entries[key]
        self.owners.pop(message_id, None)
