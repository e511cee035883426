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

This module is the coordinator link; the transactional work the links hand over (posting,
retirement), the registry of open transactions, commit operations and rollback are txn_work.py,
which sits below links.py (the coordinator is a link, so links.py cannot import it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import DecodeError
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import TxCommit

from .links import FIRST, Link
from .session import SERIAL, SessionError, error
from .txn_work import (
    ROLLBACK,
    UNKNOWN_ID,
    Transaction,
    commit_operations,
    registry,
    rollback,
    settle_after_commit,
    txn_id_of,
)

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)

LOCAL = t.Symbol("amqp:local-transactions")
OFFERED = (LOCAL, t.Symbol("amqp:multi-txns-per-ssn"), t.Symbol("amqp:multi-ssns-per-txn"))
REFUSED = frozenset(("amqp:distributed-transactions", "amqp:promotable-transactions"))
CONTROL_CREDIT = 64  # control messages the controller may send before we top its credit up
MAX_CONTROL_MESSAGE = 64 * 1024  # a declare or discharge is a few dozen bytes


def is_coordinator(attach) -> bool:
    """A controller's attach to the coordinator (4.2): the client sends, to a coordinator target."""
    return not attach.role and isinstance(attach.target, p.Coordinator)


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
        txn = reg.open.pop(txn_id_of(discharge), None)
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
                        and txn_id_of(current.state) == txn_id):
                    return True
        return False
