"""The node's audit history writer: a background thread appending events to ``<data>/events``.

The state machine calls :meth:`EventStore.append` from ``apply`` with each batch's events; that
only extends a list.  One writer thread turns everything pending into a single LMDB write
transaction (events, the message records, the catalog tables and the ``meta`` keys together),
so the broker never waits for the audit history except when the writer falls ``max_pending``
events behind (back-pressure instead of unbounded memory).

Retention is decided per event by the writer: a queue's ``x-audit-retention`` argument, else
the vhost's setting, else the node's (``none`` / ``metadata`` / ``body``).  Catalog events
(declare, delete, bind, unbind) are always kept.  Age and size limits are enforced by the same
thread in small delete transactions between appends (``compact``), oldest events first, so
trimming never blocks the broker either.

Checksums (issue 29, ``events.py`` "Checksums"): every value written is sealed.  At open the
writer stamps the history (``HISTORY_FORMAT``; a history written before checksums gets a
``legacy`` mark so its old records stay readable, and its meta records are sealed) and checks
what it reads back there -- the meta records and the queue records its retention policy comes
from.  A damaged one stops the node (``HistoryDamaged``, exit status 74): the writer would number
and extend the history from values it cannot trust.  Records read back later (a catalog record
rewritten at delete, events trimmed) are checked too; a damaged one stops the writer with an
error in the log (the history then stops, as on any writer failure) rather than write on top of it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import lmdb
import msgpack

from raftmq.versions import HISTORY_FORMAT

from ..core.message import AMQP091, convert
from . import history as EV
from .history import U64, meta_put, name_key
from .sealed import is_sealed, seal

if TYPE_CHECKING:  # (the type only: no import of the model at run time)
    from ..core.model import Message

log = logging.getLogger(__name__)

_RANK = {"none": 0, "metadata": 1, "body": 2}
#: Events whose record may keep the message's body (the writer's message records).
_BODY_KINDS = frozenset((EV.PUBLISHED, EV.ROUTED))
_WIDTH = len(EV.EVENT_FIELDS)  # an event record's fields (older callers may hand over fewer)
COMPACT_CHUNK = 5_000  # events deleted per transaction while trimming
COMPACT_INTERVAL = 1.0  # seconds between retention checks


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


class RetentionPolicy:
    """Which retention applies to an event: queue argument > vhost setting > node default."""

    def __init__(self, default: str = "metadata", vhosts: dict[str, str] | None = None) -> None:
        for value in (default, *(vhosts or {}).values()):
            if value not in _RANK:
                raise ValueError(f"audit retention must be one of {EV.RETENTIONS}, not {value!r}")
        self.default = default
        self.vhosts = dict(vhosts or {})
        self.queues: dict[tuple[str, str], str] = {}  # from x-audit-retention, kept by the writer

    def of_vhost(self, vhost: str) -> int:
        return _RANK[self.vhosts.get(vhost, self.default)]

    def of_queue(self, vhost: str, queue: str) -> int:
        own = self.queues.get((vhost, queue))
        return _RANK[own] if own is not None else self.of_vhost(vhost)

    def queue_declared(self, vhost: str, queue: str, arguments: dict) -> str:
        value = arguments.get(EV.RETENTION_ARGUMENT) if isinstance(arguments, dict) else None
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if value in _RANK:
            self.queues[(vhost, queue)] = value
            return value
        self.queues.pop((vhost, queue), None)
        if value is not None:
            log.warning("queue %r in vhost %r: ignoring %s=%r (not one of %s)", queue, vhost,
                        EV.RETENTION_ARGUMENT, value, EV.RETENTIONS)
        return self.vhosts.get(vhost, self.default)


class EventStore:
    """Appends event batches to an LMDB environment from a writer thread (see the module docstring)."""

    def __init__(self, path: str, policy: RetentionPolicy | str = "metadata", *, max_age: float = 0.0,
                 max_bytes: int = 0, max_pending: int = 500_000, map_size: int = 1 << 40) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.policy = policy if isinstance(policy, RetentionPolicy) else RetentionPolicy(policy)
        self.max_age_us = int(max_age * 1_000_000)
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self.env = lmdb.open(path, map_size=map_size, max_dbs=len(EV.TABLES) + 1, sync=False, metasync=False)
        self.tables = EV.open_tables(self.env, create=True)
        self.written = 0  # events written by this process
        self.trimmed = 0  # events removed by retention limits
        try:
            self.checker = self._stamp_format()
            with self.env.begin() as txn:
                self._check_at_open(txn)
                state = EV.info(txn, self.tables, self.checker)
                self._load_queue_policies(txn)
        except BaseException:
            self.env.close()
            raise
        self.last_seq = state.last_seq
        self.first_seq = state.first_seq
        self.raft_index = state.raft_index
        self._gaps: list = list(state.gaps)
        #: The chain head after the last batch written (issue 36): a single node continues from it.
        self.chain_head = self._last_head()
        self._pending: list[tuple[int | None, list, tuple | None]] = []
        self._pending_events = 0
        self._cond = threading.Condition()
        #: The node's body lookup (store/disk/bodies.py ``Bodies.get``); None keeps no bodies.
        self.body_of: Callable[[int], bytes | None] | None = None
        self._closing = False
        self._busy = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    def _stamp_format(self) -> EV.Checker:
        """Stamp HISTORY_FORMAT (FormatTooNew for a newer history).  A history written before
        checksums is marked ``legacy`` (its events and messages below the next keys, and its catalog
        records, may be unsealed) and its meta records are sealed."""
        path = self.env.path()
        with self.env.begin(write=True) as txn:
            found = EV.checker(txn, self.tables, path)
            if found.format < HISTORY_FORMAT:
                meta = self.tables["meta"]
                legacy = {}
                for table in ("events", "messages"):
                    cursor = txn.cursor(db=self.tables[table])
                    legacy[table] = U64.unpack(cursor.key())[0] + 1 if cursor.last() else 0
                old_meta = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=meta)
                            if k != EV.FORMAT_KEY and not is_sealed(v)]
                for key, value in old_meta:
                    found.decode("meta", key, value)  # HistoryDamaged if it does not decode
                    txn.put(key, seal(key, value), db=meta)
                populated = any(txn.stat(self.tables[t])["entries"] for t in ("events", "messages", *EV.CATALOG_TABLES))
                if populated or old_meta:
                    meta_put(txn.put, meta, EV.LEGACY_KEY, legacy)
                    log.warning("audit history %s was written before checksums: its %d events and %d messages "
                                "stay readable unchecked; everything written from now on is checked", path,
                                txn.stat(self.tables["events"])["entries"], txn.stat(self.tables["messages"])["entries"])
                txn.put(EV.FORMAT_KEY, msgpack.packb(HISTORY_FORMAT), db=meta)
                found = EV.checker(txn, self.tables, path)
        return found

    def _last_head(self) -> bytes:
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self.tables[EV.CHAIN_TABLE])
            if not cursor.last():
                return EV.CHAIN_ZERO
            return bytes(self.checker.decode(EV.CHAIN_TABLE, cursor.key(), cursor.value())[4])

    def _check_at_open(self, txn: lmdb.Transaction) -> None:
        """Check every record the writer reads at open (meta, queues); HistoryDamaged names all the
        damaged ones."""
        damages = []
        for table in ("meta", "queues"):
            for key, value in txn.cursor(db=self.tables[table]):
                if table == "meta" and key == EV.FORMAT_KEY:
                    continue
                try:
                    self.checker.decode(table, key, value)
                except EV.HistoryDamaged as exc:
                    damages.extend(exc.damages)
        if damages:
            raise EV.HistoryDamaged(self.env.path(), damages, at_start=True)

    def _load_queue_policies(self, txn: lmdb.Transaction) -> None:
        for key, value in txn.cursor(db=self.tables["queues"]):
            vhost, name, *_rest, retention, _declared, deleted = self.checker.decode("queues", key, value)
            if deleted is None and retention is not None:
                self.policy.queues[(vhost, name)] = retention

    # ------------------------------------------------------------------ called by apply

    def append(self, index: int | None, events: list[list],
               chain: tuple[bytes, bytes] | None = None) -> None:
        """Hand over one applied batch's events (``index``: its Raft index, None on a single node).

        The model holds no bodies (issue 18): a publish's or routing's event gets its message's body
        from ``body_of`` here, on the applying thread, while the body store still has it (an ack
        later in the batch may delete it before the writer thread runs)."""
        body_of = self.body_of
        if body_of is not None:
            for event in events:
                if event[2] in _BODY_KINDS:
                    event.append(body_of(event[10].id))
        with self._cond:
            while self._pending_events > self.max_pending and not self._closing and self._error is None:
                self._cond.wait(0.1)  # back-pressure: the writer is far behind
            self._pending.append((index, events, chain))
            self._pending_events += len(events)
            if len(self._pending) == 1:
                self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything appended so far is written; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._pending or self._busy) and self._error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return self._error is None

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        self.env.sync(True)
        self.env.close()

    def records(self, table: str = "events") -> list[list]:
        """A table's records as written so far (for tools and tests in this process)."""
        return list(EV.records(self.env, table))

    def snapshot(self, destination: str) -> EV.HistoryInfo:
        """A compact consistent copy of the history so far (``events.snapshot``)."""
        return EV.copy_snapshot(self.env, destination)

    def info(self) -> EV.HistoryInfo:
        with self.env.begin() as txn:
            return EV.info(txn, self.tables, self.checker)

    # ------------------------------------------------------------------ the writer thread

    def _run(self) -> None:
        next_compact = time.monotonic() + COMPACT_INTERVAL
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    if not self._cond.wait(COMPACT_INTERVAL):
                        break
                if self._closing and not self._pending:
                    return
                batches, self._pending = self._pending, []
                self._pending_events = 0
                self._busy = bool(batches)
                self._cond.notify_all()
            try:
                if batches:
                    self._write(batches)
                if (self.max_age_us or self.max_bytes) and time.monotonic() >= next_compact:
                    self.compact()
                    next_compact = time.monotonic() + COMPACT_INTERVAL
            except BaseException as exc:  # noqa: BLE001 - recorded and logged, the broker keeps running
                log.exception("audit history writer failed; history stops at seq %d", self.last_seq)
                with self._cond:
                    self._error = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _write(self, batches: Iterable[tuple[int | None, list, tuple | None]]) -> None:
        t = self.tables
        events_db, messages_db, chain_db = t["events"], t["messages"], t[EV.CHAIN_TABLE]
        policy = self.policy
        packb = msgpack.packb
        last_seq = self.last_seq
        written = 0
        raft_index = self.raft_index
        publishers: dict[int, str] = {}  # message id -> publisher, for ROUTED events later in the batch
        with self.env.begin(write=True) as txn:
            put = txn.put
            for index, events, chain in batches:
                fresh = bool(events) and events[0][0] > last_seq  # not a replay (a batch is whole)
                dropped: list[int] = []  # seqs this node's retention does not keep
                seals: list[bytes] = []  # the kept events' seal CRCs, in seq order (the chain record's hints)
                for event in events:
                    seq = event[0]
                    if seq <= last_seq:
                        continue  # a replay (the journal after a restart)
                    if seq != last_seq + 1 and last_seq:
                        self._gaps.append([last_seq + 1, seq - 1])
                    last_seq = seq
                    kind = event[2]
                    message = event[10]
                    body = event.pop() if len(event) > _WIDTH else None  # see append
                    if len(event) < _WIDTH:
                        event.extend([None] * (_WIDTH - len(event)))
                    if kind in EV.DEFINITION_KINDS:
                        self._catalog(txn, event)
                        level = 1
                    elif kind in EV.NOTE_KINDS:
                        # Who did what (issue 36): kept whatever the retention, as the catalog is.
                        if kind in (EV.CONNECTION_OPENED, EV.CONNECTION_CLOSED) and event[11]:
                            self._connection(txn, event)
                        level = 1
                    elif kind == EV.PUBLISHED:
                        level = policy.of_vhost(event[3])
                        publishers[message.id] = event[9]
                        if level:
                            self._put_message(put, messages_db, event, message, body, level, event[9])
                    elif kind == EV.UNROUTABLE:
                        level = policy.of_vhost(event[3])
                    else:
                        level = policy.of_queue(event[3], event[4])
                        if kind == EV.ROUTED and level > policy.of_vhost(event[3]):
                            # This queue keeps more than the publish did (x-audit-retention).
                            self._put_message(put, messages_db, event, message, body, level,
                                              publishers.get(message.id, ""))
                    if not level:
                        dropped.append(seq)
                        continue
                    event[10] = index
                    key = U64.pack(seq)
                    value = seal(key, packb(event, use_bin_type=True))
                    put(key, value, db=events_db, append=True)
                    if chain is not None:
                        seals.append(value[1:5])  # its CRC32C (sealed.py): no second hash per event
                    if not self.first_seq:
                        self.first_seq = seq
                    written += 1
                if chain is not None and fresh:
                    self._chain_record(put, chain_db, events, index, chain, seals, dropped)
                if index is not None:
                    raft_index = index
            meta = t["meta"]
            meta_put(put, meta, b"last_seq", last_seq)
            meta_put(put, meta, b"first_seq", self.first_seq)
            meta_put(put, meta, b"raft_index", raft_index)
            if self._gaps:
                meta_put(put, meta, b"gaps", self._gaps)
        self.last_seq = last_seq
        self.raft_index = raft_index
        self.written += written

    def _chain_record(self, put: Callable[..., object], db: lmdb._Database, events: list[list], index: int | None,
                      chain: tuple[bytes, bytes], seals: list[bytes], dropped: list[int]) -> None:
        """The batch's chain record (history.py "chain"): its seq range, Raft index, the heads before
        and after it, the kept events' seal CRCs and the seqs not kept."""
        previous, head = chain
        first = events[0][0]
        key = U64.pack(first)
        record = [first, events[-1][0], index, previous, head, b"".join(seals), dropped]
        put(key, seal(key, msgpack.packb(record, use_bin_type=True)), db=db, append=True)
        self.chain_head = head

    @staticmethod
    def _put_message(put: Callable[..., object], db: lmdb._Database, event: list, message: Message,
                     body: bytes | None, level: int, publisher: str) -> None:
        """The message record: written at publish, rewritten when a queue it was routed to keeps more."""
        # The history's properties are 0-9-1 bytes whatever the publisher spoke (spark/ reads one
        # format); converted here, off the apply path, and only for messages of another protocol.
        properties = message.properties
        if message.format != AMQP091:
            try:
                properties = convert(properties, message.format, AMQP091)
            except (ValueError, LookupError):
                properties = b"\x00\x00"  # unreadable properties: recorded as none
        record = [message.id, message.published_at, event[3], message.exchange, message.routing_key,
                  message.size, publisher, properties, body if level >= 2 else None,
                  event[0]]
        key = U64.pack(message.id)
        put(key, seal(key, msgpack.packb(record, use_bin_type=True)), db=db)

    def _catalog(self, txn: lmdb.Transaction, event: list) -> None:
        seq, now, kind, vhost, queue, _mid, exchange, routing_key, _size, detail, definition = event[:11]
        t = self.tables
        packb = msgpack.packb
        if kind == EV.QUEUE_DECLARED:
            durable, exclusive, auto_delete, arguments = definition
            retention = self.policy.queue_declared(vhost, queue, arguments)
            record = [vhost, queue, durable, exclusive, auto_delete, _json(arguments), retention, now, None]
            key = name_key(vhost, queue)
            txn.put(key, seal(key, packb(record, use_bin_type=True)), db=t["queues"])
        elif kind == EV.EXCHANGE_DECLARED:
            durable, auto_delete, internal, arguments = definition
            record = [vhost, exchange, detail, durable, auto_delete, internal, _json(arguments), now, None]
            key = name_key(vhost, exchange)
            txn.put(key, seal(key, packb(record, use_bin_type=True)), db=t["exchanges"])
        elif kind in (EV.QUEUE_DELETED, EV.EXCHANGE_DELETED):
            table = "queues" if kind == EV.QUEUE_DELETED else "exchanges"
            db = t[table]
            key = name_key(vhost, queue if kind == EV.QUEUE_DELETED else exchange)
            value = txn.get(key, db=db)
            if value is not None:
                record = self.checker.decode(table, key, value)
                record[-1] = now
                txn.put(key, seal(key, packb(record, use_bin_type=True)), db=db)
            if kind == EV.QUEUE_DELETED:
                self.policy.queues.pop((vhost, queue), None)
        else:  # BOUND / UNBOUND
            dest_is_queue, arguments = definition
            args = _json(arguments)
            key = name_key(vhost, exchange, "q" if dest_is_queue else "e", detail, routing_key, args)
            if kind == EV.BOUND:
                record = [vhost, exchange, detail, "queue" if dest_is_queue else "exchange", routing_key, args,
                          now, None]
            else:
                value = txn.get(key, db=t["bindings"])
                if value is None:
                    return
                record = self.checker.decode("bindings", key, value)
                record[-1] = now
            txn.put(key, seal(key, packb(record, use_bin_type=True)), db=t["bindings"])

    def _connection(self, txn: lmdb.Transaction, event: list) -> None:
        """The ``connections`` table (events.py CONNECTION_FIELDS): a connection's principal once,
        written when it opened, its close time added when it closed.  Per-message events carry
        only the connection id (``conn``); readers join them here (spark/datasource.py)."""
        now, kind, vhost, conn, principal = event[1], event[2], event[3], event[11], event[12]
        db = self.tables["connections"]
        key = conn.encode()
        if kind == EV.CONNECTION_OPENED:
            user, protocol, address, name = (list(principal or ()) + [None] * 4)[:4]
            record = [conn, user, vhost, protocol, address, name, now, None]
        else:
            value = txn.get(key, db=db)
            if value is None:
                return  # opened before this history began (or before issue 36)
            record = self.checker.decode("connections", key, value)
            record[-1] = now
        txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)), db=db)

    # ------------------------------------------------------------------ retention limits

    def live_bytes(self) -> int:
        """Bytes held by the events and messages tables (pages in use, not the file's size)."""
        with self.env.begin() as txn:
            total = 0
            for name in ("events", "messages"):
                st = txn.stat(self.tables[name])
                total += (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
            return total

    def compact(self) -> int:
        """Trim the oldest events (and their messages) beyond the age and size limits; how many went.

        Works in transactions of COMPACT_CHUNK events so that appends interleave with trimming.
        Age is measured against the newest event's (leader-stamped) time, not this node's clock.
        """
        removed = 0
        while True:
            cutoff_seq = self._trim_target()
            if cutoff_seq is None:
                break
            n = self._delete_before(cutoff_seq)
            if not n:
                break
            removed += n
        if removed:
            self.trim_connections()
        return removed

    def trim_connections(self) -> int:
        """Remove the ``connections`` records of connections closed before the oldest event kept
        (issue 36): no event left names them.  Without this a client that connects per request
        would grow the table past the age and size limits.  A connection never noted closed (its
        node died) keeps its record.  In chunks of COMPACT_CHUNK records; how many went."""
        removed = 0
        db = self.tables["connections"]
        while True:
            with self.env.begin(write=True) as txn:
                cursor = txn.cursor(db=self.tables["events"])
                cutoff = (self.checker.decode("events", cursor.key(), cursor.value())[1] if cursor.first()
                          else None)
                stale = []
                for key, value in txn.cursor(db=db):
                    closed = self.checker.decode("connections", key, value)[7]
                    if closed is not None and (cutoff is None or closed < cutoff):
                        stale.append(bytes(key))
                        if len(stale) >= COMPACT_CHUNK:
                            break
                for key in stale:
                    txn.delete(key, db=db)
            removed += len(stale)
            if len(stale) < COMPACT_CHUNK:
                return removed

    def _trim_target(self) -> int | None:
        """The sequence number the next chunk may delete up to (exclusive), or None."""
        with self.env.begin() as txn:
            cursor = txn.cursor(db=self.tables["events"])
            if not cursor.first():
                return None
            first_key, first_value = cursor.item()
            first = U64.unpack(first_key)[0]
            chunk_end = first + COMPACT_CHUNK
            if self.max_age_us:
                cursor.last()
                threshold = self.checker.decode("events", cursor.key(), cursor.value())[1] - self.max_age_us
                if self.checker.decode("events", first_key, first_value)[1] < threshold:
                    return self._first_young(txn, first, threshold)
        if self.max_bytes and self.live_bytes() > self.max_bytes:
            return chunk_end
        return None

    def _first_young(self, txn: lmdb.Transaction, low: int, threshold: int) -> int:
        """The first seq in [low, low + COMPACT_CHUNK) whose time is >= threshold, else the chunk's
        end (binary search: times never decrease along the sequence)."""
        cursor = txn.cursor(db=self.tables["events"])
        high = low + COMPACT_CHUNK
        while low < high:
            mid = (low + high) // 2
            if cursor.set_range(U64.pack(mid)) and self.checker.decode("events", cursor.key(), cursor.value())[1] < threshold:
                low = U64.unpack(cursor.key())[0] + 1
            else:
                high = mid
        return low

    def _delete_before(self, stop: int) -> int:
        removed = 0
        t = self.tables
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor(db=t["events"])
            last_message = None
            while cursor.first() and U64.unpack(cursor.key())[0] < stop:
                event = self.checker.decode("events", cursor.key(), cursor.value())
                if event[2] == EV.PUBLISHED and event[5] is not None:
                    last_message = event[5]
                cursor.delete()
                removed += 1
            if last_message is not None:
                messages = txn.cursor(db=t["messages"])
                while messages.first() and U64.unpack(messages.key())[0] <= last_message:
                    messages.delete()
            first = U64.unpack(cursor.key())[0] if cursor.first() else self.last_seq + 1
            meta_put(txn.put, t["meta"], b"first_seq", first)
            # Chain records of batches wholly trimmed go too (one partly trimmed stays: a verifier
            # starts after it, from the first batch whose events are all there).
            chains = txn.cursor(db=t[EV.CHAIN_TABLE])
            while chains.first() and self.checker.decode(EV.CHAIN_TABLE, chains.key(), chains.value())[1] < first:
                chains.delete()
        self.first_seq = first
        self.trimmed += removed
        return removed


# The applier hands this writer each batch's chain step too (store/applier.py ``History``).
setattr(EventStore.append, "takes_chain", True)  # noqa: B010 - a function attribute the checker need not know
