"""Where a round trip goes: the rings of every node (``raftmq/trace.py``) joined per batch.

Pure functions (``bench/latency_stages.py`` collects the rings and the client's stamps; the unit
tests feed synthetic events).  For each client round trip -- publish sent, delivery received, both
stamped by the client with the nodes' clock -- :func:`join_trip` finds the batch that carried it
(the first batch of the client's node whose client-socket read falls between the two stamps),
follows it through the leader and the followers by origin, sequence and Raft index, and returns
the instants of every stage (:data:`POINTS`).

The stages form one chain from the client's send to its receipt (:func:`chain`), so that per
round trip the stage times add up to the round trip the client measured.  Sends are stamped as
handed to the transport, receipts as handed to pysyncobj: a hop includes pickling, sealing, the
socket and unsealing.  Where Raft runs two things at once the chain follows the one that finished
last: of the two followers, the one whose acknowledgement the leader received first (the commit
needed only one), and of that acknowledgement and the leader's own fsync, the later (``durable``:
the leader's tick thread reads no message while it is in its fsync, so an acknowledgement sent
before that ends waits for it).  The leader's fsync and the other follower are reported beside
the chain (:data:`SIDE`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftmq.trace import (
    ACK_RECV,
    ACK_SEND,
    AE_RECV,
    AE_SEND,
    APPEND,
    APPLIED,
    APPLY,
    CMD_RECV,
    COMMIT,
    FLUSHED,
    FORWARD,
    HANDOFF,
    OUTPUTS,
    PROPOSE,
    RX,
    SUBMIT,
    WRITTEN,
)

# The instants of a round trip, in chain order, with what the interval *ending* at each one is.
# "o" is the client's node, "l" the leader, "x" the follower whose acknowledgement the leader
# received first.
POINTS: list[tuple[str, str]] = [
    ("send", "client: publish handed to pika"),
    ("o_rx", "client -> node: socket read on the client's node"),
    ("o_submit", "front end: frames parsed, command submitted"),
    ("o_propose", "batching: batch taken and encoded (ClusterLog._propose_pending)"),
    ("o_forward", "tick thread woken: apply_command sent to the leader"),
    ("l_cmd_recv", "hop: leader receives apply_command"),
    ("l_append", "leader: queued to its next tick, appended to its journal"),
    ("l_ae_x", "leader: AppendEntries sent to the acking follower"),
    ("x_ae_recv", "hop: follower receives AppendEntries"),
    ("x_append", "follower: appended"),
    ("x_flushed", "follower: journal fdatasync"),
    ("x_ack_send", "follower: acknowledgement sent"),
    ("durable", "leader: own fsync still running when the ack was sent (0 if done)"),
    ("l_ack_recv", "hop: leader's tick thread reads the acknowledgement"),
    ("l_commit", "leader: next tick, commit index advanced"),
    ("l_ae_commit", "leader: AppendEntries with the commit index sent to the client's node"),
    ("o_ae_commit", "hop: client's node receives the commit index"),
    ("o_handoff", "client's node: next tick hands the entry to the loop"),
    ("o_apply", "loop: woken, batch decoded"),
    ("o_applied", "loop: state machine apply"),
    ("o_outputs", "loop: bodies stored and filled, bookkeeping"),
    ("o_written", "loop: outputs to the connections, up to the socket write"),
    ("deliver", "node -> client: write, loopback, delivery read by pika"),
]
POINT_NAMES = [name for name, _ in POINTS]

# Beside the chain: (label, from point, to point).
SIDE: list[tuple[str, str, str]] = [
    ("leader: AppendEntries to the acking follower sent -> own fsync done", "l_ae_x", "l_flushed"),
    ("leader: the fsync itself (write + fdatasync)", "l_flush_start", "l_flushed"),
    ("acking follower: the fsync itself (write + fdatasync)", "x_flush_start", "x_flushed"),
    ("other follower: AppendEntries sent -> its ack received", "l_ae_y", "l_ack_recv_y"),
    ("leader (client elsewhere): commit -> its own loop applies", "l_commit", "l_apply"),
    ("leader (client elsewhere): commit -> hands the entry to its own loop", "l_commit", "l_handoff"),
    ("leader (client elsewhere): that hand-off -> commit index sent to the client's node", "l_handoff",
     "l_ae_commit"),
    ("client's node write starts -> confirm read by pika", "o_written", "confirm"),
    ("publish -> confirm (client)", "send", "confirm"),
]


@dataclass
class ClientTrip:
    """One round trip as the client stamped it (CLOCK_MONOTONIC ns)."""

    send: int
    deliver: int
    confirm: int = 0


@dataclass
class NodeEvents:
    """One node's ring, indexed for the join."""

    node_id: str
    address: str
    origin: str
    # (stage, origin, seq) -> [(ts, idx)], in time order
    by_key: dict[tuple[str, str, int], list[tuple[int, int]]] = field(default_factory=dict)
    by_stage: dict[str, list[tuple]] = field(default_factory=dict)  # stage -> events sorted by ts

    @classmethod
    def from_dump(cls, trace: dict) -> NodeEvents:
        node = cls(trace["node"], trace["address"], trace["origin"])
        by_key: dict = defaultdict(list)
        by_stage: dict = defaultdict(list)
        for ts, stage, who, a, b, c in sorted(trace["events"]):
            by_stage[stage].append((ts, who, a, b, c))
            if stage in _KEYED:
                by_key[(stage, who, a)].append((ts, b))
        node.by_key, node.by_stage = dict(by_key), dict(by_stage)
        return node

    def first(self, stage: str, origin: str, seq: int) -> tuple[int, int] | None:
        found = self.by_key.get((stage, origin, seq))
        return found[0] if found else None

    def first_after(self, stage: str, after: int, match) -> tuple | None:
        """The first ``stage`` event at or after ``after`` for which ``match(event)`` holds."""
        events = self.by_stage.get(stage, ())
        for i in range(bisect.bisect_left(events, (after,)), len(events)):
            if match(events[i]):
                return events[i]
        return None


_KEYED = frozenset((RX, SUBMIT, PROPOSE, FORWARD, CMD_RECV, APPEND, HANDOFF, APPLY, APPLIED, OUTPUTS, WRITTEN))


def _ts(event) -> int | None:
    return None if event is None else event[0]


def join_trip(trip: ClientTrip, client_node: str, nodes: dict[str, NodeEvents]) -> dict[str, int]:
    """The instants (ns) of one round trip; stages not found are absent."""
    o = nodes[client_node]
    points: dict[str, int] = {"send": trip.send, "deliver": trip.deliver}
    if trip.confirm:
        points["confirm"] = trip.confirm
    rx = o.first_after(RX, trip.send, lambda e: e[1] == o.origin and e[0] <= trip.deliver)
    if rx is None:
        return points
    key = (o.origin, rx[2])
    points["o_rx"] = rx[0]
    for name, stage in (("o_submit", SUBMIT), ("o_propose", PROPOSE), ("o_forward", FORWARD),
                        ("o_handoff", HANDOFF), ("o_apply", APPLY), ("o_applied", APPLIED),
                        ("o_outputs", OUTPUTS), ("o_written", WRITTEN)):
        found = o.first(stage, *key)
        if found is not None:
            points[name] = found[0]
    # The leader appended the batch first (a follower appends only what the leader sent it).
    appends = [(found[0], found[1], node) for node in nodes.values()
               if (found := node.first(APPEND, *key)) is not None]
    if not appends:
        return points
    l_append, idx, leader = min(appends, key=lambda a: a[0])
    points["l_append"] = l_append
    if leader is not o:
        for name, stage in (("l_cmd_recv", CMD_RECV), ("l_handoff", HANDOFF), ("l_apply", APPLY)):
            found = leader.first(stage, *key)
            if found is not None:
                points[name] = found[0]
    acks = []
    for x in nodes.values():
        if x is leader:
            continue
        ae = leader.first_after(AE_SEND, l_append, lambda e, x=x: e[1] == x.address and e[2] <= idx <= e[3])
        if ae is None:
            continue
        got = x.first_after(AE_RECV, l_append, lambda e: e[1] == leader.address and e[2] <= idx <= e[3])
        x_append = x.first(APPEND, *key)
        x_flushed = x.first_after(FLUSHED, x_append[0], lambda e: e[2] >= idx) if x_append else None
        x_ack = x.first_after(ACK_SEND, x_flushed[0], lambda e: e[1] == leader.address and e[2] >= idx) \
            if x_flushed else None
        l_ack = leader.first_after(ACK_RECV, x_ack[0], lambda e, x=x: e[1] == x.address and e[2] >= idx) \
            if x_ack else None
        acks.append((_ts(l_ack) or float("inf"), ae[0], _ts(got), x_append and x_append[0], _ts(x_flushed),
                     _ts(x_ack), _ts(l_ack), x_flushed and x_flushed[0] - x_flushed[3], x is o))
    acks.sort(key=lambda a: a[0])
    if acks:
        _, points["l_ae_x"], *rest, x_is_o = acks[0]
        points["_x_is_client_node"] = int(x_is_o)
        for name, value in zip(("x_ae_recv", "x_append", "x_flushed", "x_ack_send", "l_ack_recv", "x_flush_start"),
                               rest, strict=True):
            if value is not None:
                points[name] = value
    if len(acks) > 1:
        points["l_ae_y"] = acks[1][1]
        if acks[1][6] is not None:
            points["l_ack_recv_y"] = acks[1][6]
    l_flushed = leader.first_after(FLUSHED, l_append, lambda e: e[2] >= idx)
    if l_flushed is not None:
        points["l_flushed"], points["l_flush_start"] = l_flushed[0], l_flushed[0] - l_flushed[3]
        if "x_ack_send" in points:
            points["durable"] = max(points["x_ack_send"], l_flushed[0])
    commit = leader.first_after(COMMIT, l_append, lambda e: e[2] >= idx)
    if commit is not None:
        points["l_commit"] = commit[0]
        if leader is not o:
            ae = leader.first_after(AE_SEND, commit[0], lambda e: e[1] == o.address and e[4] >= idx)
            if ae is not None:
                points["l_ae_commit"] = ae[0]
                got = o.first_after(AE_RECV, commit[0], lambda e: e[1] == leader.address and e[4] >= idx)
                if got is not None:
                    points["o_ae_commit"] = got[0]
            other = leader.first_after(AE_SEND, commit[0], lambda e: e[1] not in (o.address, leader.address)
                                       and e[4] >= idx)
            if other is not None:
                points["l_ae_commit_y"] = other[0]
    points["_leader_is_client_node"] = int(leader is o)
    return points


def chain(points: dict[str, int]) -> list[str]:
    """The chain's points for this round trip: hops the client's node skips when it leads are left
    out (no forward, no commit message to itself)."""
    skip = {"o_forward", "l_cmd_recv", "l_ae_commit", "o_ae_commit"} if points.get("_leader_is_client_node") else set()
    return [name for name in POINT_NAMES if name not in skip]


def complete(points: dict[str, int]) -> bool:
    """Every point of the chain was observed, in order (a common clock never runs backwards)."""
    names = chain(points)
    if any(name not in points for name in names):
        return False
    return all(points[a] <= points[b] for a, b in zip(names, names[1:], strict=False))


@dataclass
class Row:
    label: str
    samples: list[float]  # ms

    @property
    def n(self) -> int:
        return len(self.samples)

    def p(self, fraction: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else float("nan")

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


@dataclass
class Breakdown:
    trips: int
    joined: int  # round trips with every stage of the chain observed
    stages: list[Row]
    side: list[Row]
    total: Row  # the client-measured publish -> delivery, every round trip
    total_joined: Row  # ... the joined ones
    durable_gated_by_leader: int  # joined trips whose ack waited for the leader's own fsync
    acked_by_client_node: int  # joined trips whose first acknowledgement came from the client's node
    commit_to_other_first: int = 0  # ... whose commit index went to the other follower before the client's node


def breakdown(joined: Iterable[dict[str, int]]) -> Breakdown:
    """Per stage, the time from the previous point of the chain, over the fully joined trips; the
    total over all of them."""
    joined = list(joined)
    labels = dict(POINTS)
    full = [p for p in joined if complete(p)]
    stages: dict[str, Row] = {name: Row(labels[name], []) for name in POINT_NAMES[1:]}
    gated = by_o = other_first = 0
    for points in full:
        names = chain(points)
        for before, name in zip(names, names[1:], strict=False):
            stages[name].samples.append((points[name] - points[before]) / 1e6)
        gated += points["durable"] > points["x_ack_send"]
        by_o += points.get("_x_is_client_node", 0)
        other_first += "l_ae_commit" in points and points.get("l_ae_commit_y", points["l_ae_commit"] + 1) < points[
            "l_ae_commit"]
    side = []
    for label, start, end in SIDE:
        side.append(Row(label, [(p[end] - p[start]) / 1e6 for p in full if start in p and end in p]))
    total = Row("publish -> delivery (client), all round trips", [(p["deliver"] - p["send"]) / 1e6 for p in joined])
    total_joined = Row("publish -> delivery (client), the joined ones", [(p["deliver"] - p["send"]) / 1e6 for p in full])
    return Breakdown(len(joined), len(full), [r for r in stages.values() if r.samples], side, total,
                     total_joined, gated, by_o, other_first)


def format_table(result: Breakdown, title: str) -> str:
    lines = [f"{title}: {result.joined} of {result.trips} round trips joined through every stage",
             f"{'stage (time since the previous one)':74s}{'p50 ms':>9s}{'p99 ms':>9s}{'mean ms':>9s}"
             f"{'of mean':>9s}"]
    sum_means = sum(row.mean for row in result.stages)
    for row in result.stages:
        lines.append(f"  {row.label:72s}{row.p(0.5):9.3f}{row.p(0.99):9.3f}{row.mean:9.3f}"
                     f"{100 * row.mean / sum_means:8.1f}%")
    lines.append(f"  {'sum of the stage means (= the mean round trip of the joined trips)':72s}{'':18s}"
                 f"{sum_means:9.3f}")
    for row in (result.total_joined, result.total):
        lines.append(f"{row.label:74s}{row.p(0.5):9.3f}{row.p(0.99):9.3f}{row.mean:9.3f}")
    lines.append("beside the chain:")
    for row in result.side:
        if row.samples:
            lines.append(f"  {row.label:72s}{row.p(0.5):9.3f}{row.p(0.99):9.3f}{row.mean:9.3f}")
    if result.joined:
        lines.append(f"  the leader's own fsync ended after the follower's ack was sent in "
                     f"{result.durable_gated_by_leader} of {result.joined} round trips")
        lines.append(f"  the first acknowledgement came from the client's node in {result.acked_by_client_node} "
                     f"of {result.joined} round trips")
        lines.append(f"  the commit index went to the other follower before the client's node in "
                     f"{result.commit_to_other_first} of {result.joined} round trips")
    return "\n".join(lines)
