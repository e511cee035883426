"""Link recovery (2.6.13 resuming deliveries) for receivers with a durable source, across connections
and nodes: the core keeps a durable link's subscription and unsettled deliveries in the replicated
state machine, so a client that re-attaches the link by name -- on any node, after its node died --
gets its unsettled deliveries back with their tags, and the outcomes it reports for them are applied
once.

A receiver's source with ``durable`` = unsettled-state (2) is durable here.  Its core session is named
after the link (container-id of the client's open + link name; the core keys it by vhost and user too),
attached with ``force`` (it takes over from a connection that is gone or going), and lives
``source.timeout`` seconds (at least :data:`DEFAULT_TIMEOUT`, at most the core's
``MAX_SESSION_TIMEOUT``) after its connection ends (``SESSION_TIMEOUT``).  Delivery tags are the core's
transfer ids, stable across re-attachments.

On a re-attach (``SESSION_ATTACH`` answers ``resumed``), the core replays the unsettled transfers.  The
front end stops the subscription's leftover credit (``MESSAGE_STOP``; transfers the old credit assigned
meanwhile join the replay), then

* applies the outcome of every delivery the client's attach reports in its ``unsettled`` map with a
  terminal state (accepted, rejected, released, modified): the client decided, we did not hear it --
  in receiver-settle-mode second this is what makes a delivery count exactly once;
* answers the attach with its own ``unsettled`` map (each remaining tag, no state), and
* sends the remaining deliveries first (``resume`` set when the client knew the tag), within the
  client's credit, before anything new.

A detach with ``closed`` ends the durable link for good (its state is destroyed, unsettled messages
return to the queue); a detach without ``closed`` or a lost connection keeps it.

A durable link whose source is a topic (terminus.py) is a durable subscription: its queue is declared
and bound when the core session is new (not when it resumes: it exists), and a detach with ``closed``
deletes the queue too (links.OutgoingLink.on_detach).
"""

from __future__ import annotations

from raftmq.protocol.amqp10 import performatives as p
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import (
    MessageSettle,
    MessageStop,
    SessionAttach,
    SessionAttached,
    SessionTimeout,
    err,
)
from raftmq.store.core.sessions import (
    MAX_SESSION_TIMEOUT,
    SETTLE_ACCEPT,
    SETTLE_REJECT,
    SETTLE_RELEASE,
    SETTLE_RELEASE_REDELIVERED,
)

from .limits import durable_refusal, refusals
from .links import SERIAL, OutgoingLink, delivery_octets

UNSETTLED_STATE = 2  # terminus-durability unsettled-state (3.5.5)
DEFAULT_TIMEOUT = 60  # seconds a durable link outlives its connection when the source says 0


def is_durable(attach) -> bool:
    source = attach.source
    return (isinstance(source, p.Source) and not source.dynamic
            and (source.durable or 0) >= UNSETTLED_STATE)


def _outcome(state) -> int | None:
    """The core settlement for a terminal delivery state (as links.OutgoingLink.on_outcome), else None."""
    cls = state.__class__
    if cls is p.Accepted:
        return SETTLE_ACCEPT
    if cls is p.Released:
        return SETTLE_RELEASE
    if cls is p.Rejected:
        return SETTLE_REJECT
    if cls is p.Modified:
        if state.undeliverable_here:
            return SETTLE_REJECT
        return SETTLE_RELEASE_REDELIVERED if state.delivery_failed else SETTLE_RELEASE
    return None


class DurableOutgoingLink(OutgoingLink):
    def __init__(self, session, attach) -> None:
        super().__init__(session, attach)
        self.readahead = False  # its unsettled deliveries are the client's to resume: none held here
        self.resuming = False
        self.early: list[tuple] = []  # core transfers that arrived while resuming
        self.replays: list[tuple[int, object, bytes | None, bool]] = []  # (transfer id, message, body, resume) owed
        self.offered: list[int] = []  # the transfer ids listed in our attach's unsettled map
        source = attach.source
        self.timeout = min(MAX_SESSION_TIMEOUT, max(int(source.timeout or 0), DEFAULT_TIMEOUT))

    def _start(self, declare: list | None, subscribe: list):
        self.setup = declare if isinstance(declare, list) else []  # a durable topic subscription's queue and binding
        conn = self.conn
        name = f"amqp10-link\x00{conn.container_id}\x00{self.name}".encode()
        refusal = durable_refusal(conn, name)  # limits.py: amqp10_durable_links_per_user
        if refusal is not None:
            self._refuse("amqp:resource-limit-exceeded", refusal)
            return None
        self.core = conn.core_channel(self)
        self.destination = "durable"
        self.resuming = True
        conn.request(SessionAttach(conn.conn_id, None, self.core, conn.vhost, conn.principal.name, name, True),
                      lambda result: self._core_attached(result, subscribe))
        return self

    def _core_attached(self, result: tuple, subscribe: list) -> None:
        if not self.alive:
            return
        if result[0] != 0 and "amqp10_durable_links_per_user" in str(result[2]):
            self.resuming = False  # refused at apply (store/core/sessions.py): attaches raced past limits.py
            refusals(self.conn.broker).refused("durable link", self.conn.peer, str(result[2]))
            self.session.links.pop(self.handle, None)
            self.release()
            return self._refuse("amqp:resource-limit-exceeded", str(result[2]))
        if result[0] != 0 or not isinstance(result[1], SessionAttached):
            self.resuming = False
            return self._subscribed(result if result[0] != 0 else err(530, "the link is busy"))
        resumed, replay = result[1].resumed, result[1].replay
        conn = self.conn
        conn.broker.submit(SessionTimeout(conn.conn_id, None, self.core, self.timeout))
        if not resumed:
            self.resuming = False
            for command in self.setup:  # terminus.py: declared and bound again (idempotent) before subscribing
                conn.broker.submit(command._replace(channel=self.core))
            conn.request(subscribe._replace(channel=self.core, destination=self.destination), self._subscribed)
            return
        self.replays = [(transfer_id, message, body, False)
                        for transfer_id, _dest, _qid, _seq, message, body in replay]
        conn.request(MessageStop(conn.conn_id, None, self.core, self.destination), self._resumed)

    def on_core_transfer(self, transfer: tuple) -> None:
        if self.resuming:
            self.early.append(transfer)
            return
        super().on_core_transfer(transfer)

    def _resumed(self, result: tuple) -> None:
        """The old credit is stopped: every transfer it assigned has arrived. Reconcile, then attach."""
        self.resuming = False
        if result[0] != 0:
            return self._subscribed(result)
        known = {replay[0] for replay in self.replays}
        # (a core transfer to be settled carries no body: read when sent, store/disk/bodies.fill_bodies)
        self.replays += [(t[0], t[4], t[5] if len(t) > 5 else None, False) for t in self.early
                         if t[0] not in known]
        self.early = []
        client = {}
        for tag, state in (self.attach_frame.unsettled or {}).items():
            if isinstance(tag, bytes) and len(tag) == 8:
                client[int.from_bytes(tag, "big")] = p.from_described(state)  # map values stay Described
        settle: dict[int, list[int]] = {}
        remaining = []
        for transfer_id, message, body, _ in self.replays:
            how = _outcome(client.get(transfer_id)) if transfer_id in client else None
            if how is not None:
                settle.setdefault(how, []).append(transfer_id)
            else:
                remaining.append((transfer_id, message, body, transfer_id in client))
        for how, ids in settle.items():
            ranges = [list(r) for r in rs.from_ids(sorted(ids))]
            self.conn.broker.submit(MessageSettle(self.conn.conn_id, None, self.core, ranges, how))
        self.replays = remaining
        self.offered = [replay[0] for replay in remaining]
        self._subscribed((0, self.destination))

    def unsettled_map(self) -> dict | None:
        if not self.offered:
            return None
        return {transfer_id.to_bytes(8, "big"): None for transfer_id in self.offered}

    def send_replays(self) -> None:
        while self.replays and self._credit() > 0 and not self.session.blocked():  # 2.5.6
            transfer_id, message, body, resume = self.replays.pop(0)
            if body is None:
                body = self.conn.broker.bodies.for_send(message.id)
                if body is None:
                    continue  # its message is gone
            self.delivery_count = (self.delivery_count + 1) % SERIAL
            data = delivery_octets(message, body, True)
            self.session.send_delivery(self, transfer_id, self.settled, data, transfer_id.to_bytes(8, "big"),
                                       resume)
        if self.replays and self.session.blocked():
            self.session.waiting[self] = None  # the rest when the window opens (links.resume_sending)

    def on_detach(self, detach) -> None:
        if detach.closed and self.core:  # closed: the link ends for good, its state with it
            self.conn.broker.submit(SessionTimeout(self.conn.conn_id, None, self.core, 0))
        super().on_detach(detach)
