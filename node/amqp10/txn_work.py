"""AMQP 1.0 transactional work (4.4) held by a connection's transactions, and its commit and rollback.

The half of local transactions that the links call (posting, 4.4.1, from ``IncomingLink``;
retirement, 4.4.2, from ``OutgoingLink``) and the operations a discharge turns the held work into.
The coordinator link that declares and discharges is transactions.py, which the module docstring
there describes as a whole; this module sits below links.py so that a link can hand its work over
without importing the coordinator (a link class), which is itself a link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftmq.protocol.amqp10 import performatives as p
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import MessageSettle, Publish
from raftmq.store.core.sessions import (
    SETTLE_ACCEPT,
    SETTLE_REJECT,
    SETTLE_RELEASE,
    SETTLE_RELEASE_REDELIVERED,
)

from .session import SERIAL, error

if TYPE_CHECKING:
    from .connection import Amqp10Connection
    from .links import IncomingLink, OutgoingLink
    from .transactions import CoordinatorLink

UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"


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


def txn_id_of(state) -> bytes | None:
    txn_id = state.txn_id
    return bytes(txn_id) if isinstance(txn_id, (bytes, bytearray)) else None


# ---------------------------------------------------------------------------- hooks for links.py

def post(link: IncomingLink, delivery_id: int, settled: bool, state, command: Publish) -> None:
    """4.4.1: a checked publish of ``link`` carrying ``transactional-state``: held by its transaction."""
    conn = link.conn
    reg = registry(conn)
    txn = reg.open.get(txn_id_of(state))
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
    txn = registry(conn).open.get(txn_id_of(state))
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


# ---------------------------------------------------------------------------- a discharge: commit, rollback

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
