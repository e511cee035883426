"""AMQP 1.0 local transactions (part 4): the coordinator link, declare/discharge, transactional work.

*Coordinator* (4.2, 4.5.1): a sender link whose target is a ``coordinator``.  Its attach is answered
with a coordinator target listing what we do: ``amqp:local-transactions``, several transactions per
session and one transaction across the sessions of a connection (txn-ids are the connection's).  A
controller that desires ``amqp:distributed-transactions`` or ``amqp:promotable-transactions`` is
refused at once with ``amqp:not-implemented`` (2.6.3: attach with a null target, then detach).
Control messages are ``declare`` (4.5.2) and ``discharge`` (4.5.3) in one amqp-value section; one
sent settled detaches the link with ``amqp:illegal-state`` (4.2).  Errors are the ``rejected``
outcome carrying a transaction error (4.5.8): ``amqp:transaction:unknown-id`` for a txn-id this
connection did not declare (or already discharged), ``amqp:transaction:rollback`` for a commit that
cannot be done (the transaction was marked failed, a link that did its work is gone, the exchange
or queue a held publish goes to was deleted).

*Transactional work* (4.4).  Posting (4.4.1): a transfer whose state is ``transactional-state(txn-id)``
is checked as any publish (address, permission), then *held here*, not published; the controller is
told the presumptive outcome at once, ``transactional-state(txn-id, accepted)``.  Retirement
(4.4.2): a disposition of one of our deliveries with ``transactional-state(txn-id, outcome)`` is
recorded with the transaction; nothing is sent to the core.  Acquisition (4.4.3, a ``txn-id`` in a
flow's properties) is not supported: 4.4.3 lets a resource refuse it, and the link is detached with
``amqp:not-implemented`` as it requires (links.py, ``OutgoingLink.on_flow``).

*Commit* (discharge with fail=false): every held publish and every retirement of the transaction go
to the core as ONE ``TxCommit`` (store/core/delivery.py ``tx_commit``): one log entry, applied on every
node at the same point, so the work is atomic across queues, links and sessions.  Publishes use the
coordinator's core session (alive for as long as the transaction can be discharged); settlements use
the core session of the link that sent the delivery (``MessageSettle`` applies to that session's
transfers).  Before it is submitted, every such link must still be attached -- a link that detached
returned its deliveries to their queues, so its part of the work can no longer be done and the
discharge is rejected with ``amqp:transaction:rollback`` (4.4.4.1: the resource "MUST NOT allow the
successful discharge").  A connection submits its commands in order, so a link detach after that
check is in the log after the commit.  The discharge is answered once the core applied the commit,
in a cluster once the entry is committed by a majority: ``accepted`` then means done and durable.
Deliveries the controller retired without settling are then settled by us with their outcome (4.4.2:
"the resource will apply the given outcome and can immediately settle the transfers").

*Rollback* (discharge with fail=true, a rejected commit, the coordinator link detached or its session
ended -- 4.1 "all such transactions are immediately rolled back"): held publishes are dropped; a
delivery the controller settled in the transaction gets the source's default outcome, released
(4.4.4.2 "the resource MUST apply the default outcome"); one it did not settle stays acquired by the
controller, which may settle it again (4.4.2).  A closed or lost connection needs nothing more: its
core sessions go with it and return every unsettled delivery, and nothing held here was published.

*Leader kill* (cluster): the commit entry is proposed through the log like any command and is
re-proposed after a leader change with the same batch id, applied once (raft/cluster.py).  A client
whose node keeps its connection gets the discharge outcome once the entry is applied -- never before.
If its node closes the connection first (no leader for ``leaderless_close_after``), the client's
transaction is *in doubt*: the commit is then all or nothing (one entry) and is never applied twice,
and the client must look at the queues to learn which.

*Bounds*: held publishes are node memory, so a connection's open transactions together hold at most
``amqp10_tx_max_messages`` publishes and ``amqp10_tx_max_bytes`` of their bodies (node/config.py); a
publish beyond is rejected with ``amqp:resource-limit-exceeded`` and its transaction is marked failed
(its commit is rejected with ``amqp:transaction:rollback``).  A connection holds at most
``amqp10_tx_max_open`` undischarged transactions; a declare beyond is rejected with
``amqp:resource-limit-exceeded``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import DecodeError
from raftmq.store.core import queries as Q
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import MessageSettle, Publish, TxCommit
from raftmq.store.core.sessions import (
    SETTLE_ACCEPT,
    SETTLE_REJECT,
    SETTLE_RELEASE,
    SETTLE_RELEASE_REDELIVERED,
)

from .links import FIRST, Link
from .session import SERIAL, error

if TYPE_CHECKING:
    from .connection import Amqp10Connection
    from .links import IncomingLink, OutgoingLink
    from .session import Session

log = logging.getLogger(__name__)

LOCAL = t.Symbol("amqp:local-transactions")
OFFERED = (LOCAL, t.Symbol("amqp:multi-txns-per-ssn"), t.Symbol("amqp:multi-ssns-per-txn"))
REFUSED = frozenset(("amqp:distributed-transactions", "amqp:promotable-transactions"))
CONTROL_CREDIT = 64  # control messages the controller may send before we top its credit up
MAX_CONTROL_MESSAGE = 64 * 1024  # a declare or discharge is a few dozen bytes

UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"


def is_coordinator(attach) -> bool:
    """A controller's attach to the coordinator (4.2): the client sends, to a coordinator target."""
    return not attach.role and isinstance(attach.target, p.Coordinator)


def settle_how(outcome) -> int:
    """The core settlement for a terminal outcome (as links.OutgoingLink.on_outcome maps them)."""
    cls = outcome.__class__
    if cls is p.Released:
        return SETTLE_RELEASE
    if cls is p.Rejected:
        return SETTLE_REJECT
    if cls is p.Modified:
        if outcome.undeliverable_here:
            return SETTLE_REJECT
        return SETTLE_RELEASE_REDELIVERED if outcome.delivery_failed else SETTLE_RELEASE
    return SETTLE_ACCEPT


@dataclass
class Retirement:
    """Outcomes the controller gave deliveries of one outgoing link in a transaction (4.4.2)."""

    link: OutgoingLink
    transfer_ids: list[int]
    how: int
    outcome: object
    settled: bool  # the controller settled them (else we settle once committed)
    delivery_ids: list[int]  # the session's delivery ids (for our settling disposition)


@dataclass
class Transaction:
    txn_id: bytes
    coordinator: CoordinatorLink
    publishes: list[Publish] = field(default_factory=list)
    held_bytes: int = 0
    retirements: list[Retirement] = field(default_factory=list)
    failed: str | None = None  # why the transaction can only roll back


class Registry:
    """A connection's undischarged transactions by txn-id (multi-ssns-per-txn: the connection's)."""

    def __init__(self) -> None:
        self.open: dict[bytes, Transaction] = {}
        self.next_id = 0

    def held(self) -> tuple[int, int]:
        """Publishes and body bytes the connection's open transactions hold (the bounds' measure)."""
        return (sum(len(txn.publishes) for txn in self.open.values()),
                sum(txn.held_bytes for txn in self.open.values()))

    def declare(self, coordinator: CoordinatorLink) -> Transaction:
        self.next_id += 1
        txn = Transaction(b"txn-%d" % self.next_id, coordinator)
        self.open[txn.txn_id] = txn
        return txn


def registry(conn: Amqp10Connection) -> Registry:
    reg = getattr(conn, "amqp10_transactions", None)
    if reg is None:
        reg = Registry()
        conn.amqp10_transactions = reg
    return reg


def _txn_id(state) -> bytes | None:
    txn_id = state.txn_id
    return bytes(txn_id) if isinstance(txn_id, (bytes, bytearray)) else None


# ---------------------------------------------------------------------------- hooks for links.py

def post(link: IncomingLink, delivery_id: int, settled: bool, state, command: Publish) -> None:
    """4.4.1: a checked publish of ``link`` carrying ``transactional-state``: held by its transaction."""
    conn = link.conn
    reg = registry(conn)
    txn = reg.open.get(_txn_id(state))
    if txn is None:
        link._outcome(delivery_id, settled, p.Rejected(error=error(UNKNOWN_ID, "no such transaction")))
        return
    tid = txn.txn_id
    if txn.failed is not None:
        link._outcome(delivery_id, settled, p.TransactionalState(
            txn_id=tid, outcome=p.Rejected(error=error(ROLLBACK, txn.failed))))
        return
    config = conn.config
    size = len(command.body)
    messages, held_bytes = reg.held()
    if messages >= config.amqp10_tx_max_messages or held_bytes + size > config.amqp10_tx_max_bytes:
        txn.failed = (f"the connection's transactions would hold more than {config.amqp10_tx_max_messages} "
                      f"messages or {config.amqp10_tx_max_bytes} bytes")
        link._outcome(delivery_id, settled, p.TransactionalState(
            txn_id=tid, outcome=p.Rejected(error=error("amqp:resource-limit-exceeded", txn.failed))))
        return
    txn.publishes.append(command)
    txn.held_bytes += size
    link._outcome(delivery_id, settled, p.TransactionalState(txn_id=tid, outcome=p.Accepted()))


def retire(link: OutgoingLink, transfer_ids: list[int], state, settled: bool, first: int, last: int) -> None:
    """4.4.2: the controller's transactional outcome for deliveries of ``link``, applied on commit."""
    conn = link.conn
    txn = registry(conn).open.get(_txn_id(state))
    if txn is None:
        # No rejected outcome can answer a disposition: the link ends with the error (its unsettled
        # deliveries return to the queue).
        link.session.detach_link(link, error(UNKNOWN_ID, "a disposition names an unknown transaction"))
        return
    outcome = state.outcome
    if outcome is None:
        if settled:  # settled with no outcome: the default outcome, applied with the transaction
            outcome = p.Released()
        else:
            return  # says nothing yet
    span = (last - first) % SERIAL
    delivery_ids = [] if settled else [d for d, (lk, _) in link.session.unsettled.items()
                                       if lk is link and (d - first) % SERIAL <= span]
    txn.retirements.append(Retirement(link, list(transfer_ids), settle_how(outcome), outcome, settled,
                                      delivery_ids))


# ---------------------------------------------------------------------------- the coordinator link

class CoordinatorLink(Link):
    """The control link (4.2): declares and discharges the connection's transactions."""

    def __init__(self, session: Session, attach) -> None:
        super().__init__(session, attach)
        self.credit = 0
        self.delivery_count = attach.initial_delivery_count or 0
        self.parts: list[bytes] = []
        self.part_bytes = 0
        self.current = None

    def attach(self):
        a = self.attach_frame
        desired = set(a.target.capabilities or ()) | set(a.desired_capabilities or ())
        refused = sorted(str(c) for c in desired if c in REFUSED)
        if refused:
            self._refuse("amqp:not-implemented", f"{', '.join(refused)} not supported: local transactions only")
            return None
        self._core_attach()  # the core session the commits (and their publishes) run on
        self.session.send_attach(p.Attach(
            name=a.name, handle=self.handle, role=True, snd_settle_mode=a.snd_settle_mode,
            rcv_settle_mode=FIRST, source=a.source, target=p.Coordinator(capabilities=list(OFFERED)),
            offered_capabilities=list(OFFERED)))
        self._grant()
        return self

    def _grant(self) -> None:
        self.credit = CONTROL_CREDIT
        self.session.send_flow({"handle": self.handle, "delivery_count": self.delivery_count,
                                "link_credit": self.credit})

    def release(self) -> None:
        """4.1: the control link closed: the transactions it declared roll back."""
        if self.alive:
            reg = registry(self.conn)
            for txn_id in [i for i, txn in reg.open.items() if txn.coordinator is self]:
                rollback(reg.open.pop(txn_id))
        super().release()

    def on_transfer(self, transfer, payload: bytes) -> None:
        if self.current is None:
            if transfer.delivery_id is None:
                from .session import SessionError
                raise SessionError("amqp:invalid-field", "the first transfer of a delivery needs a delivery-id")
            self.current = transfer
            if self.credit <= 0:
                self.session.detach_link(self, error("amqp:link:transfer-limit-exceeded", "no link credit"))
                return
        if transfer.aborted:
            self._reset()
            return
        self.part_bytes += len(payload)
        if self.part_bytes > MAX_CONTROL_MESSAGE:
            self._reset()
            self.session.detach_link(self, error("amqp:link:message-size-exceeded",
                                                 f"a control message is at most {MAX_CONTROL_MESSAGE} bytes"))
            return
        self.parts.append(payload)
        if transfer.more:
            return
        first, data = self.current, b"".join(self.parts)
        self._reset()
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % SERIAL
        if first.settled:  # 4.2: the controller must hear the outcome
            self.session.detach_link(self, error("amqp:illegal-state", "a control message must not be sent settled"))
            return
        self._control(first.delivery_id, data)
        if self.credit < CONTROL_CREDIT // 2 and self.alive:
            self._grant()

    def _reset(self) -> None:
        self.current = None
        self.parts = []
        self.part_bytes = 0

    def _answer(self, delivery_id: int, state) -> None:
        if self.alive:
            self.session.disposition(delivery_id, True, state)

    def _control(self, delivery_id: int, data: bytes) -> None:
        try:
            body = None
            for section in p.decode_sections(data, self.conn.config.amqp10_max_message_elements):
                if isinstance(section, p.AmqpValue):
                    body = p.from_described(section.value)
        except DecodeError as exc:
            return self._answer(delivery_id, p.Rejected(error=error(exc.condition, exc.text)))
        if isinstance(body, p.Declare):
            return self._declare(delivery_id, body)
        if isinstance(body, p.Discharge):
            return self._discharge(delivery_id, body)
        self._answer(delivery_id, p.Rejected(error=error(
            "amqp:decode-error", "a control message is a declare or a discharge in an amqp-value (4.2, 4.3)")))

    def _declare(self, delivery_id: int, declare) -> None:
        if declare.global_id is not None:
            return self._answer(delivery_id, p.Rejected(error=error(
                "amqp:not-implemented", "distributed transactions (global-id) are not supported")))
        reg = registry(self.conn)
        limit = self.conn.config.amqp10_tx_max_open
        if len(reg.open) >= limit:
            return self._answer(delivery_id, p.Rejected(error=error(
                "amqp:resource-limit-exceeded", f"a connection may have at most {limit} open transactions")))
        txn = reg.declare(self)
        self._answer(delivery_id, p.Declared(txn_id=txn.txn_id))

    def _discharge(self, delivery_id: int, discharge) -> None:
        reg = registry(self.conn)
        txn = reg.open.pop(_txn_id(discharge), None)
        if txn is None:
            return self._answer(delivery_id, p.Rejected(error=error(UNKNOWN_ID, "no such transaction")))
        if discharge.fail:
            rollback(txn)
            return self._answer(delivery_id, p.Accepted())  # 4.3: a rollback can always be done
        if self._partial_posting(txn.txn_id):
            rollback(txn)  # 4.4.1: a discharge with a partial delivery posted ends the control link
            self.session.detach_link(self, error(ROLLBACK, "a delivery of the transaction is incomplete"))
            return
        reason = txn.failed or next((f"link '{r.link.name}' detached before the commit" for r in txn.retirements
                                     if not r.link.alive), None) or self._gone_target(txn)
        if reason is not None:
            rollback(txn)
            return self._answer(delivery_id, p.Rejected(error=error(ROLLBACK, reason)))
        operations = commit_operations(txn)
        if not operations:
            return self._answer(delivery_id, p.Accepted())
        conn = self.conn

        def applied(result: tuple) -> None:
            if result[0] != 0:  # refused as a whole: nothing of it was applied
                rollback(txn)
                return self._answer(delivery_id, p.Rejected(error=error(ROLLBACK, str(result[2]))))
            settle_after_commit(txn)
            self._answer(delivery_id, p.Accepted())
        conn.request(TxCommit(conn.conn_id, None, self.core, operations), applied)

    def _gone_target(self, txn: Transaction) -> str | None:
        """A held publish whose exchange (or, through the default exchange, queue) was deleted since it
        was posted: the presumptive outcome no longer holds (4.4.4.1), so the commit is refused.  (This
        node's view: a deletion racing the commit is applied as the core applies it -- dropped.)"""
        machine, vhost = self.conn.broker.machine, self.conn.vhost
        for cmd in txn.publishes:
            if not Q.has_exchange(machine, vhost, cmd.exchange):
                return f"exchange '{cmd.exchange}' was deleted"
            if not cmd.exchange and not Q.has_queue(machine, vhost, cmd.routing_key):
                return f"queue '{cmd.routing_key}' was deleted"
        return None

    def _partial_posting(self, txn_id: bytes) -> bool:
        for session in self.conn.sessions.values():
            for link in session.links.values():
                current = getattr(link, "current", None)
                if (link is not self and current is not None and isinstance(current.state, p.TransactionalState)
                        and _txn_id(current.state) == txn_id):
                    return True
        return False


def commit_operations(txn: Transaction) -> list:
    """The core commands of a commit: held publishes on the coordinator's core session, then one
    MESSAGE_SETTLE per link and outcome on that link's core session."""
    conn_id, core = txn.coordinator.conn.conn_id, txn.coordinator.core
    operations: list = [cmd._replace(conn=conn_id, token=None, channel=core) for cmd in txn.publishes]
    grouped: dict[tuple[int, int], list[int]] = {}
    for r in txn.retirements:
        grouped.setdefault((r.link.core, r.how), []).extend(r.transfer_ids)
    for (channel, how), transfer_ids in grouped.items():
        ranges = [list(x) for x in rs.from_ids(sorted(set(transfer_ids)))]
        operations.append(MessageSettle(conn_id, None, channel, ranges, how))
    return operations


def settle_after_commit(txn: Transaction) -> None:
    """Deliveries the controller retired unsettled: settled by us with the outcome (4.4.2)."""
    for r in txn.retirements:
        if r.settled or not r.link.alive:
            continue
        session = r.link.session
        for delivery_id in r.delivery_ids:
            if session.unsettled.pop(delivery_id, None) is not None:
                session.conn.send(session.channel, p.Disposition(role=False, first=delivery_id, settled=True,
                                                                 state=r.outcome))


def rollback(txn: Transaction) -> None:
    """Drop the held publishes; settled retirements take the default outcome, released (4.4.4.2)."""
    txn.publishes.clear()
    txn.held_bytes = 0
    grouped: dict[object, list[int]] = {}
    for r in txn.retirements:
        if r.settled and r.link.alive:
            grouped.setdefault(r.link, []).extend(r.transfer_ids)
    txn.retirements.clear()
    for link, transfer_ids in grouped.items():
        ranges = [list(x) for x in rs.from_ids(sorted(set(transfer_ids)))]
        link.conn.broker.submit(MessageSettle(link.conn.conn_id, None, link.core, ranges, SETTLE_RELEASE))
