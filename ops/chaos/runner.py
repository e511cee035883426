"""A chaos run: workload + nemesis schedule on a backend, then heal, drain and check.

Schedule: a quiet period, then faults in turn (round robin over the chosen nemeses, random
targets from ``seed``) -- each held for ``fault_seconds`` and followed by ``quiet_seconds`` of
recovery -- until ``duration`` is up.  Then every fault is healed, the workload stops, the
cluster settles (replica digests must be equal on the netns backend), both queues are drained
and ``checker.check`` judges the history.  Outputs in ``out_dir``: ``history.jsonl``,
``report.json`` and ``timeline.png``.
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
from .workload import Q010, Q091, Q091_DEDUP, Clock, Consumer091, Publisher010, Publisher091, drain

log = logging.getLogger(__name__)


@dataclass
class RunConfig:
    duration: float = 120.0
    nemeses: list[str] = field(default_factory=lambda: ["kill", "partition", "pause", "leader-kill"])
    fault_seconds: float = 4.0
    quiet_seconds: float = 4.0
    seed: int = 1
    out_dir: str = "chaos-run"


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
    dedup_publisher = Publisher091(backend.urls()[1:] + backend.urls()[:1], history, clock, "p091d", dedup=True)
    workers = [Publisher091(backend.urls(), history, clock), Publisher010(backend.hosts(), history, clock),
               Consumer091(backend.urls(), history, clock), dedup_publisher]
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
            end_fault()
            faults.append(Fault(description, start, clock()))
            time.sleep(config.quiet_seconds)
    finally:
        backend.heal()
        for worker in workers:
            worker.stop.set()
        for worker in workers:
            worker.join(timeout=120)
    errors = [f"{w.name}: {w.error!r}" for w in workers if getattr(w, "error", None) is not None]
    digests = backend.settle()
    leader = backend.leader()
    url = backend.urls()[leader if leader is not None else 0]
    for queue in (Q091, Q010, Q091_DEDUP):
        drain(url, queue, history, clock)
    report = check(history, faults)
    # Digests come from the nodes' data directories (netns); compose checks equal applied indexes.
    converged = len(set(digests.values())) == 1 if digests else None
    valid = report.valid and converged is not False and not errors
    result = dataclasses.asdict(report)
    result.update(valid=valid, backend=backend.name, duration=config.duration, seed=config.seed,
                  nemeses=config.nemeses, faults=[dataclasses.asdict(f) for f in faults], skipped=skipped,
                  client_errors=errors, replicas_identical=converged, digests=digests,
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
