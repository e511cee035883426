"""The main process's side of queue groups (issue 34): starting the workers, handing each command
to its groups, joining their replies, and the forwarder between the groups' outboxes.

The node's main process applies the metadata group (group 0) itself and holds every client
connection; queue group ``g`` runs in worker process ``g`` (node/worker.py), over a socketpair
link (node/group_link.py).  ``submit`` replaces ``Broker.submit`` when there is more than one
group: the router (node/groups.py) names the groups, group 0's part goes to the main process's
own log, the others' to their workers, and the reply join makes the answers one.

**The forwarder** runs where the metadata group's leader is (the node whose main process leads
group 0; a single node always): after each batch of group 0 and each worker report, it sends the
workers the metadata outbox entries their groups have not applied, proposes the workers' deletions
to group 0, and trims both outboxes once taken in.  Every entry carries its sequence number and is
applied once (store/core/groups.py), so resending is always safe: once a second, anything sent and
not yet applied (a proposal lost with a leader change) is sent again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftmq.store.core.commands import (
    OUT_GROUP_REPORT,
    OUT_REPLY,
    GoneTrim,
    GroupsSet,
    MessageDone,
    MessageIn,
    MetaApply,
    MetaTrim,
    QueueGone,
    Refused,
)
from raftmq.store.core.groups import GroupReport

from .group_bodies import RECHECK_SECONDS, GroupBodies, carry_bytes, group_repairers
from .group_figures import ANSWER as FIGURES_ANSWER
from .group_figures import FigureAsker
from .group_link import GroupLink
from .groups import GroupRouter, ReplyJoin, outbox_messages, typed_replies
from .tx_forward import Report, TxForwarder

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

RESEND_SECONDS = 1.0
#: The least high-water mark of a link's write buffer (node/group_link.py): see ``GroupHost.start``.
LINK_HIGH_MIN = 1 << 20


@dataclass
class Worker:
    """One queue group's worker as the main process sees it."""

    group: int
    process: subprocess.Popen
    link: GroupLink
    meta_applied: int = 0  # reported by the worker
    meta_sent: int = 0  # the last outbox entry sent to it
    gone: list = field(default_factory=list)  # its deletion outbox as last reported
    gone_sent: int = 0
    trim_sent: int = 0
    msgs: list = field(default_factory=list)  # its message outbox as last reported (with bodies)
    msg_applied: dict[int, int] = field(default_factory=dict)  # source group -> seq applied there
    throttled: bool = False
    link_full: bool = False  # the link's write buffer passed its high-water mark (GroupHost.start)
    progress_at: float = 0.0
    resources: tuple[int, int] | None = None  # (memory held, disk free) as it last reported them


class GroupHost:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        config = broker.config
        self.count = config.raft_groups
        self.router = GroupRouter(lambda: broker.machine, self.count)
        self.join = ReplyJoin()
        self.workers: dict[int, Worker] = {}
        self.meta_trim_sent = 0
        # The metadata group's outbox positions as of its last released batch: the forwarder sends
        # nothing a later, applied but not yet durable batch made (store/core/groups.py GroupReport).
        self.released: GroupReport = broker.machine.groups.current_report()
        self.msg_sent: dict[tuple[int, int], int] = {}  # (source, target) -> last MessageIn sent
        self.done_sent: dict[tuple[int, int], int] = {}  # (source, target) -> last MessageDone sent
        self._stopping = False
        self._task: asyncio.Task | None = None
        self.tx = TxForwarder()  # transactions across groups (node/tx_forward.py)
        self.tx_reports: dict[int, Report] = {}  # each worker's last "x" report
        self.lost: int | None = None  # the queue group whose worker went first (it stops the node)
        # Reads of queues placed in queue groups ask their workers (node/group_figures.py).
        self.figures = FigureAsker(lambda: {g: w.link.send for g, w in self.workers.items()})
        # Held deliveries' bodies: carried over the link within a credit, else read from the
        # worker's body store (node/group_bodies.py); the front ends reach them through Bodies.for_send.
        paths = {}
        for group in range(1, self.count):
            where = config.for_group(group).resolved_data_dir()
            paths[group] = (os.path.join(where, "bodies"),
                            None if config.clustered else os.path.join(where, "state"))
        self.bodies = GroupBodies(paths, lambda conn: broker.endpoints.get(conn),
                                  lambda g, item: self.workers[g].link.send(item),
                                  carry_bytes(config.write_buffer_high), repairers=group_repairers(config))
        broker.bodies.remote = self.bodies
        self._credit_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ workers

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.broker.config
        # SIGUSR1 (digest.json) is passed on to the workers: ignored until a handler is installed
        # (node/status.py), here and, inherited across exec, in each worker while it starts.
        if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        for group in range(1, self.count):
            ours, theirs = socket.socketpair()
            process = subprocess.Popen([sys.executable, "-m", "raftmq.node.worker", str(theirs.fileno())],
                                       pass_fds=(theirs.fileno(),), close_fds=True)
            theirs.close()
            blob = pickle.dumps((config.for_group(group), self.broker.boot, logging.getLogger().level))
            ours.sendall(struct.pack(">I", len(blob)) + blob)
            ours.setblocking(False)
            transport, link = await loop.connect_accepted_socket(
                lambda g=group: GroupLink(lambda items, g=g: self._from_worker(g, items),
                                          lambda g=g: self._worker_lost(g)), ours)
            # Past the high-water mark the node throttles its publishers until the buffer drained to
            # half (``_link_full``), so that what waits for a worker -- and in front of a consumer's
            # stop (Op.FLOW) in its log -- is bounded as a cluster's proposal backlog is, by the same
            # mark (raft_backlog_bytes, 16 MiB; docs/design.md "Bodies across the link").
            high = max(LINK_HIGH_MIN, config.raft_backlog_bytes)
            transport.set_write_buffer_limits(high=high, low=high // 2)
            link.on_pause = lambda full, g=group: self._link_full(g, full)
            self.workers[group] = Worker(group, process, link, progress_at=time.monotonic())
            log.info("queue group %d: worker pid %d", group, process.pid)
        if self.broker.machine.group_count < self.count:
            self.broker.log.submit(GroupsSet(None, None, self.count))
        self._task = asyncio.create_task(self._resend_loop())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        if self._credit_timer is not None:
            self._credit_timer.cancel()
        for worker in self.workers.values():
            if worker.link.transport is not None:
                worker.link.transport.close()
        deadline = time.monotonic() + 10
        for worker in self.workers.values():
            while worker.process.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if worker.process.poll() is None:
                log.warning("queue group %d: worker pid %d did not stop; killing it", worker.group,
                            worker.process.pid)
                worker.process.kill()
                worker.process.wait()
        self.bodies.close()

    def workers_held(self) -> int:
        """Bytes the workers hold for clients (bodies in memory), as they last reported."""
        return sum(w.resources[0] for w in self.workers.values() if w.resources is not None)

    def workers_disk_free(self) -> int | None:
        """The least disk space free where a worker writes, as they last reported (None: no report)."""
        free = [w.resources[1] for w in self.workers.values() if w.resources is not None]
        return min(free) if free else None

    @property
    def exit_status(self) -> int | None:
        """The exit status of the worker whose loss stopped this node, when it failed (> 0): the
        node exits with it, so that a supervisor sees why (70: a journal it could not write,
        raft/journal.py) as with one group.  Known once :meth:`stop` has waited for the workers."""
        worker = self.workers.get(self.lost) if self.lost is not None else None
        code = worker.process.returncode if worker is not None else None
        return code if code is not None and code > 0 else None

    def _worker_lost(self, group: int) -> None:
        if self._stopping:
            return
        worker = self.workers.get(group)
        code = worker.process.poll() if worker is not None else None
        # A node is all its processes: without a group's worker it cannot serve that group's
        # queues, so it stops (the cluster's other members take its place; a supervisor restarts it).
        log.critical("queue group %d: its worker is gone (exit code %s): stopping this node", group, code)
        if self.lost is None:
            self.lost = group
            # Answer every client now, as a node whose own log fails does (541, node/broker.py
            # _on_disk_failure): a publisher waiting for a confirm from that group gets an answer,
            # not the 320 "broker shutdown" of a clean stop.
            self.broker.close_all(541, f"INTERNAL_ERROR - queue group {group} of this node failed and the node is stopping")
        os.kill(os.getpid(), 15)

    # ------------------------------------------------------------------ commands and outputs

    def submit(self, command: Any, deferrable: bool = False, size: int = 0) -> None:
        """Broker.submit with groups: each part to its group, the replies joined."""
        routed = self.router.route(command)
        if isinstance(routed, Refused):
            self.broker._on_outputs([(command.conn, OUT_REPLY, command.token, routed,
                                      getattr(command, "channel", None))])
            return
        self.join.expect(command.conn, command.token, command.op, len(routed), getattr(command, "channel", None))
        log_submit = self.broker.log.submit
        for group, part in routed:
            if group == 0:
                log_submit(part, deferrable, size)
            else:
                self.workers[group].link.send_command(part, deferrable, size)

    def joined(self, outputs: list) -> list:
        """Outputs with the replies of several groups joined (``Broker._on_outputs``); the metadata
        group's released positions taken from its ``GroupReport`` (the last output of a batch)."""
        if outputs and outputs[-1][1] == OUT_GROUP_REPORT and outputs[-1][0] is None:
            self.released = outputs[-1][2]
        take = self.join.take
        out = []
        for output in outputs:
            if output[1] == OUT_REPLY:
                output = take(output)
                if output is None:
                    continue
            out.append(output)
        return out

    def _from_worker(self, group: int, items: list) -> None:
        worker = self.workers[group]
        for item in items:
            kind = item[0]
            if kind == "o":
                outputs = typed_replies(item[1])
                self.bodies.received(group, outputs, item[2], item[3])
                self.broker._on_outputs(outputs)
                if item[3] or self.bodies.outstanding.get(group):
                    self._settle_credit()
            elif kind == "r":
                if item[1] > worker.meta_applied:
                    worker.progress_at = time.monotonic()
                worker.meta_applied, worker.gone, worker.msgs, worker.msg_applied = item[1:5]
                self.forward()
            elif kind == "x":
                self.tx_reports[group] = item[1]
                self.forward()
            elif kind == "t":
                worker.throttled = item[1]
                self.broker._on_log_throttle(self.broker.log_throttled)
            elif kind == "m":  # the worker's (memory held, disk free): node/worker.py check_alarms
                worker.resources = (item[1], item[2])
                self.broker.check_alarms()
            elif kind == FIGURES_ANSWER:
                self.figures.answered(group, item[1], item[2])

    def _settle_credit(self) -> None:
        """Carried bodies' credit back to the workers for connections that hold little; looked at
        again shortly while some is held back (node/group_bodies.py)."""
        if self.bodies.settle() and self._credit_timer is None and not self._stopping:
            self._credit_timer = asyncio.get_running_loop().call_later(RECHECK_SECONDS, self._recheck_credit)

    def _recheck_credit(self) -> None:
        self._credit_timer = None
        self._settle_credit()

    def _link_full(self, group: int, full: bool) -> None:
        """A worker's link passed its high-water mark (or drained): publishers are throttled
        meanwhile, as for the log's own backlog (Broker._on_log_throttle)."""
        worker = self.workers.get(group)
        if worker is not None and worker.link_full != full:
            worker.link_full = full
            self.broker._on_log_throttle(self.broker.log_throttled)

    # ------------------------------------------------------------------ the forwarder

    @property
    def forwarding(self) -> bool:
        return not self.broker.config.clustered or self.broker.log.is_leader

    def forward(self) -> None:
        if not self.forwarding or not self.workers:
            return
        meta = self.broker.machine
        submit = self.broker.log.submit
        released = self.released.meta_seq
        for group, worker in self.workers.items():
            start = max(worker.meta_applied, worker.meta_sent)
            if released > start:
                for seq, command, placed in meta.meta_outbox:
                    if seq > released:
                        break
                    if seq > start:
                        self._send_to(group, MetaApply(None, None, seq, command, placed))
                worker.meta_sent = released
            taken = self.released.gone_applied.get(group, 0)
            for seq, qid, conn, token in worker.gone:
                if seq > max(taken, worker.gone_sent):
                    submit(QueueGone(None, None, group, seq, qid, conn, token))
                    worker.gone_sent = seq
            if worker.gone and worker.gone[0][0] <= taken and taken > worker.trim_sent:
                self._send_to(group, GoneTrim(None, None, taken))
                worker.trim_sent = taken
        self._forward_messages()
        if meta.tx_coord or meta.tx_held or any(report[1] for report in self.tx_reports.values()):
            self._forward_tx()
        low = min(worker.meta_applied for worker in self.workers.values())
        if meta.meta_outbox and meta.meta_outbox[0][0] <= low and low > self.meta_trim_sent:
            submit(MetaTrim(None, None, low))
            self.meta_trim_sent = low

    def _send_to(self, group: int, command: Any) -> None:
        if group == 0:
            self.broker.log.submit(command)
        else:
            self.workers[group].link.send_command(command)

    def _forward_messages(self) -> None:
        """Messages routed to other groups' queues (store/core/groups.py ``route_remote``): each
        outbox entry to its target group as MessageIn, and MessageDone back once it applied them."""
        applied = {0: self.released.msg_applied}
        outboxes: dict[int, list] = {}
        for group, worker in self.workers.items():
            outboxes[group] = worker.msgs
            applied[group] = worker.msg_applied
        # The metadata group's own outbox as of its last released batch: its bodies are read only
        # when an entry is still to send (this runs after every batch of outputs; a MessageDone
        # needs only the sequence numbers).
        entries = self.released.msgs
        unsent = any(seq > max(applied[target].get(0, 0), self.msg_sent.get((0, target), 0))
                     for target, seq, _qids, _message, _expiration in entries)
        outboxes[0] = (outbox_messages(entries, self.broker.bodies, 0) if unsent else
                       [(target, seq, None, None, None) for target, seq, _q, _m, _e in entries])
        for source, entries in outboxes.items():
            heads: dict[int, int] = {}
            for target, seq, qids, fields, body in entries:
                heads.setdefault(target, seq)
                key = (source, target)
                if seq > max(applied[target].get(source, 0), self.msg_sent.get(key, 0)):
                    (exchange, routing_key, properties, persistent, priority, expiration, fmt, published_at) = fields
                    self._send_to(target, MessageIn(None, None, source, seq, qids, exchange, routing_key, properties,
                                                    body, persistent, priority, expiration, fmt, published_at))
                    self.msg_sent[key] = seq
            for target, head in heads.items():
                done = applied[target].get(source, 0)
                key = (source, target)
                if head <= done and done > self.done_sent.get(key, 0):
                    self._send_to(source, MessageDone(None, None, target, done))
                    self.done_sent[key] = done

    def _forward_tx(self, forget: bool = False) -> None:
        """The next steps of the transactions across groups (store/core/tx_groups.py)."""
        # (a worker that never held a transaction has sent no report: it has applied no prepare)
        reports = {group: self.tx_reports.get(group, (0, {})) for group in self.workers}
        reports[0] = self.released.tx
        for group, command in self.tx.sends(self.broker.machine, reports, forget, self.released.tx_next):
            self._send_to(group, command)

    async def _resend_loop(self) -> None:
        """Once a second: what was sent and is not applied yet is sent again (a proposal can be
        lost with a leader change; every entry applies once, so a resend is safe)."""
        while True:
            await asyncio.sleep(RESEND_SECONDS)
            now = time.monotonic()
            for worker in self.workers.values():
                if worker.meta_sent > worker.meta_applied and now - worker.progress_at > RESEND_SECONDS:
                    worker.meta_sent = worker.meta_applied
                worker.gone_sent = 0
                worker.trim_sent = 0
                worker.link.send(("report",))
            self.meta_trim_sent = 0
            self.msg_sent.clear()
            self.done_sent.clear()
            self.tx.clear()
            self.forward()
            if self.forwarding and self.workers:
                self._forward_tx(forget=True)
