"""Queue groups on the node side (issue 34): which group a command goes to, joining the groups'
replies, and forwarding the outboxes between groups.  No I/O here: the broker hands commands to
the groups' logs and outputs to connections; this module decides.

- :class:`GroupRouter` splits a front end's command into ``(group, command)`` pairs from the
  node's view of the topology (the metadata group's machine): metadata commands go to the metadata
  group, a queue's operations to its group, a publish to every group it routes to, acks by the
  groups of their deliveries, channel and connection life to every group.
- :class:`ReplyJoin` turns the replies of several groups to one token into the one reply the
  client expects: the publish outcome every queue of it would have given in one group, a declare's
  counts from the queue's own group, the first refusal.  A group says when more replies will come
  for a token (``GroupPending``: the metadata group forwards a change to the queue groups).
- :func:`forward_entries` and :func:`gone_entries` are what the forwarder proposes: the metadata
  outbox entries a queue group has not applied, the deletions the metadata group has not taken in.

Promises not kept across groups yet (docs/design.md, "Sharded Raft groups"): a transaction whose
operations touch queues of several groups is refused (540); AMQP 0-10 sessions, 1.0 durable links
and queries go to the metadata group, so their queues belong there (``x-queue-group: 0``); a
dead-lettered or delayed message reaches only the queues of its own group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftmq.store.core.commands import (
    ERR,
    OK,
    OUT_REPLY,
    REJECTED,
    ROUTED,
    UNROUTABLE,
    Ack,
    DeclaredQueue,
    MetaApply,
    Nack,
    Ok,
    Op,
    QueueGone,
    Refused,
)
from raftmq.store.core.exchange_types import PLUGIN_TYPES
from raftmq.store.core.groups import META_GROUP, META_OPS, GroupPending
from raftmq.store.core.model import Message

if TYPE_CHECKING:
    from raftmq.store.core.machine import StateMachine

log = logging.getLogger(__name__)

# Commands that every group applies: the life of channels and connections (a channel's consumers
# and deliveries may be in any group), and the node's own resets.
_EVERY_GROUP = frozenset((Op.CHANNEL_OPEN, Op.CHANNEL_CLOSE, Op.CONNECTION_CLOSE, Op.QOS, Op.FLOW,
                          Op.RECOVER, Op.CANCEL, Op.NODE_RESET))
# A queue's contents: its group only (found by the queue's name).
_BY_QUEUE_NAME = {Op.CONSUME: "queue", Op.GET: "queue", Op.QUEUE_PURGE: "name", Op.QUEUE_DELETE: "name"}

# Their group may answer "more replies will come" (GroupPending): the metadata group forwarding a
# change, a queue's group deleting it.
_MAY_PEND = META_OPS | {Op.QUEUE_DELETE}

REPORT_GONE = 256  # outbox entries a worker's report carries at most (the forwarder asks again)
REPORT_BYTES = 4 << 20  # message-outbox body bytes a report carries at most

NOT_ACROSS = Refused(ERR, 540, "NOT_IMPLEMENTED - a transaction on queues of several groups (issue 34)")


class GroupRouter:
    """Where each command goes, read from ``view()`` (the metadata group's machine on this node)."""

    def __init__(self, view: Callable[[], StateMachine], count: int) -> None:
        self.view = view
        self.count = count
        self.every = tuple(range(count))

    def route(self, command: Any) -> list[tuple[int, Any]] | Refused:
        """``(group, command)`` pairs for ``command``, or the refusal to answer it with."""
        op = command.op
        if op == Op.PUBLISH:
            return [(group, command) for group in self.publish_groups(command)]
        if op in _BY_QUEUE_NAME:
            return [(self.queue_group(command.vhost, getattr(command, _BY_QUEUE_NAME[op])), command)]
        if op == Op.ACK or op == Op.NACK:
            return self._split_refs(command)
        if op in _EVERY_GROUP:
            return [(group, command) for group in self.every]
        if op == Op.SESSION_WINDOW_CREDIT:
            return self._credit_groups(command)
        if op == Op.TX_COMMIT:
            groups: set[int] = set()
            for operation in command.operations:
                routed = self.route(operation)
                if isinstance(routed, Refused):
                    return routed
                groups.update(group for group, _part in routed)
            if len(groups) > 1:
                return NOT_ACROSS
            return [(groups.pop() if groups else META_GROUP, command)]
        # Metadata (decided and forwarded by the metadata group), 0-10 sessions, 1.0 links' own
        # commands, queries: the metadata group.
        return [(META_GROUP, command)]

    def _credit_groups(self, command: Any) -> list[tuple[int, Any]]:
        """Credit for a consumer (0-10 window credit, a 0-9-1 auto-ack consumer's top-up,
        node/amqp091/autoack.py) goes where the consumer is: the metadata group for a session's
        subscription (the view has it), else the queue groups (a consumer lives in its queue's
        group only, which the view does not see; the others ignore credit for a consumer they do
        not have, store/core/sessions.py).  Sent to the metadata group alone, an auto-ack
        consumer of a queue group's queue got no credit after its first slice and stalled."""
        ch = self.view().channels.get(command.conn, {}).get(command.channel)
        if ch is not None and command.destination in ch.consumers:
            return [(META_GROUP, command)]
        return [(group, command) for group in self.every[1:]] or [(META_GROUP, command)]

    def queue_group(self, vhost_name: str, name: str) -> int:
        vhost = self.view().vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue.group if queue is not None else META_GROUP

    def publish_groups(self, command: Any) -> list[int]:
        """The groups holding a queue the publish routes to (in the view), or the metadata group
        alone, which answers unroutable (or the exchange's refusal)."""
        m = self.view()
        vhost = m.vhosts.get(command.vhost)
        exchange = vhost.exchanges.get(command.exchange) if vhost is not None else None
        if vhost is None or exchange is None or exchange.type in PLUGIN_TYPES:
            # (a deduplicating or delayed exchange: the metadata group holds its cache and its
            # held messages, and sends the copies on through its message outbox)
            return [META_GROUP]
        probe = Message(0, command.exchange, command.routing_key, command.properties, 0, False, 0, 0, 0,
                        command.properties_format)
        groups = sorted({queue.group for queue in m.topology.route(vhost, exchange, command.routing_key, probe)})
        return groups or [META_GROUP]

    def _split_refs(self, command: Ack | Nack) -> list[tuple[int, Any]]:
        queues = self.view().queues_by_id
        parts: dict[int, list] = {}
        for ref in command.refs:
            queue = queues.get(ref[0])
            parts.setdefault(queue.group if queue is not None else META_GROUP, []).append(ref)
        if len(parts) <= 1:
            return [(next(iter(parts), META_GROUP), command)]
        return [(group, command._replace(refs=refs)) for group, refs in sorted(parts.items())]


@dataclass(slots=True)
class _Join:
    op: int
    expected: int
    channel: int | None
    result: Any = None


class ReplyJoin:
    """The replies to one client token from several groups, merged into the one the client gets."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, int], _Join] = {}

    def expect(self, conn: str, token: int | None, op: int, groups: int, channel: int | None) -> None:
        """A command from ``conn`` with ``token`` went to ``groups`` groups.  Joined: several
        groups, and the commands whose group may announce more replies (``GroupPending``)."""
        if token is not None and (groups > 1 or op in _MAY_PEND):
            self.pending[(conn, token)] = _Join(op, groups, channel)

    def take(self, out: tuple) -> tuple | None:
        """An ``OUT_REPLY`` output: the reply to hand on (None while other groups still owe one)."""
        key = (out[0], out[2])
        join = self.pending.get(key)
        if join is None:
            value = out[3][1] if out[3][0] == OK else None
            if isinstance(value, GroupPending):  # a lone group's pending reply: no join was expected
                return (out[0], OUT_REPLY, out[2], Ok(OK, value.value), out[4])
            return out
        result = out[3]
        join.expected -= 1
        if result[0] == OK and isinstance(result[1], GroupPending):
            join.expected += result[1].more
            result = Ok(OK, result[1].value)
        join.result = result if join.result is None else merge(join.op, join.result, result)
        if join.expected > 0:
            return None
        del self.pending[key]
        return (out[0], OUT_REPLY, out[2], join.result, out[4] if out[4] is not None else join.channel)


def merge(op: int, a: Any, b: Any) -> Any:
    """Two groups' results for one command, as one group holding both parts would have answered."""
    if a[0] != OK:
        return a
    if b[0] != OK:
        return b
    va, vb = a[1], b[1]
    if op == Op.PUBLISH:
        # A queue that refused (reject-publish) nacks the publish; else routed if any group routed.
        for outcome in (REJECTED, ROUTED):
            if outcome in (va, vb):
                return Ok(OK, outcome)
        return Ok(OK, UNROUTABLE)
    if isinstance(va, DeclaredQueue) and isinstance(vb, DeclaredQueue):
        return Ok(OK, DeclaredQueue(va.queue, max(va.message_count, vb.message_count),
                                    max(va.consumer_count, vb.consumer_count)))
    if isinstance(va, int) and isinstance(vb, int):
        return Ok(OK, max(va, vb))
    return Ok(OK, va if va is not None else vb)


def forward_entries(meta: StateMachine, group: StateMachine, limit: int = 256) -> list[MetaApply]:
    """The metadata outbox entries ``group`` has not applied yet, as the commands to propose to it."""
    after = group.meta_applied
    out = []
    for seq, command, placed in meta.meta_outbox:
        if seq > after:
            out.append(MetaApply(None, None, seq, command, placed))
            if len(out) >= limit:
                break
    return out


def gone_entries(meta: StateMachine, group: StateMachine, limit: int = 256) -> list[QueueGone]:
    """The deletions of ``group`` the metadata group has not taken in yet."""
    after = meta.gone_applied.get(group.group, 0)
    return [QueueGone(None, None, group.group, seq, qid, conn, token)
            for seq, qid, conn, token in list(group.gone_outbox)[:limit] if seq > after]


def outbox_messages(m: Any, bodies: Any, limit: int = REPORT_GONE, max_bytes: int = REPORT_BYTES) -> list:
    """The message outbox's first entries as the forwarder sends them on: (target, seq, qids,
    fields, body), bounded in count and body bytes (the rest goes with a later report)."""
    out, size = [], 0
    for target, seq, qids, message, expiration in m.msg_outbox:
        body = bodies.for_send(message.id)
        if body is None:  # (gone or damaged: the target gets what the source can prove)
            log.error("group %d: no body for message %d sent to group %d", m.group, message.id, target)
            continue
        out.append((target, seq, qids, (message.exchange, message.routing_key, message.properties,
                                        message.persistent, message.priority, expiration, message.format,
                                        message.published_at), body))
        size += len(body)
        if len(out) >= limit or size >= max_bytes:
            break
    return out
