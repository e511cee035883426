"""The LMDB mirror of durable broker state.

One LMDB environment per node with named databases (tables). Applying a batch records the
operations that keep this mirror in step (``PersistenceRecorder``, as effects: apply does no I/O);
the single-node log commits them with ``DurableStore.commit``, one write transaction per batch
(group commit); the node loads everything back with ``DurableStore.load`` at start.

Key layouts (all big-endian so LMDB's byte order is the natural order):
  meta        b"counters" -> msgpack [next_qid, next_msg_id]; b"applied" -> msgpack index;
              b"format" -> msgpack STORE_FORMAT (store/versions.py)
  vhosts      name (utf-8) -> b""
  users       name (utf-8) -> msgpack [password_hash, tags, loopback_only, {vhost: [configure, write, read]}]
  exchanges   msgpack [vhost, name] -> msgpack [type, auto_delete, internal, arguments]
  queues      msgpack [vhost, name] -> msgpack [qid, auto_delete, arguments]
  bindings    msgpack [vhost, source, dest_is_queue, destination, routing_key, arguments] -> b""
  messages    u64 message id -> msgpack [exchange, routing_key, properties, body, priority, published_at,
              properties_format (store/message.py; left out for 0-9-1, as in store format 1)]
  entries     u64 qid + u64 seq -> msgpack [message id, expires_at, priority, delivery_count]
  delayed     u64 due + u64 seq -> msgpack [vhost, exchange, routing_key, message id, properties, body,
              persistent, priority, published_at, expiration, delay] (store/delayed.py; every held
              message, persistent or not, as the plugin keeps them all on disk)

Why LMDB's own ``sync=False`` plus an explicit ``sync()``: commits then cost no fsync, and the node
fsyncs once for every batch that promised durability (a confirm, a durable declare) before it
releases that batch's replies. A kill -9 loses nothing either way (the page cache survives it);
the fsync is for power loss.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import lmdb
import msgpack

from .effects import DELETE, DELETE_PREFIX, PUT, PUT_WITH_BODY
from .versions import STORE_FORMAT, check

_U64 = struct.Struct(">Q")
_QID_SEQ = struct.Struct(">QQ")

TABLES = ("meta", "vhosts", "exchanges", "queues", "bindings", "messages", "entries", "users", "delayed")


def _pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unpack(data: bytes) -> object:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def entry_key(qid: int, seq: int) -> bytes:
    return _QID_SEQ.pack(qid, seq)


@dataclass(slots=True)
class LoadedState:
    """Everything read back from LMDB at start, in key order."""

    counters: tuple[int, int] = (1, 1)
    applied_index: int = 0
    vhosts: list[str] = field(default_factory=list)
    users: list[tuple[str, list]] = field(default_factory=list)
    exchanges: list[tuple[str, str, str, bool, bool, dict]] = field(default_factory=list)
    queues: list[tuple[str, str, int, bool, dict]] = field(default_factory=list)
    bindings: list[tuple[str, str, bool, str, str, dict]] = field(default_factory=list)
    messages: dict[int, list] = field(default_factory=dict)
    entries: list[tuple[int, int, list]] = field(default_factory=list)
    delayed: list[tuple[int, int, list]] = field(default_factory=list)


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
        self._check_format()

    def _check_format(self) -> None:
        """Stamp the store with STORE_FORMAT; refuse one written by a newer raftmq (FormatTooNew).
        A store without a stamp predates numbered formats: version 1.  An older store is re-stamped:
        this raftmq reads its records and writes records of its own format from now on, which an
        older raftmq must then refuse rather than misread."""
        with self.env.begin(write=True) as txn:
            raw = txn.get(b"format", db=self.db["meta"])
            if raw is not None:
                check(f"the LMDB store in {self.path}", _unpack(raw), STORE_FORMAT)
            if raw is None or _unpack(raw) < STORE_FORMAT:
                txn.put(b"format", _pack(STORE_FORMAT), db=self.db["meta"])

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
                    txn.put(op[2], op[3], db=table)
                elif kind == PUT_WITH_BODY:
                    _, _, key, record, at, msg_id = op
                    body = body_of(msg_id) if body_of is not None else None
                    if body is None:
                        raise LookupError(f"no body for message {msg_id} to store")
                    record = list(record)
                    record[at] = body
                    txn.put(key, _pack(record), db=table)
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
            txn.put(b"counters", _pack(list(counters)), db=meta)
            if applied_index is not None:
                txn.put(b"applied", _pack(applied_index), db=meta)

    def load(self) -> LoadedState:
        state = LoadedState()
        db = self.db
        with self.env.begin() as txn:
            raw = txn.get(b"counters", db=db["meta"])
            if raw is not None:
                state.counters = tuple(_unpack(raw))
            raw = txn.get(b"applied", db=db["meta"])
            if raw is not None:
                state.applied_index = _unpack(raw)
            state.vhosts = [bytes(k).decode() for k, _ in txn.cursor(db=db["vhosts"])]
            state.users = [(bytes(k).decode(), _unpack(v)) for k, v in txn.cursor(db=db["users"])]
            for k, v in txn.cursor(db=db["exchanges"]):
                vhost, name = _unpack(k)
                type_, auto_delete, internal, args = _unpack(v)
                state.exchanges.append((vhost, name, type_, auto_delete, internal, args))
            for k, v in txn.cursor(db=db["queues"]):
                vhost, name = _unpack(k)
                qid, auto_delete, args = _unpack(v)
                state.queues.append((vhost, name, qid, auto_delete, args))
            for k, _ in txn.cursor(db=db["bindings"]):
                state.bindings.append(tuple(_unpack(k)))
            for k, v in txn.cursor(db=db["messages"]):
                state.messages[_U64.unpack(k)[0]] = _unpack(v)
            for k, v in txn.cursor(db=db["entries"]):
                qid, seq = _QID_SEQ.unpack(k)
                state.entries.append((qid, seq, _unpack(v)))
            for k, v in txn.cursor(db=db["delayed"]):
                due, seq = _QID_SEQ.unpack(k)
                state.delayed.append((due, seq, _unpack(v)))
        return state

    def message_bodies(self, ids) -> dict[int, bytes]:
        """The bodies of the stored messages among ``ids`` (a single node's persistent messages
        are read back from here after a restart: store/bodies.py's fallback)."""
        found: dict[int, bytes] = {}
        table = self.db["messages"]
        with self.env.begin(db=table) as txn:
            for msg_id in sorted(ids):
                raw = txn.get(_U64.pack(msg_id))
                if raw is not None:
                    found[msg_id] = _unpack(raw)[3]
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
        with self.env.begin() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor(db=self.db[table])]


def binding_key(vhost: str, source: str, dest_is_queue: bool, dest: str, rk: str, args: dict) -> bytes:
    return _pack([vhost, source, dest_is_queue, dest, rk, args])


class PersistenceRecorder:
    """Records, during one apply, the LMDB operations that keep the durable mirror in step with the
    model (``store/effects.py``): apply itself does no I/O; ``DurableStore.commit`` performs them
    after it, in one write transaction per batch (group commit)."""

    __slots__ = ("ops", "sync_needed")

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.sync_needed = False

    def _put(self, table: str, key: bytes, value: bytes, durable_promise: bool = True) -> None:
        self.ops.append((PUT, table, key, value))
        if durable_promise:
            self.sync_needed = True

    def _delete(self, table: str, key: bytes) -> None:
        self.ops.append((DELETE, table, key))

    def put_vhost(self, name: str) -> None:
        self._put("vhosts", name.encode(), b"")

    def put_user(self, name: str, record: list) -> None:
        self._put("users", name.encode(), _pack(record))

    def delete_user(self, name: str) -> None:
        self._delete("users", name.encode())

    def put_exchange(self, vhost: str, name: str, type_: str, auto_delete: bool, internal: bool, args: dict):
        self._put("exchanges", _pack([vhost, name]), _pack([type_, auto_delete, internal, args]))

    def delete_exchange(self, vhost: str, name: str) -> None:
        self._delete("exchanges", _pack([vhost, name]))
        self.sync_needed = True

    def put_queue(self, vhost: str, name: str, qid: int, auto_delete: bool, args: dict) -> None:
        self._put("queues", _pack([vhost, name]), _pack([qid, auto_delete, args]))

    def delete_queue(self, vhost: str, name: str, qid: int) -> None:
        self._delete("queues", _pack([vhost, name]))
        self.ops.append((DELETE_PREFIX, "entries", _U64.pack(qid)))
        self.sync_needed = True

    def put_binding(self, key: bytes) -> None:
        self._put("bindings", key, b"")

    def delete_binding(self, key: bytes) -> None:
        self._delete("bindings", key)
        self.sync_needed = True

    def put_message(self, msg_id: int, record: list) -> None:
        """``record[3]``, the body, is filled in at commit."""
        self.ops.append((PUT_WITH_BODY, "messages", _U64.pack(msg_id), record, 3, msg_id))
        self.sync_needed = True

    def delete_message(self, msg_id: int) -> None:
        self._delete("messages", _U64.pack(msg_id))

    def put_entry(self, qid: int, seq: int, record: list, durable_promise: bool = True) -> None:
        self._put("entries", _QID_SEQ.pack(qid, seq), _pack(record), durable_promise)

    def delete_entry(self, qid: int, seq: int) -> None:
        self._delete("entries", _QID_SEQ.pack(qid, seq))

    def put_delayed(self, due: int, seq: int, record: list) -> None:
        """``record[5]``, the body of message ``record[3]``, is filled in at commit."""
        self.ops.append((PUT_WITH_BODY, "delayed", _QID_SEQ.pack(due, seq), record, 5, record[3]))
        self.sync_needed = True

    def delete_delayed(self, due: int, seq: int) -> None:
        self._delete("delayed", _QID_SEQ.pack(due, seq))
