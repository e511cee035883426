"""A queue group's worker process (issue 34): one Raft group's log, applier, bodies, snapshots and
audit history, in a process of its own so that it has a core of its own.

The node's main process (node/group_host.py) starts it with one end of a socketpair
(``python -m raftmq.node.worker FD``) and sends it, as the link's first frame, the group's
configuration (``Config.for_group``) and the node's boot stamp.  From then on the link carries
commands in (each submitted to the group's log as the main process would submit it) and the
group's outputs out: only those for this node's client connections (the main process holds them
all), a held delivery with its body or as a reference the main process reads from this group's
body store (node/group_bodies.py), and a report of the group's outbox positions for the forwarder.

The worker is a ``Broker`` without client listeners: the same log, applier, tick loop (expiry in
its queues), alarm loop and status file (``<data>/groups/g<N>/status.json``).  It stops when the
link closes: a node is all its processes, and one that lost its main process is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any

from raftmq.store.core import queries as Q
from raftmq.store.core.commands import OUT_GROUP_REPORT
from raftmq.store.core.groups import GroupReport
from raftmq.store.core.tx_groups import participant_report
from raftmq.store.disk.sealed import EXIT_STORE_DAMAGED, StoreDamaged
from raftmq.versions import EXIT_FORMAT_TOO_NEW, FormatTooNew

from .broker import Broker
from .config import Config
from .group_bodies import CREDIT, REPAIR, Carrier, carry_bytes
from .group_figures import ANSWER as FIGURES_ANSWER
from .group_figures import ASK as FIGURES_ASK
from .group_figures import STATS as FIGURES_STATS
from .group_figures import answer as figures_answer
from .group_link import GroupLink
from .groups import outbox_messages, plain_replies
from .status import bodies_status, status_loop

log = logging.getLogger(__name__)

RESOURCES = "m"  # the link frame reporting a worker's (memory held, disk free) to its main process
RESOURCE_REPORT_STEP = 256 << 10  # bytes either must move by before it is reported again



class WorkerBroker(Broker):
    """A Broker applying one queue group, its outputs sent to the main process over the link."""

    def __init__(self, config: Config, boot: str, send: Callable[[Any], None]) -> None:
        self._send = send
        self._report: GroupReport | None = None  # the last released batch's (store/core/groups.py)
        self._last_tx: tuple = (0, {})
        self._resources_sent: tuple[int, int] | None = None
        super().__init__(config, boot=boot)
        prefix = boot + "."
        self._prefix = prefix
        # Deliveries for this node's connections get their bodies here (fill_bodies), but for those
        # whose consumer holds the message: carried, or read by the main process (node/group_bodies.py).
        self.applier.is_local = lambda conn: conn is not None and conn.startswith(prefix)
        self.carrier = Carrier(self.bodies, carry_bytes(config.write_buffer_high))

    def node_of_raft(self, raft_address: str | None) -> str | None:
        """The node whose replica of this group is at ``raft_address``: the group's own Raft
        addresses (the members' moved by ``group`` port steps, Config.for_group), not the
        replicated member list's (the metadata group's addresses), which status.json's
        ``leader_node`` would otherwise never match."""
        for member in self.config.cluster:
            if member.raft == raft_address:
                return member.node_id
        return super().node_of_raft(raft_address)

    def _on_outputs(self, outputs: list) -> None:
        prefix = self._prefix
        mine = [out for out in outputs if out[0] is not None and out[0].startswith(prefix)]
        if mine:
            refs, carried = self.carrier.prepare(mine)
            self._send(("o", plain_replies(mine), refs, carried))
        last = outputs[-1]
        if last[1] == OUT_GROUP_REPORT and last[0] is None:  # (apply puts it last: store/core/groups.py)
            self._report = last[2]
            self.report()
            self.report_tx()  # (its part in transactions is in the report: it moves only with one)
        self.maybe_check_alarms()  # what it holds grew: the main process's alarms count it (check_alarms)

    def report(self) -> None:
        """The group's outbox positions as of the last released batch (``GroupReport``, with the
        message outbox's bodies read from this group's body store), for the forwarder.  Released,
        not applied: a deletion or a message must not leave before the batch that made it is
        durable and answered (a single node applies before its fsync)."""
        report = self._report
        if report is None:  # nothing released since the start: the state on disk is the machine's
            report = self.machine.groups.current_report()
        self._send(("r", report.meta_applied, report.gone,
                    outbox_messages(report.msgs, self.bodies, self.machine.group), dict(report.msg_applied)))

    def report_tx(self, force: bool = False) -> None:
        """This group's part in transactions across groups (node/tx_forward.py), as frame kind
        "x", when it changed: nothing is sent while the group holds no transaction.  As of the
        last released batch (``GroupReport.tx``), as the outbox positions: a vote must not leave
        before the prepare it answers is durable."""
        report = self._report
        tx = report.tx if report is not None else participant_report(self.machine)
        if tx != self._last_tx or force:
            self._last_tx = tx
            self._send(("x", tx))

    def check_alarms(self) -> None:
        """The worker has no connections to block: it reports what it holds and the disk space
        where it writes to the main process, which sums them with its own (a node's memory and
        disk alarms cover all its processes, node/group_host.py ``resources``); sent when either
        moved by more than RESOURCE_REPORT_STEP or crossed a limit."""
        held, free = self.memory_held(), self.disk_free()
        last = self._resources_sent
        config = self.config
        if last is None or abs(held - last[0]) > RESOURCE_REPORT_STEP or abs(free - last[1]) > RESOURCE_REPORT_STEP \
                or (held > config.memory_high_watermark) != (last[0] > config.memory_high_watermark) \
                or (free < config.disk_free_limit) != (last[1] < config.disk_free_limit):
            self._resources_sent = (held, free)
            self._send((RESOURCES, held, free))

    def _on_throttle(self, on: bool) -> None:
        super()._on_throttle(on)
        self._send(("t", on))

    def take(self, items: list) -> None:
        """Items from the main process: commands for the log, or a request for a fresh report."""
        submit = self.log.submit
        for item in items:
            kind = item[0]
            if kind == "c":
                submit(item[1], item[2], item[3])
            elif kind == CREDIT:  # carried bodies the main process handed back (node/group_bodies.py)
                self.carrier.returned(item[1])
            elif kind == REPAIR:  # bodies the main process found damaged in this group's store
                damaged: list[int] = []
                self.bodies.store.get_many(item[1], damaged)
                if damaged:
                    self.bodies.repair(damaged)
            elif kind == "report":
                self.report()
                self.report_tx(force=True)
            elif kind == FIGURES_ASK:  # the main process reads queues of this group (node/group_figures.py)
                if item[3] == FIGURES_STATS:
                    m = self.machine
                    dedup = [(v, n, e) for v, n, e in Q.dedup_queues(m)
                             if getattr(m.vhosts[v].queues.get(n), "group", None) == m.group]
                    answer = {self.config.group: (dict(m.stats), bodies_status(self), dedup)}
                else:
                    answer = figures_answer(self.machine, item[3], item[2])
                self._send((FIGURES_ANSWER, item[1], answer))


async def serve_worker(config: Config, boot: str, sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()
    early: list = []
    broker: WorkerBroker | None = None

    def on_items(items: list) -> None:
        if broker is None:
            early.extend(items)
        else:
            broker.take(items)

    _transport, link = await loop.connect_accepted_socket(lambda: GroupLink(on_items, closed.set), sock)
    broker = WorkerBroker(config, boot, link.send)
    await broker.start()
    if early:
        broker.take(early)
        early.clear()
    status = asyncio.create_task(status_loop(broker, config.resolved_data_dir()))
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, closed.set)
        except (NotImplementedError, RuntimeError):
            pass
    log.info("group %d worker of node %s running (pid %d, data in %s)", config.group, config.node_id,
             os.getpid(), config.resolved_data_dir())
    try:
        await closed.wait()
    finally:
        status.cancel()
        await asyncio.gather(status, return_exceptions=True)
        await broker.stop()


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise SystemExit("group worker: the main process closed the link before the configuration")
        data += chunk
    return data


def main(argv: list[str] | None = None) -> None:
    # The main process passes SIGUSR1 (write digest.json, node/status.py) on to its workers at any
    # time, also while a worker is still starting (opening its stores, installing a snapshot)
    # and has no handler yet: SIGUSR1's default action would end it, and with it the node (seen in
    # tests/cluster/test_replication.py with 3 groups: exit code -10 on a returning follower).
    # Ignored until status_loop installs the handler (the main process starts it with SIGUSR1
    # ignored already, node/group_host.py: this covers a worker started otherwise).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    sock.setblocking(True)
    (length,) = struct.unpack(">I", _read_exactly(sock, 4))
    config, boot, log_level = pickle.loads(_read_exactly(sock, length))  # noqa: S301 - our own parent, over a socketpair
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s g{config.group} %(name)s: %(message)s")
    from .server import tune_gc

    tune_gc()
    if config.clustered:
        sys.setswitchinterval(0.0005)  # as the main process (node/server.py run)
    if config.use_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    sock.setblocking(False)
    try:
        asyncio.run(serve_worker(config, boot, sock))
    except FormatTooNew as exc:  # as node/server.py run(): the exit status says why (the node exits with it)
        log.critical("stopping: %s", exc)
        raise SystemExit(EXIT_FORMAT_TOO_NEW) from exc
    except StoreDamaged as exc:
        log.critical("stopping: %s", exc)
        raise SystemExit(EXIT_STORE_DAMAGED) from exc


if __name__ == "__main__":
    main()
