"""Snapshots of the whole state machine, and a digest to compare replicas.

A Raft snapshot must reproduce the *entire* replicated state at one log index, transient messages,
channels, consumers and unacknowledged deliveries included: a follower that installs it and then
applies the following entries must end up exactly where the others are.  The durable LMDB mirror
(``durable.py``) holds only what survives a restart in single-node mode, so snapshots are taken from
the in-memory model instead.

A snapshot is an LMDB file (``subdir=False``) with two records:

* ``meta``: opaque bytes owned by the Raft layer (the last applied entries and the membership);
* ``format``: the snapshot format version (``raftmq/versions.py``; absent in version 1 files);
* ``check`` (format 4 on): CRC32C of ``format`` + ``meta`` and of ``model`` (two u32), checked on
  every read (issue 29): a snapshot that fails it is :class:`SnapshotDamaged`, never installed;
* ``model``: the model without message bodies, as msgpack ``[FLAT, pickle, message rows, ready
  rows]``: the object graph (channels, consumers, unacked entries, sessions...) pickled, with every
  ``Message`` and every queue's ``ReadyList`` replaced by a reference into flat rows.  The rows
  are built and packed in C (``attrgetter``, msgpack): a model of a million queued messages
  pickled as objects took seconds, and a snapshot's time must not grow with the backlog faster
  than that (issue 18).  Formats 1 and 2 were one pickle, with the bodies (issue 18: each node keeps them in its body
  store, store/disk/bodies.py; a follower that installs a snapshot fetches the ones it lacks,
  store/disk/body_fetch.py).  Formats 1 and 2 held the bodies: ``import_model`` hands them back.  Pickle keeps the object graph (a message shared by several
  queues, consumers pointing at their channels) without a hand-written schema.  Snapshots travel
  only between cluster members over the authenticated, encrypted Raft transport and are read only
  from the node's own data directory, the same trust boundary as pysyncobj's own wire format.
"""

from __future__ import annotations

import gc
import hashlib
import io
import os
import pickle
import struct
import threading
from collections import deque
from collections.abc import Iterator
from operator import attrgetter
from typing import Any, Literal, overload

import lmdb
import msgpack

from raftmq.integrity import Damage, SnapshotDamaged, checksum
from raftmq.versions import SNAPSHOT_FORMAT, FormatTooNew, check

from ..core.frozen import FrozenRun
from ..core.machine import StateMachine
from ..core.model import LEGACY_BODIES, Entry, Message, ReadyList
from ..core.tx_groups import digest_items as tx_digest_items

#: The attributes of StateMachine that make up the replicated state.
MODEL_FIELDS = (
    "vhosts", "channels", "exclusive_queues", "queues_by_id", "inbound", "expiring", "idle_expiring",
    "queue_last_used", "next_qid", "next_msg_id", "applied_index", "message_bytes", "_now",
    "applied_batches", "members", "sessions", "detached_sessions", "stats", "event_seq", "users",
    "delayed", "exchange_caches",  # issue 21 (store/core/delayed.py, store/core/exchange_dedup.py)
    "rescan",  # issue 37 (filtered consumers, store/core/delivery.py)
    "permission_overlay",  # issue 37 (configuration-file users' permissions, store/core/users.py)
    "vhost_limits", "user_limits",  # issue 31 (store/core/limits.py); absent in older snapshots: no limits
    # issue 34 (store/core/groups.py): absent in older snapshots, one group
    "group_count", "meta_outbox", "meta_seq", "meta_applied", "gone_outbox", "gone_seq", "gone_applied",
    "msg_outbox", "msg_seq", "msg_applied",
    "tx_next", "tx_part_seq", "tx_coord", "tx_prep_applied", "tx_held",  # issue 34 (store/core/tx_groups.py)
    "tx_decided",  # issue 34, session 21 (0-10 commits across groups); absent in older snapshots: none
    "chain_head", "chain_on",  # issue 36 (store/core/events.py); absent in older snapshots: the chain starts there
)


#: The first item of a format-3 model: its layout (a pickle of formats 1-2 starts with 0x80).
FLAT = 1
_MESSAGE_ROW = attrgetter("id", "exchange", "routing_key", "properties", "size", "persistent", "priority",
                          "published_at", "refs", "format", "live")  # Message's fields, in order
_ENTRY_ROW = attrgetter("seq", "message.id", "expires_at", "priority", "durable", "delivery_count")
_ENTRY_MESSAGE = attrgetter("message")
_ID = attrgetter("id")


class _ModelPickler(pickle.Pickler):
    """Pickles the object graph, leaving out what goes into rows: a ``Message`` becomes its id
    (> 0), a ``ReadyList`` its position in ``ready`` (<= 0)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5)
        self.messages: dict[int, Message] = {}
        self.ready: list[ReadyList] = []

    def persistent_id(self, obj: Any) -> int | None:
        # Any, as pickle.Pickler declares it: every object of the graph comes here, so the class
        # test stays one attribute read (no isinstance) and does not narrow for the checker.
        cls = obj.__class__
        if cls is Message:
            self.messages[obj.id] = obj
            return obj.id
        if cls is ReadyList:
            self.ready.append(obj)
            return 1 - len(self.ready)
        return None


def _ready_rows(ready: ReadyList, messages: dict[int, Message]) -> list:
    """[fresh entries per level, requeued entries per level (heap order)], each entry a row."""
    fresh, returned = [], []
    for level in ready._levels:
        if any(item.__class__ is FrozenRun for item in level):
            # Frozen runs (store/core/frozen.py) go as their columns' bytes; their messages are in them.
            fresh.append([item.to_row() if item.__class__ is FrozenRun else _ENTRY_ROW(item) for item in level])
            held = [item.message for item in level if isinstance(item, Entry)]
        else:
            fresh.append(list(map(_ENTRY_ROW, level)))
            held = list(map(_ENTRY_MESSAGE, level))
        messages.update(zip(map(_ID, held), held, strict=True))
    for heap in ready._returned:
        entries = [entry for _seq, entry in heap]
        returned.append(list(map(_ENTRY_ROW, entries)))
        held = list(map(_ENTRY_MESSAGE, entries))
        messages.update(zip(map(_ID, held), held, strict=True))
    return [fresh, returned]


def export_model(machine: StateMachine) -> bytes:
    buffer = io.BytesIO()
    pickler = _ModelPickler(buffer)
    pickler.dump({name: getattr(machine, name) for name in MODEL_FIELDS})
    messages = pickler.messages
    ready_rows = [_ready_rows(ready, messages) for ready in pickler.ready]
    message_rows = list(map(_MESSAGE_ROW, messages.values()))
    return msgpack.packb([FLAT, buffer.getvalue(), message_rows, ready_rows], use_bin_type=True)


def _ready_from_rows(rows: list, messages: dict[int, Message]) -> ReadyList:
    fresh, returned = rows
    ready = ReadyList.__new__(ReadyList)
    ready._levels = [deque([FrozenRun.from_row(row) if row[0] == "run" else
                            Entry(row[0], messages[row[1]], *row[2:]) for row in level]) for level in fresh]
    ready._returned = [[(seq, Entry(seq, messages[mid], expires, prio, durable, count))
                        for seq, mid, expires, prio, durable, count in heap] for heap in returned]
    ready._count = sum(len(item) if item.__class__ is FrozenRun else 1 for level in ready._levels for item in level) \
        + sum(map(len, ready._returned))
    ready._plain = [0] * len(ready._levels)
    return ready


# Snapshots written before issue 33 split store/ name the model's classes by their old modules
# (``raftmq.store.model``); they live in ``store/core/`` now.
_MOVED_MODULES = {f"raftmq.store.{name}": f"raftmq.store.core.{name}" for name in (
    "commands", "connections", "dedup", "delayed", "delivery", "effects", "errors", "exchange_dedup",
    "exchange_types", "expiry", "frozen", "headers", "limits", "machine", "message", "model", "modify",
    "plugin_exchanges", "queue_args", "ranges", "ready_peek", "routing", "session_rules", "sessions",
    "topology", "users", "values")}
_MOVED_PREFIX = ("raftmq.store.filters", "raftmq.store.core.filters")


class _RenamingUnpickler(pickle.Unpickler):
    """Reads a pickled model, finding the classes of snapshots written before store/ was split."""

    def find_class(self, module: str, name: str) -> object:
        moved = _MOVED_MODULES.get(module)
        if moved is None and module.startswith(_MOVED_PREFIX[0]):
            moved = _MOVED_PREFIX[1] + module[len(_MOVED_PREFIX[0]):]
        return super().find_class(moved or module, name)


class _ModelUnpickler(_RenamingUnpickler):
    def __init__(self, data: bytes, messages: dict[int, Message], ready: list) -> None:
        super().__init__(io.BytesIO(data))
        self.messages, self.ready_rows = messages, ready

    def persistent_load(self, pid: int) -> object:
        if pid > 0:
            return self.messages[pid]
        return _ready_from_rows(self.ready_rows[-pid], self.messages)


def _load_model(blob: bytes) -> dict:
    if blob[:1] == b"\x80":  # formats 1 and 2: one pickle
        return _RenamingUnpickler(io.BytesIO(blob)).load()  # noqa: S301 - see the module docstring for the trust boundary
    layout, pickled, message_rows, ready_rows = msgpack.unpackb(blob, raw=False, use_list=False,
                                                                strict_map_key=False)
    if layout != FLAT:
        raise ValueError(f"unknown snapshot model layout {layout}")
    messages = {row[0]: Message(*row) for row in message_rows}
    return _ModelUnpickler(pickled, messages, ready_rows).load()  # noqa: S301 - as above


def import_model(machine: StateMachine, blob: bytes) -> list[tuple[int, bytes]]:
    """Replace ``machine``'s state with a snapshot's (in place: the broker keeps its reference).

    Returns the bodies a snapshot of format 1 or 2 carried in its messages (none from format 3):
    the caller stores them in the node's body store."""
    LEGACY_BODIES.clear()
    collecting = gc.isenabled()
    gc.disable()  # millions of new objects, none garbage: collections would only rescan them
    try:
        state = _load_model(blob)
        legacy = list(LEGACY_BODIES)
    finally:
        LEGACY_BODIES.clear()
        if collecting:
            gc.enable()
    for name in MODEL_FIELDS:
        if name in state:  # a field added after the snapshot was written keeps its initial value
            setattr(machine, name, state[name])
    machine._dirty = {}
    if legacy:
        count_holders(machine)
    return legacy


def holders(machine: StateMachine, ready: bool = True) -> Iterator[Message]:
    """Every message held, once per holder: queue entries (ready and unacked) and delayed holds."""
    for queue in machine.queues_by_id.values() if ready else ():
        for entry in queue.ready.entries():
            yield entry.message
    seen: set[int] = set()
    channels = [ch for chs in machine.channels.values() for ch in chs.values()]
    channels += [s.channel for s in machine.sessions.values()]
    for ch in channels:
        if id(ch) in seen:
            continue
        seen.add(id(ch))
        for _queue, entry in ch.unacked.values():
            yield entry.message
    for held in machine.delayed.ordered():
        yield held.message
    for _target, _seq, _qids, message, _expiration in machine.msg_outbox:  # issue 34: until sent
        yield message
    for rec in machine.tx_held.values():  # issue 34: deliveries a prepared transaction holds
        for _op, _requeue, _unsent, _queue, entry in rec.settles:
            yield entry.message


def count_holders(machine: StateMachine) -> None:
    """Set ``Message.live`` from the model (a snapshot written before it existed)."""
    messages = list(holders(machine))
    for message in messages:
        message.live = 0
    for message in messages:
        message.live += 1


def live_bodies(machine: StateMachine) -> dict[int, int]:
    """Message id -> body size of every message the model holds: the bodies a node needs."""
    live: dict[int, int] = {}
    for queue in machine.queues_by_id.values():
        live.update(queue.ready.id_sizes())  # frozen runs without thawing them
    for message in holders(machine, ready=False):
        live[message.id] = message.size
    return live


_CHECK = struct.Struct("<II")  # crc32c of format + meta, of model
CHECKED_FORMAT = 4  # the first format that carries ``check``


def write_snapshot(path: str, machine: StateMachine, meta: bytes) -> None:
    """Write a snapshot file atomically (a temporary file, fsynced, then renamed over ``path``)."""
    tmp = f"{path}.writing.{os.getpid()}"
    for leftover in (tmp, tmp + "-lock"):
        if os.path.exists(leftover):
            os.unlink(leftover)
    model = export_model(machine)
    env = lmdb.open(tmp, subdir=False, map_size=max(1 << 24, 2 * len(model) + (1 << 20)), lock=False,
                    sync=True, metasync=True)
    try:
        version = str(SNAPSHOT_FORMAT).encode()
        with env.begin(write=True) as txn:
            txn.put(b"meta", meta)
            txn.put(b"format", version)
            txn.put(b"check", _CHECK.pack(checksum(version + meta), checksum(model)))
            txn.put(b"model", model)
        env.sync(True)
    finally:
        env.close()
    os.replace(tmp, path)


@overload
def read_snapshot(path: str, with_model: Literal[True] = True) -> tuple[bytes, bytes]: ...
@overload
def read_snapshot(path: str, with_model: Literal[False]) -> tuple[bytes, None]: ...
@overload
def read_snapshot(path: str, with_model: bool) -> tuple[bytes, bytes | None]: ...
def read_snapshot(path: str, with_model: bool = True) -> tuple[bytes, bytes | None]:
    """(meta, model), each checked against its checksum; FormatTooNew for a snapshot written by a
    newer raftmq, SnapshotDamaged for one that fails its check (or that LMDB cannot read).

    Reads take turns (``_READING``): the Raft scrubber's thread verifies ``snapshot.lmdb`` while the
    loop may be installing the same file through its private hard link, and py-lmdb refuses a second
    open of one file in a process ("already open in this process"), which read as damage."""
    with _READING:
        return _read_snapshot(path, with_model)


_READING = threading.Lock()  # one snapshot file open at a time in this process (read_snapshot)


def _read_snapshot(path: str, with_model: bool) -> tuple[bytes, bytes | None]:
    try:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    except lmdb.Error as exc:
        raise SnapshotDamaged(path, f"LMDB cannot open it ({exc})") from exc
    try:
        # A file cut short: LMDB maps it, and touching a page past its end is SIGBUS, which kills
        # the process (seen in a chaos run that truncated a snapshot).  Its meta pages say how
        # many pages it has.
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        size = os.path.getsize(path)
        if size < needed:
            raise SnapshotDamaged(path, f"cut short: {size} of {needed} bytes")
        with env.begin() as txn:
            raw_version = txn.get(b"format")
            version_bytes = bytes(raw_version) if raw_version is not None else b""
            try:
                version = int(version_bytes) if raw_version is not None else 1
            except ValueError as exc:
                raise SnapshotDamaged(path, f"format record {version_bytes!r}") from exc
            check(f"snapshot {path}", version, SNAPSHOT_FORMAT)
            raw_meta = txn.get(b"meta")
            if raw_meta is None:
                raise SnapshotDamaged(path, "no meta record")
            meta = bytes(raw_meta)
            model = txn.get(b"model") if with_model else None
            if model is not None:
                model = bytes(model)
            elif with_model:
                raise SnapshotDamaged(path, "no model record")
            if version >= CHECKED_FORMAT:
                sums = txn.get(b"check")
                if sums is None or len(sums) != _CHECK.size:
                    raise SnapshotDamaged(path, "no intact check record")
                meta_sum, model_sum = _CHECK.unpack(bytes(sums))
                if checksum(version_bytes + meta) != meta_sum:
                    raise SnapshotDamaged(path, "meta fails its checksum")
                if model is not None and checksum(model) != model_sum:
                    raise SnapshotDamaged(path, "model fails its checksum")
    except lmdb.Error as exc:
        raise SnapshotDamaged(path, f"LMDB cannot read it ({exc})") from exc
    finally:
        env.close()
    return meta, model


def verify_snapshot(path: str) -> list[Damage]:
    """Check a snapshot file whole (``raftmq verify``, the scrubber, a node's start)."""
    try:
        read_snapshot(path)
    except SnapshotDamaged as exc:
        return [Damage("snapshot", path, "file", exc.what)]
    except FormatTooNew as exc:
        return [Damage("snapshot", path, "format", str(exc))]
    return []


def digest(machine: StateMachine) -> str:
    """SHA-256 over a canonical rendering of the replicated state: equal state, equal digest.

    Walks the model in sorted key order and covers everything that affects future behaviour:
    entities and their arguments, bindings, every queued message in delivery order with its
    delivery count, unacknowledged deliveries, consumers and their credit, counters, delivery
    limits and deduplication caches (their entries in eviction order).
    """
    h = hashlib.sha256()

    def put(*items: object) -> None:
        h.update(repr(items).encode())
        h.update(b"\x00")

    put("counters", machine.next_qid, machine.next_msg_id, machine.message_bytes)
    put("members", sorted(machine.members.items()))
    if machine.group_count > 1:  # issue 34: the same digest as before for a cluster of one group
        put("groups", machine.group_count, machine.meta_seq, machine.meta_applied, machine.gone_seq,
            sorted(machine.gone_applied.items()), [(s, c, p) for s, c, p in machine.meta_outbox],
            list(machine.gone_outbox), sorted((q.qid, q.group) for q in machine.queues_by_id.values()),
            sorted(machine.msg_seq.items()), sorted(machine.msg_applied.items()),
            [(t, s, q, msg.id, e) for t, s, q, msg, e in machine.msg_outbox])
        if machine.tx_next or machine.tx_prep_applied:  # issue 34: transactions across groups
            put("tx", tx_digest_items(machine))
    for vname in sorted(machine.vhosts):
        vhost = machine.vhosts[vname]
        put("vhost", vname)
        for ename in sorted(vhost.exchanges):
            ex = vhost.exchanges[ename]
            put("exchange", ename, ex.type, ex.durable, ex.auto_delete, ex.internal, sorted(ex.arguments.items()))
            for b in ex.bindings:
                put("binding", b.destination, b.dest_is_queue, b.routing_key, sorted((b.arguments or {}).items()))
        for qname in sorted(vhost.queues):
            q = vhost.queues[qname]
            put("queue", qname, q.qid, q.durable, q.exclusive_owner, q.auto_delete, sorted(q.arguments.items()),
                q.next_seq, len(q.ready), q.ready_bytes, q.unacked_count, q.next_consumer)
            ready = q.ready
            # Walk the ready list without consuming it.
            for level in range(len(ready._levels) - 1, -1, -1):
                for entry in ready._levels[level]:
                    if isinstance(entry, FrozenRun):  # rendered as its entries would be
                        for row in entry.digest_rows():
                            put("ready", *row)
                        continue
                    put("ready", entry.seq, entry.message.id, entry.expires_at, entry.priority, entry.delivery_count,
                        entry.message.size, entry.message.live, entry.message.properties,
                        entry.message.format)
                for seq, entry in sorted(ready._returned[level], key=lambda item: item[0]):
                    put("returned", seq, entry.message.id, entry.delivery_count)
            if q.delivery_limit is not None or q.delivery_header:
                put("delivery", q.delivery_limit, q.delivery_header)
            if q.dedup is not None:
                # In insertion order: eviction takes the oldest, so the order is state too.
                put("dedup", q.dedup.size, q.dedup.ttl, list(q.dedup.entries.items()))
            for c in q.consumers:
                put("consumer", c.channel.conn, c.channel.number, c.tag, c.no_ack, c.exclusive, c.prefetch, c.unacked)
                if c.filter is not None:
                    put("filter", c.filter.spec, c.scan_cursor)
    for held in machine.delayed.ordered():
        m = held.message
        put("delayed", held.due, held.seq, held.vhost, held.exchange, held.routing_key, held.expiration, held.delay,
            m.id, m.properties, m.size, m.live)
    for key in sorted(machine.exchange_caches):
        cache = machine.exchange_caches[key]
        put("exchange-dedup", key, cache.size, cache.ttl, list(cache.entries.items()))
    for name in sorted(machine.users):
        u = machine.users[name]
        put("user", name, u.password_hash, u.tags, u.loopback_only, sorted(u.permissions.items()))
    for name in sorted(machine.permission_overlay):
        put("permission-overlay", name, sorted(machine.permission_overlay[name].items()))
    for scope, table in (("vhost-limits", machine.vhost_limits), ("user-limits", machine.user_limits)):
        for name in sorted(table):
            put(scope, name, sorted(table[name].items()))
    for session_key in sorted(machine.sessions):
        s = machine.sessions[session_key]
        put("session", session_key, s.channel.conn, s.channel.number, s.timeout, s.detached_at, s.completed,
            s.next_transfer, sorted(s.transfers.items()))
    for conn in sorted(machine.channels):
        for number in sorted(machine.channels[conn]):
            ch = machine.channels[conn][number]
            put("channel", conn, number, ch.prefetch_count, ch.consumer_prefetch, ch.active, ch.next_tag,
                sorted(ch.unacked))
    return h.hexdigest()
