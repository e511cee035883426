"""``spark.read.format("raftmq")``: a PySpark Python data source over audit-history snapshots.

    spark.dataSource.register(RaftmqDataSource)
    df = (spark.read.format("raftmq").option("path", "/snapshots/s1")
          .option("table", "events").load())

Tables (``option("table", ...)``, default ``events``): ``events``, ``messages``, ``queues``,
``exchanges``, ``bindings``, ``connections`` -- the layout is documented in
``raftmq.store.disk.history``.

**Who (issue 36).**  ``events`` has ``conn`` (the connection that acted) and the principal columns
``user``, ``protocol``, ``address`` and ``connection_name``: the issue-36 kinds (connection opened
and closed, login and access refused, admin change) carry their principal in the record; the
per-message events carry only ``conn``, and the reader fills the principal from the
``connections`` table (one lookup per connection per partition, remembered) -- the join happens
here, once per row read, rather than each event storing its principal.  Histories written before
issue 36 read with these columns null.

* **Partitions** are key ranges of the u64-keyed tables (``events`` by sequence, ``messages`` by
  message id); ``option("partitions", n)`` overrides the default of one per 250,000 rows.
  The catalog tables are small and read as one partition.
* **Arrow**: ``read()`` yields ``pyarrow.RecordBatch`` objects (``option("batchRows", n)``,
  default 8,192 rows), which Spark takes without a per-row Python conversion.
* **Filter pushdown** (needs ``spark.sql.python.filterPushdown.enabled=true``): comparisons on
  ``seq`` / ``message_id`` narrow the key range; comparisons on ``time`` become a key range too,
  because time never decreases along the sequence (the state machine keeps the largest
  leader-stamped time) -- found by binary search, then applied exactly row by row.  ``kind``,
  ``queue`` and ``vhost`` equalities (and ``kind IN (...)``), and ``message_id = n`` /
  ``message_id IN (...)`` on ``events`` (``audit trace``), are applied while reading.

**Self-joins**: Spark 4.3 keeps one pushed-down reader (and one partition list) per loaded
relation, so two scans of the *same* ``load()`` with different filters (a self-join, a union)
both read with the filters of the last one planned -- a silently wrong result (seen here: an
anti-join of ``kind = 'routed'`` against ``kind = 'delivered'`` of one DataFrame returned nothing).
Load the table once per scan (as ``raftmq.spark.audit`` does), or turn pushdown off for that
load with ``option("pushdown", "false")``.

**Damaged records fail the read** (issue 29): every record is checked against its checksum
(``raftmq.store.disk.history.Checker``; snapshots written before checksums are read unchecked, as
before) and a damaged one raises ``HistoryDamaged`` naming the snapshot, table and key -- the
Spark job fails with that message instead of returning a damaged row or a silently shorter
answer.  ``raftmq verify --data-dir`` lists every damaged record of a stopped node's history.

**Several nodes as one** (issue 36, ``spark/union.py``): ``option("paths", "a,b,c")`` (or a JSON
list) reads several nodes' snapshots as one table: each event once (events have the same sequence
number and record on every node; two histories disagreeing on one fail the read), a node's
``gaps`` filled from the others.  ``raftmq.spark.union.holes`` says which ranges none holds.

**Every group of a node as one table** (issue 34, ``spark/groups.py``): ``path`` (or each of
``paths``) may be a node's data directory or a ``raftmq snapshot`` of it; with queue groups each
group's history (``groups/g<N>``) is read on its own -- its own sequence, its own checksums, a
damaged record failing the read with that group's history named -- and ``events`` and ``messages``
get a ``group`` column (0 for the metadata group; a one-group history reads as before, with
``group`` 0 in every row).  Message ids and sequence numbers are per group: a row is identified by
``(group, seq)`` / ``(group, message_id)``.  The documented order of the merged events is
``time``, then ``group``, then ``seq`` (``groups.ORDER``).  ``group = n`` / ``group IN (...)`` are
pushed down (the other groups are not opened).  The catalog tables are the metadata group's, and
a queue group's events get their principals from the metadata group's connections table.

**Streaming** (``spark/stream.py``): ``spark.readStream.format("raftmq").option("path",
<data dir>/events)`` follows a node's live history by sequence offsets.

Each ``read()`` opens the snapshot itself (an ``lmdb.Environment`` cannot be pickled, and one
process may not open the same environment twice) and closes it before returning.  Workers import
this module, so raftmq must be installed where Spark's Python workers run (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import datetime as dt
import json
import os

import lmdb
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from raftmq.store.disk import history as EV

from . import groups as G
from . import union

SCHEMAS = {
    "events": "seq long, time timestamp, kind string, vhost string, queue string, message_id long, "
              "exchange string, routing_key string, size long, detail string, raft_index long, conn string, "
              "user string, protocol string, address string, connection_name string, group int",
    "messages": "message_id long, time timestamp, vhost string, exchange string, routing_key string, "
                "size long, publisher string, seq long, content_type string, delivery_mode int, priority int, "
                "correlation_id string, reply_to string, expiration string, amqp_message_id string, "
                "type string, user_id string, app_id string, headers map<string,string>, body binary, group int",
    "queues": "vhost string, name string, durable boolean, exclusive boolean, auto_delete boolean, "
              "arguments string, retention string, declared timestamp, deleted timestamp",
    "exchanges": "vhost string, name string, type string, durable boolean, auto_delete boolean, "
                 "internal boolean, arguments string, declared timestamp, deleted timestamp",
    "bindings": "vhost string, source string, destination string, destination_type string, routing_key string, "
                "arguments string, bound timestamp, unbound timestamp",
    "connections": "conn string, user string, vhost string, protocol string, address string, "
                   "connection_name string, opened timestamp, closed timestamp",
}
KEY_COLUMN = {"events": "seq", "messages": "message_id"}  # the u64-keyed tables: one per group, with `group`
ROWS_PER_PARTITION = 250_000
_COMPARISONS = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
_KIND_CODES = {name: code for code, name in EV.KIND_NAMES.items()}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(value) -> int | None:
    """A pushed-down time literal as integer microseconds since the epoch (naive = UTC)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(value, dt.date):
        return _micros(dt.datetime(value.year, value.month, value.day))
    if isinstance(value, int):
        return value
    return None


class RaftmqDataSource(DataSource):
    """The ``raftmq`` format (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "raftmq"

    def __init__(self, options: dict) -> None:
        super().__init__(options)
        opts = {k.lower(): v for k, v in dict(options).items()}
        self.options = opts
        self.groups = G.layout(parse_paths(opts))  # issue 34: every group's histories (spark/groups.py)
        self.paths = G.meta_histories(self.groups)
        self.path = self.paths[0]
        self.table = opts.get("table", "events").lower()
        if self.table not in SCHEMAS:
            raise ValueError(f"unknown raftmq table {self.table!r}; one of {sorted(SCHEMAS)}")
        for path in self.paths:
            if not os.path.exists(os.path.join(path, "data.mdb")):
                raise FileNotFoundError(f"{path} is not a raftmq history snapshot (no data.mdb)")
        self.partition_count = int(opts["partitions"]) if "partitions" in opts else None
        self.batch_rows = int(opts.get("batchrows", 8192))
        self.pushdown = opts.get("pushdown", "true").lower() not in ("false", "0", "no")

    def schema(self) -> str:
        return SCHEMAS[self.table]

    def reader(self, schema: StructType) -> DataSourceReader:
        return RaftmqReader(self.paths, self.table, schema, self.partition_count, self.batch_rows,
                            self.pushdown, self.groups)

    def streamReader(self, schema: StructType):  # noqa: N802 - the pyspark API's name
        from .stream import RaftmqStreamReader

        return RaftmqStreamReader(self, schema, RaftmqReader, _batches)


def parse_paths(opts: dict) -> list[str]:
    """The histories to read: ``path`` (one), or ``paths`` (several: a JSON list or comma-separated)."""
    raw = opts.get("paths")
    if raw:
        paths = json.loads(raw) if raw.lstrip().startswith("[") else raw.split(",")
        paths = [str(p).strip() for p in paths if str(p).strip()]
    else:
        paths = [opts["path"]] if opts.get("path") else []
    if not paths:
        raise ValueError('the raftmq data source needs option("path", <snapshot directory>) '
                         'or option("paths", "<dir>,<dir>,...")')
    return paths


class RaftmqReader(DataSourceReader):
    def __init__(self, paths: str | list[str], table: str, schema: StructType, partition_count: int | None,
                 batch_rows: int, pushdown: bool = True, groups: dict[int, list[str]] | None = None) -> None:
        self.pushdown = pushdown
        self.paths = [paths] if isinstance(paths, str) else list(paths)
        self.path = self.paths[0]
        # Issue 34: group -> its histories (one per node); the metadata group's are ``paths``.
        self.groups = dict(groups) if groups else {G.META_GROUP: self.paths}
        self.table = table
        self.schema = schema
        self.partition_count = partition_count
        self.batch_rows = batch_rows
        # Events' principals (issue 36): set by each read from its history's connections table;
        # until then, none known.
        self.principal_of: _Principals | _UnionPrincipals = _UnionPrincipals()
        self._reset()

    def use_principals(self, txn: lmdb.Transaction, tables: dict) -> None:
        """Events read in ``txn`` get their principals from its history's connections table."""
        self.principal_of = _Principals(txn, tables.get("connections"), self.check)

    # ------------------------------------------------------------------ planning (driver)

    def _reset(self) -> None:
        # Key bounds [low, high) and time bounds [low, high) in microseconds; None = open.
        self.key_low, self.key_high = 0, None
        self.time_low, self.time_high = None, None
        self.kinds: set[int] | None = None
        self.equal: dict[int, str] = {}  # record position -> required value (queue, vhost)
        self.message_ids: set[int] | None = None  # events: message_id = / IN
        self.only_groups: set[int] | None = None  # group = / IN: the other groups are not read

    def pushFilters(self, filters):  # noqa: N802 - the pyspark API's name
        self._reset()
        if not self.pushdown:
            yield from filters
            return
        key = KEY_COLUMN.get(self.table)
        for f in filters:
            column = f.attribute[0] if len(f.attribute) == 1 else None
            if key and column in (key, "time") and self._bound(column == key, f):
                continue
            if self.table == "events" and column == "kind" and isinstance(f, EqualTo | In):
                values = f.value if isinstance(f, In) else (f.value,)
                codes = {_KIND_CODES.get(v, -1) for v in values}
                self.kinds = codes if self.kinds is None else self.kinds & codes
                continue
            if self.table == "events" and column == "message_id" and isinstance(f, EqualTo | In) \
                    and all(isinstance(v, int) and not isinstance(v, bool)
                            for v in (f.value if isinstance(f, In) else (f.value,))):
                ids = set(f.value) if isinstance(f, In) else {f.value}
                self.message_ids = ids if self.message_ids is None else self.message_ids & ids
                continue
            if key and column == "group" and isinstance(f, EqualTo | In) \
                    and all(isinstance(v, int) and not isinstance(v, bool)
                            for v in (f.value if isinstance(f, In) else (f.value,))):
                wanted = set(f.value) if isinstance(f, In) else {f.value}
                self.only_groups = wanted if self.only_groups is None else self.only_groups & wanted
                continue
            if self.table == "events" and column in ("queue", "vhost") and isinstance(f, EqualTo) \
                    and isinstance(f.value, str):
                position = EV.EVENT_FIELDS.index(column)
                if self.equal.get(position, f.value) != f.value:
                    self.kinds = set()  # two different equalities on one column: nothing matches
                self.equal[position] = f.value
                continue
            yield f

    def _bound(self, on_key: bool, f) -> bool:
        """Narrow the key or time range by one comparison; False if it cannot be pushed."""
        if not isinstance(f, _COMPARISONS):
            return False
        value = f.value if on_key else _micros(f.value)
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if isinstance(f, EqualTo):
            low, high = value, value + 1
        elif isinstance(f, GreaterThan):
            low, high = value + 1, None
        elif isinstance(f, GreaterThanOrEqual):
            low, high = value, None
        elif isinstance(f, LessThan):
            low, high = None, value
        elif isinstance(f, LessThanOrEqual):
            low, high = None, value + 1
        else:
            return False
        if on_key:
            self.key_low = max(self.key_low, low) if low is not None else self.key_low
            if high is not None:
                self.key_high = high if self.key_high is None else min(self.key_high, high)
        else:
            if low is not None:
                self.time_low = low if self.time_low is None else max(self.time_low, low)
            if high is not None:
                self.time_high = high if self.time_high is None else min(self.time_high, high)
        return True

    def partitions(self):
        """Key ranges of each group's table (issue 34: the groups in order, each its own keys); the
        catalog tables are the metadata group's (every queue group keeps a copy of the topology as
        it applied it, a little later; the metadata group decided it)."""
        if self.table not in KEY_COLUMN:
            return [self._partition(0, 0)]
        found = [part for group, paths in self.groups.items()
                 if self.only_groups is None or group in self.only_groups
                 for part in self._group_partitions(group, paths)]
        return found or [self._partition(0, 0)]

    def _group_partitions(self, group: int, paths: list[str]) -> list[InputPartition]:
        """One group's key ranges (its histories read as one when several nodes' are given)."""
        if len(paths) > 1:
            with _Histories(paths, self.table) as opened:
                if opened.cursor is None:
                    return []
                found = self._key_range(opened.cursor, opened.check, opened.entries)
        else:
            env = EV.open_history(paths[0])
            try:
                with env.begin() as txn:
                    tables = EV.open_tables(env, create=False, txn=txn)
                    db = tables.get(self.table)
                    if db is None:
                        return []
                    found = self._key_range(txn.cursor(db=db), EV.checker(txn, tables, paths[0]),
                                            txn.stat(db)["entries"])
            finally:
                env.close()
        if found is None:
            return []
        low, high, rows = found
        if low >= high:
            return []
        count = self.partition_count or max(1, min(64, rows // ROWS_PER_PARTITION + 1))
        count = max(1, min(count, high - low))
        step = -(-(high - low) // count)
        return [self._partition(start, min(start + step, high), group) for start in range(low, high, step)]

    def _key_range(self, cursor, check, rows: int) -> tuple[int, int, int] | None:
        """The key range [low, high) the pushed-down bounds leave, and the rows held; None if empty."""
        if not cursor.first():
            return None
        first = EV.U64.unpack(cursor.key())[0]
        cursor.last()
        last = EV.U64.unpack(cursor.key())[0]
        low, high = max(self.key_low, first), last + 1
        if self.key_high is not None:
            high = min(high, self.key_high)
        if self.time_low is not None:
            low = max(low, _first_key_at(cursor, low, high, self.time_low, check, self.table))
        if self.time_high is not None:
            high = min(high, _first_key_at(cursor, low, high, self.time_high, check, self.table))
        return low, high, rows

    def _partition(self, start: int, stop: int, group: int = G.META_GROUP) -> InputPartition:
        """A key range of one group with the scan's pushed-down filters (plain values: partitions
        are pickled)."""
        kinds = tuple(sorted(self.kinds)) if self.kinds is not None else None
        ids = tuple(sorted(self.message_ids)) if self.message_ids is not None else None
        return InputPartition((start, stop, kinds, tuple(sorted(self.equal.items())), self.time_low,
                               self.time_high, ids, group))

    # ------------------------------------------------------------------ reading (workers)

    def read(self, partition):
        start, stop, kinds, equal, self.time_low, self.time_high, ids, group = partition.value
        self.kinds = set(kinds) if kinds is not None else None
        self.message_ids = set(ids) if ids is not None else None
        self.equal = dict(equal)
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        keyed = self.table in KEY_COLUMN
        if keyed and start >= stop:
            return
        paths = self.groups.get(group, []) if keyed else self.paths
        constant = group if keyed else None  # the `group` column: one value per partition
        if not paths:
            return
        if paths != self.paths and self.table == "events":
            # A queue group's events name their connection; its principal is in the metadata
            # group's connections table (the front end's notes go there).
            with _Histories(self.paths, "connections") as meta:
                self.principal_of = meta.principals
                yield from self._read(paths, start, stop, arrow_schema, constant, principals=False)
            return
        yield from self._read(paths, start, stop, arrow_schema, constant, principals=True)

    def _read(self, paths: list[str], start: int, stop: int, arrow_schema: pa.Schema, constant: int | None,
              principals: bool):
        """One group's histories (or the catalog's) from ``start`` to ``stop``."""
        if len(paths) > 1:
            yield from self._read_union(paths, start, stop, arrow_schema, constant, principals)
            return
        env = EV.open_history(paths[0])
        try:
            with env.begin() as txn:
                tables = EV.open_tables(env, create=False, txn=txn)
                db = tables.get(self.table)
                if db is None:
                    return
                self.check = EV.checker(txn, tables, paths[0])
                if principals:
                    self.use_principals(txn, tables)
                rows = _ROWS[self.table](self, txn.cursor(db=db), start, stop)
                yield from _batches(rows, arrow_schema, self.batch_rows, constant)
        finally:
            env.close()

    def _read_union(self, paths: list[str], start: int, stop: int, arrow_schema: pa.Schema, constant: int | None,
                    principals: bool):
        """``read`` over several histories (spark/union.py): one merged cursor, each key once."""
        with _Histories(paths, self.table) as opened:
            if self.table not in KEY_COLUMN:
                rows = iter(opened.catalog())
            elif opened.cursor is None:
                return
            else:
                self.check = opened.check
                if principals:
                    self.principal_of = opened.principals
                rows = _ROWS[self.table](self, opened.cursor, start, stop)
            yield from _batches(rows, arrow_schema, self.batch_rows, constant)

    def _event_rows(self, cursor: lmdb.Cursor, start: int, stop: int):
        decode, key_of = self.check.decode, EV.U64.unpack
        principal_of = self.principal_of
        known = principal_of.known.get
        kinds, equal = self.kinds, list(self.equal.items())
        ids = self.message_ids
        t_low, t_high = self.time_low, self.time_high
        if (kinds is not None and not kinds) or (ids is not None and not ids):
            return
        if not cursor.set_range(EV.U64.pack(start)):
            return
        for key, value in cursor:
            if key_of(key)[0] >= stop:
                return
            r = decode("events", key, value)
            if kinds is not None and r[2] not in kinds:
                continue
            if equal and any(r[pos] != want for pos, want in equal):
                continue
            if ids is not None and r[5] not in ids:
                continue
            t = r[1]
            if (t_low is not None and t < t_low) or (t_high is not None and t >= t_high):
                continue
            r[2] = EV.KIND_NAMES.get(r[2], str(r[2]))
            if len(r) < _WIDTH:  # written before issue 36: no conn, no principal
                r += _NO_WHO
                yield r
                continue
            principal = r[12]
            if principal is None:
                conn = r[11]
                principal = _NO_PRINCIPAL if conn is None else (known(conn) or principal_of(conn))
            r[12:] = principal  # in place: the record's principal becomes its four columns
            yield r

    def _message_rows(self, cursor: lmdb.Cursor, start: int, stop: int):
        from raftmq.protocol.amqp091.properties import decode_properties

        decode, key_of = self.check.decode, EV.U64.unpack
        t_low, t_high = self.time_low, self.time_high
        if not cursor.set_range(EV.U64.pack(start)):
            return
        for key, value in cursor:
            if key_of(key)[0] >= stop:
                return
            mid, t, vhost, exchange, rk, size, publisher, props, body, seq = decode("messages", key, value)
            if (t_low is not None and t < t_low) or (t_high is not None and t >= t_high):
                continue
            try:
                p = decode_properties(props)
            except Exception:  # noqa: BLE001 - a malformed property list still yields the row
                p = None
            if p is None:
                yield [mid, t, vhost, exchange, rk, size, publisher, seq, *([None] * 11), body]
                continue
            headers = {str(k): _text(v) for k, v in p.headers.items()} if p.headers else None
            yield [mid, t, vhost, exchange, rk, size, publisher, seq, p.content_type, p.delivery_mode, p.priority,
                   p.correlation_id, p.reply_to, p.expiration, p.message_id, p.type, p.user_id, p.app_id,
                   headers, body]

    def _catalog_rows(self, cursor: lmdb.Cursor, _start: int, _stop: int):
        for key, value in cursor:
            yield self.check.decode(self.table, key, value)


_ROWS = {"events": RaftmqReader._event_rows, "messages": RaftmqReader._message_rows,
         "queues": RaftmqReader._catalog_rows, "exchanges": RaftmqReader._catalog_rows,
         "bindings": RaftmqReader._catalog_rows, "connections": RaftmqReader._catalog_rows}
_WIDTH = len(EV.EVENT_FIELDS)
_NO_PRINCIPAL = (None, None, None, None)
_NO_WHO = (None, *_NO_PRINCIPAL)  # conn and the principal, for records written before issue 36


class _Principals:
    """conn -> (user, protocol, address, connection name) from the ``connections`` table, each
    connection read (and checked) once; all None for a connection the table does not have.  The
    reader's loop looks in ``known`` first (a dict lookup per row) and calls only on a miss."""

    def __init__(self, txn: lmdb.Transaction, db, check: EV.Checker) -> None:
        self.txn, self.db, self.check = txn, db, check
        self.known: dict[str, tuple] = {}

    def __call__(self, conn: str) -> tuple:
        found = self.known.get(conn)
        if found is None:
            key = conn.encode()
            value = self.txn.get(key, db=self.db) if self.db is not None else None
            if value is None:
                found = _NO_PRINCIPAL
            else:
                _conn, user, _vhost, protocol, address, name, _opened, _closed = self.check.decode(
                    "connections", key, value)
                found = (user, protocol, address, name)
            self.known[conn] = found
        return found


class _UnionPrincipals:
    """``_Principals`` over several histories: a connection's principal from the first history
    that recorded it (the same record on every node that has it: it is an event's)."""

    def __init__(self) -> None:
        self.parts: list[_Principals] = []
        self.known: dict[str, tuple] = {}

    def __call__(self, conn: str) -> tuple:
        found = _NO_PRINCIPAL
        for part in self.parts:
            found = part(conn)
            if found != _NO_PRINCIPAL:
                break
        self.known[conn] = found
        return found


class _Histories:
    """Several histories open at once, each in one read transaction, for one table: a union cursor
    over a u64-keyed table (``cursor``, ``check``, ``entries``: the most any one holds), or the
    catalog union (``catalog()``)."""

    def __init__(self, paths: list[str], table: str) -> None:
        self.paths, self.table = paths, table
        self.envs: list[lmdb.Environment] = []
        self.txns: list[lmdb.Transaction] = []
        self.cursor: union.UnionCursor | None = None
        self.check: union.UnionChecker | None = None
        self.parts: list[tuple[lmdb.Cursor, EV.Checker]] = []
        self.entries = 0
        self.principals = _UnionPrincipals()  # the events' principals: from whichever history has them

    def __enter__(self) -> _Histories:
        try:
            held = []
            for path in self.paths:
                env = EV.open_history(path)
                self.envs.append(env)
                txn = env.begin()
                self.txns.append(txn)
                tables = EV.open_tables(env, create=False, txn=txn)
                db = tables.get(self.table)
                if db is not None:
                    check = EV.checker(txn, tables, path)
                    held.append((path, txn.cursor(db=db), check))
                    self.entries = max(self.entries, txn.stat(db)["entries"])
                    self.principals.parts.append(_Principals(txn, tables.get("connections"), check))
            self.parts = [(cursor, check) for _path, cursor, check in held]
            if held and self.table in KEY_COLUMN:
                self.check = union.UnionChecker([check for _p, _c, check in held])
                self.cursor = union.UnionCursor(self.table, [c for _p, c, _k in held], self.check,
                                                [p for p, _c, _k in held], compare=self.table == "events")
        except BaseException:
            self.__exit__()
            raise
        return self

    def catalog(self) -> list[list]:
        return union.catalog_union(self.parts, self.table)

    def __exit__(self, *exc: object) -> None:
        for txn in self.txns:
            txn.abort()
        for env in self.envs:
            env.close()


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _first_key_at(cursor: lmdb.Cursor, low: int, high: int, time_us: int, check: EV.Checker, table: str) -> int:
    """The first key in [low, high) whose record's time is >= time_us, else high (binary search:
    time never decreases along the key; keys may have gaps, hence set_range)."""
    while low < high:
        mid = (low + high) // 2
        if not cursor.set_range(EV.U64.pack(mid)):
            high = mid
            continue
        key = EV.U64.unpack(cursor.key())[0]
        if key >= high:
            high = mid
        elif check.decode(table, cursor.key(), cursor.value())[1] < time_us:
            low = key + 1
        else:
            high = mid
    return low


def _batches(rows, arrow_schema: pa.Schema, batch_rows: int, constant: int | None = None):
    """Group rows into RecordBatches built column by column.  ``constant``: the rows lack the last
    column (``group``, issue 34), which takes this value in every row -- one array per batch, not
    a value per row, so one group's reading costs what it did."""
    width = len(arrow_schema) - (constant is not None)
    types = [f.type for f in arrow_schema]
    pending: list[list] = []
    for row in rows:
        pending.append(row)
        if len(pending) >= batch_rows:
            yield _batch(pending, width, types, arrow_schema, constant)
            pending = []
    if pending:
        yield _batch(pending, width, types, arrow_schema, constant)


def _batch(rows: list[list], width: int, types: list, arrow_schema: pa.Schema,
           constant: int | None = None) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [()] * width
    arrays = []
    for values, type_ in zip(columns, types[:width], strict=True):
        if pa.types.is_map(type_):
            values = [list(v.items()) if v is not None else None for v in values]
        arrays.append(pa.array(values, type=type_))
    if constant is not None:
        arrays.append(pa.repeat(pa.scalar(constant, types[width]), len(rows)))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
