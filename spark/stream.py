"""``spark.readStream.format("raftmq")``: follow a node's audit history as it grows (issue 36).

    (spark.readStream.format("raftmq").option("path", "<data dir>/events")
          .option("startingOffsets", "earliest").load())

The stream is the ``events`` table (same columns as the batch source) read by **sequence offsets**,
as Kafka's Spark source reads by partition offsets: an offset is ``{"seq": n}``, the next sequence
number to read, and a micro-batch is the range ``[start, end)``.  Sequence numbers are the state
machine's (replicated, the same on every node) and a node's writer appends them in order in one
LMDB transaction per round, so:

* ``latestOffset`` opens the history in one read transaction and takes ``meta last_seq + 1``:
  every event below it that the node keeps is committed (LMDB transactions are atomic, and the
  meta keys are written in the same transaction as the events), so re-reading a range later reads
  the same rows -- a batch replayed after a failure is identical (Spark checkpoints the offsets);
* ``read`` opens the history itself in its own read transaction (an ``lmdb.Environment`` is not
  picklable) and reads the range, verifying every record as the batch source does;
* a node restart changes nothing: the history is the same file, the writer skips the events of
  the batches it replays (``seq <= last_seq``), and the stream reads the history whether the node
  is running or not (``open_history``: LMDB's reader lock on a live history).

Options: ``path`` (a node's ``<data dir>/events``, or a snapshot), ``startingOffsets``
(``earliest``, default; ``latest``; or a sequence number), ``maxEventsPerTrigger`` (a sequence
span per micro-batch; default no limit), ``partitions`` (per micro-batch, default 1 per 250,000).

What a stream cannot give: events trimmed by ``audit_max_age``/``audit_max_bytes`` before the
stream reached them are gone, and a node that installed a state snapshot never had the events of
its ``gaps`` (read several nodes' snapshots as one, ``spark/union.py``, to audit those ranges).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from raftmq.store.disk import history as EV

ROWS_PER_PARTITION = 250_000


def _read_limit_rows(limit) -> int | None:
    """The row cap of a ``ReadMaxRows`` limit (None for ReadAllAvailable and anything else)."""
    rows = getattr(limit, "max_rows", None)
    return int(rows) if isinstance(rows, int) and rows > 0 else None


class RaftmqStreamReader(DataSourceStreamReader):
    """A micro-batch stream of one history's events by sequence offsets (see the module docstring)."""

    def __init__(self, source, schema: StructType, reader, batches) -> None:
        """``source``: the RaftmqDataSource (its options); ``reader``/``batches``: the batch reader's
        class and Arrow batching (datasource.py passes them: no import cycle)."""
        if len(source.paths) != 1:
            raise ValueError("the raftmq stream follows one node's history: option(\"path\", <data dir>/events)")
        if source.table != "events":
            raise ValueError("the raftmq stream reads the events table")
        opts = source.options
        self.path = source.path
        self.schema = schema
        self.batch_rows = source.batch_rows
        self.partition_count = source.partition_count
        self.reader, self.batches = reader, batches
        self.starting = str(opts.get("startingoffsets", "earliest")).strip().lower()
        span = opts.get("maxeventspertrigger")
        self.max_span = int(span) if span else None

    def _next_seq(self) -> int:
        """``last_seq + 1`` of the history, read in one read transaction."""
        return EV.history_info(self.path).last_seq + 1

    def initialOffset(self) -> dict:  # noqa: N802 - the pyspark API's name
        if self.starting == "earliest":
            return {"seq": 1}
        if self.starting == "latest":
            return {"seq": self._next_seq()}
        return {"seq": int(self.starting)}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:  # noqa: N802
        end = self._next_seq()
        if start is not None:
            begin = int(start["seq"])
            end = max(end, begin)  # never behind the last batch (a history moved aside starts anew)
            cap = _read_limit_rows(limit) if limit is not None else self.max_span
            if cap is not None:
                end = min(end, begin + cap)
        return {"seq": end}

    def getDefaultReadLimit(self):  # noqa: N802
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_span) if self.max_span else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        low, high = int(start["seq"]), int(end["seq"])
        if low >= high:
            return []
        count = self.partition_count or max(1, (high - low) // ROWS_PER_PARTITION + 1)
        step = -(-(high - low) // count)
        return [InputPartition((s, min(s + step, high))) for s in range(low, high, step)]

    def read(self, partition: InputPartition):
        start, stop = partition.value
        reader = self.reader([self.path], "events", self.schema, None, self.batch_rows, pushdown=False)
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        env = EV.open_history(self.path)
        try:
            with env.begin() as txn:
                tables = EV.open_tables(env, create=False, txn=txn)
                db = tables.get("events")
                if db is None:
                    return
                reader.check = EV.checker(txn, tables, self.path)
                reader.use_principals(txn, tables)
                yield from self.batches(reader._event_rows(txn.cursor(db=db), start, stop), arrow_schema,
                                        self.batch_rows, 0)  # the metadata group's: `group` 0
        finally:
            env.close()

    def commit(self, end: dict) -> None:
        """Nothing to release: the history is not consumed by reading it."""
