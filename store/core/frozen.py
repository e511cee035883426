"""Runs of queued messages kept as columns instead of objects (issue 18).

A queued message costs the model a ``Message`` and an ``Entry`` (two slotted objects and their
ints, ~281 B in all): 1.3M queued messages held ~350 MB on every node, and a snapshot walked them
one by one.  Deep in a queue nothing refers to a message but its entry, and nothing will until the
queue's head reaches it, so ``ReadyList`` (store/core/model.py) freezes such entries, ``FREEZE_BATCH``
at a time, into a ``FrozenRun``: parallel ``array`` columns (~50 B per message) and, for the
exchange, routing key and properties that a run's messages usually share, one value.  The run sits
in the ready list's deque where its entries were, and is thawed back into the same objects when the
head reaches it (or a 0-10 browse or acquire looks inside it).  A snapshot writes a run as its
columns' bytes.

Only entries whose message no one else holds (``Message.live == 1``) are frozen: a fanout copy
shares its message with other queues, which must see the same object.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from operator import attrgetter
from typing import TypeVar, cast

from .entries import Entry, Message

_T = TypeVar("_T")
_NONE = -1  # expires_at None
_PERSISTENT, _DURABLE, _REFERENCED = 1, 2, 4  # flags

_MESSAGE = attrgetter("message")
_SEQ = attrgetter("seq")
_EXPIRES = attrgetter("expires_at")
_COUNT = attrgetter("delivery_count")
_ID = attrgetter("id")
_SIZE = attrgetter("size")
_PUBLISHED = attrgetter("published_at")
_PRIORITY = attrgetter("priority")
_FORMAT = attrgetter("format")
_COLUMNS = ("seqs", "ids", "sizes", "published", "expires", "counts", "flags", "priorities", "formats")


_TYPECODE = {name: "B" if name in ("flags", "priorities", "formats") else "q" for name in _COLUMNS}


def _progression(column: array) -> list[int] | None:
    """``[first, step, length]`` when the column is an arithmetic progression (step >= 0), else None.
    Cheap where it fails (the last value) and for constant columns (one bytes comparison); only a
    real progression with a step (sequences, ids) is built and compared whole."""
    first, length = column[0], len(column)
    step = column[1] - first if length > 1 else 0
    if step < 0 or column[-1] != first + step * (length - 1):
        return None
    if step == 0:
        raw = column.tobytes()
        return [first, 0, length] if raw == raw[:column.itemsize] * length else None
    return [first, step, length] if column == array(column.typecode, range(first, first + step * length, step)) \
        else None


def _shared(values: list[_T]) -> _T | list[_T]:
    """One value when every item is that value (the usual case), else the list."""
    first = values[0]
    for value in values:
        if value != first:
            return values
    return first


class FrozenRun:
    """Consecutive ready entries of one priority level, as columns."""

    __slots__ = ("seq", "last_seq", "level", *_COLUMNS, "exchange", "routing_key", "properties", "_progressions")
    # The slots' types (the slots are named from _COLUMNS, which the checker cannot read).
    seq: int  # the first entry's sequence
    last_seq: int
    level: int
    seqs: array[int]
    ids: array[int]
    sizes: array[int]
    published: array[int]
    expires: array[int]  # _NONE for None
    counts: array[int]
    flags: array[int]
    priorities: array[int]
    formats: array[int]
    # One value shared by every message of the run, or the list of each message's (``_shared``).
    exchange: str | list[str]
    routing_key: str | list[str]
    properties: bytes | list[bytes]
    _progressions: tuple[list[int] | None, ...]

    def __len__(self) -> int:
        return len(self.seqs)

    @classmethod
    def freeze(cls, entries: list[Entry | FrozenRun], level: int) -> FrozenRun | None:
        """A run of ``entries`` (in sequence order), or None when one of them cannot be frozen.

        An item may be a FrozenRun itself (no ``message``): the newest items of a level are not
        always entries appended since its last freeze, when 0-10 message.acquire took those out
        of the list (``ReadyList.remove_seq``); reading its message was an AttributeError in apply."""
        for item in entries:
            if item.__class__ is not Entry or item.holder is not None:
                return None
        plain = cast("list[Entry]", entries)  # every item is an Entry: checked just above
        messages = list(map(_MESSAGE, plain))
        for message in messages:
            if message.__class__ is not Message or message.live != 1 or message.refs > 1:
                return None
        run = cls.__new__(cls)
        run.level = level
        run.seqs = array("q", map(_SEQ, plain))
        run.seq, run.last_seq = run.seqs[0], run.seqs[-1]
        run.ids = array("q", map(_ID, messages))
        run.sizes = array("q", map(_SIZE, messages))
        run.published = array("q", map(_PUBLISHED, messages))
        run.expires = array("q", [_NONE if e is None else e for e in map(_EXPIRES, plain)])
        run.counts = array("q", map(_COUNT, plain))
        run.flags = array("B", [(_PERSISTENT if m.persistent else 0) | (_DURABLE if e.durable else 0)
                                | (_REFERENCED if m.refs else 0) for e, m in zip(plain, messages, strict=True)])
        run.priorities = array("B", map(_PRIORITY, messages))
        run.formats = array("B", map(_FORMAT, messages))
        run.exchange = _shared([m.exchange for m in messages])
        run.routing_key = _shared([m.routing_key for m in messages])
        run.properties = _shared([m.properties for m in messages])
        run._progressions = tuple(_progression(getattr(run, name)) for name in _COLUMNS)
        return run

    def _column(self, name: str) -> list:
        value = getattr(self, name)
        return value if value.__class__ is list else [value] * len(self.seqs)

    def thaw(self) -> list[Entry]:
        """The entries again, each with its own ``Message`` (live 1), as they were frozen."""
        level = self.level
        out: list[Entry] = []
        append = out.append
        for seq, msg_id, size, published, expires, count, flags, priority, fmt, exchange, key, props in zip(
                self.seqs, self.ids, self.sizes, self.published, self.expires, self.counts, self.flags,
                self.priorities, self.formats, self._column("exchange"), self._column("routing_key"),
                self._column("properties"), strict=True):
            message = Message(msg_id, exchange, key, props, size, bool(flags & _PERSISTENT), priority, published,
                              1 if flags & _REFERENCED else 0, fmt, 1)
            append(Entry(seq, message, None if expires == _NONE else expires, level, bool(flags & _DURABLE),
                         count))
        return out

    def seq_ids(self) -> Iterator[tuple[int, int]]:
        return zip(self.seqs, self.ids, strict=True)

    def id_sizes(self) -> Iterator[tuple[int, int]]:
        return zip(self.ids, self.sizes, strict=True)

    def digest_rows(self) -> Iterator[tuple]:
        """What ``store.snapshot.digest`` renders for each entry (as for a thawed one)."""
        level = self.level
        for seq, msg_id, expires, count, size, props, fmt in zip(
                self.seqs, self.ids, self.expires, self.counts, self.sizes, self._column("properties"),
                self.formats, strict=True):
            yield (seq, msg_id, None if expires == _NONE else expires, level, count, size, 1, props, fmt)

    # ------------------------------------------------------------------ snapshots

    def to_row(self) -> list:
        """The run in a snapshot: each column as its bytes, or -- most are -- as ``[first, step]``
        when its values go up by a constant step (sequences, ids; 0 for sizes, flags, counts...).
        A snapshot's size, and the fsync that ends it, stays near 8 B per frozen message.

        Which columns are progressions is found once, when the run is frozen (a run is never
        changed, only thawed whole), not at every snapshot: in the forked child that writes it,
        the check (0.1 ms per column) was 90 % of the export of 500,000 queued messages, a cost
        that grew with the backlog (0.5 s per snapshot under load at 2 GB queued)."""
        return ["run", self.level,
                *(getattr(self, name).tobytes() if progression is None else progression
                  for name, progression in zip(_COLUMNS, self._progressions, strict=True)),
                self.exchange, self.routing_key, self.properties]

    @classmethod
    def from_row(cls, row: list | tuple) -> FrozenRun:
        run = cls.__new__(cls)
        run.level = row[1]
        progressions: list[list[int] | None] = []
        for name, raw in zip(_COLUMNS, row[2:2 + len(_COLUMNS)], strict=True):
            column = array(_TYPECODE[name])
            if isinstance(raw, (bytes, bytearray)):
                column.frombytes(raw)
                progressions.append(None)
            else:
                first, step, length = raw
                column.extend(range(first, first + step * length, step) if step else [first] * length)
                progressions.append([first, step, length])
            setattr(run, name, column)
        run._progressions = tuple(progressions)
        run.exchange, run.routing_key, run.properties = (
            list(v) if isinstance(v, (list, tuple)) else v for v in row[2 + len(_COLUMNS):])
        run.seq, run.last_seq = run.seqs[0], run.seqs[-1]
        return run
