"""Issue 30's measuring instrument: the confirmed publish-to-delivery round trip of a lone client.

One publisher and one consumer of the same queue, on one connection to one node: a persistent 256 B
message is published with a confirm, and the next one only once the previous one was both delivered
to the consumer and confirmed to the publisher.  Per cell (system x protocol x placement) it gives
publish->delivery p50 / p99 / p999 and publish->confirm p50 / p99 in ms.

Protocols, each with one client for every system:

* ``0-9-1``: pika, bench/ab_cluster.py's ``bench_roundtrip`` (publisher confirms on a channel that
  also consumes, auto-ack);
* ``1.0``: python-qpid-proton, a sender with unsettled (at-least-once) transfers, its ``accepted``
  disposition being the confirm, and a receiver (credit 10, accepting each delivery) on the same
  connection;
* ``0-10``: raftmq's own client (client/amqp010.py), a ``message.transfer`` with accept-mode
  explicit and ``sync`` whose completion (session.completed) is the confirm, and a subscription
  (accept-mode explicit; each delivery accepted without waiting).  The client connects with
  ``insist`` set, so that a follower serves it instead of redirecting it to the leader.

Systems, each in the same run: raftmq ``new`` (``--new``, a checkout with its .venv) and ``old``
(``--old``, by default /work/base-e12, the e12cb5e main of issue 30), each a 3-node cluster started
through bench/ab_cluster.py's CheckoutCluster, and a 3-node RabbitMQ cluster (bench/rabbit_cluster.py)
with 3-replica quorum queues declared through r1.  RabbitMQ has no 0-10; it gets 1.0 through its
rabbitmq_amqp1_0 plugin (enabled on every node before boot; addresses ``/amq/queue/Q``).  A system
that cannot do a protocol prints n/a, with the reason.

Placements: ``follower`` (raftmq: a follower, the one chosen at start while it still is one;
RabbitMQ: r2, the queue's leader being r1) and ``leader`` (raftmq: the Raft leader; RabbitMQ: r1).
Before each raftmq cell every node's role is read from its status.json and the client goes to a node
that has the role now: a leader change is printed and noted on the cell (under load elections
happen here: e12cb5e's cluster changed leaders in a run at load average 7).  For RabbitMQ every
queue's leader is read with ``rabbitmqctl list_queues`` before the cell (~2 s, not timed).  A cell
whose client was not where its placement says is marked MISPLACED and left out of the medians.

Rounds: a warm-up round (a tenth of ``--count``, at least 20, every cell, not counted), then
``--rounds`` rounds; in each the cells are measured cell by cell, every system back to back, in an
order of the systems that rotates through all permutations.  Bounded by ``--count`` round trips
and ``--cell-seconds`` per cell, and ``--max-minutes`` for the run (no round starts after it).

Printed: the cells of each round, then per cell the medians per system over the rounds, the
ratios new/rabbitmq and new/old of the medians, and the goals of issue 30 per protocol and
placement: p50 <= 0.5x RabbitMQ's, p50 < 1 ms, p99 <= 0.5x RabbitMQ's.  ``--json PATH`` writes
every cell's percentiles per round.

Usage::

    python -m bench.latency --new . --rounds 4 --count 500 --json /tmp/latency.json
    python -m bench.latency --new . --no-old --no-rabbitmq --rounds 1 --count 50 --protocols 0-9-1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pika
from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_cluster import CheckoutCluster, RabbitTarget, bench_roundtrip, commit, percentile  # noqa: E402

from raftmq.client.amqp010 import ClientError, Connection  # noqa: E402
from raftmq.protocol.amqp010 import codec as c010  # noqa: E402

PROTOCOLS = ("0-9-1", "1.0", "0-10")
PLACEMENTS = ("follower", "leader")
SIZE = 256
METRICS = ("p50", "p99", "p999", "confirm p50", "confirm p99")
DEFAULT_OLD = Path("/work/base-e12")


class NotApplicable(Exception):
    """This system cannot do this protocol or placement: the cell prints n/a with the reason."""


# ---------------------------------------------------------------------------------------- clients


def roundtrip_091(url: str, queue: str, count: int, quorum: bool, limit: float) -> tuple[list[float], list[float]]:
    """0-9-1 through pika: bench/ab_cluster.py's bench_roundtrip (the same code ab_cluster measures)."""
    return bench_roundtrip(url, queue, count, SIZE, quorum, time_limit=limit)


class _RoundTrip10(MessagingHandler):
    """One sender (unsettled: the receiver's ``accepted`` disposition is the confirm) and one
    receiver on the same connection and queue; the next message once the previous one was both
    received and accepted."""

    def __init__(self, url: str, address: str, count: int, limit: float) -> None:
        super().__init__(prefetch=10, auto_accept=True, auto_settle=True)
        self.url, self.address, self.count, self.limit = url, address, count, limit
        self.body = b"x" * SIZE
        self.delivered: list[float] = []
        self.confirmed: list[float] = []
        self.sent = 0
        self.t0 = self.start = 0.0
        self.got = self.acked = True
        self.sender = self.receiver = self.connection = self.timer = None
        self.error = ""

    def on_start(self, event) -> None:
        self.connection = event.container.connect(self.url, reconnect=False)
        self.receiver = event.container.create_receiver(self.connection, self.address)
        self.sender = event.container.create_sender(self.connection, self.address)
        self.timer = event.container.schedule(self.limit * 2 + 10, self)  # a broker that stops answering

    def on_timer_task(self, event) -> None:
        self.error = "no answer within the cell's time limit"
        self._finish()

    def on_sendable(self, event) -> None:
        if self.sent == 0 and self.receiver.state & self.receiver.REMOTE_ACTIVE:
            self.start = time.perf_counter()
            self._next()

    def on_link_opened(self, event) -> None:
        if event.link.is_receiver and self.sent == 0 and self.sender.credit > 0:  # (wrappers: no `is`)
            self.start = time.perf_counter()
            self._next()

    def _next(self) -> None:
        if not (self.got and self.acked):
            return
        if self.sent >= self.count or (self.sent and time.perf_counter() - self.start > self.limit):
            self._finish()
            return
        self.got = self.acked = False
        self.sent += 1
        self.t0 = time.perf_counter()
        self.sender.send(Message(body=self.body, durable=True, inferred=True))

    def on_message(self, event) -> None:
        self.delivered.append((time.perf_counter() - self.t0) * 1000)
        self.got = True
        self._next()

    def on_accepted(self, event) -> None:
        self.confirmed.append((time.perf_counter() - self.t0) * 1000)
        self.acked = True
        self._next()

    def on_rejected(self, event) -> None:
        self.error = f"delivery rejected: {event.delivery.remote.condition}"
        self._finish()

    def on_released(self, event) -> None:
        self.error = "delivery released"
        self._finish()

    def on_transport_error(self, event) -> None:
        self.error = f"transport error: {event.transport.condition}"
        super().on_transport_error(event)
        self._finish()  # and cancel the timer, or the reactor would wait for it

    def on_connection_error(self, event) -> None:
        self.error = f"connection error: {event.connection.remote_condition}"
        super().on_connection_error(event)
        self._finish()  # and cancel the timer, or the reactor would wait for it

    def on_link_error(self, event) -> None:
        self.error = f"link error: {event.link.remote_condition}"
        self._finish()

    def _finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def roundtrip_10(url: str, address: str, count: int, limit: float) -> tuple[list[float], list[float]]:
    handler = _RoundTrip10(url, address, count, limit)
    Container(handler).run()
    if handler.error or not handler.delivered:
        raise RuntimeError(f"AMQP 1.0 round trip: {handler.error or 'nothing delivered'} "
                           f"({len(handler.delivered)} delivered)")
    return handler.delivered, handler.confirmed


class _InsistingConnection(Connection):
    """raftmq's 0-10 client, asking (connection.open insist, spec L4135) to be served by the node it
    connects to: without it a follower redirects the client to the leader."""

    def send(self, channel: int, method) -> None:
        if isinstance(method, c010.ConnectionOpen):
            method.insist = True
        super().send(channel, method)


async def _roundtrip_010(host: str, queue: str, count: int, limit: float) -> tuple[list[float], list[float]]:
    conn = await _InsistingConnection.connect([host], stall_timeout=0, reconnect_timeout=10)
    try:
        if conn.current != host:
            raise RuntimeError(f"0-10 client on {conn.current}, not {host}")
        session = await conn.session(f"latency-{uuid.uuid4().hex[:8]}".encode(), timeout=60)
        await session.queue_declare(queue, durable=True)
        subscription = await session.subscribe(queue, window=10)
        body = b"x" * SIZE
        delivered: list[float] = []
        confirmed: list[float] = []
        start = time.perf_counter()
        while len(delivered) < count and (not delivered or time.perf_counter() - start <= limit):
            t0 = time.perf_counter()
            completion = session.publish_nowait("", queue, body, persistent=True, sync=True)
            completion.add_done_callback(lambda _f, t0=t0: confirmed.append((time.perf_counter() - t0) * 1000))
            message = await asyncio.wait_for(subscription.queue.get(), limit + 10)
            delivered.append((time.perf_counter() - t0) * 1000)
            session.send(c010.MessageAccept(transfers=[(message.id, message.id)]))  # not waited for
            await asyncio.wait_for(completion, limit + 10)
        await session.execute(c010.QueueDelete(queue=queue))
        if conn.reconnects or conn.current != host:  # it resumed elsewhere: not the node measured
            raise RuntimeError(f"0-10 client reconnected {conn.reconnects} time(s), now on {conn.current}")
        return delivered, confirmed
    finally:
        with contextlib.suppress(ClientError, OSError, TimeoutError):
            await asyncio.wait_for(conn.close(), 10)


def roundtrip_010(host: str, queue: str, count: int, limit: float) -> tuple[list[float], list[float]]:
    return asyncio.run(_roundtrip_010(host, queue, count, limit))


# ---------------------------------------------------------------------------------------- systems


def _declare(url: str, queue: str, quorum: bool) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"} if quorum else None)
    finally:
        conn.close()


def _delete(url: str, queue: str) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            conn.channel().queue_delete(queue)
        finally:
            conn.close()


@dataclass
class Raftmq:
    """A 3-node raftmq cluster of one checkout: the client on the node that was a follower (or the
    leader) when it started; every cell checks that the node still has that role."""

    name: str
    checkout: Path
    cluster: CheckoutCluster
    quorum: bool = False
    na: dict[str, str] = field(default_factory=dict)  # protocol -> why not

    def __post_init__(self) -> None:
        self.leader_seen = self.cluster.info["leader"]
        if not (self.checkout / "node" / "amqp10").is_dir():
            self.na["1.0"] = "no AMQP 1.0 front end in this checkout (node/amqp10 absent)"

    def roles(self) -> dict[str, tuple[str, str]]:
        """Each node's (role, leader) from its status.json (("?", "?") if unreadable)."""
        roles = {}
        for node in self.cluster.info["nodes"]:
            status: dict = {}
            with contextlib.suppress(OSError, ValueError):
                status = json.loads((Path(node["data_dir"]) / "status.json").read_text())
            roles[node["id"]] = (status.get("role", "?"), status.get("leader_node", "?"))
        return roles

    def place(self, placement: str) -> tuple[str, str, bool]:
        """The URL of a node that has the ``placement`` role now (the follower chosen at start while
        it still is one), where that is, and whether a node had that role.  A leader change since
        the last cell is printed and noted."""
        roles = self.roles()
        leaders = [i for i, (role, _) in roles.items() if role == "leader"]
        leader = leaders[0] if leaders else "?"
        note = ""
        if leader != self.leader_seen:
            note = f"; LEADER CHANGE ({self.leader_seen} -> {leader})"
            print(f"    {self.name}: leader change {self.leader_seen} -> {leader} (roles {roles})", flush=True)
            self.leader_seen = leader
        preferred = self.cluster.info["follower" if placement == "follower" else "leader"]
        candidates = sorted((i for i, (role, _) in roles.items() if role == placement), key=lambda i: i != preferred)
        chosen = candidates[0] if candidates else preferred
        url = next(n["url"] for n in self.cluster.info["nodes"] if n["id"] == chosen)
        return url, f"client on {chosen} ({roles[chosen][0]}), leader {leader}{note}", bool(candidates)

    def run(self, protocol: str, url: str, count: int, limit: float) -> tuple[list[float], list[float]]:
        queue = f"lat-{uuid.uuid4().hex[:8]}"
        if protocol == "0-9-1":
            return roundtrip_091(url, queue, count, False, limit)
        parsed = urlparse(url)
        _declare(url, queue, False)
        if protocol == "1.0":
            try:
                return roundtrip_10(f"amqp://guest:guest@{parsed.hostname}:{parsed.port}", f"/queues/{queue}",
                                    count, limit)
            finally:
                _delete(url, queue)
        return roundtrip_010(f"{parsed.hostname}:{parsed.port}", queue, count, limit)

    def stop(self) -> None:
        self.cluster.stop()


class Rabbit:
    """A 3-node RabbitMQ cluster: quorum queues declared through r1 (their leader), the client on r2
    (``follower``) or r1 (``leader``)."""

    name = "rabbitmq"
    quorum = True

    def __init__(self, amqp10: bool) -> None:
        from rabbit_cluster import RabbitCluster

        self.rc = RabbitCluster(3, plugins=("rabbitmq_amqp1_0",) if amqp10 else ())
        self.target = RabbitTarget(self.rc)
        self.na = {"0-10": "RabbitMQ has no AMQP 0-10"}
        if not amqp10:
            self.na["1.0"] = "run with --no-rabbitmq-amqp10"

    def start(self) -> Rabbit:
        self.rc.start()
        if "1.0" not in self.na:
            running = self.rc.ctl(1, "eval", "lists:keymember(rabbitmq_amqp1_0, 1, application:which_applications()).")
            if running.strip() != "true":
                self.na["1.0"] = f"the rabbitmq_amqp1_0 plugin does not run on r2 ({running.strip()!r})"
        return self

    def url(self, placement: str) -> str:
        return self.rc.url(1 if placement == "follower" else 0)

    def where(self, placement: str, queue: str) -> tuple[str, bool]:
        out = self.rc.ctl(0, "list_queues", "name", "leader", "--quiet", "--no-table-headers")
        client = self.rc.nodename(1 if placement == "follower" else 0)
        for line in out.splitlines():
            fields = line.split("\t")
            if fields[0] == queue:
                leader = fields[1]
                ok = (leader != client) if placement == "follower" else (leader == client)
                return f"client on {client}, quorum queue leader {leader}", ok
        return f"queue {queue} not listed by r1", False

    def run(self, protocol: str, placement: str, count: int, limit: float,
            queue: str = "") -> tuple[list[float], list[float]]:
        url = self.url(placement)
        if protocol == "0-9-1":
            return roundtrip_091(url, queue, count, True, limit)
        parsed = urlparse(url)
        try:
            return roundtrip_10(f"amqp://guest:guest@{parsed.hostname}:{parsed.port}", f"/amq/queue/{queue}",
                                count, limit)
        finally:
            _delete(self.rc.url(0), queue)

    def stop(self) -> None:
        self.rc.stop()


# ---------------------------------------------------------------------------------------- the run


@dataclass
class Cell:
    system: str
    protocol: str
    placement: str
    values: dict[str, float] = field(default_factory=dict)  # METRICS -> ms
    samples: int = 0
    where: str = ""
    placed: bool = True  # the client was where the placement says
    na: str = ""
    failed: str = ""  # the error that ended this cell (it is left out of the medians)

    def text(self) -> str:
        if self.na:
            return f"{self.system} n/a"
        if self.failed:
            return f"{self.system} FAILED"
        v = self.values
        mark = "" if self.placed else " (MISPLACED)"
        return (f"{self.system} {v['p50']:.2f}/{v['p99']:.2f}/{v['p999']:.2f} "
                f"c {v['confirm p50']:.2f}/{v['confirm p99']:.2f}{mark}")


def measure(system, protocol: str, placement: str, count: int, limit: float, warm: bool) -> Cell:
    cell = Cell(system.name, protocol, placement)
    if protocol in system.na:
        cell.na = system.na[protocol]
        return cell
    if isinstance(system, Rabbit):
        queue = f"lat-{uuid.uuid4().hex[:8]}"
        _declare(system.rc.url(0), queue, True)  # through r1: r1 leads the quorum queue
        if not warm:
            cell.where, cell.placed = system.where(placement, queue)
        delivered, confirmed = system.run(protocol, placement, count, limit, queue=queue)
    else:
        url, cell.where, cell.placed = system.place(placement)  # before every cell: leaders change
        delivered, confirmed = system.run(protocol, url, count, limit)
    cell.samples = len(delivered)
    cell.values = {"p50": percentile(delivered, 0.5), "p99": percentile(delivered, 0.99),
                   "p999": percentile(delivered, 0.999), "confirm p50": percentile(confirmed, 0.5),
                   "confirm p99": percentile(confirmed, 0.99)}
    return cell


def per_round_ratios(rounds: list[list[Cell]], protocol: str, placement: str, metric: str, other: str) -> list[float]:
    """new/``other`` of ``metric`` in each round where both cells were measured where they should be."""
    ratios = []
    for cells in rounds:
        mine = {c.system: c for c in cells if c.protocol == protocol and c.placement == placement
                and not c.na and not c.failed and c.placed}
        if "new" in mine and other in mine:
            ratios.append(mine["new"].values[metric] / mine[other].values[metric])
    return ratios


def summarise(rounds: list[list[Cell]], names: list[str]) -> dict:
    """Print the medians per system, the ratios and issue 30's goals; return them for --json."""
    summary: dict = {}
    print(f"\nsummary: medians over {len(rounds)} round(s), ms; ratios of the medians and [range of the "
          f"per-round ratios] (below 1: new is faster)")
    header = f"{'cell':22s}{'metric':>12s}" + "".join(f"{n:>10s}" for n in names)
    header += "".join(f"{'new/' + n:>26s}" for n in ("rabbitmq", "old") if n in names)
    print(header)
    goals: list[str] = []
    for protocol, placement in itertools.product(PROTOCOLS, PLACEMENTS):
        cells = [c for r in rounds for c in r if c.protocol == protocol and c.placement == placement]
        if not cells:
            continue
        key = f"{protocol} {placement}"
        medians: dict[str, dict[str, float | None]] = {}
        for name in names:
            mine = [c for c in cells if c.system == name and not c.na and not c.failed and c.placed]
            medians[name] = {m: (statistics.median(c.values[m] for c in mine) if mine else None) for m in METRICS}
        summary[key] = medians
        for metric in METRICS:
            row = f"{key if metric == 'p50' else '':22s}{metric:>12s}"
            for name in names:
                value = medians[name][metric]
                row += f"{'n/a' if value is None else f'{value:.2f}':>10s}"
            for other in ("rabbitmq", "old"):
                if other in names:
                    a, b = medians["new"][metric], medians[other][metric]
                    ratios = per_round_ratios(rounds, protocol, placement, metric, other)
                    spread = f"[{min(ratios):.2f}-{max(ratios):.2f}]" if ratios else "[no round with both]"
                    text = "n/a" if a is None or b is None else f"{a / b:.2f} {spread}"
                    row += f"{text:>26s}"
            print(row)
        new, rabbit = medians["new"], medians.get("rabbitmq", {})

        def versus(metric: str, new: dict = new, rabbit: dict = rabbit) -> str:
            if new[metric] is None or rabbit.get(metric) is None:
                return "n/a (no RabbitMQ figure)"
            ratio = new[metric] / rabbit[metric]
            return f"{'yes' if ratio <= 0.5 else 'no'} ({ratio:.2f}x)"

        under = "n/a" if new["p50"] is None else f"{'yes' if new['p50'] < 1.0 else 'no'} ({new['p50']:.2f} ms)"
        goals += [f"{key:16s} p50 <= 0.5x RabbitMQ's: {versus('p50')}",
                  f"{key:16s} p50 < 1 ms: {under}",
                  f"{key:16s} p99 <= 0.5x RabbitMQ's: {versus('p99')}"]
    print("\nissue 30's goals (new):")
    for line in goals:
        print(f"  {line}")
    failed = [c for r in rounds for c in r if c.failed]
    if failed:
        print(f"WARNING: {len(failed)} cell(s) failed (marked FAILED above; left out of the medians)")
    misplaced = [c for r in rounds for c in r if not c.na and not c.failed and not c.placed]
    if misplaced:
        print(f"WARNING: {len(misplaced)} cell(s) ran with the client not where its placement says "
              f"(marked MISPLACED above; left out of the medians)")
    return {"medians": summary, "goals": goals}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1],
                        help="checkout of the new code, with its .venv (default: this one)")
    parser.add_argument("--old", type=Path, default=DEFAULT_OLD, help=f"old checkout (default {DEFAULT_OLD})")
    parser.add_argument("--no-old", action="store_true", help="no old column")
    parser.add_argument("--rabbitmq", action=argparse.BooleanOptionalAction, default=True,
                        help="a 3-node RabbitMQ cluster with quorum queues (default: on)")
    parser.add_argument("--rabbitmq-amqp10", action=argparse.BooleanOptionalAction, default=True,
                        help="enable RabbitMQ's rabbitmq_amqp1_0 plugin and measure 1.0 on it (default: on)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma separated (default: all)")
    parser.add_argument("--placements", default=",".join(PLACEMENTS), help="comma separated (default: both)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--count", type=int, default=1000, help="round trips per cell")
    parser.add_argument("--cell-seconds", type=float, default=30.0, help="time limit of one cell")
    parser.add_argument("--max-minutes", type=float, default=15.0, help="no round starts after this")
    parser.add_argument("--json", type=Path, help="write every cell of every round here")
    args = parser.parse_args(argv)
    protocols = [p for p in PROTOCOLS if p in args.protocols.split(",")]
    placements = [p for p in PLACEMENTS if p in args.placements.split(",")]
    if not protocols or not placements:
        parser.error(f"protocols of {PROTOCOLS}, placements of {PLACEMENTS}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ends the rounds; the clusters are stopped

    started = time.monotonic()
    checkouts = {"new": args.new.resolve()}
    if not args.no_old:
        checkouts["old"] = args.old.resolve()
    commits = {name: commit(path) for name, path in checkouts.items()}
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: lone confirming publisher + consumer, persistent {SIZE} B, "
          f"{args.count} round trips per cell, {args.rounds} rounds; "
          + ", ".join(f"{n} {p} ({commits[n]})" for n, p in checkouts.items())
          + (", rabbitmq 3 nodes (quorum queues)" if args.rabbitmq else ""), flush=True)
    rounds: list[list[Cell]] = []
    round_info: list[dict] = []  # per counted round: its start, load average and order of the systems
    with contextlib.ExitStack() as stack:
        systems: dict[str, object] = {}
        for name, checkout in checkouts.items():  # one at a time: clusters booting at once time out here
            cluster = CheckoutCluster(checkout, "disk_free_limit = 1\n")
            stack.callback(cluster.stop)
            info = cluster.wait_ready().info
            systems[name] = Raftmq(name, checkout, cluster)
            print(f"raftmq {name}: leader {info['leader']}, follower {info['follower']}, pids {info['pids']}",
                  flush=True)
        if args.rabbitmq:
            rabbit = Rabbit(args.rabbitmq_amqp10)
            stack.callback(rabbit.stop)
            rabbit.start()
            systems["rabbitmq"] = rabbit
            print(f"rabbitmq: {', '.join(f'{rabbit.rc.nodename(i)} pid {rabbit.rc.servers[i].pid}' for i in range(3))}",
                  flush=True)
        names = list(systems)
        orders = [list(order) for order in itertools.permutations(names)]
        cells = list(itertools.product(protocols, placements))

        warm = max(20, args.count // 10)
        print(f"warm-up ({warm} round trips per cell, not counted)", flush=True)
        for (protocol, placement), name in itertools.product(cells, names):
            system = systems[name]
            try:
                measure(system, protocol, placement, warm, args.cell_seconds, warm=True)
            except (RuntimeError, pika.exceptions.AMQPError, ClientError, OSError, TimeoutError) as exc:
                system.na[protocol] = f"failed in the warm-up: {exc!r}"
                print(f"  {name} {protocol} {placement}: n/a ({system.na[protocol]})", flush=True)
        for name, system in systems.items():
            for protocol, why in system.na.items():
                if protocol in protocols:
                    print(f"  {name} {protocol}: n/a: {why}", flush=True)

        print("per cell: publish->delivery p50/p99/p999, c = publish->confirm p50/p99 (ms)", flush=True)
        for number in range(args.rounds):
            if time.monotonic() - started > args.max_minutes * 60:
                print(f"--max-minutes {args.max_minutes} reached: {number} rounds", flush=True)
                break
            order = orders[number % len(orders)]
            started_at, load = time.strftime("%H:%M:%S"), round(os.getloadavg()[0], 1)
            print(f"round {number + 1} of {args.rounds} ({started_at}, load average {load}), "
                  f"order {', '.join(order)}", flush=True)
            this_round: list[Cell] = []
            try:
                for protocol, placement in cells:
                    row = {}
                    for n in order:
                        try:
                            row[n] = measure(systems[n], protocol, placement, args.count, args.cell_seconds,
                                             warm=False)
                        except (RuntimeError, pika.exceptions.AMQPError, ClientError, OSError, TimeoutError) as exc:
                            row[n] = Cell(n, protocol, placement, failed=repr(exc)[:300])
                    this_round += row.values()
                    line = "  ".join(row[n].text() for n in names)
                    print(f"  {protocol:5s} {placement:8s} {line}", flush=True)
                    for n in names:
                        if row[n].failed:
                            print(f"    FAILED {n}: {row[n].failed}", flush=True)
                        elif not row[n].placed or "LEADER CHANGE" in row[n].where:
                            print(f"    WARNING {n}: {row[n].where}", flush=True)
            except (KeyboardInterrupt, SystemExit) as exc:
                print(f"round {number + 1} was interrupted ({exc!r}): the summary covers the "
                      f"rounds before it", flush=True)
                break
            rounds.append(this_round)
            round_info.append({"round": number + 1, "started": started_at, "load_average": load, "order": order})
            wheres = {f"{c.system} {c.placement}": c.where for c in this_round if c.where}
            print("  placement: " + "; ".join(f"{k}: {v}" for k, v in sorted(wheres.items())), flush=True)
    for name, path in checkouts.items():
        if commit(path) != commits[name]:
            print(f"WARNING: {path} moved from {commits[name]} to {commit(path)} during the run", flush=True)
    summary = summarise(rounds, names) if rounds else {}
    if args.json:
        args.json.write_text(json.dumps({
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "count": args.count, "size": SIZE,
            "commits": commits, "systems": names,
            "rounds": [{**info, "cells": [
                {"system": c.system, "protocol": c.protocol, "placement": c.placement, "samples": c.samples,
                 "where": c.where, "placed": c.placed, "na": c.na, "failed": c.failed, **c.values} for c in r]}
                for info, r in zip(round_info, rounds, strict=True)],
            **summary}, indent=1))
        print(f"wrote {args.json}")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}: done in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return 0 if rounds else 1


if __name__ == "__main__":
    sys.exit(main())
