"""The node's broker: the state machine, its log, and the connections the outputs go to.

Front ends never touch the state machine directly; they ``submit`` commands and receive outputs
through the ``Endpoint`` interface. Reads they make for early validation (of the ``machine``
attribute, through store/core/queries.py; the few per-message ones listed there directly) are local
and advisory: apply re-validates every command.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Protocol

from raftmq.node.config import Config
from raftmq.node.leaders import LeaderHistory
from raftmq.raft.cluster import ClusterLog
from raftmq.raft.local import LocalLog
from raftmq.raft.log import Log
from raftmq.store.applier import Applier
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import (
    OUT_CANCEL,
    OUT_CLOSE,
    OUT_DELIVER,
    OUT_REPLY,
    OUT_SESSION_DETACHED,
    OUT_TRANSFER,
    OUT_VHOST_CLOSED,
    AuditChainOn,
    Command,
    ConnectionClose,
    MemberRemove,
    MemberSet,
    NodeReset,
    Result,
    Tick,
    VhostAdd,
)
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.bodies import Bodies
from raftmq.store.disk.body_scrub import BodyScrubber
from raftmq.store.disk.body_store import BodyStore
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.event_writer import EventStore, RetentionPolicy
from raftmq.trace import Tracer

from .admission import Admission
from .audit import AuditNotes
from .auth import Authenticator
from .core import formats  # noqa: F401  (every protocol's property codec, before the machine applies anything)
from .group_host import GroupHost
from .limits import Usage
from .rebalancer import rebalance_loop

log = logging.getLogger(__name__)

TICK_INTERVAL = 0.05  # seconds between expiry ticks while any queue has expiring messages
TICK_AFTER_SUBMIT = 0.01  # seconds before looking again after a TICK was submitted
TICK_MIN_PAUSE = 0.002  # seconds: the shortest wait for a deadline that is about to pass
ALARM_CHECK_INTERVAL = 1.0


class Endpoint(Protocol):
    """What the broker calls on everything it registered (``register``): the front ends' connections
    and the admin's pseudo-connection (ops/control.py ``AdminEndpoint``).

    Outputs of an apply reach their connection through the ``on_*`` methods, one call per output
    tuple (store/core/commands.py ``OUT_*``), then one ``flush`` per connection touched.  An output
    kind a protocol cannot receive (a 0-9-1 delivery to a 0-10 connection) never reaches it; its
    method is there, empty, so that the broker dispatches without asking.  The parameters are
    positional-only: the broker passes them so, and each front end names them its own way.
    """

    def on_reply(self, token: int | None, result: Result, channel: int | None, /) -> None:
        """OUT_REPLY: the result of a command this connection submitted with ``token`` (None for a
        command submitted without one: only errors come back, e.g. a publish without confirms)."""

    def on_deliver(self, channel: int, consumer_tag: str, delivery: tuple, /) -> None:
        """OUT_DELIVER: a message for a 0-9-1 consumer; ``delivery`` is ``(qid, seq, redelivered,
        Message[, body])`` (store/core/commands.py)."""

    def on_cancel(self, channel: int, consumer_tag: str, /) -> None:
        """OUT_CANCEL: the core cancelled a consumer (its queue was deleted)."""

    def on_transfer(self, channel: int, destination: str, transfer: tuple, /) -> None:
        """OUT_TRANSFER: a message for a 0-10 subscription or a 1.0 link (a core session's
        destination); ``transfer`` is ``(transfer_id, qid, seq, redelivered, Message[, body])``."""

    def on_session_detached(self, channel: int, name: bytes, /) -> None:
        """OUT_SESSION_DETACHED: the core session on ``channel`` was attached elsewhere (a 0-10
        attach with force, a stolen 1.0 link): end ours."""

    def on_forced_close(self, reply_code: int, reply_text: str, /) -> None:
        """OUT_CLOSE, or the connection's vhost was deleted: close with the protocol's forced close."""

    def flush(self) -> None:
        """Write what the outputs just dispatched queued (once per batch of outputs)."""

    def set_blocked(self, reason: str | None) -> None:
        """A resource alarm was set (``reason``) or cleared (None): stop or resume reading publishers."""

    def resume_flow(self) -> None:
        """The proposal backlog is low again: read again if ``pause_for_flow`` stopped this one."""


class ClientEndpoint(Endpoint, Protocol):
    """A client's connection, which the broker also closes, watches while blocked and counts for the
    memory alarm (``close_all``, the alarm loop, ``memory_held``; node/server.py closes them at
    shutdown).  Every front end's connection class is one; the admin's endpoint is not, so the
    broker looks these methods up with ``getattr``."""

    def close_connection(self, code: int, text: str, /) -> None:
        """Close from the server's side (shutdown, a disk failure, an administrator): ``code`` is a
        0-9-1 reply code, mapped by the other protocols to their forced close."""

    def drop_if_peer_gone(self) -> None:
        """While reading is paused the connection cannot see its client leave: look, and drop it."""

    def held_bytes(self) -> int:
        """Bytes held for the client (write buffer, parked deliveries, partial input), for the
        memory alarm."""
        ...


class Broker:
    def __init__(self, config: Config, boot: str | None = None) -> None:
        self.config = config
        self.admission = Admission(config)  # connection limits of the protocol front ends
        # Vhost and user limits against this node's clients (node/limits.py; the limits are replicated).
        self.usage = Usage(lambda: self.machine.vhost_limits, lambda: self.machine.user_limits)
        data_dir = config.resolved_data_dir()
        # Connection ids must never repeat across restarts once the log is replicated: prefix a
        # boot stamp (taken here, outside apply, so the state machine stays deterministic).
        self._boot = boot or f"{config.node_id}.{time.time_ns() // 1000:x}"  # a queue group's worker: its node's
        self.store: DurableStore | None
        self.log: Log
        # Message bodies live outside the model, once per node (store/disk/bodies.py, issue 18).
        self.bodies = Bodies(BodyStore(os.path.join(data_dir, "bodies")), config.body_cache_bytes,
                             config.body_write_behind_bytes, defer_deletes=config.clustered)
        if config.clustered:
            # In a cluster the journal and snapshots are the durable state (replica.py); the
            # model is rebuilt from them at start, transient parts included.
            self.store = None
            self.machine = StateMachine()
            # (A queue group's worker too: the main process reads a held delivery's body from the
            # worker's body store when it is not carried over the link, node/group_bodies.py.)
            self.applier = Applier(self.machine, self.bodies)
            me = config.member()
            self.log = ClusterLog(
                self.applier, self._on_outputs, origin=self._boot, self_address=me.raft,
                partners=[m.raft for m in config.cluster if m.node_id != config.node_id],
                data_dir=os.path.join(data_dir, "raft"), secret=config.secret(),
                snapshot_entries=config.snapshot_entries, snapshot_seconds=config.snapshot_seconds,
                snapshot_bytes=config.snapshot_bytes,
                append_entries_period=config.raft_append_entries_period, tick_period=config.raft_tick_period,
                election_timeout=(config.raft_election_timeout_min, config.raft_election_timeout_max),
                batch_append_entries=config.raft_batch_append_entries,
                message_bytes=config.raft_message_bytes,
                leader_fallback=config.raft_leader_fallback, pre_vote=config.raft_pre_vote,
                max_batch_bytes=config.raft_batch_bytes, high_water_bytes=config.raft_backlog_bytes,
                pipeline_min_bytes=config.raft_pipeline_min_bytes, defer_seconds=config.raft_defer_seconds,
                urgent_in_flight=config.raft_urgent_in_flight, in_loop=config.raft_in_loop, scrub_bytes_per_second=config.scrub_bytes_per_second,
                peer_gate={"handshake_timeout": config.raft_handshake_timeout,
                           "max_unauthenticated": config.raft_max_unauthenticated,
                           "stall_timeout": config.raft_frame_stall_timeout},
            )
            self._configured_members = {m.node_id: (m.raft, m.amqp) for m in config.cluster}
        else:
            self.store = DurableStore(os.path.join(data_dir, "state"))
            self.machine = StateMachine(persistent=True)
            self.machine.group = config.group  # (before restore: a queue's stub-ness depends on it)
            self.machine.restore(self.store.load())
            # One node: persistent bodies are in the store's message records; transient ones may
            # spill to <data>/bodies under pressure and do not survive a restart.
            self.bodies.clear()
            self.bodies.fallback = self.store.message_bodies
            self.bodies.put(self.machine.loaded_bodies)
            self.machine.loaded_bodies = []
            self.applier = Applier(self.machine, self.bodies, self.store)
            self.log = LocalLog(self.applier, self._on_outputs)
            self.log.on_fatal = self._on_disk_failure
            self._configured_members = {}
        self.machine.group = config.group  # issue 34: which group this process applies
        self.machine.delayed_limit = config.max_delayed_messages
        # max-queues refusals (applied on every node): counted and logged by the node of the client.
        self.machine.limit_commands.on_refused = lambda conn, reason: (
            self.usage.refuse("vhost max-queues", reason) if conn in self.endpoints else None)
        self.machine.durable_links_limit = config.amqp10_durable_links_per_user  # store/core/sessions.py
        machine = self.machine
        # A refused delivery of a damaged body names its queue in the log (store/disk/bodies.py).
        self.bodies.queue_name = lambda qid: Q.queue_name(machine, qid)
        # Damaged bodies are found when read and by this scrubber (started with the node).
        self.scrubber = BodyScrubber(self.bodies, config.scrub_bytes_per_second)
        self.flow_throttled = False
        self.flow_paused: set[Endpoint] = set()  # endpoints not read until the backlog is low again
        self.log.on_throttle = self._on_log_throttle
        self.log_throttled = False
        # Queue groups (issue 34): the main process of a node with several groups hands commands to
        # them through the router and joins their replies (node/group_host.py).  One group: None,
        # and ``submit`` is the plain method below.
        self.group_host: GroupHost | None = None
        if config.raft_groups > 1 and config.group == 0:
            self.group_host = GroupHost(self)
            self.submit = self.group_host.submit  # type: ignore[method-assign]  # one attribute look-up per command, as before
        self.events: EventStore | None = None
        if config.audit_retention != "none" or config.audit_vhosts:
            self.events = EventStore(os.path.join(data_dir, "events"),
                                     RetentionPolicy(config.audit_retention, config.audit_vhosts),
                                     max_age=config.audit_max_age, max_bytes=config.audit_max_bytes)
            self.applier.set_history(self.events.append)
            self.events.body_of = self.bodies.get
            if not config.clustered:
                # One node: the history continues its numbering (a cluster's comes from the log).
                self.machine.event_seq = max(self.machine.event_seq, self.events.last_seq)
                self.machine.chain_head = self.events.chain_head  # and its chain (issue 36)
                self.machine.chain_on = True  # (one node: no replica to agree with; a cluster: start())
        self.auth = Authenticator(config.users, lambda: self.machine.users, lambda: self.machine.permission_overlay,
                                  login_workers=config.login_workers, login_limit=config.login_queue_limit,
                                  refusal_log_interval=config.login_refusal_log_interval)
        # Who did what (issue 36): connections, refusals and admin changes as AuditNote commands.
        self.audit = AuditNotes(self.submit)
        self.auth.on_refused = self.audit.login_refused
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self.endpoints: dict[str, Endpoint] = {}
        self.applier.is_local = self.endpoints.__contains__  # outputs for other nodes' connections get no body
        # Messages published and delivered through this node, per protocol (ops/metrics.py):
        # front ends count into their protocol's [published, delivered] pair.
        self.message_counts: dict[str, list[int]] = {}
        self._conn_ids = itertools.count(1)
        self.alarm: str | None = None
        self._disk_paths = [data_dir] + [os.path.join(data_dir, sub) for sub in ("state", "raft", "events", "bodies")]
        self._next_alarm_check = 0.0  # monotonic time from which growth triggers check_alarms again
        self.memory_in_use = 0  # at the last check (bytes): see memory_held()
        self._tasks: list[asyncio.Task] = []
        self._leaderless_since: float | None = None
        self.leader_changes = 0
        self.leader_history = LeaderHistory()  # the last leaders seen, with time and term (node/leaders.py)
        self._last_leader: str | None = None
        self._cut_off = False  # leaderless since this node, the leader, lost its majority
        self._majority_lost_seen = 0  # Replica.majority_lost at the last look
        self._declared_down: set[str] = set()
        # Issue 30's stage tracer (raftmq/trace.py): None unless trace_stages, and then hooked in at start.
        self.tracer: Tracer | None = None
        if config.trace_stages and config.clustered:
            self.tracer = Tracer(config.node_id, config.trace_stages_events)
        self.trace_path = os.path.join(data_dir, "trace.msgpack")

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.log.start(self.loop)
        if self.tracer is not None:
            self._start_tracing()
        if self.group_host is not None:
            await self.group_host.start()
        if self.config.group:
            # A queue group's worker: the main process sends what the groups need (node resets to
            # every group, members and vhosts through the metadata group, forwarded).  Its own
            # group's event chain is its to start, as the main process does for the metadata
            # group below (issue 36; without it a queue group's history had no chain at all).
            if self.config.clustered and self.events is not None and not self.machine.chain_on:
                self.submit(AuditChainOn(None, None))
            self._tasks.append(asyncio.create_task(self._tick_loop()))
            if self.config.clustered:
                self._tasks.append(asyncio.create_task(self._cluster_watch_loop()))
            # Its alarm checks (reported to the main process, node/worker.py) and its body store's
            # scrubber (issue 29: damage found before a read meets it) are its own too.
            self._tasks.append(asyncio.create_task(self._alarm_loop()))
            self.scrubber.start()
            return
        if self.config.clustered and self.events is not None and not self.machine.chain_on:
            # This node keeps an audit history: every replica chains the events from this entry
            # on (a cluster without histories does not pay for the chain; issue 36).
            self.submit(AuditChainOn(None, None))
        if self.config.clustered:
            # Connections of this node's previous incarnation are gone: release what they held.
            self.submit(NodeReset(None, None, self.config.node_id, self._boot))
            me = self.config.member()
            self.submit(MemberSet(None, None, me.node_id, me.raft, me.amqp))
            self._tasks.append(asyncio.create_task(self._cluster_watch_loop()))
            if self.group_host is not None:  # issue 34: spread the groups' leaders (node/rebalancer.py)
                self._tasks.append(asyncio.create_task(rebalance_loop(self)))
        for vhost in self.config.vhosts:
            if not Q.has_vhost(self.machine, vhost):
                self.submit(VhostAdd(None, None, vhost))
        self._tasks.append(asyncio.create_task(self._tick_loop()))
        self._tasks.append(asyncio.create_task(self._alarm_loop()))
        self.scrubber.start()

    async def stop(self) -> None:
        if self.group_host is not None:
            await self.group_host.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self.events is not None:
            self.events.close()
        self.scrubber.stop()
        self.dump_trace()
        self.log.close()
        self.bodies.store.close()

    def _start_tracing(self) -> None:
        from raftmq.raft.tracing import install

        install(self.log, self.tracer)
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, self.dump_trace)
        except (NotImplementedError, RuntimeError):
            pass
        log.info("stage tracer on: the newest %d events go to %s on SIGUSR2 and at stop",
                 self.config.trace_stages_events, self.trace_path)

    def dump_trace(self) -> None:
        """Write the tracer's ring to <data>/trace.msgpack (SIGUSR2, and at stop)."""
        if self.tracer is None:
            return
        try:
            self.tracer.dump(self.trace_path)
        except OSError as exc:
            log.warning("stage trace not written to %s: %s", self.trace_path, exc)

    def counts_for(self, protocol: str) -> list[int]:
        """The [published, delivered] counters of ``protocol`` (shared by its connections)."""
        return self.message_counts.setdefault(protocol, [0, 0])

    @property
    def boot(self) -> str:
        return self._boot

    @property
    def members(self) -> dict[str, tuple[str, str]]:
        """node_id -> (raft, amqp): the replicated member list, or the configured one until it has one."""
        return Q.members(self.machine) or self._configured_members

    @property
    def known_hosts(self) -> str:
        """Every member's client address (connection.open-ok known-hosts, server property)."""
        if not self.config.clustered:
            return f"{self.config.host}:{self.config.port}"
        return ",".join(amqp for _raft, amqp in self.members.values())

    def client_address(self) -> str:
        if not self.config.clustered:
            return f"{self.config.host}:{self.config.port}"
        member = self.members.get(self.config.node_id)
        return member[1] if member else self.config.member().amqp

    def leader_client_address(self) -> str | None:
        """The leader's client address (None in single-node mode or without a leader)."""
        if not self.config.clustered:
            return None
        node_id = self.node_of_raft(self.log.leader)
        member = self.members.get(node_id) if node_id else None
        return member[1] if member else None

    def node_of_raft(self, raft_address: str | None) -> str | None:
        if not raft_address:
            return None
        for node_id, (raft, _amqp) in self.members.items():
            if raft == raft_address:
                return node_id
        return None

    @property
    def accepting(self) -> bool:
        """Whether client operations can make progress here (single node, or a cluster with a leader)."""
        return not self.config.clustered or self.log.ready

    # ------------------------------------------------------------------ connections

    def register(self, endpoint: Endpoint) -> str:
        conn_id = f"{self._boot}.{next(self._conn_ids)}"
        self.endpoints[conn_id] = endpoint
        return conn_id

    def unregister(self, conn_id: str) -> None:
        self.usage.close(conn_id)
        endpoint = self.endpoints.pop(conn_id, None)
        if endpoint is not None:
            self.flow_paused.discard(endpoint)
            self.audit.closed(conn_id)
            self.submit(ConnectionClose(conn_id, None))

    def audit_from_thread(self, note: Callable[..., None], *args: object) -> None:
        """Run an audit note method on the broker's loop (the notes and the log belong to it) from
        any thread: the management APIs check logins in the login pool and gRPC's threads."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(note, *args)

    @property
    def connection_count(self) -> int:
        return len(self.endpoints)

    def submit(self, command: Command, deferrable: bool = False, size: int = 0) -> None:
        """Hand ``command`` to the log; ``size``, the bytes it carries if the caller knows them."""
        self.log.submit(command, deferrable, size)
        # (No alarm check here, per command: what a submitted command holds grows memory when it
        # is applied -- checked after its outputs -- or while it waits to be proposed, which the
        # log's own backlog throttle bounds; the read that carried it was checked.  A check per
        # publish cost ~0.5 us/msg in bench/ingress.py.)

    # ------------------------------------------------------------------ flow control

    def _on_log_throttle(self, on: bool) -> None:
        """This process's log crossed a backlog mark; with queue groups, the workers' count too."""
        self.log_throttled = on
        if self.group_host is not None:
            on = on or any(worker.throttled or worker.link_full for worker in self.group_host.workers.values())
        if on != self.flow_throttled:
            self._on_throttle(on)

    def _on_throttle(self, on: bool) -> None:
        """The Raft proposal backlog crossed its high (on) or low (off) water mark.

        Publishing connections stop being read while it is high -- TCP pushes back on the
        clients, as RabbitMQ's credit flow does -- and are read again once it is low."""
        self.flow_throttled = on
        if on:
            log.info("proposal backlog above its high-water mark: throttling publishers")
        else:
            paused, self.flow_paused = self.flow_paused, set()
            for endpoint in paused:
                endpoint.resume_flow()

    def pause_for_flow(self, endpoint: Endpoint) -> None:
        self.flow_paused.add(endpoint)

    # ------------------------------------------------------------------ outputs

    def _on_outputs(self, outputs: list) -> None:
        if self.group_host is not None:
            outputs = self.group_host.joined(outputs)
            self.group_host.forward()
        endpoints = self.endpoints
        touched: dict[str, Endpoint] = {}
        for out in outputs:
            endpoint = endpoints.get(out[0])
            if endpoint is None:
                # Outputs of other nodes' connections come here too (most of a follower's): the
                # cheapest test first (+5 ns per output measured, against +12 ns testing the kind).
                if out[0] is None and out[1] == OUT_VHOST_CLOSED:
                    touched.update(self._close_vhost_connections(out[2], out[3], out[4]))
                continue
            kind = out[1]
            if kind == OUT_DELIVER:
                endpoint.on_deliver(out[2], out[3], out[4])
            elif kind == OUT_REPLY:
                endpoint.on_reply(out[2], out[3], out[4])
            elif kind == OUT_CANCEL:
                endpoint.on_cancel(out[2], out[3])
            elif kind == OUT_TRANSFER:
                endpoint.on_transfer(out[2], out[3], out[4])
            elif kind == OUT_CLOSE:
                endpoint.on_forced_close(out[2], out[3])
            elif kind == OUT_SESSION_DETACHED:
                endpoint.on_session_detached(out[2], out[3])
            touched[out[0]] = endpoint
        for endpoint in touched.values():
            endpoint.flush()
        self.maybe_check_alarms()

    def _close_vhost_connections(self, vhost: str, code: int, text: str) -> dict[str, Endpoint]:
        """A vhost was deleted (store/core/topology.py vhost_delete): close this node's client connections
        open on it, each with its protocol's forced close (0-9-1 320 CONNECTION_FORCED, 1.0
        amqp:connection:forced, 0-10 connection-forced), as RabbitMQ does."""
        closed = {}
        for conn_id, endpoint in list(self.endpoints.items()):
            if getattr(endpoint, "access", None) is not None and getattr(endpoint, "vhost", None) == vhost:
                endpoint.on_forced_close(code, text)
                closed[conn_id] = endpoint
        return closed

    # ------------------------------------------------------------------ timers

    async def _tick_loop(self) -> None:
        clustered = self.config.clustered
        pause = TICK_INTERVAL
        while True:
            await asyncio.sleep(pause)
            pause = TICK_INTERVAL
            self.audit.flush()  # refusal notes held back by the bound: their counts (node/audit.py)
            if not self.machine.next_expiry_due() or (clustered and not self.log.is_leader):
                continue
            deadline = self.machine.next_deadline()
            now = time.time_ns() // 1000
            if deadline is not None and now >= deadline:
                self.submit(Tick(None, None))
            due = Q.next_delayed_due(self.machine)
            if due is not None:
                # Delayed messages (store/core/delayed.py) are released promptly: wake at the next due
                # time rather than up to TICK_INTERVAL after it, and soon after a TICK just
                # submitted (still on its way through the log).  TTLs keep the plain interval.
                wait = (due - now) / 1e6
                pause = min(TICK_INTERVAL, TICK_AFTER_SUBMIT if wait <= 0 else max(TICK_MIN_PAUSE, wait))

    async def _cluster_watch_loop(self) -> None:
        """Leader: declare unreachable members down. Everyone: drop clients while leaderless."""
        config = self.config
        unreachable_since: dict[str, float] = {}
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            raft = self.log.raft_status()
            if self.log.leader is None:
                if self._leaderless_since is None:
                    self._leaderless_since = now
                waited = now - self._leaderless_since
                if raft.majority_lost != self._majority_lost_seen:
                    # This node stopped leading in its own term: it heard from no majority for
                    # raft_leader_fallback.  The others elect a leader among themselves meanwhile;
                    # waiting only holds its clients (a partitioned leader's clients waited 1 s +
                    # leaderless_close_after).  A leader deposed by a higher term is in an
                    # election instead, and gets the usual grace.
                    self._majority_lost_seen = raft.majority_lost
                    self._cut_off = True
                    log.warning("this node led and lost its majority")
                if (self._cut_off or waited > config.leaderless_close_after) and self.endpoints:
                    log.warning("no Raft leader for %.1f s: closing %d client connections",
                                waited, len(self.endpoints))
                    self.close_all(320, "CONNECTION_FORCED - this node lost the cluster leader; "
                                        f"reconnect to one of {self.known_hosts}")
            else:
                self._leaderless_since = None
                self._cut_off = False
                self._majority_lost_seen = raft.majority_lost  # (a step-down already over)
                if self.log.leader != self._last_leader:
                    self.leader_changes += self._last_leader is not None
                    log.info("Raft leader is now %s (%s)%s", self.node_of_raft(self.log.leader) or "?",
                             self.log.leader, ", this node" if self.log.is_leader else "")
                    self._last_leader = self.log.leader
                    self.leader_history.saw(time.time(), raft.term,
                                            self.node_of_raft(self.log.leader) or self.log.leader)
            if not self.log.is_leader or config.group:
                # (A queue group's worker leaves members and node resets to the main process.)
                unreachable_since.clear()
                continue
            connected = set(raft.connected_partners)
            raft_members = set(raft.member_addresses)
            announced = Q.members(self.machine)
            if announced:
                # A configured member back in the Raft configuration (removed, then added again while
                # it kept running) announces itself only at start: the leader announces it instead.
                known = {raft for raft, _amqp in announced.values()}
                for member in config.cluster:
                    if member.raft in raft_members and member.raft not in known:
                        log.info("member %s is back in the Raft configuration", member.node_id)
                        self.submit(MemberSet(None, None, member.node_id, member.raft, member.amqp))
            for node_id, (raft_address, _amqp) in list(self.members.items()):
                if node_id == config.node_id:
                    continue
                if announced and raft_address not in raft_members:
                    # Removed from the Raft configuration (raftmq cluster remove): forget it.
                    log.warning("member %s left the Raft configuration", node_id)
                    self.submit(MemberRemove(None, None, node_id))
                    continue
                if raft_address in connected:
                    unreachable_since.pop(raft_address, None)
                    self._declared_down.discard(node_id)
                    continue
                since = unreachable_since.setdefault(raft_address, now)
                if now - since > config.node_down_after and node_id not in self._declared_down:
                    log.warning("member %s unreachable for %.1f s: releasing its connections", node_id, now - since)
                    self._declared_down.add(node_id)
                    self.submit(NodeReset(None, None, node_id, None))

    def _on_disk_failure(self, reason: str) -> None:
        """The log is about to stop the node (a failed LMDB commit or fsync): answer every client."""
        self.close_all(541, "INTERNAL_ERROR - this node could not write to its disk and is stopping")

    def close_all(self, code: int, text: str) -> None:
        for endpoint in list(self.endpoints.values()):
            close = getattr(endpoint, "close_connection", None)
            if close is not None:
                close(code, text)
                endpoint.flush()

    async def _alarm_loop(self) -> None:
        while True:
            try:
                if self.alarm:
                    # Blocked connections are not read: find those whose client left (their partial
                    # input would otherwise hold the alarm up for good).
                    for endpoint in list(self.endpoints.values()):
                        drop = getattr(endpoint, "drop_if_peer_gone", None)
                        if drop is not None:
                            drop()
                self.check_alarms()
            except Exception:  # a failing check must not end the loop (and with it all alarms)
                log.exception("resource alarm check failed")
            await asyncio.sleep(ALARM_CHECK_INTERVAL)

    def maybe_check_alarms(self) -> None:
        """Memory or disk use may have grown (input read, outputs dispatched): check, at most every
        ``resource_check_interval``."""
        if time.monotonic() >= self._next_alarm_check:
            self._check_alarms_now()

    def _check_alarms_now(self) -> None:
        """Evaluate the alarms as memory and disk use grow (called after input is read and after
        outputs are dispatched), at most every ``resource_check_interval``. Summing the
        connections' holdings costs ~0.6 us per connection (10,000 in-process connections: 5.9 ms),
        so with many connections the interval grows to keep the check near 2 % of a core
        (10,000 connections: every 0.3 s)."""
        interval = max(self.config.resource_check_interval, len(self.endpoints) * 30e-6)
        self._next_alarm_check = time.monotonic() + interval
        try:
            self.check_alarms()
        except Exception:
            log.exception("resource alarm check failed")

    def memory_held(self) -> int:
        """Bytes the node holds for clients: message bodies in memory (the body cache and those
        not written yet; a backlog on disk does not count), and per connection its socket write
        buffer, parked auto-ack deliveries and partial input."""
        held = self.bodies.held_bytes
        for endpoint in list(self.endpoints.values()):
            held_bytes = getattr(endpoint, "held_bytes", None)
            if held_bytes is not None:
                held += held_bytes()
        if self.group_host is not None:  # issue 34: the queue groups' workers' bodies too
            held += self.group_host.workers_held()
        return held

    def disk_free(self) -> int:
        """Bytes free for an unprivileged writer where the node writes: the least of the data
        directory's filesystem and those of its stores (each may be a mount of its own)."""
        free = None
        for path in self._disk_paths:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            avail = st.f_bavail * st.f_frsize
            free = avail if free is None else min(free, avail)
        if self.group_host is not None:  # issue 34: where the queue groups' workers write too
            theirs = self.group_host.workers_disk_free()
            if theirs is not None:
                free = theirs if free is None else min(free, theirs)
        return self.config.disk_free_limit + 1 if free is None else free

    def check_alarms(self) -> None:
        reason = None
        self.memory_in_use = self.memory_held()
        if self.memory_in_use > self.config.memory_high_watermark:
            reason = "low on memory"
        elif self.disk_free() < self.config.disk_free_limit:
            reason = "low on disk"
        if reason != self.alarm:
            log.warning("resource alarm %s (memory held %d bytes, watermark %d)",
                        f"set: {reason}" if reason else "cleared", self.memory_in_use,
                        self.config.memory_high_watermark)
            self.alarm = reason
            for endpoint in list(self.endpoints.values()):
                endpoint.set_blocked(reason)
