"""The ``raftmq`` reader's per-row work without Spark's JVM: ``read()`` of every partition of the
events table into Arrow batches, as Spark's Python worker does, in CPU time (best of ``--rounds``).

``bench/spark_scan.py`` measures the same path through Spark, where on a shared 2-core machine the
JVM and the other tenants move the figure by 3x between runs of the same code; this one isolates
what a change to spark/datasource.py costs per row.  Runs against any checkout, on one snapshot,
so old and new can be compared side by side::

    python bench/spark_rows.py --make /tmp/snap              # write a 300,000-event snapshot once
    for w in /work/main .; do (cd /tmp && $w/.venv/bin/python $w/bench/spark_rows.py /tmp/snap); done

``--union N`` (issue 36, spark/union.py) also reads N copies of the snapshot as one table (every key
in every copy: the worst case of the duplicate check).

``--groups N`` (issue 34, spark/groups.py) also reads a node snapshot laid out with N groups (the
snapshot as group 0 and as each queue group's ``groups/g<N>``) as one table with ``group``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

TYPES = {"long": LongType(), "string": StringType(), "timestamp": TimestampType(), "int": IntegerType()}


def rate(options: dict, rounds: int) -> tuple[int, float]:
    from raftmq.spark import datasource as D

    schema = StructType([StructField(n, TYPES[t]) for n, t in (c.split() for c in D.SCHEMAS["events"].split(", "))])
    reader = D.RaftmqDataSource({"table": "events", **options}).reader(schema)
    list(reader.pushFilters([]))
    parts = [p.value for p in reader.partitions()]
    best, rows = float("inf"), 0
    for _ in range(rounds):
        t = time.process_time()
        rows = sum(batch.num_rows for p in parts for batch in reader.read(InputPartition(p)))
        best = min(best, time.process_time() - t)
    return rows, best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", nargs="?")
    parser.add_argument("--make", help="write a snapshot of --events events to this (new) directory and stop")
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--union", type=int, default=0, help="also read this many copies as one table")
    parser.add_argument("--groups", type=int, default=0, help="also read a snapshot laid out as this many groups")
    args = parser.parse_args()
    if args.make:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from spark_scan import generate

        from raftmq.store.disk import history as EV

        with tempfile.TemporaryDirectory(prefix="raftmq-spark-rows-") as tmp:
            generate(os.path.join(tmp, "events"), args.events)
            print(EV.snapshot(os.path.join(tmp, "events"), args.make))
        return 0
    rows, best = rate({"path": args.snapshot}, args.rounds)
    where = os.path.dirname(os.path.dirname(os.path.realpath(__import__("raftmq").__file__)))
    print(f"{where}: one history, {rows:,} rows: {best:.2f} s CPU (best of {args.rounds}), {rows / best:,.0f} rows/s")
    if args.union > 1:
        with tempfile.TemporaryDirectory(prefix="raftmq-spark-rows-") as tmp:
            copies = [args.snapshot]
            for i in range(1, args.union):
                copies.append(os.path.join(tmp, f"copy{i}"))
                shutil.copytree(args.snapshot, copies[-1])
            rows, best = rate({"paths": ",".join(copies)}, args.rounds)
        print(f"{where}: {args.union} copies as one, {rows:,} rows: {best:.2f} s CPU, {rows / best:,.0f} rows/s")
    if args.groups > 1:
        with tempfile.TemporaryDirectory(prefix="raftmq-spark-rows-") as tmp:
            node = os.path.join(tmp, "node")
            shutil.copytree(args.snapshot, node)
            for group in range(1, args.groups):
                shutil.copytree(args.snapshot, os.path.join(node, "groups", f"g{group}"))
            rows, best = rate({"path": node}, args.rounds)
        print(f"{where}: {args.groups} groups as one, {rows:,} rows: {best:.2f} s CPU, {rows / best:,.0f} rows/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
