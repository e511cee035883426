"""A queue group's worker process (issue 34): one Raft group's log, applier, bodies, snapshots and
audit history, in a process of its own so that it has a core of its own.

The node's main process (node/group_host.py) starts it with one end of a socketpair
(``python -m raftmq.node.worker FD``) and sends it, as the link's first frame, the group's
configuration (``Config.for_group``) and the node's boot stamp.  From then on the link carries
commands in (each submitted to the group's log as the main process would submit it) and the
group's outputs out: only those for this node's client connections (the main process holds them
all), with their bodies, and a report of the group's outbox positions for the forwarder.

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

from raftmq.store.core.commands import OUT_GROUP_REPORT
from raftmq.store.core.groups import GroupReport
from raftmq.store.core.tx_groups import participant_report

from .broker import Broker
from .config import Config
from .group_link import GroupLink
from .groups import REPORT_GONE, outbox_messages, plain_replies
from .status import status_loop

log = logging.getLogger(__name__)



class WorkerBroker(Broker):
    """A Broker applying one queue group, its outputs sent to the main process over the link."""

    def __init__(self, config: Config, boot: str, send: Callable[[Any], None]) -> None:
        self._send = send
        self._report: GroupReport | None = None  # the last released batch's (store/core/groups.py)
        self._last_tx: tuple = (0, {})
        super().__init__(config, boot=boot)
        prefix = boot + "."
        self._prefix = prefix
        # Deliveries for this node's connections get their bodies here (fill_bodies): the main
        # process has no access to this group's body store.
        self.applier.is_local = lambda conn: conn is not None and conn.startswith(prefix)

    def _on_outputs(self, outputs: list) -> None:
        prefix = self._prefix
        mine = [out for out in outputs if out[0] is not None and out[0].startswith(prefix)]
        if mine:
            self._send(("o", plain_replies(mine)))
        last = outputs[-1]
        if last[1] == OUT_GROUP_REPORT and last[0] is None:  # (apply puts it last: store/core/groups.py)
            self._report = last[2]
            self.report()
        self.report_tx()

    def report(self) -> None:
        """The group's outbox positions as of the last released batch (``GroupReport``, with the
        message outbox's bodies read from this group's body store), for the forwarder.  Released,
        not applied: a deletion or a message must not leave before the batch that made it is
        durable and answered (a single node applies before its fsync)."""
        report = self._report
        if report is None:  # nothing released since the start: the state on disk is the machine's
            report = self.machine.groups.current_report()
        self._send(("r", report.meta_applied, report.gone[:REPORT_GONE],
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
            elif kind == "report":
                self.report()
                self.report_tx(force=True)


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
    asyncio.run(serve_worker(config, boot, sock))


if __name__ == "__main__":
    main()
