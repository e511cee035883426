"""The LMDB mirror of durable broker state.

One LMDB environment per node with named databases (tables). Applying a batch records the
operations that keep this mirror in step (``PersistenceRecorder``, as effects: apply does no I/O);
the single-node log commits them with ``DurableStore.commit``, one write transaction per batch
(group commit); the node loads everything back with ``DurableStore.load`` at start.

Key layouts (all big-endian so LMDB's byte order is the natural order):
  meta        b"counters" -> msgpack [next_qid, next_msg_id]; b"applied" -> msgpack index;
              b"format" -> msgpack STORE_FORMAT (raftmq/versions.py);
              b"overlay/" + user name (utf-8) -> msgpack {vhost: [configure, write, read] or None}: the
              admin API's permissions for a user of the configuration file (store/core/users.py).  In meta,
              not a table of its own: an older raftmq reads past the key, and the tables stay the same;
              b"limits/vhost/" or b"limits/user/" + name (utf-8) -> msgpack {limit: value} (store/core/limits.py,
              in meta for the same reason)
  vhosts      name (utf-8) -> b""
  users       name (utf-8) -> msgpack [password_hash, tags, loopback_only, {vhost: [configure, write, read]}]
  exchanges   msgpack [vhost, name] -> msgpack [type, auto_delete, internal, arguments]
  queues      msgpack [vhost, name] -> msgpack [qid, auto_delete, arguments]
  bindings    msgpack [vhost, source, dest_is_queue, destination, routing_key, arguments] -> b""
  messages    u64 message id -> msgpack [exchange, routing_key, properties, body, priority, published_at,
              properties_format (store/core/message.py; left out for 0-9-1, as in store format 1)]
  entries     u64 qid + u64 seq -> msgpack [message id, expires_at, priority, delivery_count]
  delayed     u64 due + u64 seq -> msgpack [vhost, exchange, routing_key, message id, properties, body,
              persistent, priority, published_at, expiration, delay] (store/core/delayed.py; every held
              message, persistent or not, as the plugin keeps them all on disk)

Why LMDB's own ``sync=False`` plus an explicit ``sync()``: commits then cost no fsync, and the node
fsyncs once for every batch that promised durability (a confirm, a durable declare) before it
releases that batch's replies. A kill -9 loses nothing either way (the page cache survives it);
the fsync is for power loss.

**Every record carries a checksum (store format 3, issue 29).**  A value is stored *sealed*:
``0xC1`` + CRC32C (4 bytes, big-endian) + the payload above, the CRC taken over the key and then
the payload (``integrity.checksum(key + payload)``), so a flipped byte in a key (a binding, a
vhost: their value is empty) is caught as surely as one in a body.  0xC1 is the one byte msgpack
never uses, so no record of format 1 or 2 (msgpack, or empty) starts with it.  ``b"format"`` alone
stays plain msgpack: an older raftmq must still be able to read the stamp to refuse the store.

*When it is checked*: ``load`` (the node's start) opens every record and checks its CRC;
``message_bodies`` (a persistent body read back after a restart) checks again.  ``verify_state``
(``raftmq verify``) does the same on a stopped node's files without writing.

*What is done about damage*: nothing is dropped.  A damaged record stops the node at start
(``StateDamaged``, exit status ``EXIT_STATE_DAMAGED``, one CRITICAL log line naming every damaged
key) -- it never serves a state its disk does not have.  No table holds something that is safe to
lose silently: ``messages`` and ``delayed`` are confirmed messages, ``entries`` are their places in
queues (without one the message is never delivered), a lost binding or exchange silently drops
what is published to it later, a lost queue drops its messages, a lost user or vhost locks clients
out or lets a password through that was changed, and the ``meta`` counters keep message ids from
being reused (the audit history and deduplication key on them).  A single node has no peer to
repair from, so the operator decides (``raftmq verify`` lists what is damaged; restore the data
directory from a backup, or accept the loss by hand).  A body found damaged while running (after
it passed at start) is left out of ``message_bodies``'s answer with a CRITICAL log line: the body
store then has no body for it, and the message is not delivered with wrong bytes.

*Older stores* (format 1 and 2, no checksums) are upgraded at open: a first read-only pass decodes
every record (msgpack that does not parse is damage: nothing is written and the node stops), then
records are rewritten sealed in transactions of ``UPGRADE_CHUNK``, and the stamp becomes 3 last,
after an fsync.  An upgrade cut short is resumed at the next start (sealed records are recognised
by their first byte and checked).  After it, every record of the store is checked: there is no
lasting "unchecked" mode to reason about.  What the upgrade cannot do is prove bytes written
before it intact; it checksums them as they are (they were never checked before either).
LMDB's own pages carry no checksum: damage to the B-tree structure is reported by LMDB
(``MDB_CORRUPTED``, ``MDB_PAGE_NOTFOUND``: ``lmdb.Error``) and counted as damage of the table.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import lmdb
import msgpack

from raftmq.integrity import Damage
from raftmq.versions import STORE_FORMAT, check

from ..core.effects import DELETE, PUT, PUT_WITH_BODY
from ..core.persistence import (
    GROUP_MESSAGE_PREFIX,
    GROUPS_KEY,
    LIMITS_PREFIX,
    OVERLAY_PREFIX,
    QID_SEQ,
    TX_KEY,
    U64,
    LoadedState,
    pack,
)
from .sealed import EXIT_STORE_DAMAGED, SEAL_HEAD, BadRecord, StoreDamaged, seal, unseal

log = logging.getLogger(__name__)

TABLES = ("meta", "vhosts", "exchanges", "queues", "bindings", "messages", "entries", "users", "delayed")
EMPTY_VALUE_TABLES = frozenset(("vhosts", "bindings"))  # the key is the record; the value is b""

FIRST_CHECKED_FORMAT = 3  # the store format from which every record is sealed
UPGRADE_CHUNK = 10_000  # records rewritten per transaction when an older store is upgraded
EXIT_STATE_DAMAGED = EXIT_STORE_DAMAGED


class StateDamaged(StoreDamaged):
    """The single-node state has damaged records: the node does not start on it."""

    def __init__(self, path: str, damages: list[Damage]) -> None:
        shown = "; ".join(f"{d.where}: {d.what}" for d in damages[:20])
        more = f" (and {len(damages) - 20} more)" if len(damages) > 20 else ""
        super().__init__(f"the single-node state in {path} has {len(damages)} damaged record(s): {shown}{more}. "
                         f"Not starting on it: nothing is dropped silently. `raftmq verify --data-dir` lists "
                         f"them; restore the data directory from a backup or remove the records by hand",
                         damages)
        self.path = path


def describe_key(table: str, key: bytes) -> str:
    """A damaged record's place, for a person: table and key (decoded when the layout says how)."""
    try:
        if table in ("messages",) and len(key) == 8:
            return f"{table}/message {U64.unpack(key)[0]}"
        if table in ("entries", "delayed") and len(key) == 16:
            a, b = QID_SEQ.unpack(key)
            return f"{table}/{'qid' if table == 'entries' else 'due'} {a} seq {b}"
        if table in ("vhosts", "users", "meta"):
            return f"{table}/{key.decode()!r}"
        return f"{table}/{_unpack(key)!r}"
    except Exception:  # noqa: BLE001 - a damaged key may decode as nothing: show its bytes
        return f"{table}/key {key.hex()}"


def _check_payload(table: str, key: bytes, payload: bytes | memoryview) -> None:
    """An unsealed record's structure (the only check an older record allows): msgpack that parses."""
    if table in EMPTY_VALUE_TABLES:
        if len(payload):
            raise BadRecord(f"{len(payload)} bytes where the layout has none")
        if table == "bindings":
            _unpack(key)
        return
    try:
        _unpack(payload)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types for bad input
        raise BadRecord(f"does not decode ({exc.__class__.__name__})") from exc


def _unpack(data: bytes | memoryview) -> Any:
    """A record's value.  Any: its shape is the one ``pack`` was given for that table (the table
    says which; the record's checksum proved the bytes are those written), not a static type."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def entry_key(qid: int, seq: int) -> bytes:
    return QID_SEQ.pack(qid, seq)


class DurableStore:
    """Owns the LMDB environment of one node."""

    def __init__(self, path: str, map_size: int = 1 << 40) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=len(TABLES) + 4,
            sync=False,
            metasync=False,
            max_readers=256,
        )
        self.db = {name: self.env.open_db(name.encode()) for name in TABLES}
        self._sealed_on_upgrade = 0
        self._check_format()

    def _check_format(self) -> None:
        """Stamp the store with STORE_FORMAT; refuse one written by a newer raftmq (FormatTooNew).
        A store without a stamp predates numbered formats: version 1.  An older store is re-stamped:
        this raftmq reads its records and writes records of its own format from now on, which an
        older raftmq must then refuse rather than misread.  A store older than format 3 is first
        upgraded: every record sealed (see the module docstring), the stamp last."""
        with self.env.begin() as txn:
            found = read_format(txn, self.db["meta"], self.path)
        check(f"the LMDB store in {self.path}", found, STORE_FORMAT)
        if found < FIRST_CHECKED_FORMAT:
            self._seal_older_records(found)
        if found < FIRST_CHECKED_FORMAT and found > 1 or self._sealed_on_upgrade:
            log.warning("the LMDB store in %s was format %d: %d record(s) now carry checksums (format %d); "
                        "they were written unchecked and are checked from now on", self.path, found,
                        self._sealed_on_upgrade, STORE_FORMAT)
        if found < STORE_FORMAT:
            with self.env.begin(write=True) as txn:
                txn.put(b"format", pack(STORE_FORMAT), db=self.db["meta"])
            self.sync()

    def _seal_older_records(self, found: int) -> None:
        """Upgrade a format 1-2 store: check every record's structure (stop on damage, nothing
        written), then seal the unsealed ones, UPGRADE_CHUNK per transaction."""
        damages = scan_tables(self.env, self.db, self.path, sealed_only=False)
        if damages:
            raise StateDamaged(self.path, damages)
        sealed = 0
        for table in TABLES:
            db = self.db[table]
            after: bytes | None = None
            while True:
                with self.env.begin() as txn:
                    cursor = txn.cursor(db=db)
                    positioned = cursor.set_range(after) if after is not None else cursor.first()
                    chunk: list[tuple[bytes, bytes]] = []
                    while positioned and len(chunk) < UPGRADE_CHUNK:
                        key, value = bytes(cursor.key()), cursor.value()
                        if not (after is not None and key == after) and value[:1] != SEAL_HEAD \
                                and not (table == "meta" and key == b"format"):
                            chunk.append((key, bytes(value)))
                        after = key
                        positioned = cursor.next()
                if chunk:
                    with self.env.begin(write=True) as txn:
                        for key, value in chunk:
                            txn.put(key, seal(key, value), db=db)
                    sealed += len(chunk)
                if not positioned:
                    break
        self.sync()
        self._sealed_on_upgrade = sealed

    def close(self) -> None:
        self.env.close()

    def sync(self) -> None:
        """fsync everything committed so far (called off the event loop)."""
        self.env.sync(True)

    def commit(self, ops: list[tuple], counters: tuple[int, int], applied_index: int | None = None,
               body_of: Callable[[int], bytes | None] | None = None) -> None:
        """Perform one batch's persistence operations (``PersistenceRecorder``) in one transaction,
        with the id counters (and the applied index, when there is one).  Nothing to do, no
        transaction.  Not fsynced here: ``sync`` is (group commit, see raft/local.py).

        ``body_of`` gives the bodies of message and delayed records (the model holds none): the
        node's body store, which holds this batch's bodies by the time it commits."""
        if not ops and applied_index is None:
            return
        db = self.db
        with self.env.begin(write=True) as txn:
            for op in ops:
                kind, table = op[0], db[op[1]]
                if kind == PUT:
                    txn.put(op[2], seal(op[2], op[3]), db=table)
                elif kind == PUT_WITH_BODY:
                    _, _, key, record, at, msg_id = op
                    body = body_of(msg_id) if body_of is not None else None
                    if body is None:
                        raise LookupError(f"no body for message {msg_id} to store")
                    record = list(record)
                    record[at] = body
                    txn.put(key, seal(key, pack(record)), db=table)
                elif kind == DELETE:
                    txn.delete(op[2], db=table)
                else:  # DELETE_PREFIX
                    prefix, size = op[2], len(op[2])
                    cursor = txn.cursor(db=table)
                    if cursor.set_range(prefix):
                        while cursor.key()[:size] == prefix:
                            if not cursor.delete():
                                break
            meta = db["meta"]
            txn.put(b"counters", seal(b"counters", pack(list(counters))), db=meta)
            if applied_index is not None:
                txn.put(b"applied", seal(b"applied", pack(applied_index)), db=meta)

    def load(self) -> LoadedState:
        """Everything in the store, every record checked (StateDamaged names all damaged ones)."""
        state = LoadedState()
        damages: list[Damage] = []
        with self.env.begin() as txn:

            def records(table: str) -> Iterator[tuple[bytes, Any]]:
                for key, payload in self._checked(txn, table, damages):
                    yield key, (None if table in EMPTY_VALUE_TABLES else _unpack(payload))

            meta = {bytes(k): v for k, v in records("meta")}
            if b"counters" in meta:
                state.counters = tuple(meta[b"counters"])
            if b"applied" in meta:
                state.applied_index = meta[b"applied"]
            if GROUPS_KEY in meta:
                state.groups = meta[GROUPS_KEY]
            if TX_KEY in meta:
                state.tx = meta[TX_KEY]
            for k, v in sorted(meta.items()):
                if k.startswith(GROUP_MESSAGE_PREFIX):
                    target, seq = QID_SEQ.unpack(k[len(GROUP_MESSAGE_PREFIX):])
                    state.group_messages.append((target, seq, v))
            state.vhosts = [k.decode() for k, _ in records("vhosts")]
            state.permission_overlay = [(k[len(OVERLAY_PREFIX):].decode(), v) for k, v in sorted(meta.items())
                                        if k.startswith(OVERLAY_PREFIX)]
            for k, v in sorted(meta.items()):
                if k.startswith(LIMITS_PREFIX):
                    scope, _, name = k[len(LIMITS_PREFIX):].decode().partition("/")
                    state.limits.append((scope, name, v))
            state.users = [(k.decode(), v) for k, v in records("users")]
            for k, v in records("exchanges"):
                vhost, name = _unpack(k)
                type_, auto_delete, internal, args = v
                state.exchanges.append((vhost, name, type_, auto_delete, internal, args))
            for k, v in records("queues"):
                vhost, name = _unpack(k)
                qid, auto_delete, args = v
                state.queues.append((vhost, name, qid, auto_delete, args))
            for k, _ in records("bindings"):
                state.bindings.append(tuple(_unpack(k)))
            for k, v in records("messages"):
                state.messages[U64.unpack(k)[0]] = v
            for k, v in records("entries"):
                qid, seq = QID_SEQ.unpack(k)
                state.entries.append((qid, seq, v))
            for k, v in records("delayed"):
                due, seq = QID_SEQ.unpack(k)
                state.delayed.append((due, seq, v))
        if damages:
            raise StateDamaged(self.path, damages)
        return state

    def _checked(self, txn: lmdb.Transaction[bytes], table: str, damages: list[Damage]) -> Iterator[tuple[bytes, bytes]]:
        """A table's (key, payload) pairs whose checksum holds; the others go to ``damages``."""
        try:
            for key, value in txn.cursor(db=self.db[table]):
                if table == "meta" and key == b"format":
                    continue
                try:
                    yield key, unseal(key, value)
                except BadRecord as exc:
                    damages.append(Damage("state", self.path, describe_key(table, key), str(exc)))
        except lmdb.Error as exc:
            damages.append(Damage("state", self.path, f"table {table}", f"LMDB cannot read it: {exc}"))

    def message_bodies(self, ids: Iterable[int]) -> dict[int, bytes]:
        """The bodies of the stored messages among ``ids`` (a single node's persistent messages
        are read back from here after a restart: store/disk/bodies.py's fallback)."""
        found: dict[int, bytes] = {}
        table = self.db["messages"]
        with self.env.begin(db=table) as txn:
            for msg_id in sorted(ids):
                key = U64.pack(msg_id)
                raw = txn.get(key)
                if raw is None:
                    continue
                try:
                    found[msg_id] = _unpack(unseal(key, raw))[3]
                except BadRecord as exc:  # it passed at start: damaged since, on a running node
                    log.critical("the single-node state in %s: message %d is damaged (%s); its body is not "
                                 "served (run raftmq verify once the node is stopped)", self.path, msg_id, exc)
        return found

    def digest(self) -> str:
        """SHA-256 over every table's keys and values in key order: equal state, equal digest."""
        h = hashlib.sha256()
        with self.env.begin() as txn:
            for table in TABLES:
                h.update(table.encode() + b"\x00")
                for k, v in txn.cursor(db=self.db[table]):
                    h.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
        return h.hexdigest()

    def table_items(self, table: str) -> list[tuple[bytes, bytes]]:
        """A table's (key, payload) pairs, checked (BadRecord on a damaged one)."""
        with self.env.begin() as txn:
            return [(bytes(k), bytes(v) if table == "meta" and k == b"format" else bytes(unseal(k, v)))
                    for k, v in txn.cursor(db=self.db[table])]


def read_format(txn: lmdb.Transaction, meta: lmdb._Database, path: str) -> int:
    """The store's format stamp (1 when there is none: it predates numbered formats)."""
    raw = txn.get(b"format", db=meta)
    if raw is None:
        return 1
    try:
        found = _unpack(raw)
    except Exception:  # noqa: BLE001 - msgpack raises several types for bad input
        found = None
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise StateDamaged(path, [Damage("state", path, "meta/'format'", f"not a format number: {bytes(raw).hex()}")])
    return found


def scan_tables(env: lmdb.Environment, dbs: dict, path: str, sealed_only: bool) -> list[Damage]:
    """Check every record of every table (``sealed_only`` False: an older store, where an unsealed
    record is checked for structure only)."""
    damages: list[Damage] = []
    with env.begin() as txn:
        for table in TABLES:
            db = dbs.get(table)
            if db is None:
                continue
            try:
                for key, value in txn.cursor(db=db):
                    if table == "meta" and key == b"format":
                        continue
                    try:
                        payload = unseal(key, value, sealed_only)
                        if payload is value:  # unsealed, accepted on its structure
                            _check_payload(table, key, payload)
                    except BadRecord as exc:
                        damages.append(Damage("state", path, describe_key(table, key), str(exc)))
                    except Exception as exc:  # noqa: BLE001 - a damaged key that does not decode
                        damages.append(Damage("state", path, describe_key(table, key),
                                              f"does not decode ({exc.__class__.__name__})"))
            except lmdb.Error as exc:
                damages.append(Damage("state", path, f"table {table}", f"LMDB cannot read it: {exc}"))
    return damages


def verify_state(path: str) -> list[Damage]:
    """Check a stopped node's single-node state (``<data>/state``) without writing to it: every
    record's checksum (format 3), or the structure of every record of an older store (which the
    node seals at its next start).  ``raftmq verify`` runs this."""
    if not os.path.exists(os.path.join(path, "data.mdb")):
        return []
    try:
        env = lmdb.open(path, readonly=True, lock=False, max_dbs=len(TABLES) + 4, map_size=0)
    except lmdb.Error as exc:
        return [Damage("state", path, "data.mdb", f"LMDB cannot open it: {exc}")]
    try:
        dbs: dict = {}
        for table in TABLES:
            try:
                dbs[table] = env.open_db(table.encode(), create=False)
            except lmdb.NotFoundError:
                pass
            except lmdb.Error as exc:
                return [Damage("state", path, f"table {table}", f"LMDB cannot open it: {exc}")]
        try:
            with env.begin() as txn:
                found = read_format(txn, dbs["meta"], path) if "meta" in dbs else 1
        except StateDamaged as exc:
            return exc.damages
        return scan_tables(env, dbs, path, sealed_only=found >= FIRST_CHECKED_FORMAT)
    finally:
        env.close()
