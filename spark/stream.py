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

**Every group** (issue 34, spark/groups.py): given a node's data directory (rather than its
``events``), a node with queue groups is followed in every group's history, each by its own
sequence: the offset is ``{"seq": n}`` for the metadata group (as with one group, so a one-group
checkpoint reads on) plus ``"g<N>": m`` for each queue group, and rows carry ``group``.
``maxEventsPerTrigger`` bounds each group's span; a ``startingOffsets`` number is the metadata
group's (queue groups start at their earliest: their sequences are their own).

What a stream cannot give: events trimmed by ``audit_max_age``/``audit_max_bytes`` before the
stream reached them are gone, and a node that installed a state snapshot never had the events of
its ``gaps`` (read several nodes' snapshots as one, ``spark/union.py``, to audit those ranges).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
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
            raise ValueError("the raftmq stream follows one node's history: option(\"path\", <data dir>)")
        if source.table != "events":
            raise ValueError("the raftmq stream reads the events table")
        opts = source.options
        self.path = source.path
        self.groups = source.groups  # group -> [its history] (issue 34)
        self.schema = schema
        self.batch_rows = source.batch_rows
        self.partition_count = source.partition_count
        self.reader, self.batches = reader, batches
        self.starting = str(opts.get("startingoffsets", "earliest")).strip().lower()
        span = opts.get("maxeventspertrigger")
        self.max_span = int(span) if span else None

    def _next_seq(self, group: int = 0) -> int:
        """``last_seq + 1`` of the group's history, read in one read transaction."""
        return EV.history_info(self.groups[group][0]).last_seq + 1

    @staticmethod
    def _key(group: int) -> str:
        """The offset's key of a group: ``seq`` for the metadata group (one group's offset as
        before), ``g<N>`` for queue group N."""
        return "seq" if group == 0 else f"g{group}"

    def initialOffset(self) -> dict:  # noqa: N802 - the pyspark API's name
        offset = {}
        for group in self.groups:
            if self.starting == "latest":
                offset[self._key(group)] = self._next_seq(group)
            elif self.starting == "earliest" or group:
                offset[self._key(group)] = 1
            else:
                offset[self._key(group)] = int(self.starting)
        return offset

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:  # noqa: N802
        offset = {}
        for group in self.groups:
            end = self._next_seq(group)
            if start is not None:
                begin = int(start.get(self._key(group), 1))  # a group new since the checkpoint: earliest
                end = max(end, begin)  # never behind the last batch (a history moved aside starts anew)
                cap = _read_limit_rows(limit) if limit is not None else self.max_span
                if cap is not None:
                    end = min(end, begin + cap)
            offset[self._key(group)] = end
        return offset

    def getDefaultReadLimit(self):  # noqa: N802
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_span) if self.max_span else ReadAllAvailable()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        found = []
        for group in self.groups:
            key = self._key(group)
            low, high = int(start.get(key, 1)), int(end.get(key, 1))
            if low >= high:
                continue
            count = self.partition_count or max(1, (high - low) // ROWS_PER_PARTITION + 1)
            step = -(-(high - low) // count)
            found += [InputPartition((s, min(s + step, high), group)) for s in range(low, high, step)]
        return found

    def read(self, partition: InputPartition):
        """The batch reader's read of one group's range (its records checked, its principals from
        the metadata group's connections, ``group`` filled in)."""
        start, stop, group = partition.value
        reader = self.reader([self.path], "events", self.schema, None, self.batch_rows, pushdown=False,
                             groups=self.groups)
        yield from reader.read(InputPartition((start, stop, None, (), None, None, None, group)))

    def commit(self, end: dict) -> None:
        """Nothing to release: the history is not consumed by reading it."""
