"""In-memory broker state: the entities the state machine mutates.

Memory is the working copy; durable parts (durable exchanges/queues/bindings, persistent messages in
durable queues) are mirrored into LMDB by the state machine in the same apply. Nothing here reads a
clock: times are integer microseconds carried in by commands.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .dedup import DedupCache
from .entries import LEGACY_BODIES as LEGACY_BODIES  # re-exported, as Entry and Message (entries.py)
from .entries import Entry, Message
from .exchange_types import routing_type
from .frozen import FrozenRun
from .routing import MATCHERS, Binding

if TYPE_CHECKING:
    from .filters import SubscriptionFilter


def _body_size(message: Message) -> int:
    return message.size


#: The byte credit (AMQP 0-10 message.flow unit byte) one transfer of a message takes: its header
#: segment as the 0-10 front end sends it plus its body (message.set-flow-mode rule byte-accounting).
#: The headers are the front end's encoding, so protocol/amqp010/neutral.transfer_credit is
#: registered by node/core/formats.py with the property codecs (every node runs the same code);
#: the body alone until then.  Read only for a consumer with finite byte credit.
transfer_credit: Callable[[Message], int] = _body_size


def register_transfer_credit(size: Callable[[Message], int]) -> None:
    global transfer_credit
    transfer_credit = size


_NO_LIMIT = 1 << 62  # Consumer.room() of a consumer without any limit


def _seq_of(entry: Entry | FrozenRun) -> int:
    return entry.seq


#: Entries a ready list level freezes at once into a FrozenRun (store/core/frozen.py), once the list
#: holds more than four times as many.
FREEZE_BATCH = 4096


def _expanded(level: deque) -> list[Entry]:
    out: list[Entry] = []
    for item in level:
        if item.__class__ is FrozenRun:
            out.extend(item.thaw())
        else:
            out.append(item)
    return out


class ReadyList:
    """Ready entries of one queue, highest priority first, then by sequence.

    New entries arrive in sequence order (a deque); requeued entries go back to their original
    position (a heap by sequence), as 0-9-1 basic.reject/recover ask ("as close as possible to
    its original position").
    """

    __slots__ = ("_levels", "_returned", "_count", "_plain")

    def __init__(self, max_priority: int = 0) -> None:
        # A level's deque holds Entry objects and, deep in a long queue, FrozenRuns of them
        # (store/core/frozen.py), thawed when the head reaches them.
        self._levels: list[deque[Entry | FrozenRun]] = [deque() for _ in range(max_priority + 1)]
        self._returned: list[list[tuple[int, Entry]]] = [[] for _ in range(max_priority + 1)]
        self._count = 0
        self._plain = [0] * (max_priority + 1)  # entries appended to each level since it last froze

    def __setstate__(self, state: tuple) -> None:
        """Unpickle (snapshot formats 1 and 2, and pickled ready lists in tests): no ``_plain``."""
        _no_dict, slots = state
        for name, value in slots.items():
            setattr(self, name, value)
        self._plain = [0] * len(self._levels)

    def __len__(self) -> int:
        return self._count

    def append(self, entry: Entry) -> None:
        level = entry.priority
        plain = self._plain[level]
        if plain >= FREEZE_BATCH and self._count >= 4 * FREEZE_BATCH:
            # Before ``entry`` goes in, not after: the entries being frozen must be ones whose
            # holders are all counted, and ``entry``'s are not yet (see _freeze).
            self._freeze(level)
            plain = self._plain[level]
        self._levels[level].append(entry)
        self._count += 1
        self._plain[level] = plain + 1

    def _freeze(self, level: int) -> None:
        """The newest FREEZE_BATCH entries of a level become one FrozenRun, if they all can.

        Called by ``append`` before it adds its entry, never with that entry in the batch: while a
        message is being routed, its ``live`` counts the routing's own hold (Delivery.publish,
        Expiry.dead_letter, a delayed release) and the queues it was added to so far, and a queue's
        count is added after its ``append`` -- so the entry being appended has ``live == 1`` even
        when the message goes on to other queues.  Frozen then, it was thawed later as a message of
        its own: the other queues' copy kept the body's count up while the thawed one released it,
        so the body was deleted under them, and a durable one's LMDB record with it (``refs``, also
        counted after ``append``, was frozen as 0).  Found by hypothesis (test_determinism, runs of
        2): a fanout message in a queue deep enough to freeze.  The entries already in the list
        were counted by their own ``enqueue`` (a message still being routed has its routing hold
        on top, so ``live > 1`` and it is not frozen)."""
        self._plain[level] = 0
        fresh = self._levels[level]
        if len(fresh) < FREEZE_BATCH:
            # Entries of this level were popped since they were counted (a high priority level is
            # consumed first): fewer than a batch are left.  Found by hypothesis
            # (test_ready_peek), an IndexError in apply before.
            self._plain[level] = len(fresh)
            return
        batch = [fresh.pop() for _ in range(FREEZE_BATCH)]
        batch.reverse()
        run = FrozenRun.freeze(batch, level)  # None if an item is not a plain Entry (a run among them)
        if run is None:
            fresh.extend(batch)
        else:
            fresh.append(run)

    @staticmethod
    def _thaw_at(fresh: deque, i: int) -> None:
        """Replace the FrozenRun at position ``i`` by its entries."""
        fresh.rotate(-i)
        run = fresh.popleft()
        fresh.extendleft(reversed(run.thaw()))
        fresh.rotate(i)

    @staticmethod
    def _head(fresh: deque[Entry | FrozenRun]) -> Entry:
        head = fresh[0]
        if isinstance(head, FrozenRun):
            fresh.popleft()
            entries = head.thaw()
            fresh.extendleft(reversed(entries))
            return entries[0]
        return head

    def requeue(self, entry: Entry) -> None:
        heapq.heappush(self._returned[entry.priority], (entry.seq, entry))
        self._count += 1

    def peek(self) -> Entry | None:
        for level in range(len(self._levels) - 1, -1, -1):
            fresh, returned = self._levels[level], self._returned[level]
            if returned and (not fresh or returned[0][0] < fresh[0].seq):
                return returned[0][1]
            if fresh:
                return self._head(fresh)
        return None

    def pop(self) -> Entry | None:
        for level in range(len(self._levels) - 1, -1, -1):
            fresh, returned = self._levels[level], self._returned[level]
            if returned and (not fresh or returned[0][0] < fresh[0].seq):
                self._count -= 1
                return heapq.heappop(returned)[1]
            if fresh:
                self._count -= 1
                if fresh[0].__class__ is FrozenRun:
                    self._head(fresh)
                entry = fresh.popleft()
                if TYPE_CHECKING:  # an Entry: _head thawed a run at the head (no check at run time)
                    assert isinstance(entry, Entry)
                return entry
        return None

    def pop_oldest(self) -> Entry | None:
        """The entry with the lowest sequence regardless of priority (x-max-length drop-head)."""
        best_level, best_seq = -1, None
        for level in range(len(self._levels)):
            fresh, returned = self._levels[level], self._returned[level]
            for seq in (fresh[0].seq if fresh else None, returned[0][0] if returned else None):
                if seq is not None and (best_seq is None or seq < best_seq):
                    best_level, best_seq = level, seq
        if best_seq is None:
            return None
        fresh, returned = self._levels[best_level], self._returned[best_level]
        self._count -= 1
        if fresh and fresh[0].seq == best_seq:
            entry = self._head(fresh)
            fresh.popleft()
            return entry
        return heapq.heappop(returned)[1]

    def next_after(self, seq: int) -> Entry | None:
        """The entry with the lowest sequence above ``seq``, without taking it (0-10 browsing)."""
        best = None
        for fresh, returned in zip(self._levels, self._returned, strict=True):
            i = bisect_right(fresh, seq, key=_seq_of)
            if i > 0 and (before := fresh[i - 1]).__class__ is FrozenRun and before.last_seq > seq:
                self._thaw_at(fresh, i - 1)  # the next entry is inside that run
                i = bisect_right(fresh, seq, key=_seq_of)
            if i < len(fresh) and fresh[i].__class__ is FrozenRun:
                self._thaw_at(fresh, i)
            if i < len(fresh) and (best is None or fresh[i].seq < best.seq):
                item = fresh[i]
                if isinstance(item, Entry):  # always: a run there was thawed just above
                    best = item
            for item_seq, entry in returned:
                if item_seq > seq and (best is None or item_seq < best.seq):
                    best = entry
        return best

    def remove_seq(self, seq: int) -> Entry | None:
        """Take the entry with sequence ``seq`` out of the list, wherever it is (0-10 message.acquire)."""
        for fresh, returned in zip(self._levels, self._returned, strict=True):
            i = bisect_right(fresh, seq, key=_seq_of) - 1
            if i >= 0 and isinstance(run := fresh[i], FrozenRun) and seq <= run.last_seq:
                self._thaw_at(fresh, i)
                i = bisect_right(fresh, seq, key=_seq_of) - 1
            if i >= 0 and isinstance(entry := fresh[i], Entry) and entry.seq == seq:
                del fresh[i]
                self._count -= 1
                return entry
            for k, (item_seq, entry) in enumerate(returned):
                if item_seq == seq:
                    returned[k] = returned[-1]
                    returned.pop()
                    heapq.heapify(returned)
                    self._count -= 1
                    return entry
        return None

    def take_all(self) -> list[Entry]:
        """Remove every entry; they come back in delivery order (a queue being deleted)."""
        if len(self._levels) == 1 and not self._returned[0]:
            entries = _expanded(self._levels[0])
            self._levels[0].clear()
            self._count = 0
            return entries
        return list(self.drain())

    def entries(self) -> Iterator[Entry]:
        """Every entry, without taking any (not in delivery order: fresh ones level by level,
        then the requeued ones)."""
        for level in self._levels:
            yield from _expanded(level)
        for returned in self._returned:
            for _seq, entry in returned:
                yield entry

    def id_sizes(self) -> Iterator[tuple[int, int]]:
        """(message id, body size) of every entry, frozen ones without thawing them."""
        for level in self._levels:
            for item in level:
                if isinstance(item, FrozenRun):
                    yield from item.id_sizes()
                else:
                    yield item.message.id, item.message.size
        for returned in self._returned:
            for _seq, entry in returned:
                yield entry.message.id, entry.message.size

    def fresh_seq_ids(self, level: int) -> Iterator[tuple[int, int]]:
        """(seq, message id) of a level's fresh entries in order, frozen ones without thawing."""
        for item in self._levels[level]:
            if isinstance(item, FrozenRun):
                yield from item.seq_ids()
            else:
                yield item.seq, item.message.id

    def drain(self) -> Iterator[Entry]:
        """Remove and yield every entry in delivery order."""
        while True:
            entry = self.pop()
            if entry is None:
                return
            yield entry


@dataclass(slots=True, eq=False)
class ChannelState:
    conn: str | None  # None while a detached 0-10 session waits out its timeout (sessions.py)
    number: int
    prefetch_count: int = 0  # channel-wide limit (basic.qos global=true)
    consumer_prefetch: int = 0  # limit for consumers created after basic.qos global=false
    unacked: dict[tuple[int, int], tuple[Queue, Entry]] = field(default_factory=dict)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    active: bool = True  # channel.flow
    next_tag: int = 0  # for server-generated consumer tags
    session: Session | None = None  # set for an AMQP 0-10 session's channel state (sessions.py)


@dataclass(slots=True, eq=False)
class Consumer:
    channel: ChannelState
    tag: str
    queue: Queue
    no_ack: bool
    exclusive: bool
    prefetch: int
    unacked: int = 0

    # AMQP 0-10 subscriptions: explicit message/byte credit (None = unlimited, the 0-9-1 case).
    credit_messages: int | None = None
    credit_bytes: int | None = None
    window_mode: bool = False
    browse: bool = False  # 0-10 acquire-mode not-acquired: sees messages without taking them
    cursor: int = 0  # browsing: the sequence of the last message seen
    # Issue 37 (added after snapshot format 4: ``__setstate__`` gives older consumers these defaults).
    filter: SubscriptionFilter | None = None  # store/filters: only messages it matches (1.0 source filter)
    scan_cursor: int = 0  # filtered: every ready entry up to this sequence is known not to match

    def __setstate__(self, state: tuple) -> None:
        """Unpickle a consumer, the fields a snapshot predates taking their defaults."""
        slots = state[1] if isinstance(state, tuple) else state
        self.filter = None
        self.scan_cursor = 0
        for name, value in slots.items():
            setattr(self, name, value)

    def has_credit(self) -> bool:
        return self.room() > 0

    def fits(self, entry: Entry | None) -> bool:
        """0-10 byte credit covers the whole message: message.set-flow-mode (L6097ff) "if there is
        not enough byte credit available to send a complete message, the sender must either wait
        or use message fragmentation" (we wait)."""
        limit = self.credit_bytes
        return entry is None or limit is None or limit >= 0xFFFFFFFF or transfer_credit(entry.message) <= limit

    def room(self) -> int:
        """How many messages this consumer may be given now, one after another (0 or less: none).

        Byte credit (AMQP 0-10) depends on each message's size, so with byte credit the answer is
        at most 1 and the caller asks again after each delivery.  The dispatcher delivers up to
        this many in a row instead of re-checking every limit before every message.
        """
        ch = self.channel
        if not ch.active:
            return 0
        if self.credit_bytes is not None:
            if self.credit_bytes <= 0:
                return 0
            room = 1
        else:
            room = _NO_LIMIT
        if self.prefetch and self.prefetch - self.unacked < room:
            room = self.prefetch - self.unacked
        if ch.prefetch_count and ch.prefetch_count - len(ch.unacked) < room:
            room = ch.prefetch_count - len(ch.unacked)
        if self.credit_messages is not None and self.credit_messages < room:
            room = self.credit_messages
        return room


@dataclass(slots=True, eq=False)
class Queue:
    qid: int
    vhost: str
    name: str
    durable: bool
    exclusive_owner: str | None
    auto_delete: bool
    arguments: dict
    message_ttl: int | None = None  # milliseconds
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    max_priority: int = 0
    ready: ReadyList = field(default_factory=ReadyList)
    ready_bytes: int = 0
    consumers: list[Consumer] = field(default_factory=list)
    browsers: list[Consumer] = field(default_factory=list)  # 0-10 not-acquired subscriptions
    next_consumer: int = 0  # round-robin position
    had_consumers: bool = False
    next_seq: int = 1
    unacked_count: int = 0
    # Added after snapshot format 1: ``__setstate__`` gives them their defaults when an older
    # snapshot is loaded (tests/unit/store/test_versions.py).
    delivery_limit: int | None = None  # x-delivery-limit: returns allowed before dead-lettering
    delivery_header: bool = False  # redeliveries carry x-delivery-count (as quorum queues do)
    dedup: DedupCache | None = None  # x-message-deduplication (store/core/dedup.py)
    selective: list[Consumer] = field(default_factory=list)  # consumers with a filter (also in consumers)
    no_local: bool = False  # Qpid's no-local argument (store/core/queue_args.py NO_LOCAL)
    # The group whose log holds the queue's messages (issue 34, store/core/groups.py).  In every
    # other group the queue is a *stub*: its name, arguments and bindings, for routing, no messages.
    group: int = 0

    def __setstate__(self, state: tuple) -> None:
        """Unpickle a queue, the fields a snapshot predates taking their defaults."""
        slots = state[1] if isinstance(state, tuple) else state
        if "selective" not in slots:
            object.__setattr__(self, "selective", [])
        for name, default in _QUEUE_ADDED_FIELDS:
            if name not in slots:
                object.__setattr__(self, name, default)
        for name, value in slots.items():
            object.__setattr__(self, name, value)


_QUEUE_ADDED_FIELDS = (("delivery_limit", None), ("delivery_header", False), ("dedup", None), ("no_local", False),
                       ("group", 0))


@dataclass(slots=True, eq=False)
class Exchange:
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict
    bindings: list[Binding] = field(default_factory=list)
    matcher: object = None

    def __post_init__(self) -> None:
        self.rebuild()

    @property
    def alternate_exchange(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return value if isinstance(value, str) else None

    def rebuild(self) -> None:
        self.matcher = MATCHERS[routing_type(self.type, self.arguments)](self.bindings)

    def find_binding(self, wanted: Binding) -> int:
        for i, b in enumerate(self.bindings):
            if b.same_as(wanted):
                return i
        return -1


@dataclass(slots=True, eq=False)
class Session:
    """An AMQP 0-10 session's replicated state: what a client needs to resume it on any node.

    ``completed`` is the idempotence barrier for the client's commands (ids executed here and not
    yet known-completed by the client); ``transfers`` maps the ids of message.transfer commands sent
    to the client to the deliveries they carry, until the client accepts (or releases, rejects)
    them; they are replayed, with the same ids, when the session is resumed.
    """

    key: str
    vhost: str
    principal: str
    name: bytes
    channel: ChannelState
    timeout: int = 0  # seconds the state outlives a detach
    detached_at: int | None = None  # microseconds
    completed: list[list[int]] = field(default_factory=list)  # sorted disjoint [lo, hi] ranges
    next_transfer: int = 0
    transfers: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # id -> (qid, seq, destination)
    transactional: bool = False  # tx.select was applied: the front end buffers work until tx.commit
    browsed: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # not-acquired transfers


@dataclass(slots=True, eq=False)
class VHost:
    name: str
    exchanges: dict[str, Exchange] = field(default_factory=dict)
    queues: dict[str, Queue] = field(default_factory=dict)

