"""Issue 34's benchmark: one Raft group against several, side by side in one run, alternating rounds,
printing the confirm rate and the CPU seconds per message of every broker process and, apart, of the
clients (on this 2-core machine the publishers compete with the brokers for the same cores).

Systems (``--systems``, comma separated; the first is the baseline of the ratios):

* ``one``: one broker (``--nodes 1``) or one 3-node cluster (``--nodes 3``); every publisher on it,
  each on its own queue.  Today's code: one Raft group.
* ``split``: ``--split K`` (default 2) independent brokers or clusters of today's code (their own
  processes, data directories and ports); publisher i on broker i mod K.  With no hop, no shared
  metadata and no cross-group transaction this is the **ceiling** of K groups (the best case of the
  design in docs/design.md "Sharded Raft groups"): the real groups can only add costs to it.  With
  ``--nodes 3`` the leader of cluster k is moved to node k mod 3 (pysyncobj's leadership transfer,
  the ``transfer`` admin command ``raftmq cluster remove`` uses), so that the clusters' leaders sit
  on different nodes as issue 34 wants its groups' leaders.  A leader that moves (an election under
  load) is put back before the next run, and a run during which a leader changed is flagged.
* ``groups``: ONE broker or cluster started with ``raft_groups = N`` (``--groups N``) in its TOML
  file, every publisher on it: the real thing once issue 34 is built.  **Today's broker does not
  know the setting** (ops/config.py refuses an unknown key, so the node exits at start): the run
  then reports that and goes on without the system.  ``--broker-config`` adds further TOML lines to
  every raftmq broker (e.g. a number of workers once that exists).  Where the groups' leaders are is
  the broker's business (placement and ``raftmq cluster rebalance``); the script prints status.json's
  ``groups`` if the broker writes one.
* ``rabbitmq`` (``--nodes 3`` only): a 3-node RabbitMQ cluster (bench/rabbit_cluster.py), one
  3-replica quorum queue per publisher, queue i declared through node i mod 3 (so its leader is
  there: RabbitMQ 3.10's default leader locator is client-local) and its publisher on the next node.

Load: ``--publishers P`` (default 2) processes, each one pika ``SelectConnection`` in confirm mode
publishing ``--count`` persistent ``--size`` B messages to its own durable queue (RabbitMQ: quorum),
``--window`` unconfirmed in flight, topped up from the confirm callback (bench/throughput.py's
``confirm (pika async)``; bench/ab_cluster.py's confirm256).  Each publisher connects and declares
its queue, says it is ready, and starts on the parent's word, so all start together; the system's
rate is the messages confirmed by all of them over the wall time from the first start to the last
finish.  Bounded by the count and by ``--time-limit`` seconds per publisher.  With ``--nodes 3``
the publishers talk to followers (``--client-on leader`` to the leaders), as ab_cluster.py does.

CPU: of every broker process (raftmq: each node's server; RabbitMQ: every process of each node's
process group), ``utime + stime + cutime + cstime`` from /proc/<pid>/stat read just before the
publishers start and just after the last one finished (cutime/cstime: children the broker reaped
meanwhile, e.g. a snapshot fork).  Idle systems keep running while another is measured: their
heartbeats cost the measured one a little CPU, the same for every system.  The clients' CPU is each
publisher's own ``time.process_time()`` over its publishing.  Per message = seconds / confirmed.
The whole machine's busy time (/proc/stat) over the run, less ours, is printed as the cores the
*others* kept busy (other sessions' tests, the idle systems, kernel threads, softirq): on a shared
2-core machine that decides how much room a second group has.  "CPU-bound msg/s (proj.)" is a
projection, not a measurement: the rate at the run's CPU per message if CPU were the only limit,
the machine ours alone and the scheduler perfect (bounded by the busiest single process, one core,
and by all our processes' CPU over every core).

Rounds: a warm-up run per system (a tenth of the count, not counted), then ``--rounds`` rounds,
each running every system once, the order rotating through the permutations.  The machine drifts
by up to 2x within minutes: only the side-by-side ratios mean anything.  Summary: medians per
system, ratios of the medians to the baseline and the range of the per-round ratios.

Usage::

    python bench/groups.py --nodes 1 --rounds 4                     # one broker against two
    python bench/groups.py --nodes 3 --rounds 3 --systems one,split,rabbitmq
    python bench/groups.py --nodes 1 --systems one,groups --groups 2   # once raft_groups exists
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SYSTEMS = ("one", "split", "groups", "rabbitmq")
TICKS = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------- pure parts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, checked: systems known, ``groups`` only with ``--groups``, ``rabbitmq``
    only with 3 nodes, positive counts."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, choices=(1, 3), default=1, help="nodes per broker or cluster")
    parser.add_argument("--systems", default=None,
                        help=f"comma separated, of {', '.join(SYSTEMS)}; the first is the baseline of the ratios "
                             "(default: one,split; plus groups with --groups; plus rabbitmq with --rabbitmq)")
    parser.add_argument("--split", type=int, default=2, help="independent brokers/clusters of the split system")
    parser.add_argument("--groups", type=int, default=None, metavar="N",
                        help="adds the groups system: one broker/cluster with 'raft_groups = N' in its TOML file "
                             "(issue 34; NOT known to today's broker, which refuses to start with it)")
    parser.add_argument("--broker-config", action="append", default=[], metavar="LINE",
                        help="a TOML line for every raftmq broker's configuration (repeatable)")
    parser.add_argument("--rabbitmq", action="store_true", help="adds a 3-node RabbitMQ cluster (--nodes 3)")
    parser.add_argument("--publishers", type=int, default=2, help="publisher processes, one queue each")
    parser.add_argument("--count", type=int, default=20_000, help="messages per publisher")
    parser.add_argument("--size", type=int, default=256, help="body size in bytes")
    parser.add_argument("--window", type=int, default=1000, help="unconfirmed messages in flight per publisher")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per publisher and run")
    parser.add_argument("--client-on", choices=("follower", "leader"), default="follower",
                        help="with --nodes 3: the node each publisher talks to")
    parser.add_argument("--own-sessions", action="store_true",
                        help="start every raftmq node in a session of its own (setsid), as bench/rabbit_cluster.py "
                             "starts RabbitMQ's nodes: with the kernel's autogroup on, the CPU of a busy machine is "
                             "shared per session (by default all raftmq nodes share this script's one)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-minutes", type=float, default=30.0, help="no round starts after this")
    args = parser.parse_args(argv)
    if args.systems is None:
        systems = ["one", "split"] + (["groups"] if args.groups else []) + (["rabbitmq"] if args.rabbitmq else [])
    else:
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := sorted(set(systems) - set(SYSTEMS)):
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if len(set(systems)) != len(systems) or not systems:
        parser.error("--systems: each system once, at least one")
    if "groups" in systems and not args.groups:
        parser.error("the groups system needs --groups N")
    if "rabbitmq" in systems and args.nodes != 3:
        parser.error("rabbitmq runs as a 3-node cluster: use --nodes 3")
    for name in ("split", "publishers", "count", "size", "window", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.groups is not None and args.groups < 1:
        parser.error("--groups must be at least 1")
    args.systems = systems
    return args


def broker_config(args: argparse.Namespace, system: str) -> str:
    """The TOML lines a raftmq broker of ``system`` starts with (disk_free_limit as ab_cluster.py:
    the shared machine's disk must not block publishers)."""
    lines = ["disk_free_limit = 1"]
    if system == "groups":
        lines.append(f"raft_groups = {args.groups}")
    return "\n".join(lines + list(args.broker_config)) + "\n"


def stat_seconds(stat: str) -> float:
    """CPU seconds of a /proc/<pid>/stat line: utime + stime + cutime + cstime (fields 14-17,
    proc(5)).  The command name (field 2) may hold spaces and parentheses: split after its last ')'."""
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is field 3 (state): field n is fields[n - 3]
    return sum(int(fields[n - 3]) for n in (14, 15, 16, 17)) / TICKS


def cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds of each live process in ``pids`` (a process that is gone is left out)."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/stat") as fh:
            out[pid] = stat_seconds(fh.read())
    return out


def machine_ticks(stat: str) -> tuple[int, int, int]:
    """(busy, iowait, total) jiffies of the first "cpu" line of /proc/stat (proc(5): user nice system
    idle iowait irq softirq steal ...; guest time is already inside user): busy is everything but idle
    and iowait."""
    line = next(row for row in stat.splitlines() if row.startswith("cpu "))
    values = [int(v) for v in line.split()[1:9]]
    idle, iowait = values[3], values[4]
    return sum(values) - idle - iowait, iowait, sum(values)


def read_machine() -> tuple[int, int, int]:
    with open("/proc/stat") as fh:
        return machine_ticks(fh.read())


def cpu_deltas(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """The CPU each process used between two samples: a process only in ``after`` counts from 0
    (started meanwhile); one only in ``before`` is gone and its CPU since is unknown (left out)."""
    return {pid: seconds - before.get(pid, 0.0) for pid, seconds in after.items()}


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """The CPU all the processes used between two samples (see cpu_deltas)."""
    return sum(cpu_deltas(before, after).values())


@dataclass(frozen=True)
class Publisher:
    """What one publisher process reports: confirmed (acked) and nacked messages, its start and end
    (time.monotonic(), one clock for every process of the machine) and its own CPU seconds."""

    acked: int
    nacked: int
    start: float
    end: float
    cpu: float


@dataclass(frozen=True)
class Run:
    """One system measured once: every publisher's report and the brokers' CPU seconds."""

    system: str
    publishers: tuple[Publisher, ...]
    broker_cpu: float
    machine_busy: float = 0.0  # CPU seconds of the whole machine (every process, ours or not) meanwhile
    machine_iowait: float = 0.0
    busiest: float = 0.0  # CPU seconds of the busiest broker process

    @property
    def confirmed(self) -> int:
        return sum(p.acked for p in self.publishers)

    @property
    def wall(self) -> float:
        """From the first publisher's start to the last one's end."""
        return max(p.end for p in self.publishers) - min(p.start for p in self.publishers)

    @property
    def rate(self) -> float:
        return self.confirmed / self.wall

    @property
    def broker_us(self) -> float:
        """Broker CPU per confirmed message, µs."""
        return self.broker_cpu / self.confirmed * 1e6

    @property
    def client_us(self) -> float:
        """Publisher CPU per confirmed message, µs."""
        return sum(p.cpu for p in self.publishers) / self.confirmed * 1e6

    @property
    def cores(self) -> float:
        """Cores the brokers and the publishers kept busy on average over the run."""
        return (self.broker_cpu + sum(p.cpu for p in self.publishers)) / self.wall

    @property
    def others(self) -> float:
        """Cores the rest of the machine (other processes, idle systems, this script) kept busy."""
        return max(0.0, self.machine_busy / self.wall - self.cores)

    def ceiling(self, cores: int = CORES) -> float:
        """A projection, not a measurement: the confirm rate if CPU were the only limit, the
        machine ours alone and the scheduler perfect, at this run's CPU per message.  Bounded by
        the busiest single process (one core: a broker's process, or one publisher) and by all
        our processes' CPU shared over ``cores``."""
        clients = [p.cpu for p in self.publishers]
        return self.confirmed / max(self.busiest, *clients, (self.broker_cpu + sum(clients)) / cores)

    def values(self) -> dict[str, float]:
        return {"rate": self.rate, "broker_us": self.broker_us, "busiest_us": self.busiest / self.confirmed * 1e6,
                "client_us": self.client_us,
                "total_us": self.broker_us + self.client_us, "cores": self.cores, "others": self.others,
                "ceiling": self.ceiling()}


METRICS = {"rate": "confirmed msg/s", "broker_us": "broker CPU µs/msg", "busiest_us": " busiest process µs/msg",
           "client_us": "client CPU µs/msg",
           "total_us": "all CPU µs/msg", "cores": "cores busy (ours)", "others": "cores busy (others)",
           "ceiling": "CPU-bound msg/s (proj.)"}


@dataclass
class Summary:
    """Medians per system and metric; per system and metric against the baseline: the ratio of the
    medians, the median of the per-round ratios (the paired figure: the two runs of a round are
    seconds apart) and the range of the per-round ratios (rounds where both were measured)."""

    medians: dict[str, dict[str, float]] = field(default_factory=dict)
    ratios: dict[str, dict[str, tuple[float, float, float, float]]] = field(default_factory=dict)
    rounds: int = 0


def ratio(a: float, b: float) -> float:
    """a / b; NaN when b is 0 (e.g. no CPU left for the others)."""
    return a / b if b else float("nan")


def summarise(rounds: list[dict[str, Run]], systems: list[str]) -> Summary:
    """``rounds``: per round, the run of each system measured in it.  The first system is the
    baseline."""
    summary = Summary(rounds=len(rounds))
    base = systems[0]
    for system in systems:
        runs = [r[system].values() for r in rounds if system in r]
        if runs:
            summary.medians[system] = {m: statistics.median(v[m] for v in runs) for m in METRICS}
    for system in systems[1:]:
        if system not in summary.medians or base not in summary.medians:
            continue
        pairs = [(r[system].values(), r[base].values()) for r in rounds if system in r and base in r]
        summary.ratios[system] = {}
        for metric in METRICS:
            per_round = [ratio(a[metric], b[metric]) for a, b in pairs]
            summary.ratios[system][metric] = (ratio(summary.medians[system][metric], summary.medians[base][metric]),
                                              statistics.median(per_round), min(per_round), max(per_round))
    return summary


def format_summary(summary: Summary, systems: list[str]) -> str:
    shown = [s for s in systems if s in summary.medians]
    lines = [f"summary: medians of {summary.rounds} round(s); ratios to {systems[0]}: of the medians, "
             f"(median of the per-round ratios) [their range]",
             f"{'metric':22s}" + "".join(f"{s:>12s}" for s in shown)
             + "".join(f"  {s + '/' + systems[0]:>16s} {'(per round) [range]':>20s}" for s in shown[1:])]
    for metric, label in METRICS.items():
        digits = 2 if metric in ("cores", "others") else 1
        row = f"{label:22s}" + "".join(f"{summary.medians[s][metric]:12,.{digits}f}" for s in shown)
        for s in shown[1:]:
            ratio, paired, low, high = summary.ratios[s][metric]
            row += f"  {ratio:16.2f} ({paired:.2f}) [{low:.2f}-{high:.2f}]"
        lines.append(row)
    lines.append("(msg/s: higher is better; µs/msg: lower is better)")
    return "\n".join(lines)


def orders(systems: list[str]) -> list[list[str]]:
    """Every order of the systems, so that each runs first (and last) as often as the others."""
    return [list(p) for p in itertools.permutations(systems)]


def spread(items: Sequence[str], count: int) -> list[str]:
    """``count`` picks from ``items``, round robin."""
    return [items[i % len(items)] for i in range(count)]


# ---------------------------------------------------------------------------------------------- publisher


def publisher_main(spec: dict) -> None:
    """A publisher process: connect, declare the queue, print "ready", wait for a line on stdin,
    publish with confirms, print its report (JSON), wait for a second line (the parent has read the
    brokers' CPU), delete the queue and exit."""
    import pika

    count, window, limit = spec["count"], spec["window"], spec["time_limit"]
    queue = spec["queue"]
    body = b"x" * spec["size"]
    properties = pika.BasicProperties(delivery_mode=2)
    state = {"sent": 0, "settled": 0, "acked": 0, "start": 0.0, "cpu": 0.0}
    box: list = []

    def top_up() -> None:
        channel = box[0]
        while (state["sent"] < count and state["sent"] - state["settled"] < window
               and time.monotonic() - state["start"] < limit):
            channel.basic_publish("", queue, body, properties)
            state["sent"] += 1

    def on_confirm(frame) -> None:
        method = frame.method
        settled = method.delivery_tag - state["settled"] if method.multiple else 1
        state["settled"] += settled
        if isinstance(method, pika.spec.Basic.Ack):
            state["acked"] += settled
        finished = state["sent"] >= count or time.monotonic() - state["start"] >= limit
        if not (finished and state["settled"] >= state["sent"]):
            top_up()
            return
        end, cpu = time.monotonic(), time.process_time() - state["cpu"]
        print(json.dumps({"acked": state["acked"], "nacked": state["settled"] - state["acked"],
                          "start": state["start"], "end": end, "cpu": cpu}), flush=True)
        sys.stdin.readline()
        box[0].queue_delete(queue, callback=lambda _frame: connection.close())

    def on_declared(_frame) -> None:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            connection.close()
            return
        state["start"], state["cpu"] = time.monotonic(), time.process_time()
        top_up()

    def on_channel(channel) -> None:
        box.append(channel)
        channel.confirm_delivery(on_confirm, callback=lambda _frame: channel.queue_declare(
            queue, durable=True, arguments={"x-queue-type": "quorum"} if spec["quorum"] else None,
            callback=on_declared))

    connection = pika.SelectConnection(pika.URLParameters(spec["url"]),
                                       on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                       on_close_callback=lambda c, _reason: c.ioloop.stop())
    connection.ioloop.call_later(limit * 3 + 60, connection.close)  # a broker that stops answering
    connection.ioloop.start()


# ---------------------------------------------------------------------------------------------- systems


class RaftmqSystem:
    """``count`` independent raftmq brokers (1 node) or clusters (3 nodes) of this checkout."""

    quorum = False

    def __init__(self, name: str, count: int, args: argparse.Namespace, base: Path) -> None:
        self.name = name
        self.args = args
        self.count = count
        self.base = base
        self.config = broker_config(args, name)
        self.brokers: list = []  # RaftmqNode (1 node) or Cluster (3 nodes)

    def start(self) -> RaftmqSystem:
        from raftmq.ops.local.cluster import Cluster
        from raftmq.ops.local.node import RaftmqNode

        for k in range(self.count):  # one at a time: many nodes booting at once time out here
            directory = self.base / f"{self.name}-{k}"
            directory.mkdir(parents=True)
            if self.args.nodes == 1:
                toml = directory / "node.toml"
                toml.write_text(self.config)
                node = RaftmqNode(directory / "data", config=toml, start_timeout=120,
                                  command_prefix=self.prefix())
                self.brokers.append(node)
                node.start()
            else:
                cluster = Cluster(3, directory, extra_config=self.config, start_timeout=120)
                for member in cluster.nodes:
                    member.command_prefix = self.prefix()
                self.brokers.append(cluster)
                cluster.start()
                self._place_leader(cluster, k % 3)
        return self

    def prefix(self) -> list[str]:
        """``setsid`` execs the server in a new session (same PID: a Popen child is not a process
        group leader, so setsid does not fork)."""
        return ["setsid"] if self.args.own_sessions else []

    @staticmethod
    def _place_leader(cluster, index: int, timeout: float = 30.0) -> str:
        """Move the leadership to node ``index`` (pysyncobj's TimeoutNow transfer, asked of the
        leader through the admin port); returns the leader's node id in the end."""
        from raftmq.ops.cluster_admin import run_admin
        from raftmq.ops.config import load_config

        target = cluster.nodes[index]
        config = load_config(str(cluster.config_path))
        deadline = time.monotonic() + timeout
        leader = cluster.leader()
        while leader is not target and time.monotonic() < deadline:
            with contextlib.suppress(SystemExit, OSError):  # denied while the target is not caught up
                run_admin(config, ["transfer", cluster.raft_address(target)], cluster.raft_address(leader))
            time.sleep(1.0)
            leader = cluster.leader()
        return leader.node_id

    def urls(self) -> list[str]:
        """Where the publishers go: publisher i on broker i mod count; on a cluster, its followers
        (or its leader) round robin."""
        per_broker: list[list[str]] = []
        for broker in self.brokers:
            if self.args.nodes == 1:
                per_broker.append([broker.url])
                continue
            leader = broker.leader()
            nodes = [leader] if self.args.client_on == "leader" else [
                broker.nodes[(broker.nodes.index(leader) + step) % 3] for step in (1, 2)]
            per_broker.append([n.url for n in nodes])
        mine: dict[int, int] = {}
        out = []
        for i in range(self.args.publishers):
            k = i % self.count
            out.append(per_broker[k][mine.get(k, 0) % len(per_broker[k])])
            mine[k] = mine.get(k, 0) + 1
        return out

    def declare(self, queues: list[str]) -> None:
        """Nothing: each publisher declares its own queue (raftmq places it; today in its one group)."""

    def pids(self) -> list[int]:
        """Every broker process: each node's main process and, with queue groups (issue 34), its
        workers (status.json's ``groups``: alive during the run, so not in the main's cutime)."""
        nodes = self.brokers if self.args.nodes == 1 else [n for c in self.brokers for n in c.nodes]
        pids = [n.pid for n in nodes if n.pid]
        for n in nodes:
            groups = (n.status() or {}).get("groups") or {}
            pids += [g["pid"] for g in groups.values() if isinstance(g, dict) and g.get("pid")]
        return pids

    def where(self) -> str:
        """The leaders now (3 nodes), against where they were put; status.json's groups if any."""
        notes = []
        for k, broker in enumerate(self.brokers):
            nodes = [broker] if self.args.nodes == 1 else broker.nodes
            groups = (nodes[0].status() or {}).get("groups")
            if self.args.nodes == 3:
                leader = broker.leader().node_id
                expected = broker.nodes[k % 3].node_id
                notes.append(f"leader {leader}" + ("" if leader == expected else f" (WARNING: placed on {expected})"))
            if groups is not None:
                notes.append(f"groups {json.dumps(groups)}")
        return "; ".join(notes)

    def leaders(self) -> list[str]:
        """Each cluster's leader now (3 nodes; [] for single nodes)."""
        return [c.leader().node_id for c in self.brokers] if self.args.nodes == 3 else []

    def prepare(self) -> str:
        """Before a run: a leader that moved (an election under load) is put back on its node;
        returns what was done, for the log."""
        notes = []
        for k, (cluster, leader) in enumerate(zip(self.brokers, self.leaders(), strict=False)):
            if leader != cluster.nodes[k % 3].node_id:
                notes.append(f"cluster {k}'s leader {leader} moved back to {self._place_leader(cluster, k % 3)}")
        return "; ".join(notes)

    def stop(self) -> None:
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                broker.stop()


class RabbitSystem:
    """A 3-node RabbitMQ cluster; quorum queue i declared through node i mod 3, its publisher on the
    next node."""

    quorum = True
    name = "rabbitmq"

    def __init__(self, args: argparse.Namespace) -> None:
        from rabbit_cluster import RabbitCluster

        self.args = args
        self.rc = RabbitCluster(3)

    def start(self) -> RabbitSystem:
        self.rc.start()
        return self

    def urls(self) -> list[str]:
        return [self.rc.url((i + 1) % 3) for i in range(self.args.publishers)]

    def declare(self, queues: list[str]) -> None:
        import pika

        for i, queue in enumerate(queues):
            conn = pika.BlockingConnection(pika.URLParameters(self.rc.url(i % 3)))
            try:
                conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            finally:
                conn.close()

    def pids(self) -> list[int]:
        return [pid for i in range(3) for pid in self.rc.pids(i)]

    def prepare(self) -> str:
        return ""

    def leaders(self) -> list[str]:
        return []

    def where(self, queues: list[str] | None = None) -> str:
        out = self.rc.ctl(0, "list_queues", "name", "leader", "--quiet", "--no-table-headers")
        leaders = dict(line.split("\t")[:2] for line in out.splitlines() if "\t" in line)
        return "; ".join(f"{q}: leader {leaders.get(q, '?')}, client on {self.rc.nodename((i + 1) % 3)}"
                         for i, q in enumerate(queues or []))

    def stop(self) -> None:
        self.rc.stop()


# ---------------------------------------------------------------------------------------------- driver


def say(proc: subprocess.Popen[str], word: str, last: bool = False) -> None:
    """A line to a publisher (its stdin); ``last`` closes the pipe after it."""
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()
    if last:
        proc.stdin.close()


def hear(proc: subprocess.Popen[str]) -> str:
    """A line from a publisher (its stdout); "" once it has exited."""
    assert proc.stdout is not None
    return proc.stdout.readline()


def measure(system, args: argparse.Namespace, count: int, check: bool) -> Run:
    """One run of ``system``: the publishers start together; the brokers' CPU is read just before
    and just after."""
    tag = uuid.uuid4().hex[:8]
    queues = [f"groups-{tag}-{i}" for i in range(args.publishers)]
    if note := system.prepare():
        print(f"    {system.name}: {note}", flush=True)
    leaders = system.leaders()
    system.declare(queues)
    if check and isinstance(system, RabbitSystem):
        print(f"    rabbitmq: {system.where(queues)}", flush=True)
    procs = []
    try:
        for queue, url in zip(queues, system.urls(), strict=True):
            spec = {"url": url, "queue": queue, "count": count, "size": args.size, "window": args.window,
                    "time_limit": args.time_limit, "quorum": system.quorum}
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_publish",
                                           json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          text=True))
        for proc in procs:
            if hear(proc).strip() != "ready":
                raise RuntimeError(f"a publisher of {system.name} did not get ready (exit {proc.wait(30)})")
        pids = system.pids()
        machine_before = read_machine()
        before = cpu_seconds(pids)
        for proc in procs:
            say(proc, "go")
        reports = []
        for proc in procs:
            line = hear(proc)
            if not line:
                raise RuntimeError(f"a publisher of {system.name} ended without a report (exit {proc.wait(30)})")
            reports.append(Publisher(**json.loads(line)))
        after = cpu_seconds(system.pids())
        machine_after = read_machine()
        for proc in procs:
            say(proc, "delete", last=True)
        for proc in procs:
            proc.wait(60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    if any(r.nacked for r in reports) or sum(r.acked for r in reports) < args.publishers * count:
        print(f"    WARNING {system.name}: confirmed {[r.acked for r in reports]}, nacked "
              f"{[r.nacked for r in reports]} of {count} each (time limit {args.time_limit} s?)", flush=True)
    if (now := system.leaders()) != leaders:
        print(f"    WARNING {system.name}: leaders {leaders} before the run, {now} after: an election "
              f"during the run", flush=True)
    busy, iowait = (machine_after[i] - machine_before[i] for i in (0, 1))
    deltas = cpu_deltas(before, after)
    return Run(system.name, tuple(reports), sum(deltas.values()), busy / TICKS, iowait / TICKS,
               max(deltas.values(), default=0.0))


def line(run: Run) -> str:
    v = run.values()
    each = ", ".join(f"{p.acked / (p.end - p.start):,.0f}" for p in run.publishers)
    return (f"  {run.system:9s} {v['rate']:9,.0f} msg/s (each {each})  broker {v['broker_us']:6.1f} µs/msg  "
            f"clients {v['client_us']:6.1f} µs/msg  cores busy {run.cores:.2f} + others {run.others:.2f}, "
            f"iowait {run.machine_iowait / run.wall:.2f}  wall {run.wall:5.2f} s  (CPU-bound projection "
            f"{run.ceiling():,.0f} msg/s)")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_publish"]:
        publisher_main(json.loads(argv[1]))
        return
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "describe", "--always",
                             "--dirty", "--abbrev=10"], capture_output=True, text=True, timeout=30).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {args.nodes} node(s), systems {','.join(args.systems)} "
          f"(split {args.split}{f', groups {args.groups}' if args.groups else ''}), {args.publishers} publishers x "
          f"{args.count} x {args.size} B, window {args.window}, {args.rounds} rounds, code {commit}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}", flush=True)
    base = Path(tempfile.mkdtemp(prefix="raftmq-groups-"))
    systems: dict[str, RaftmqSystem | RabbitSystem] = {}
    rounds: list[dict[str, Run]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, base, True)
        for name in args.systems:
            system: RaftmqSystem | RabbitSystem
            if name == "rabbitmq":
                system = RabbitSystem(args)
            else:
                system = RaftmqSystem(name, args.split if name == "split" else 1, args, base)
            stack.callback(system.stop)
            try:
                system.start()
            except Exception as exc:  # noqa: BLE001 - e.g. today's broker refusing raft_groups
                said = [row for row in str(exc).splitlines() if row.strip()] or [repr(exc)]
                print(f"{name}: did not start, left out of the run: {said[0]}"
                      + (f" ... {said[-1].strip()}" if len(said) > 1 else ""), flush=True)
                if name == "groups":
                    print("  (raft_groups is issue 34's setting: today's broker refuses the unknown key)", flush=True)
                continue
            systems[name] = system
            where = system.where() if isinstance(system, RaftmqSystem) else "3 nodes"
            print(f"{name}: pids {system.pids()}{'; ' + where if where else ''}", flush=True)
        names = [n for n in args.systems if n in systems]
        if not names:
            raise SystemExit("no system started")
        print("warm-up (a tenth of the count each, not counted)", flush=True)
        for name in names:
            print(line(measure(systems[name], args, max(1, args.count // 10), check=True)), flush=True)
        for number, order in zip(range(args.rounds), itertools.cycle(orders(names)), strict=False):
            if time.monotonic() - started > args.max_minutes * 60:
                print(f"--max-minutes {args.max_minutes} reached: {number} rounds", flush=True)
                break
            print(f"round {number + 1} of {args.rounds} ({time.strftime('%H:%M:%S')}, load average "
                  f"{os.getloadavg()[0]:.1f}), order {', '.join(order)}", flush=True)
            runs: dict[str, Run] = {}
            try:
                for name in order:
                    runs[name] = measure(systems[name], args, args.count, check=False)
                    print(line(runs[name]), flush=True)
            except (RuntimeError, OSError, KeyboardInterrupt, SystemExit) as exc:
                print(f"round {number + 1} failed or was interrupted ({exc!r}): the summary covers the rounds "
                      f"before it", flush=True)
                break
            base_run = runs[names[0]]
            print("    ratios to " + names[0] + ": " + ", ".join(
                f"{n} rate {runs[n].rate / base_run.rate:.2f} broker CPU/msg {runs[n].broker_us / base_run.broker_us:.2f}"
                for n in names[1:]), flush=True)
            rounds.append(runs)
        for name in names:
            if isinstance(systems[name], RaftmqSystem) and args.nodes == 3:
                print(f"{name} at the end: {systems[name].where()}", flush=True)
    if rounds:
        print()
        print(format_summary(summarise(rounds, names), names))
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: done in {(time.monotonic() - started) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
