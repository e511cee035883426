"""What the single node's LMDB mirror needs from apply: persistence operations recorded as data.

A single node keeps its state in LMDB (``store/disk/durable.py``), in step with the model.  Apply
does no I/O: while it runs, the machine records here the operations that keep the mirror in step
(``PersistenceRecorder``, effects.persistence), and the applier commits them after it, in one write
transaction per batch.  At start the mirror's contents come back as a ``LoadedState``, from which
``StateMachine.restore`` rebuilds the model.  The key and value encodings live here, beside the
operations that produce them; the store reads them back with the same helpers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import msgpack

from .effects import DELETE, DELETE_PREFIX, PUT, PUT_WITH_BODY

U64 = struct.Struct(">Q")
QID_SEQ = struct.Struct(">QQ")

OVERLAY_PREFIX = b"overlay/"  # meta keys of configuration-file users' permissions (store/core/users.py)
LIMITS_PREFIX = b"limits/"  # meta keys of vhost and user limits: limits/<scope>/<name> (store/core/limits.py)
GROUPS_KEY = b"groups"  # meta key of a single node's queue-group state (store/core/groups.py, issue 34)
TX_KEY = b"tx"  # meta key of a single node's cross-group transaction state (store/core/tx_groups.py)
GROUP_MESSAGE_PREFIX = b"gmsg/"  # meta keys of its message outbox: gmsg/<target u64><seq u64>




def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@dataclass(slots=True)
class LoadedState:
    """Everything read back from LMDB at start, in key order."""

    counters: tuple[int, int] = (1, 1)
    applied_index: int = 0
    vhosts: list[str] = field(default_factory=list)
    users: list[tuple[str, list]] = field(default_factory=list)
    permission_overlay: list[tuple[str, dict]] = field(default_factory=list)
    limits: list[tuple[str, str, dict]] = field(default_factory=list)  # (scope, name, {limit: value})
    exchanges: list[tuple[str, str, str, bool, bool, dict]] = field(default_factory=list)
    queues: list[tuple[str, str, int, bool, dict]] = field(default_factory=list)
    bindings: list[tuple[str, str, bool, str, str, dict]] = field(default_factory=list)
    messages: dict[int, list] = field(default_factory=dict)
    entries: list[tuple[int, int, list]] = field(default_factory=list)
    delayed: list[tuple[int, int, list]] = field(default_factory=list)
    groups: list | None = None  # store/core/groups.py ``persisted_state``; None: one group
    group_messages: list[tuple[int, int, list]] = field(default_factory=list)  # (target, seq, record)
    tx: list | None = None  # store/core/tx_groups.py ``persisted_state``; None: none kept


def binding_key(vhost: str, source: str, dest_is_queue: bool, dest: str, rk: str, args: dict) -> bytes:
    return pack([vhost, source, dest_is_queue, dest, rk, args])


class PersistenceRecorder:
    """Records, during one apply, the LMDB operations that keep the durable mirror in step with the
    model (``store/core/effects.py``): apply itself does no I/O; ``DurableStore.commit`` performs them
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

    def delete_vhost(self, name: str) -> None:
        self._delete("vhosts", name.encode())
        self.sync_needed = True  # the admin's 204 promises it, as a durable declare's ok does

    def put_overlay(self, name: str, overlay: dict) -> None:
        self._put("meta", OVERLAY_PREFIX + name.encode(), pack(overlay))

    def delete_overlay(self, name: str) -> None:
        self._delete("meta", OVERLAY_PREFIX + name.encode())
        self.sync_needed = True

    def put_limits(self, scope: str, name: str, limits: dict) -> None:
        """A vhost's or user's limits (store/core/limits.py); none left: the key goes."""
        key = LIMITS_PREFIX + f"{scope}/{name}".encode()
        if limits:
            self._put("meta", key, pack(limits))
        else:
            self._delete("meta", key)
        self.sync_needed = True

    def put_groups(self, state: list) -> None:
        """A single node's queue-group state (store/core/groups.py), whole, when it changed."""
        self._put("meta", GROUPS_KEY, pack(state))

    def put_tx(self, state: list) -> None:
        """A single node's cross-group transaction state (store/core/tx_groups.py), whole."""
        self._put("meta", TX_KEY, pack(state))

    def put_group_message(self, target: int, seq: int, record: list) -> None:
        """A message outbox entry; ``record[5]``, the body of message ``record[1]``, is filled in
        at commit (store/core/groups.py)."""
        key = GROUP_MESSAGE_PREFIX + QID_SEQ.pack(target, seq)
        self.ops.append((PUT_WITH_BODY, "meta", key, record, 5, record[1]))
        self.sync_needed = True

    def delete_group_message(self, target: int, seq: int) -> None:
        self._delete("meta", GROUP_MESSAGE_PREFIX + QID_SEQ.pack(target, seq))

    def put_user(self, name: str, record: list) -> None:
        self._put("users", name.encode(), pack(record))

    def delete_user(self, name: str) -> None:
        self._delete("users", name.encode())

    def put_exchange(self, vhost: str, name: str, type_: str, auto_delete: bool, internal: bool, args: dict) -> None:
        self._put("exchanges", pack([vhost, name]), pack([type_, auto_delete, internal, args]))

    def delete_exchange(self, vhost: str, name: str) -> None:
        self._delete("exchanges", pack([vhost, name]))
        self.sync_needed = True

    def put_queue(self, vhost: str, name: str, qid: int, auto_delete: bool, args: dict) -> None:
        self._put("queues", pack([vhost, name]), pack([qid, auto_delete, args]))

    def delete_queue(self, vhost: str, name: str, qid: int) -> None:
        self._delete("queues", pack([vhost, name]))
        self.ops.append((DELETE_PREFIX, "entries", U64.pack(qid)))
        self.sync_needed = True

    def put_binding(self, key: bytes) -> None:
        self._put("bindings", key, b"")

    def delete_binding(self, key: bytes) -> None:
        self._delete("bindings", key)
        self.sync_needed = True

    def put_message(self, msg_id: int, record: list) -> None:
        """``record[3]``, the body, is filled in at commit."""
        self.ops.append((PUT_WITH_BODY, "messages", U64.pack(msg_id), record, 3, msg_id))
        self.sync_needed = True

    def delete_message(self, msg_id: int) -> None:
        self._delete("messages", U64.pack(msg_id))

    def put_entry(self, qid: int, seq: int, record: list, durable_promise: bool = True) -> None:
        self._put("entries", QID_SEQ.pack(qid, seq), pack(record), durable_promise)

    def delete_entry(self, qid: int, seq: int) -> None:
        self._delete("entries", QID_SEQ.pack(qid, seq))

    def put_delayed(self, due: int, seq: int, record: list) -> None:
        """``record[5]``, the body of message ``record[3]``, is filled in at commit."""
        self.ops.append((PUT_WITH_BODY, "delayed", QID_SEQ.pack(due, seq), record, 5, record[3]))
        self.sync_needed = True

    def delete_delayed(self, due: int, seq: int) -> None:
        self._delete("delayed", QID_SEQ.pack(due, seq))
