"""Failover per Raft group (issue 34, "How we will check it": "leader kill -9 of a node that leads
several groups, time to the next confirm per group (p50/p99 over 20 kills), against one group's
figure").

For each configuration (``--configs 3,1``: raft_groups 3, then 1; one cluster at a time) a 3-node
cluster on loopback gets one durable queue per group, placed with ``x-queue-group``, and one
confirming publisher per queue (persistent messages, one at a time, each on its own connection
to node n1, which is never killed).  Each round:

1. all the groups' leaders are moved to the victim (``rebalance --to``, node/group_leaders.py),
   n2 and n3 in turn, so that the victim leads *every* group (the worst case: each group needs an
   election at once; with one group it is today's leader kill);
2. the victim is killed -9, its group workers first, then its main process;
3. per group: the time from the kill to the first confirm of a message published after it;
4. the victim is restarted and waited for (every group's replica following a leader, lag 0).

The nodes' own rebalancing is off (``leader_rebalance_seconds = 0``): the bench places leaders
itself.  Bounded: ``--kills`` rounds (default 20), each waiting at most ROUND_LIMIT s for a
confirm, and ``--max-seconds`` per configuration.  At the end each queue is drained and compared
with what was confirmed (lost = confirmed and not stored).  Prints every round and, per
configuration and group, p50/p99/max; ``--json PATH`` writes them.

    python bench/failover_groups.py [--kills 20] [--configs 3,1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftmq.node.group_leaders import rebalance  # noqa: E402
from raftmq.ops.config import load_config  # noqa: E402
from raftmq.ops.local.cluster import Cluster  # noqa: E402
from raftmq.ops.local.node import RaftmqNode  # noqa: E402

ROUND_LIMIT = 30.0  # seconds to wait for every group's confirm after a kill
CATCH_UP_LIMIT = 60.0  # seconds for a restarted node's groups to follow and catch up


class Publisher(threading.Thread):
    """Publishes to ``queue`` through ``node`` with confirms, one message at a time, reconnecting
    after an error; ``confirmed`` holds (time published, time confirmed, seq)."""

    def __init__(self, cluster: Cluster, node: RaftmqNode, queue: str, group: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.node, self.queue, self.group = cluster, node, queue, group
        self.confirmed: list[tuple[float, float, int]] = []
        self.stop = threading.Event()
        self.seq = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.cluster.connection(self.node, timeout=ROUND_LIMIT)
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(self.queue, durable=True, arguments={"x-queue-group": self.group})
                while not self.stop.is_set():
                    self.seq += 1
                    sent_at = time.monotonic()
                    ch.basic_publish("", self.queue, str(self.seq).encode(), pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append((sent_at, time.monotonic(), self.seq))
                conn.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.05)  # reconnect (a node closes its clients while leaderless too long)

    def first_confirm_after(self, at: float) -> float | None:
        """Seconds from ``at`` to the confirm of the first message published after it, or None."""
        first = None
        for sent, confirmed, _seq in reversed(self.confirmed):  # appended in order
            if sent <= at:
                break
            first = confirmed
        return None if first is None else first - at


def caught_up(node: RaftmqNode, groups: int) -> bool:
    st = node.status() or {}
    if st.get("pid") != node.pid or not st.get("leader"):
        return False
    if groups == 1:
        return st.get("role") in ("leader", "follower") and st.get("commit_index", 0) <= st.get("raft_applied", -1) + 1
    views = st.get("group_status") or []
    return len(views) == groups and all(v["role"] in ("leader", "follower") and v["leader"] and v["lag"] == 0
                                        for v in views)


def run_config(groups: int, kills: int, max_seconds: float, base: Path) -> dict:
    extra = f"raft_groups = {groups}\nleader_rebalance_seconds = 0"
    results: dict[int, list[float]] = {g: [] for g in range(groups)}
    misses = {g: 0 for g in range(groups)}
    started = time.monotonic()
    with Cluster(3, base / f"g{groups}", extra_config=extra, start_timeout=60) as cluster:
        config = load_config(str(cluster.config_path))
        front = cluster.nodes[0]
        publishers = [Publisher(cluster, front, f"failover-g{g}", g) for g in range(groups)]
        for p in publishers:
            p.start()
        time.sleep(2.0)
        for round_no in range(1, kills + 1):
            if time.monotonic() - started > max_seconds:
                print(f"  stopping after {round_no - 1} kills: --max-seconds {max_seconds:g} reached", flush=True)
                break
            victim = cluster.nodes[1 + round_no % 2]
            moved = rebalance(config, victim.node_id, None, 20.0)
            if moved.failed:
                print(f"  round {round_no}: groups {moved.failed} did not move to {victim.node_id}; leaders "
                      f"{moved.leaders}", flush=True)
            killed_at = time.monotonic()
            victim.kill9_whole()
            found: dict[int, float | None] = {g: None for g in range(groups)}
            deadline = killed_at + ROUND_LIMIT
            while time.monotonic() < deadline and any(v is None for v in found.values()):
                for p in publishers:
                    if found[p.group] is None:
                        found[p.group] = p.first_confirm_after(killed_at)
                time.sleep(0.005)
            cells = []
            for g in range(groups):
                led = moved.leaders.get(g) == victim.node_id
                if found[g] is None:
                    misses[g] += 1
                    cells.append(f"g{g} none")
                else:
                    if led:
                        results[g].append(found[g])  # type: ignore[arg-type]
                    cells.append(f"g{g} {found[g] * 1000:.0f} ms" + ("" if led else " (not led by the victim)"))
            print(f"  round {round_no}: kill -9 {victim.node_id} -> first confirm " + ", ".join(cells), flush=True)
            victim.start()
            deadline = time.monotonic() + CATCH_UP_LIMIT
            while time.monotonic() < deadline and not caught_up(victim, groups):
                time.sleep(0.2)
            time.sleep(0.5)
        for p in publishers:
            p.stop.set()
        for p in publishers:
            p.join(timeout=15)
        conn = cluster.connection(front)
        ch = conn.channel()
        lost = {}
        for p in publishers:
            stored = set()
            while True:
                method, _props, body = ch.basic_get(p.queue, auto_ack=True)
                if method is None:
                    break
                stored.add(int(body))
            confirmed = {seq for _s, _c, seq in p.confirmed}
            lost[p.group] = len(confirmed - stored)
            print(f"  g{p.group}: confirmed {len(confirmed)}, stored {len(stored)}, lost {lost[p.group]}")
        conn.close()
    summary = {}
    for g, times in results.items():
        if times:
            ordered = sorted(times)
            p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
            summary[g] = {"kills": len(times), "p50_ms": round(statistics.median(times) * 1000),
                          "p99_ms": round(p99 * 1000), "max_ms": round(max(times) * 1000),
                          "min_ms": round(min(times) * 1000), "no_confirm": misses[g], "lost": lost[g]}
        else:
            summary[g] = {"kills": 0, "no_confirm": misses[g], "lost": lost[g]}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--configs", default="3,1", help="raft_groups values, run one after the other")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="per configuration")
    parser.add_argument("--base", default=None, help="data directory (default: a new temporary one)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args()
    base = Path(args.base or tempfile.mkdtemp(prefix="raftmq-failover-groups-"))
    out = {}
    for groups in (int(x) for x in args.configs.split(",")):
        print(f"raft_groups = {groups}: {args.kills} kills of a node leading every group", flush=True)
        out[groups] = run_config(groups, args.kills, args.max_seconds, base)
    print("\nkill -9 of the node leading every group -> first confirm per group (ms)")
    for groups, summary in out.items():
        for g, s in summary.items():
            if s["kills"]:
                print(f"  raft_groups={groups} group {g}: p50 {s['p50_ms']}, p99 {s['p99_ms']}, max {s['max_ms']}, "
                      f"min {s['min_ms']} over {s['kills']} kills; no confirm {s['no_confirm']}, lost {s['lost']}")
            else:
                print(f"  raft_groups={groups} group {g}: no kill measured; no confirm {s['no_confirm']}, "
                      f"lost {s['lost']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
