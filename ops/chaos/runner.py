"""A chaos run: workload + nemesis schedule on a backend, then heal, drain and check.

Schedule: a quiet period, then faults in turn (round robin over the chosen nemeses, random
targets from ``seed``) -- each held for ``fault_seconds`` and followed by ``quiet_seconds`` of
recovery -- until ``duration`` is up.  Then every fault is healed, the workload stops, the
cluster settles (replica digests must be equal on the netns backend), both queues are drained
and ``checker.check`` judges the history.  A fault that cannot be ended (a damaged node that does not
start again), a cluster that does not settle or a queue that cannot be drained is recorded in the
report (``fault_errors``, ``settle_error``, ``drain_errors``; nodes that died by themselves in
``node_exits``) and makes the run invalid, but the run goes on to its verdict.  Outputs in ``out_dir``: ``history.jsonl``,
``report.json`` and ``timeline.png``.

With queue groups (``groups`` > 1, issue 34) the report adds ``group_digests`` (queue group ->
node -> digest; group 0's are ``digests``) and ``groups_identical``: every group's replicas must be
identical for the run to be valid; ``group_applied`` (group -> the Raft index its replicas
reached: each group had its own traffic); ``worker_exit_seconds`` (how long a killed node's workers took
to stop by themselves) and ``worker_stragglers`` (workers still running after that: invalid).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import nemesis as nemeses
from .checker import Fault, Operation, check
from .workload import (
    BODY_BYTES,
    LIMIT,
    Q010,
    Q091,
    Q091_DEDUP,
    Clock,
    Consumer091,
    Publisher010,
    Publisher091,
    drain,
)

log = logging.getLogger(__name__)


@dataclass
class RunConfig:
    duration: float = 120.0
    nemeses: list[str] = field(default_factory=lambda: ["kill", "partition", "pause", "leader-kill"])
    fault_seconds: float = 4.0
    quiet_seconds: float = 4.0
    seed: int = 1
    out_dir: str = "chaos-run"
    body_bytes: int = BODY_BYTES  # payload of every message (bodies check themselves)
    limit: int = LIMIT  # messages per publisher, at most
    groups: int = 1  # the nodes' raft_groups (issue 34): the workload places its queues over them


@dataclass
class RunResult:
    report: dict
    faults: list[Fault]
    digests: dict
    valid: bool


def run_on_fresh(backend, config: RunConfig) -> RunResult:
    """Start ``backend``, run, and stop it whatever happens (the CLI's and the tests' way)."""
    backend.start()
    try:
        return run(backend, config)
    finally:
        backend.stop()


def run(backend, config: RunConfig) -> RunResult:
    for name in config.nemeses:
        if name not in nemeses.NEMESES:
            raise ValueError(f"unknown nemesis {name!r}; one of {', '.join(nemeses.NEMESES)}")
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    clock = Clock()
    history: list[Operation] = []
    faults: list[Fault] = []
    skipped: list[str] = []
    fault_errors: list[str] = []
    size, limit = config.body_bytes, config.limit
    groups = max(config.groups, getattr(backend, "groups", 1))  # the backend's nodes may run groups (env)
    dedup_publisher = Publisher091(backend.urls()[1:] + backend.urls()[:1], history, clock, "p091d", dedup=True,
                                   body_bytes=size, limit=limit, groups=groups)
    workers = [Publisher091(backend.urls(), history, clock, body_bytes=size, limit=limit, groups=groups),
               Publisher010(backend.hosts(), history, clock, body_bytes=size, limit=limit),
               Consumer091(backend.urls(), history, clock, body_bytes=size, groups=groups), dedup_publisher]
    for worker in workers:
        worker.start()
    try:
        time.sleep(config.quiet_seconds)
        turn = 0
        while clock() + config.fault_seconds < config.duration:
            name = config.nemeses[turn % len(config.nemeses)]
            turn += 1
            start = clock()
            try:
                description, end_fault = nemeses.start_fault(name, backend, rng)
            except Exception as exc:  # noqa: BLE001 - e.g. a fault this backend cannot make
                log.warning("nemesis %s not applied: %s", name, exc)
                skipped.append(f"{name}: {exc}")
                continue
            log.info("fault: %s", description)
            time.sleep(config.fault_seconds)
            try:
                end_fault()
            except Exception as exc:  # noqa: BLE001 - e.g. a damaged node that does not start again
                log.warning("fault %s did not end: %s", description, exc)
                fault_errors.append(f"{description}: {str(exc).splitlines()[0] if str(exc) else repr(exc)}")
            faults.append(Fault(description, start, clock()))
            time.sleep(config.quiet_seconds)
    finally:
        backend.heal()
        for worker in workers:
            worker.stop.set()
        for worker in workers:
            worker.join(timeout=120)
    errors = [f"{w.name}: {w.error!r}" for w in workers if getattr(w, "error", None) is not None]
    settle_error = None
    try:
        digests = backend.settle()
    except Exception as exc:  # noqa: BLE001 - judged below: the run is invalid, the history still checked
        log.warning("the cluster did not settle: %s", exc)
        settle_error, digests = str(exc).splitlines()[0] if str(exc) else repr(exc), {}
    leader = backend.leader()
    url = backend.urls()[leader if leader is not None else 0]
    drain_errors = []
    for queue in (Q091, Q010, Q091_DEDUP):
        try:
            drain(url, queue, history, clock, body_bytes=size)
        except Exception as exc:  # noqa: BLE001 - what was not drained counts as lost
            drain_errors.append(f"{queue}: {exc!r}")
    report = check(history, faults)
    # Digests come from the nodes' data directories (netns); compose checks equal applied indexes.
    converged = len(set(digests.values())) == 1 if digests else None
    # Queue groups (issue 34): every group's replicas must be identical too (group 0 is ``digests``).
    group_digests = dict(getattr(backend, "group_digests", {}) or {})
    groups_identical = {group: len(set(found.values())) == 1 for group, found in group_digests.items()}
    if groups > 1 and digests and (len(groups_identical) != groups - 1 or not all(groups_identical.values())):
        converged = False
    if settle_error is not None:
        converged = False
    exits = list(getattr(backend, "exits", []))
    stragglers = list(getattr(backend, "worker_stragglers", []))  # a node that was not all gone when killed
    valid = (report.valid and converged is not False and not errors and not fault_errors and not drain_errors
             and not stragglers)
    result = dataclasses.asdict(report)
    result.update(valid=valid, backend=backend.name, duration=config.duration, seed=config.seed,
                  nemeses=config.nemeses, faults=[dataclasses.asdict(f) for f in faults], skipped=skipped,
                  client_errors=errors, replicas_identical=converged, digests=digests,
                  fault_errors=fault_errors, settle_error=settle_error, drain_errors=drain_errors,
                  node_exits=exits, body_bytes=size, groups=groups, group_digests=group_digests,
                  groups_identical=groups_identical, group_applied=dict(getattr(backend, "group_applied", {})),
                  worker_exit_seconds=list(getattr(backend, "worker_exits", [])),
                  worker_stragglers=list(getattr(backend, "worker_stragglers", [])),
                  confirmed_by_kind=_confirmed_by_kind(history), dedup_resent=dedup_publisher.resent)
    with open(out / "history.jsonl", "w") as fh:
        for op in history:
            fh.write(json.dumps(dataclasses.asdict(op)) + "\n")
    (out / "report.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    try:
        from .timeline import plot_timeline

        plot_timeline(history, faults, out / "timeline.png", title=f"raftmq chaos ({backend.name})")
    except ImportError as exc:  # matplotlib is optional
        log.warning("no timeline.png: %s", exc)
    return RunResult(report=result, faults=faults, digests=digests, valid=valid)


def _confirmed_by_kind(history: list[Operation]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op in history:
        if op.kind == "enqueue" and op.status == "ok":
            counts[op.client_kind] = counts.get(op.client_kind, 0) + 1
    return counts
