"""``raftmq audit``: run an audit job on a snapshot and print, save and plot its result."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time

from . import audit
from .groups import ORDER


class Progress:
    """A one-line progress display of Spark's running stages (tasks done / total) on stderr."""

    def __init__(self, spark, stream=sys.stderr, interval: float = 0.5) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.stream = stream
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-progress", daemon=True)
        self._drawn = False

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self.interval):
            done = total = 0
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if not total:
                continue
            width = 30
            filled = width * done // total
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} tasks, "
                              f"{time.monotonic() - started:.0f} s")
            self.stream.flush()
            self._drawn = True


def save(df, out: str) -> None:
    """Write the result as Parquet (a directory, or a ``.parquet`` path) or one CSV file (``.csv``)."""
    if not out.endswith(".csv"):
        df.write.mode("overwrite").parquet(out)
        return
    import csv

    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(df.columns)
        for row in df.toLocalIterator():
            writer.writerow(list(row))


def plot(job: str, rows: list, columns: list[str], out: str) -> None:
    """A PNG of the result: lines over time for ``throughput``, bars for the other jobs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    if job == "throughput":
        times = [r[0] for r in rows]
        for i, name in enumerate(columns[1:], start=1):
            ax.plot(times, [r[i] for r in rows], label=name)
        ax.set_xlabel("time (UTC)")
        ax.set_ylabel("messages per bucket")
        ax.legend()
    elif job == "latency":
        labels = [f"{r[0]} {r[1]}" for r in rows]
        index = {c: i for i, c in enumerate(columns)}
        x = range(len(rows))
        for offset, name in ((-0.2, "to_ack_p50_ms"), (0.2, "to_ack_p99_ms")):
            ax.bar([i + offset for i in x], [r[index[name]] or 0 for r in rows], width=0.4, label=name)
        ax.set_xticks(list(x), labels, rotation=30, ha="right")
        ax.set_ylabel("ms")
        ax.legend()
    else:
        numeric = max(range(len(columns)), key=lambda i: isinstance(rows[0][i], int | float) if rows else 0)
        shown = rows[:30]
        ax.bar(range(len(shown)), [r[numeric] for r in shown])
        ax.set_xticks(range(len(shown)), [" ".join(str(v) for v in r[:min(3, numeric)]) for r in shown],
                      rotation=45, ha="right", fontsize=7)
        ax.set_ylabel(columns[numeric])
    ax.set_title(f"raftmq audit: {job}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def run(args) -> int:
    """The ``raftmq audit`` command (arguments from ops/cli.py).  Several ``--snapshot`` or
    ``--data-dir`` options are read as one history (spark/union.py); every group's history of each
    (issue 34) as one table with ``group`` (spark/groups.py)."""
    from raftmq.ops.group_dirs import queue_group_histories
    from raftmq.store.disk.history import snapshot

    from .session import audit_session

    paths = list(_listed(args.snapshot))
    scratch = None
    if not paths:
        # Audit a node's live history: take a consistent snapshot of it first (of each group's, laid
        # out as `raftmq snapshot` does: <out>/groups/g<N>).
        scratch = tempfile.TemporaryDirectory(prefix="raftmq-audit-")
        for n, data_dir in enumerate(_listed(args.data_dir)):
            path = os.path.join(scratch.name, f"snapshot{n}")
            info = snapshot(os.path.join(data_dir, "events"), path)
            print(f"snapshot of {data_dir}: events {info.first_seq}..{info.last_seq}, "
                  f"raft index {info.raft_index}", file=sys.stderr)
            for group, events in queue_group_histories(data_dir):
                info = snapshot(events, os.path.join(path, "groups", f"g{group}"))
                print(f"snapshot of {data_dir} group {group}: events {info.first_seq}..{info.last_seq}",
                      file=sys.stderr)
            paths.append(path)
    try:
        _warn_holes(paths)
        source = paths[0] if len(paths) == 1 else paths
        spark = audit_session(master=args.master)
        df = _job(args, spark, source)
        if df is None:
            return 2
        with Progress(spark) if not args.quiet else contextlib.nullcontext():
            rows = df.collect()
            if args.out:
                save(df, args.out)
        _print_table(df.columns, rows, args.limit)
        if args.plot:
            plot(args.job, rows, df.columns, args.plot)
            print(f"plot written to {args.plot}", file=sys.stderr)
        if args.out:
            print(f"result written to {args.out}", file=sys.stderr)
    finally:
        if scratch is not None:
            scratch.cleanup()
    return 0


def _listed(value) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _job(args, spark, source):
    """The job's DataFrame; None (after a message on stderr) if its arguments are missing."""
    if args.job == "trace":
        wanted = getattr(args, "message_id", None)
        if wanted is None:
            print("raftmq audit trace needs --message-id (a raftmq message id, or an AMQP message-id)",
                  file=sys.stderr)
            return None
        if wanted.isdigit():  # a raftmq message id is its group's (issue 34): --group, default 0
            return audit.trace(spark, source, int(wanted), getattr(args, "group", None) or 0)
        found = audit.message_keys(spark, source, wanted)
        if not found:
            print(f"no message with message-id {wanted!r} in the history", file=sys.stderr)
            return None
        if len(found) > 1:
            print(f"{len(found)} messages carry message-id {wanted!r} ((group, id) {found[:10]}); tracing all",
                  file=sys.stderr)
        frames = [audit.trace(spark, source, m, group) for group, m in found]
        df = frames[0]
        for more in frames[1:]:
            df = df.unionByName(more)
        return df.dropDuplicates(["group", "seq"]).orderBy(*ORDER)
    if args.job == "contents":
        if not getattr(args, "queue", None) or not getattr(args, "at", None):
            print("raftmq audit contents needs --queue and --at (UTC, e.g. '2026-11-28 10:42:00')",
                  file=sys.stderr)
            return None
        return audit.contents(spark, source, args.queue, args.at, vhost=getattr(args, "vhost", None) or "/")
    return audit.JOBS[args.job](spark, source)


def _warn_holes(paths: list[str]) -> None:
    """Say on stderr which sequence ranges none of the histories holds (a node that installed a
    state snapshot lacks the batches it covers: add another node's snapshot); each group's on its
    own (issue 34: each group numbers its events)."""
    from .groups import layout
    from .union import holes

    for group, histories in layout(paths).items():
        found = holes(histories)
        if found.holes:
            shown = ", ".join(f"{a}..{b}" for a, b in found.holes[:10])
            more = f" and {len(found.holes) - 10} more" if len(found.holes) > 10 else ""
            advice = "add another node's --snapshot/--data-dir to fill them" if len(paths) == 1 else \
                "no node given holds them"
            which = f"group {group}'s history" if group else "the history"
            print(f"warning: {which} lacks events {shown}{more} ({advice})", file=sys.stderr)


def _print_table(columns: list[str], rows: list, limit: int) -> None:
    shown = [[_cell(v) for v in row] for row in rows[:limit]]
    widths = [max([len(c), *(len(r[i]) for r in shown)]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in shown:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    if len(rows) > limit:
        print(f"... {len(rows) - limit} more rows (--limit, or --out to save them all)")
    else:
        print(f"({len(rows)} rows)")


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
