"""Joining the nodes' rings per batch, and the breakdown table (raftmq/trace_report.py, issue 30).

Synthetic rings for a 3-node cluster (leader n1 (address LA), the client's follower n2 (OA), the other
follower n3 (YA)), times in ns chosen so that every expected interval is known.  Checked: the batch
is found from the client's window, followed by origin/seq and Raft index through all three nodes;
the chain follows the follower whose acknowledgement the leader read first, and the later of that
acknowledgement and the leader's own fsync; the stage times add up to the client's round trip;
with the client on the leader the forward and commit hops drop out.
"""

from __future__ import annotations

import pytest

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
from raftmq.trace_report import (
    ClientTrip,
    NodeEvents,
    Row,
    breakdown,
    chain,
    complete,
    format_table,
    join_trip,
)

LA, OA, YA = "a:1", "a:2", "a:3"
ORIGIN_O, ORIGIN_L = "n2.b", "n1.b"


def rings(events: dict[str, list[tuple]]) -> dict[str, NodeEvents]:
    meta = {"n1": (LA, ORIGIN_L), "n2": (OA, ORIGIN_O), "n3": (YA, "n3.b")}
    return {node: NodeEvents.from_dump({"node": node, "address": meta[node][0], "origin": meta[node][1],
                                        "events": evs}) for node, evs in events.items()}


def follower_trip(t: int, seq: int, idx: int, out: dict[str, list], *, y_first: bool = False,
                  leader_fsync_end: int = 700) -> ClientTrip:
    """One round trip through OA (n2); the follower whose ack the leader reads first is OA unless
    ``y_first``.  Returns the client's stamps."""
    fast, slow = (YA, OA) if y_first else (OA, YA)
    node_of = {OA: "n2", YA: "n3"}
    out["n2"] += [(t + 100, RX, ORIGIN_O, seq, 0, 0), (t + 120, SUBMIT, ORIGIN_O, seq, 0, 0),
                  (t + 140, PROPOSE, ORIGIN_O, seq, 0, 0), (t + 180, FORWARD, ORIGIN_O, seq, 0, 0)]
    out["n1"] += [(t + 250, CMD_RECV, ORIGIN_O, seq, 0, 0), (t + 280, APPEND, ORIGIN_O, seq, idx, 0),
                  (t + 300, AE_SEND, fast, idx, idx, idx - 1), (t + 320, AE_SEND, slow, idx, idx, idx - 1),
                  (t + leader_fsync_end, FLUSHED, "", idx, 300, 0)]
    for who, base in ((fast, 360), (slow, 460)):
        out[node_of[who]] += [(t + base, AE_RECV, LA, idx, idx, idx - 1), (t + base + 10, APPEND, ORIGIN_O, seq, idx, 0),
                              (t + base + 240, FLUSHED, "", idx, 220, 0), (t + base + 250, ACK_SEND, LA, idx, 0, 0)]
    out["n1"] += [(t + 760, ACK_RECV, fast, idx, 0, 0), (t + 860, ACK_RECV, slow, idx, 0, 0),
                  (t + 800, COMMIT, "", idx, 0, 0), (t + 850, AE_SEND, OA, 0, 0, idx), (t + 860, AE_SEND, YA, 0, 0, idx),
                  (t + 870, HANDOFF, ORIGIN_O, seq, idx, 0), (t + 990, APPLY, ORIGIN_O, seq, idx, 0)]
    out["n3"] += [(t + 905, AE_RECV, LA, 0, 0, idx)]
    out["n2"] += [(t + 900, AE_RECV, LA, 0, 0, idx), (t + 910, COMMIT, "", idx, 0, 0),
                  (t + 950, HANDOFF, ORIGIN_O, seq, idx, 0), (t + 1050, APPLY, ORIGIN_O, seq, idx, 0),
                  (t + 1080, APPLIED, ORIGIN_O, seq, idx, 0), (t + 1090, OUTPUTS, ORIGIN_O, seq, idx, 0),
                  (t + 1100, WRITTEN, ORIGIN_O, seq, idx, 0)]
    return ClientTrip(t, t + 1200, t + 1210)


def empty() -> dict[str, list]:
    return {"n1": [], "n2": [], "n3": []}


def test_a_round_trip_through_a_follower_is_joined_stage_by_stage():
    out = empty()
    out["n1"].append((50, AE_SEND, OA, 0, 0, 9))  # a heartbeat before the batch: matches nothing
    trip = follower_trip(10_000, seq=5, idx=10, out=out)
    points = join_trip(trip, "n2", rings(out))
    t = 10_000
    assert points["o_rx"] == t + 100 and points["o_forward"] == t + 180
    assert points["l_cmd_recv"] == t + 250 and points["l_append"] == t + 280
    assert points["l_ae_x"] == t + 300 and points["x_ae_recv"] == t + 360  # OA acked first
    assert points["x_flushed"] == t + 600 and points["x_ack_send"] == t + 610
    assert points["durable"] == t + 700  # the leader's fsync ended after OA's ack was sent
    assert points["l_ack_recv"] == t + 760 and points["l_commit"] == t + 800
    assert points["l_ae_commit"] == t + 850 and points["o_ae_commit"] == t + 900
    assert points["o_handoff"] == t + 950 and points["o_written"] == t + 1100
    assert points["l_flush_start"] == t + 400 and points["x_flush_start"] == t + 380
    assert complete(points)
    result = breakdown([points])
    assert result.joined == 1 and result.durable_gated_by_leader == 1 and result.acked_by_client_node == 1
    assert result.commit_to_other_first == 0  # (to n2 at +850, to n3 at +860)
    assert points["l_handoff"] == t + 870 and points["l_ae_commit_y"] == t + 860
    assert sum(row.mean for row in result.stages) == pytest.approx(1200 / 1e6)  # telescopes to the round trip
    assert result.total.samples == [pytest.approx(1200 / 1e6)]
    durable = next(r for r in result.stages if r.label.startswith("leader: own fsync"))
    assert durable.samples == [pytest.approx(90 / 1e6)]


def test_the_chain_follows_the_follower_whose_ack_came_first():
    out = empty()
    trip = follower_trip(0, seq=1, idx=3, out=out, y_first=True, leader_fsync_end=500)
    points = join_trip(trip, "n2", rings(out))
    # YA was sent AppendEntries first and acked first: its times are the chain's.
    assert points["l_ae_x"] == 300 and points["x_ae_recv"] == 360 and points["x_append"] == 370
    assert points["l_ae_y"] == 320 and points["l_ack_recv_y"] == 860
    assert points["durable"] == points["x_ack_send"] == 610  # the leader's fsync was done (500)
    assert complete(points)
    result = breakdown([points])
    assert result.durable_gated_by_leader == 0 and result.acked_by_client_node == 0


def test_many_trips_pick_their_own_batch_and_aggregate():
    out = empty()
    trips = [follower_trip(i * 5_000, seq=i + 1, idx=i + 2, out=out) for i in range(20)]
    nodes = rings(out)
    joined = [join_trip(trip, "n2", nodes) for trip in trips]
    assert [p["o_rx"] for p in joined] == [i * 5_000 + 100 for i in range(20)]
    result = breakdown(joined)
    assert result.joined == 20 and result.trips == 20
    assert all(row.n == 20 for row in result.stages)
    table = format_table(result, "client on the follower n2")
    assert "20 of 20 round trips joined" in table and "hop: leader receives apply_command" in table


def test_the_client_on_the_leader_skips_the_forward_and_commit_hops():
    out = empty()
    t, seq, idx = 1_000, 4, 8
    out["n1"] += [(t + 100, RX, ORIGIN_L, seq, 0, 0), (t + 110, SUBMIT, ORIGIN_L, seq, 0, 0),
                  (t + 120, PROPOSE, ORIGIN_L, seq, 0, 0), (t + 150, APPEND, ORIGIN_L, seq, idx, 0),
                  (t + 160, AE_SEND, OA, idx, idx, idx - 1), (t + 170, AE_SEND, YA, idx, idx, idx - 1),
                  (t + 400, FLUSHED, "", idx, 200, 0), (t + 520, ACK_RECV, YA, idx, 0, 0),
                  (t + 600, ACK_RECV, OA, idx, 0, 0), (t + 540, COMMIT, "", idx, 0, 0),
                  (t + 550, HANDOFF, ORIGIN_L, seq, idx, 0), (t + 600, APPLY, ORIGIN_L, seq, idx, 0),
                  (t + 620, APPLIED, ORIGIN_L, seq, idx, 0), (t + 630, OUTPUTS, ORIGIN_L, seq, idx, 0),
                  (t + 640, WRITTEN, ORIGIN_L, seq, idx, 0)]
    out["n3"] += [(t + 200, AE_RECV, LA, idx, idx, idx - 1), (t + 210, APPEND, ORIGIN_L, seq, idx, 0),
                  (t + 480, FLUSHED, "", idx, 250, 0), (t + 490, ACK_SEND, LA, idx, 0, 0)]
    out["n2"] += [(t + 300, AE_RECV, LA, idx, idx, idx - 1), (t + 310, APPEND, ORIGIN_L, seq, idx, 0),
                  (t + 560, FLUSHED, "", idx, 240, 0), (t + 570, ACK_SEND, LA, idx, 0, 0)]
    points = join_trip(ClientTrip(t, t + 700, t + 705), "n1", rings(out))
    assert "o_forward" not in chain(points) and "o_ae_commit" not in chain(points)
    assert points["x_ae_recv"] == t + 200  # n3 acked first
    assert complete(points)
    result = breakdown([points])
    assert sum(row.mean for row in result.stages) == pytest.approx(700 / 1e6)


def test_a_trip_without_its_batch_is_counted_in_the_total_but_not_joined():
    """A round trip whose socket read is not in any ring (the ring wrapped, or tracing was off on
    that node) is not joined; nor is a batch read outside the trip's window matched to it."""
    out = empty()
    follower_trip(0, seq=1, idx=2, out=out)
    nodes = rings(out)
    lost = ClientTrip(50_000, 51_500)
    points = join_trip(lost, "n2", nodes)
    assert points == {"send": 50_000, "deliver": 51_500}
    assert not complete(points)
    result = breakdown([points])
    assert (result.trips, result.joined, result.stages) == (1, 0, [])
    assert result.total.samples == [pytest.approx(1500 / 1e6)]


def test_events_out_of_order_do_not_join():
    """A common clock never runs backwards along the chain: a trip whose stages are out of order
    (a bug in a hook, or clocks that are not comparable) is left out rather than reported."""
    out = empty()
    trip = follower_trip(0, seq=1, idx=2, out=out)
    out["n2"] = [(e[0] - 2_000, *e[1:]) if e[1] == WRITTEN else e for e in out["n2"]]
    points = join_trip(trip, "n2", rings(out))
    assert not complete(points)


def test_percentiles():
    row = Row("x", [float(v) for v in range(1, 101)])
    assert (row.p(0.5), row.p(0.99), row.mean, row.n) == (51.0, 100.0, 50.5, 100)
