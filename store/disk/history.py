"""The audit history's format: event kinds, the LMDB layout, reading it, and consistent snapshots.

The state machine numbers events deterministically (``machine.event_seq`` is replicated state, so
the same event has the same sequence number on every node) and hands each applied batch's events
to an ``EventStore`` (``event_writer.py``), which appends them to its own LMDB environment,
``<data>/events``.  Events are derived data: they never feed back into the state.

The environment holds seven tables (keys big-endian so that LMDB order is numeric order):

``events``     u64 seq -> ``[seq, time_us, kind, vhost, queue, message_id, exchange, routing_key,
               size, detail, raft_index, conn, principal]``.  ``detail`` is kind-specific text: the
               publisher's connection, the consumer tag, a dead-letter reason and target, an
               exclusive queue's owner, a binding's destination; on the issue-36 kinds a refused
               login's mechanism and reason, a refused operation and the permission it lacked, an
               administrative change.  ``conn`` is the connection that acted (publish, deliver,
               get, ack, reject, connection opened/closed, refused operation) or None;
               ``principal`` is ``[user, protocol, address, connection name]`` on the issue-36
               kinds, else None.  Records written before issue 36 end at ``raft_index``.
               ``time_us`` never decreases with ``seq`` (the machine keeps the largest
               leader-stamped time), so a time range is a sequence range.
``messages``   u64 message id -> ``[message_id, time_us, vhost, exchange, routing_key, size,
               publisher, properties, body, seq]``; ``properties`` are the AMQP 0-9-1 encoded
               basic properties, ``body`` is None unless retention keeps bodies.
``queues``     ``vhost NUL name`` -> ``[vhost, name, durable, exclusive, auto_delete, arguments,
               retention, declared_us, deleted_us]`` (arguments as JSON text).
``exchanges``  ``vhost NUL name`` -> ``[vhost, name, type, durable, auto_delete, internal,
               arguments, declared_us, deleted_us]``.
``bindings``   ``vhost NUL source NUL q|e NUL destination NUL key NUL arguments`` ->
               ``[vhost, source, destination, destination_type, routing_key, arguments,
               bound_us, unbound_us]``.
``connections`` connection id -> ``[conn, user, vhost, protocol, address, connection_name,
               opened_us, closed_us]``: each client connection's principal, once (from its
               ``connection_opened`` event; the join key of ``conn``).  When the age and size
               limits trim events, the records of connections closed before the oldest event kept
               go too (``EventStore.trim_connections``).
``meta``       ``raft_index`` (the last applied batch whose events are all written), ``first_seq``
               and ``last_seq`` (the retained range), ``gaps`` (ranges this node never saw: it
               installed a state snapshot instead of applying them).
``chain``      u64 first seq of a batch -> ``[first_seq, last_seq, raft_index, previous head, head,
               seals, dropped]``: the tamper-evidence chain (issue 36, ``store/core/events.py``;
               checked by ``raftmq audit verify``, ``ops/audit_verify.py``).  ``seals`` are the
               4-byte CRC32C of each kept event's record as written (its seal), in seq order: a
               hint that names the event an edit changed (the head is the proof); ``dropped`` the
               seqs retention did not keep.  A table added without a format change: older readers
               ignore it.

A snapshot (:func:`snapshot`) is ``env.copy(compact=True)`` inside one read transaction: it holds
every event of every batch up to its ``raft_index`` and none after, even while the node writes.

**Checksums (history format 2, issue 29).**  Every value is sealed (``store/disk/sealed.py``: 0xC1,
CRC32C over key and payload, the msgpack payload above); ``meta`` also holds ``format`` (plain
msgpack, ``HISTORY_FORMAT``: an older raftmq reads it to refuse) and, in a history that was
written before checksums and continued after, ``legacy`` = ``{"events": seq, "messages": id}``:
records of those two tables below those keys, and catalog records, may be unsealed -- they were
written unchecked and are read as such (msgpack must still decode).  Every other unsealed value is
damage.  A history without ``format`` (written before checksums) is read as it is, unchecked.

*Readers verify every record they return* (:class:`Checker`): ``records``/``read_table``, the
writer (what it reads back: meta, catalog records, events it trims) and the Spark data source.
A damaged record is never returned as if intact and never skipped silently: reading stops with
:class:`HistoryDamaged`, which names the history, the table and the key (``raftmq verify`` lists
every damaged record of a stopped node's history).  Skipping would make an audit job's answer
("unconsumed", "lost") silently wrong; failing loudly lets the operator decide (verify, then audit
a range without the damaged record, or accept it).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

from raftmq.integrity import Damage
from raftmq.versions import HISTORY_FORMAT, check

from ..core.events import (  # noqa: F401 - the kinds and fields are this format's vocabulary too
    ACCESS_REFUSED,
    ACKED,
    ADMIN_CHANGE,
    BINDING_FIELDS,
    BOUND,
    CATALOG_TABLES,
    CHAIN_TABLE,
    CHAIN_ZERO,
    CONNECTION_CLOSED,
    CONNECTION_FIELDS,
    CONNECTION_OPENED,
    DEAD_LETTERED,
    DEDUPLICATED,
    DEFINITION_KINDS,
    DELAY_RELEASED,
    DELAYED,
    DELETED,
    DELIVERED,
    DROPPED,
    EVENT_FIELDS,
    EXCHANGE_DECLARED,
    EXCHANGE_DELETED,
    EXCHANGE_FIELDS,
    EXPIRED,
    KIND_NAMES,
    LOGIN_REFUSED,
    MESSAGE_FIELDS,
    NOTE_KINDS,
    PRINCIPAL_FIELDS,
    PUBLISHED,
    PURGED,
    QUEUE_DECLARED,
    QUEUE_DELETED,
    QUEUE_FIELDS,
    REJECTED,
    REQUEUED,
    RETENTION_ARGUMENT,
    RETENTIONS,
    ROUTED,
    TABLES,
    UNBOUND,
    UNROUTABLE,
    chain_next,
    chain_packed,
    chained_fields,
)
from .sealed import BadRecord, StoreDamaged, is_sealed, seal, unseal

U64 = struct.Struct(">Q")
FORMAT_KEY, LEGACY_KEY = b"format", b"legacy"


class HistoryDamaged(StoreDamaged):
    """Damaged records in an audit history (never returned as if intact)."""

    def __init__(self, path: str, damages: list[Damage], at_start: bool = False) -> None:
        shown = "; ".join(f"{d.where}: {d.what}" for d in damages[:20])
        more = f" (and {len(damages) - 20} more)" if len(damages) > 20 else ""
        advice = (f"Not starting on it: move {path} aside to start a new history (the old one stays readable "
                  f"up to the damage)" if at_start else "`raftmq verify --data-dir` lists every damaged record")
        super().__init__(f"the audit history in {path} has {len(damages)} damaged record(s): {shown}{more}. "
                         f"{advice}", damages)
        self.path = path


def describe_key(table: str, key: bytes) -> str:
    if table in ("events", "messages") and len(key) == 8:
        return f"{table}/{'seq' if table == 'events' else 'message'} {U64.unpack(key)[0]}"
    try:
        return f"{table}/{key.decode()!r}"
    except UnicodeDecodeError:
        return f"{table}/key {key.hex()}"


@dataclass(frozen=True)
class Checker:
    """How the records of one history are checked (see "Checksums" in the module docstring)."""

    path: str
    format: int  # 1: written before checksums, nothing sealed
    legacy: dict | None = None  # {"events": seq, "messages": id}: unsealed below these keys are old records

    def unchecked_allowed(self, table: str, key: bytes | memoryview) -> bool:
        if self.format < 2:
            return True
        if self.legacy is None or table == "meta":
            return False
        if table in CATALOG_TABLES:
            return True
        return len(key) == 8 and U64.unpack(key)[0] < self.legacy.get(table, 0)

    def payload(self, table: str, key: bytes | memoryview, value: bytes | memoryview) -> bytes | memoryview:
        """The checked payload; BadRecord if damaged.  An allowed old record is returned unchanged."""
        if is_sealed(value) or not self.unchecked_allowed(table, key):
            return unseal(key, value)
        return value

    def decode(self, table: str, key: bytes | memoryview, value: bytes | memoryview) -> Any:
        """The record, checked and decoded; HistoryDamaged names it if it is damaged.  Any: the
        record's shape is the one its table was written with (event_writer.py), not a static type."""
        try:
            return msgpack.unpackb(self.payload(table, key, value), raw=False)
        except BadRecord as exc:
            raise HistoryDamaged(self.path, [Damage("events", self.path, describe_key(table, bytes(key)),
                                                    str(exc))]) from exc
        except Exception as exc:  # noqa: BLE001 - an unchecked old record that does not decode
            raise HistoryDamaged(self.path, [Damage("events", self.path, describe_key(table, bytes(key)),
                                                    f"does not decode ({exc.__class__.__name__})")]) from exc


def checker(txn: lmdb.Transaction, tables: dict, path: str) -> Checker:
    """The checker of a history, from its meta table; FormatTooNew for a newer history."""
    meta = tables.get("meta")
    raw = txn.get(FORMAT_KEY, db=meta) if meta is not None else None
    if raw is None:
        return Checker(path, 1)
    try:
        found = msgpack.unpackb(raw)
    except Exception:  # noqa: BLE001 - msgpack raises several types for bad input
        found = None
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise HistoryDamaged(path, [Damage("events", path, "meta/'format'", f"not a format number: {bytes(raw).hex()}")])
    check(f"the audit history in {path}", found, HISTORY_FORMAT)
    legacy = txn.get(LEGACY_KEY, db=meta)
    plain = Checker(path, found)
    return Checker(path, found, plain.decode("meta", LEGACY_KEY, legacy) if legacy is not None else None)


def name_key(*parts: str) -> bytes:
    return "\0".join(parts).encode()


def open_tables(env: lmdb.Environment, create: bool, txn: lmdb.Transaction | None = None) -> dict:
    """The environment's named tables (``create=False``: only those that exist)."""
    tables = {}
    for name in TABLES:
        try:
            tables[name] = env.open_db(name.encode(), txn=txn, create=create)
        except lmdb.NotFoundError:
            pass
    return tables


@dataclass(frozen=True)
class HistoryInfo:
    """What a history (live or snapshot) holds."""

    raft_index: int
    first_seq: int
    last_seq: int
    events: int
    messages: int
    gaps: list


def _meta(txn: lmdb.Transaction, db: lmdb._Database | None, key: bytes, default: Any, check_: Checker) -> Any:
    value = txn.get(key, db=db) if db is not None else None
    return check_.decode("meta", key, value) if value is not None else default


def info(txn: lmdb.Transaction, tables: dict, check_: Checker) -> HistoryInfo:
    meta = tables.get("meta")

    def count(name: str) -> int:
        db = tables.get(name)
        return txn.stat(db)["entries"] if db is not None else 0

    return HistoryInfo(raft_index=_meta(txn, meta, b"raft_index", 0, check_),
                       first_seq=_meta(txn, meta, b"first_seq", 0, check_),
                       last_seq=_meta(txn, meta, b"last_seq", 0, check_), events=count("events"),
                       messages=count("messages"), gaps=_meta(txn, meta, b"gaps", [], check_))


def meta_put(put: Callable[..., object], db: lmdb._Database, key: bytes, value: object) -> None:
    """Write one meta record, sealed (``put``: a transaction's put)."""
    put(key, seal(key, msgpack.packb(value, use_bin_type=True)), db=db)


def open_history(path: str) -> lmdb.Environment:
    """Open a history read-only: a live one (it has a lock file) with LMDB's reader lock, a frozen
    snapshot copy (no lock file) without, so that reading a snapshot never writes to it."""
    live = os.path.exists(os.path.join(path, "lock.mdb"))
    return lmdb.open(path, readonly=True, lock=live, max_dbs=len(TABLES) + 1, map_size=0)


def history_info(path: str) -> HistoryInfo:
    env = open_history(path)
    try:
        with env.begin() as txn:
            tables = open_tables(env, create=False, txn=txn)
            return info(txn, tables, checker(txn, tables, path))
    finally:
        env.close()


def read_events(path: str, start: int = 0, stop: int | None = None) -> Iterator[list]:
    """Yield event records (see the module docstring) with start <= seq < stop, in order."""
    yield from read_table(path, "events", start, stop)


def read_table(path: str, table: str, start: int = 0, stop: int | None = None) -> Iterator[list]:
    """Yield a table's records in key order; ``start``/``stop`` bound the key of the u64-keyed
    tables (``events``, ``messages``) and must be left out for the catalog tables."""
    env = open_history(path)
    try:
        yield from records(env, table, start, stop)
    finally:
        env.close()


def records(env: lmdb.Environment, table: str, start: int = 0, stop: int | None = None) -> Iterator[list]:
    """``read_table`` on an environment already open (LMDB allows one handle per process)."""
    with env.begin() as txn:
        tables = open_tables(env, create=False, txn=txn)
        db = tables.get(table)
        if db is None:
            return
        check_ = checker(txn, tables, env.path())
        cursor = txn.cursor(db=db)
        if not (cursor.set_range(U64.pack(start)) if start else cursor.first()):
            return
        for key, value in cursor:
            if stop is not None and U64.unpack(key)[0] >= stop:
                return
            yield check_.decode(table, key, value)


def snapshot(path: str, destination: str) -> HistoryInfo:
    """Write a compact, consistent copy of a (possibly running) node's history to an empty directory."""
    env = open_history(path)
    try:
        return copy_snapshot(env, destination)
    finally:
        env.close()


def copy_snapshot(env: lmdb.Environment, destination: str) -> HistoryInfo:
    """``snapshot`` from an environment already open (the node's own, for the admin API)."""
    os.makedirs(destination, exist_ok=True)
    if os.listdir(destination):
        raise ValueError(f"snapshot destination {destination} must be empty")
    with env.begin() as txn:
        tables = open_tables(env, create=False, txn=txn)
        env.copy(destination, compact=True, txn=txn)
        return info(txn, tables, checker(txn, tables, env.path()))


def scan_history(path: str) -> tuple[list[Damage], int]:
    """Check every record of a (stopped node's, or snapshot) history without writing: the damaged
    records, and how many old records were read unchecked (written before checksums)."""
    if not os.path.exists(os.path.join(path, "data.mdb")):
        return [], 0
    try:
        env = lmdb.open(path, readonly=True, lock=False, max_dbs=len(TABLES) + 1, map_size=0)
    except lmdb.Error as exc:
        return [Damage("events", path, "data.mdb", f"LMDB cannot open it: {exc}")], 0
    damages: list[Damage] = []
    unchecked = 0
    try:
        with env.begin() as txn:
            try:
                tables = open_tables(env, create=False, txn=txn)
                check_ = checker(txn, tables, path)
            except HistoryDamaged as exc:
                return exc.damages, 0
            except lmdb.Error as exc:
                return [Damage("events", path, "tables", f"LMDB cannot open them: {exc}")], 0
            for table, db in tables.items():
                try:
                    for key, value in txn.cursor(db=db):
                        if table == "meta" and key == FORMAT_KEY:
                            continue
                        try:
                            check_.decode(table, key, value)
                        except HistoryDamaged as exc:
                            damages.extend(exc.damages)
                            continue
                        unchecked += not is_sealed(value)
                except lmdb.Error as exc:
                    damages.append(Damage("events", path, f"table {table}", f"LMDB cannot read it: {exc}"))
    finally:
        env.close()
    return damages, unchecked


def may_hold_unchecked(path: str) -> bool:
    """Whether a history may hold records written before checksums (format 1, or a legacy mark):
    only then is a second scan (``scan_history``'s count) worth its time."""
    env = open_history(path)
    try:
        with env.begin() as txn:
            check_ = checker(txn, open_tables(env, create=False, txn=txn), path)
            return check_.format < HISTORY_FORMAT or check_.legacy is not None
    except (StoreDamaged, lmdb.Error):
        return False  # reported as damage by the check itself
    finally:
        env.close()


def verify_history(path: str) -> list[Damage]:
    """``scan_history``'s damaged records (``raftmq verify`` runs this on ``<data>/events``)."""
    return scan_history(path)[0]
