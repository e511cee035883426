"""A total-queue checker in the spirit of Jepsen's: what a message queue must guarantee under faults.

A *history* is the list of operations the workload's clients performed, each with its outcome:

* ``enqueue`` ``ok``: the broker confirmed the message (0-9-1 publisher confirm, 0-10 completion);
  ``fail``: it certainly did not take it (a nack); ``info``: unknown (the connection died first).
* ``dequeue`` ``ok``: a message was received (consumers during the run, the final drain after).

Verdict:

* **lost**: confirmed, never received intact. Always an error.
* **damaged**: a delivery whose body is not what was published (the workload's bodies check
  themselves, ``workload.read_body``; issue 29). Always an error: a broker must refuse to deliver
  bytes it cannot prove intact rather than send them.  Listed by the number the body carries
  (-1 when even that is unreadable); a damaged delivery does not count as the message received.
* **unexpected**: received, never attempted. Always an error.
* **duplicated**: received more than once. Allowed for plain 0-9-1 publishers (at-least-once: a
  publisher that lost its connection before the confirm publishes again), an error for 0-10
  session-resume publishers (exactly-once is the point of sessions) and for 0-9-1 publishers that
  resend with ``x-deduplication-header`` into a deduplicating queue (``0-9-1-dedup``, issue 21: the
  replicated cache drops the resend).
* **recovered**: outcome unknown to the publisher, yet delivered (fine, reported).
* **availability**: for each fault, the time from its end (the heal) to the next confirmed enqueue,
  and the longest stretch without any confirmed enqueue from its start to RECOVERY_WINDOW after
  its end (how long clients saw the broker unavailable).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field

KINDS = ("0-9-1", "0-10", "0-9-1-dedup")
EXACTLY_ONCE = ("0-10", "0-9-1-dedup")  # kinds for which a duplicate makes the history invalid
RECOVERY_WINDOW = 5.0  # seconds after a fault's end still counted as its effect


@dataclass(slots=True)
class Operation:
    kind: str  # "enqueue" | "dequeue"
    value: int
    status: str  # "ok" | "fail" | "info"
    client: str = ""
    client_kind: str = "0-9-1"  # the protocol of the client that *published* the value (for enqueues)
    time: float = 0.0  # seconds since the start of the run, when the outcome was known
    latency: float = 0.0  # seconds from the publish to its confirm (confirmed enqueues)
    damaged: bool = False  # dequeues: the body was not what was published
    note: str = ""  # damaged dequeues: how the body differs (workload.body_difference)


@dataclass(slots=True)
class Fault:
    name: str
    start: float
    end: float


@dataclass
class Report:
    valid: bool
    confirmed: int
    attempted: int
    received: int
    lost: list[int]
    unexpected: list[int]
    duplicated: dict[str, list[int]]
    recovered: int
    availability: list[dict] = field(default_factory=list)
    damaged: list[int] = field(default_factory=list)  # numbers carried by damaged deliveries
    damaged_count: int = 0  # damaged deliveries (the list is cut to a limit)
    lost_count: int = 0  # lost messages (the list is cut to a limit)
    damaged_examples: list[str] = field(default_factory=list)  # how the first damaged bodies differ

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def summary(self) -> str:
        dups = ", ".join(f"{k}: {len(v)}" for k, v in self.duplicated.items())
        return (f"{'VALID' if self.valid else 'INVALID'}: confirmed {self.confirmed}, received {self.received}, "
                f"lost {self.lost_count}, damaged {self.damaged_count}, unexpected {len(self.unexpected)}, duplicated ({dups}), "
                f"recovered {self.recovered}")


def check(history: list[Operation], faults: list[Fault] | None = None, limit: int = 50) -> Report:
    """Judge a history; lists in the report are cut to ``limit`` examples."""
    confirmed: set[int] = set()
    attempted: dict[int, str] = {}  # value -> kind of the publishing client
    unknown: set[int] = set()
    received: Counter[int] = Counter()
    damaged: list[int] = []
    examples: list[str] = []
    deliveries = 0
    enqueued_ok_times: list[float] = []
    for op in history:
        if op.kind == "enqueue":
            if op.status in ("ok", "info"):
                attempted[op.value] = op.client_kind
            if op.status == "ok":
                confirmed.add(op.value)
                enqueued_ok_times.append(op.time)
            elif op.status == "info":
                unknown.add(op.value)
        elif op.kind == "dequeue" and op.status == "ok":
            deliveries += 1
            if op.damaged:
                damaged.append(op.value)
                if len(examples) < 10:
                    examples.append(f"{op.client} t={op.time:.1f}: {op.note or op.value}")
            else:
                received[op.value] += 1
        else:
            raise ValueError(f"unknown operation {op!r}")
    lost = sorted(confirmed - set(received))
    unexpected = sorted(set(received) - set(attempted))
    duplicated = {kind: sorted(v for v, n in received.items() if n > 1 and attempted.get(v) == kind)
                  for kind in KINDS}
    recovered = len((unknown - confirmed) & set(received))
    availability = []
    enqueued_ok_times.sort()
    horizon = enqueued_ok_times[-1] if enqueued_ok_times else 0.0  # the workload's last confirm
    for fault in faults or ():
        after = next((t for t in enqueued_ok_times if t >= fault.end), None)
        availability.append({"fault": fault.name, "healed_at": fault.end,
                             "first_confirm_after_s": None if after is None else round(after - fault.end, 3),
                             "longest_gap_s": _longest_gap(enqueued_ok_times, fault.start,
                                                           max(fault.end, min(fault.end + RECOVERY_WINDOW,
                                                                              horizon)))})
    valid = (not lost and not unexpected and not damaged
             and not any(duplicated[kind] for kind in EXACTLY_ONCE))
    return Report(valid=valid, confirmed=len(confirmed), attempted=len(attempted), received=deliveries,
                  lost=lost[:limit], unexpected=unexpected[:limit],
                  duplicated={k: v[:limit] for k, v in duplicated.items()}, recovered=recovered,
                  availability=availability, damaged=sorted(damaged)[:limit], damaged_count=len(damaged),
                  lost_count=len(lost), damaged_examples=examples)


def _longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval in [start, end] without an element of the sorted ``times``."""
    inside = [t for t in times if start <= t <= end]
    edges = [start, *inside, end]
    return round(max(b - a for a, b in zip(edges, edges[1:], strict=False)), 3)
