"""Exchange-level deduplication: the ``x-message-deduplication`` exchange's cache (issue 21).

Compatible with the rabbitmq-message-deduplication plugin's exchange interface: ``x-cache-size``
(required, > 0) bounds the cache, ``x-cache-ttl`` (optional, ms) how long a header value is
remembered, and a message's own ``x-cache-ttl`` header overrides it for that message.  A message whose
``x-deduplication-header`` value is in the cache is not routed (the plugin's ``route/2`` returns no
queue: a mandatory publish gets basic.return, a confirm-mode publisher basic.ack); otherwise its value
is cached, whether or not any queue is bound, and it is routed to every binding.  A message without
the header is routed and not cached.  When the cache is full the oldest entry leaves first.

The cache is a ``DedupCache`` (store/core/dedup.py) in ``StateMachine.exchange_caches``: replicated state,
changed only in apply with leader-stamped time, carried in snapshots and covered by the digest.
Like the plugin's default ``x-cache-persistence: memory`` it is not kept in the single-node LMDB
store: a restart of a single node starts it empty (a cluster keeps it through its snapshots).
"""

from __future__ import annotations

from .dedup import DedupCache, dedup_key
from .exchange_types import positive_int
from .message import headers_of
from .model import Exchange

CACHE_TTL = "x-cache-ttl"


def new_cache(exchange: Exchange) -> DedupCache:
    args = exchange.arguments
    ttl = positive_int(args.get(CACHE_TTL))
    return DedupCache(positive_int(args.get("x-cache-size")) or 1, ttl * 1000 if ttl is not None else None)


def is_duplicate(cache: DedupCache, properties: bytes, format: int, message_id: int, now: int) -> bool:
    """True if the message is a duplicate (not to be routed); else its header value, if any, is
    remembered from ``now`` on."""
    key = dedup_key(properties, format)
    if key is None:
        return False
    if cache.seen(key, now):
        return True
    ttl = None
    if CACHE_TTL.encode() in properties:
        ms = positive_int(headers_of(properties, format).get(CACHE_TTL))
        ttl = ms * 1000 if ms is not None else None
    cache.add(key, message_id, now, None, ttl=ttl)
    return False
