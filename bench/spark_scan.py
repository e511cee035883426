"""Spark scan rate over a history snapshot of ``--events`` events, beside a plain-Python LMDB scan.

The history is written by the node's own writer (``EventStore``) from synthetic traffic: each
message is published, routed to one of 20 queues, delivered and acknowledged (four events, with
realistic names, sizes, timestamps and properties).  It is then snapshotted like ``raftmq
snapshot`` does, and read three ways, each over every row:

* plain Python: ``read_events`` (LMDB cursor + msgpack), one core;
* Spark, ``raftmq`` format: ``groupBy(kind).count()`` and ``sum(size)`` -- Arrow batches from
  the Python workers (``local[2]``), after one warm-up query that starts the workers;
* Spark with a time-range filter on the last tenth (pushdown: only that range is read).

    python bench/spark_scan.py [--events 1000000] [--partitions N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.store.core.model import Message  # noqa: E402
from raftmq.store.disk import history as EV  # noqa: E402
from raftmq.store.disk.event_writer import EventStore  # noqa: E402

PROPS = bytes.fromhex("9000") + b"\x10application/json\x02"  # content-type + delivery-mode 2


def generate(path: str, events: int, batch: int = 2_000) -> None:
    store = EventStore(path, "metadata")
    seq, now, index = 0, 1_790_000_000_000_000, 0
    head = bytes(32)
    pending: list[list] = []
    message_id = 0
    # Issue 36's history: the connection opened once with its principal, and the publisher's and
    # consumer's events carry its id (the reader joins them); before it, 11-field records.
    who = "conn" in EV.EVENT_FIELDS
    conn = "n1.boot.7"
    if who:
        seq += 1
        pending.append([seq, now, EV.CONNECTION_OPENED, "/", "", None, "", "", 0, "", None, conn,
                        ["shop-user", "AMQP 0-9-1", "127.0.0.1:40000", "shop"]])
    while seq < events:
        message_id += 1
        queue = f"orders-{message_id % 20}"
        message = Message(message_id, "shop", queue, PROPS, 200, True, 0, now)  # size, not the body (issue 18)
        for kind, detail in ((EV.PUBLISHED, conn), (EV.ROUTED, ""), (EV.DELIVERED, "ctag-1"),
                             (EV.ACKED, "")):
            seq += 1
            now += 37
            pending.append([seq, now, kind, "/", "" if kind == EV.PUBLISHED else queue, message_id, "shop",
                            queue, 200, detail, message])
            if who:
                pending[-1] += [None if kind == EV.ROUTED else conn, None]
        if len(pending) >= batch:
            index += 1
            head = _append(store, index, pending, head)
            pending = []
    if pending:
        _append(store, index + 1, pending, head)
    store.close()


def _append(store: EventStore, index: int, events: list[list], head: bytes) -> bytes:
    """Hand a batch over as the applier does: with its chain step where the writer takes one
    (issue 36: the writer then also writes the batch's chain record and the kept events' leaves)."""
    if not getattr(store.append, "takes_chain", False):
        store.append(index, events)
        return head
    from raftmq.store.core.events import chain_next, chain_packed

    new_head = chain_next(head, b"".join(chain_packed(e[:10]) for e in events))
    store.append(index, events, (head, new_head))
    return new_head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raftmq-spark-bench-") as tmp:
        live, snap = os.path.join(tmp, "events"), os.path.join(tmp, "snapshot")
        t = time.perf_counter()
        generate(live, args.events)
        written = time.perf_counter() - t
        info = EV.snapshot(live, snap)
        size = sum(f.stat().st_size for f in Path(snap).iterdir())
        print(f"history: {info.events:,} events, {info.messages:,} messages, snapshot {size / 1e6:.0f} MB; "
              f"written at {info.events / written:,.0f} events/s by the EventStore writer")

        t = time.perf_counter()
        total = sum(r[8] for r in EV.read_events(snap))
        plain = time.perf_counter() - t
        print(f"plain Python LMDB scan:  {info.events / plain:>10,.0f} rows/s  ({plain:.1f} s)")

        from pyspark.sql import functions as F

        from raftmq.spark.session import audit_session, load

        t = time.perf_counter()
        spark = audit_session()
        options = {"partitions": args.partitions} if args.partitions else {}
        load(spark, snap, "queues").collect()  # starts the Python workers
        print(f"Spark session + first query: {time.perf_counter() - t:.1f} s (fixed cost)")
        results = {}
        for run in range(2):
            t = time.perf_counter()
            kinds = load(spark, snap, "events", **options).groupBy("kind").count().collect()
            summed = load(spark, snap, "events", **options).agg(F.sum("size")).collect()[0][0]
            elapsed = (time.perf_counter() - t) / 2
            results[run] = elapsed
            assert sum(r["count"] for r in kinds) == info.events and summed == total
        best = min(results.values())
        print(f"Spark raftmq format scan: {info.events / best:>10,.0f} rows/s  ({best:.1f} s per full scan, "
              f"best of 2; {info.events / max(results.values()):,.0f} rows/s worst)")
        last = list(EV.read_events(snap, start=info.last_seq - info.events // 10))
        t = time.perf_counter()
        count = load(spark, snap, "events", **options).where(f"time >= timestamp_micros({last[0][1]})").count()
        elapsed = time.perf_counter() - t
        assert count == len(last), (count, len(last))
        print(f"Spark time-range query (last 10%, pushed down): {count:,} rows in {elapsed:.1f} s")
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
