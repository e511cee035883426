"""AMQP 0-10 sessions and 1.0 links with queue groups (issue 34): which group executes what.

With ``G > 1`` groups (store/core/groups.py) a session is state in **every** group: the front end
sends its life (attach, detach, timeout, tx.select, known-completed) and every ``SESSION_COMMAND``
to every group (node/groups.py), so each group holds a replica of the session record with its own
idempotence barrier.  Each group records every command id in its barrier, but executes the inner
command only if it is *its part* (:func:`session_part`, decided from the group's own replicated
state, so every replica of a group decides alike):

- a subscription, a queue query, purge or delete: the group the queue is placed in (the metadata
  group if no group has the queue: it gives the refusal);
- a publish: every group, each storing the copies of its own queues (as a 0-9-1 publish sent to
  several groups; ``NOT_HERE`` where none is), except to a plugin exchange: the metadata group;
- credit, flush, stop and cancel of a subscription: the group holding the subscription;
- settlements: every group, each settling the transfers it numbered (the others' ids are unknown
  there and ignored); message.acquire: the group of its first transfer id;
- a transaction: the one group its operations touch (the front end refuses one across groups);
- anything else (declares, bindings, exchange queries): the metadata group, which decides and
  forwards metadata as for 0-9-1.

So the barriers of all groups hold the same ids once every group applied a command, and a client
resuming after a failover is told complete exactly the commands every group applied (the front
end intersects the groups' barriers): a command one group applied and another did not is replayed
and deduplicated in the first, executed in the second -- exactly once in each.

**Transfer ids.**  A session's outgoing ids (0-10 transfers and execution results, the delivery tags
of 1.0 durable links) are numbered in apply, by whichever group delivers: group ``g`` numbers
``g, g + G, g + 2G, ...`` (:func:`first_transfer`, step ``G``), so ids of different groups never
meet, and the front end finds a settlement's group as ``id % G`` without asking anyone.  With one
group this is today's numbering (0, 1, 2, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import ranges as rs
from .commands import Op
from .entries import Message
from .exchange_types import PLUGIN_TYPES
from .groups import META_GROUP

if TYPE_CHECKING:
    from .machine import StateMachine
    from .model import Session

# Session commands of one subscription, executed where the subscription is.
SUBSCRIPTION_OPS = frozenset((Op.MESSAGE_FLOW, Op.MESSAGE_FLOW_MODE, Op.MESSAGE_STOP, Op.MESSAGE_FLUSH, Op.CANCEL,
                              Op.SESSION_WINDOW_CREDIT))
# Session commands on one queue's contents, by the field naming the queue.
QUEUE_FIELD = {Op.MESSAGE_SUBSCRIBE: "queue", Op.QUEUE_QUERY: "name", Op.QUEUE_PURGE: "name",
               Op.QUEUE_DELETE: "name"}
# Commands with transfer ids in ``ranges`` (the group that numbered them holds them).
TRANSFER_OPS = frozenset((Op.MESSAGE_SETTLE, Op.MESSAGE_MODIFY, Op.MESSAGE_ACQUIRE))


def first_transfer(m: StateMachine) -> int:
    """The first outgoing id of a new session in this group."""
    return m.group if m.group_count > 1 else 0


def transfer_group(transfer_id: int, count: int) -> int:
    """The group that numbered ``transfer_id`` (module docstring: group ``g``'s ids are ``g mod G``)."""
    return transfer_id % count if count > 1 else META_GROUP


def queue_group(m: StateMachine, vhost_name: Any, name: Any) -> int:
    """The group of queue ``name`` in this group's copy of the topology (the metadata group if
    there is none: it answers the refusal)."""
    vhost = m.vhosts.get(vhost_name) if isinstance(vhost_name, str) else None
    queue = vhost.queues.get(name) if vhost is not None and isinstance(name, str) else None
    return queue.group if queue is not None else META_GROUP


def publish_groups(m: StateMachine, publish: Any) -> set[int] | None:
    """The groups a publish is for (None: every group, each storing its own queues' copies)."""
    vhost = m.vhosts.get(publish.vhost)
    exchange = vhost.exchanges.get(publish.exchange) if vhost is not None else None
    if exchange is None or exchange.type in PLUGIN_TYPES:
        return {META_GROUP}  # refused there (no exchange), or the plugin exchange's home
    return None


def session_part(m: StateMachine, conn: str, number: int, inner: Any) -> bool:
    """Whether this group executes ``inner``, a command of session ``(conn, number)`` (module
    docstring).  Only called with more than one group."""
    op = inner.op
    group = m.group
    if op == Op.PUBLISH:
        groups = publish_groups(m, inner)
        return groups is None or group in groups
    field = QUEUE_FIELD.get(op)
    if field is not None:
        return queue_group(m, inner.vhost, getattr(inner, field)) == group
    if op in SUBSCRIPTION_OPS:
        ch = m.channels.get(conn, {}).get(number)
        tag = inner.consumer_tag if op == Op.CANCEL else inner.destination
        return ch is not None and tag in ch.consumers
    if op == Op.MESSAGE_SETTLE or op == Op.MESSAGE_MODIFY:
        return True  # each group settles the ids it numbered; the others' are unknown here
    if op == Op.MESSAGE_ACQUIRE:
        first = next(rs.ids(inner.ranges), None)
        return transfer_group(first, m.group_count) == group if first is not None else group == META_GROUP
    if op == Op.TX_COMMIT:
        groups = tx_groups(m, inner.operations)
        return group in groups if groups else group == META_GROUP
    return group == META_GROUP


def tx_groups(m: StateMachine, operations: list) -> set[int]:
    """The groups a transaction's operations touch, as this group's copy of the topology sees them."""
    groups: set[int] = set()
    for operation in operations:
        op = operation.op
        if op == Op.PUBLISH:
            found = publish_groups(m, operation)
            if found is None:
                vhost = m.vhosts[operation.vhost]
                exchange = vhost.exchanges[operation.exchange]
                probe = Message(0, operation.exchange, operation.routing_key, operation.properties, 0, False, 0, 0,
                                0, operation.properties_format)
                found = {queue.group for queue in m.topology.route(vhost, exchange, operation.routing_key, probe)}
            groups.update(found)
        elif op in TRANSFER_OPS:
            groups.update(transfer_group(i, m.group_count) for i in rs.ids(operation.ranges))
        else:
            groups.add(META_GROUP)
    return groups


def merge_attached(a: Any, b: Any) -> Any:
    """Two groups' ``SessionAttached`` as one: resumed if any group had the session, complete the
    commands every group applied (their barriers' intersection) and the 0-10 commits across groups
    the metadata group committed (``decided``: the other groups execute nothing for those, so a
    barrier entry lost in one of them must not make the client replay a commit that happened),
    every group's unsettled transfers in id order, transactional if any group says so."""
    from .commands import SessionAttached, SessionBusy

    if isinstance(a, SessionBusy) or not isinstance(b, SessionAttached):
        return a
    if isinstance(b, SessionBusy) or not isinstance(a, SessionAttached):
        return b
    completed = intersect(a.completed, b.completed)
    decided = a.decided or b.decided  # (the metadata group's alone: store/core/tx_groups.py)
    for lo, hi in decided:
        rs.add(completed, lo, hi)
    return SessionAttached(a.resumed or b.resumed, completed, sorted(a.replay + b.replay, key=lambda r: r[0]),
                           a.transactional or b.transactional, decided)


def intersect(a: list, b: list) -> list[list[int]]:
    """The intersection of two sorted lists of disjoint ``[lo, hi]`` ranges."""
    out: list[list[int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def next_id(session: Session, count: int) -> int:
    """Take the session's next outgoing id (step ``count``: the number of groups)."""
    transfer_id = session.next_transfer
    session.next_transfer = transfer_id + count
    return transfer_id
