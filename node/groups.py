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

AMQP 0-10 sessions and 1.0 links' core sessions (store/core/group_sessions.py): their life and every
session command to every group, each executing its part; a 1.0 link's subscription to its queue's
group, its credit after it, settlements to the groups that numbered the transfers (id mod G).

A transaction whose operations touch queues of several groups (0-9-1 tx.commit, a 1.0 discharge)
goes to the metadata group as a ``TxBegin`` for the two-phase commit (store/core/tx_groups.py,
node/tx_forward.py); a 0-10 tx.commit across groups is a ``SESSION_COMMAND`` around that ``TxBegin``,
to every group as every session command (the metadata group coordinates, the others keep the id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import (
    OK,
    OUT_REPLY,
    REJECTED,
    ROUTED,
    UNROUTABLE,
    Ack,
    DeclaredQueue,
    Duplicate,
    MetaApply,
    Nack,
    Ok,
    Op,
    QueueGone,
    Refused,
    TxBegin,
    TxCommit,
)
from raftmq.store.core.exchange_types import PLUGIN_TYPES
from raftmq.store.core.group_sessions import SUBSCRIPTION_OPS, merge_attached, transfer_group
from raftmq.store.core.groups import META_GROUP, META_OPS, GroupEcho, GroupPending
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

# The life of an AMQP 0-10 session (a 1.0 link's core session): a replica in every group
# (store/core/group_sessions.py), like a channel's.
_SESSION_LIFE = frozenset((Op.SESSION_ATTACH, Op.SESSION_DETACH, Op.SESSION_TIMEOUT, Op.SESSION_TX_SELECT,
                           Op.SESSION_KNOWN_COMPLETED))
# Their group may answer "more replies will come" (GroupPending): the metadata group forwarding a
# change, a queue's group deleting it.
_MAY_PEND = META_OPS | {Op.QUEUE_DELETE}

REPORT_BYTES = 4 << 20  # message-outbox body bytes a report carries at most

ROUTES_REMEMBERED = 4096  # publish routes kept at most (forgotten all at once beyond)


class GroupRouter:
    """Where each command goes, read from ``view()`` (the metadata group's machine on this node)."""

    def __init__(self, view: Callable[[], StateMachine], count: int) -> None:
        self.view = view
        self.count = count
        self.every = tuple(range(count))
        self._routes: dict[tuple[str, str, str], list[int]] = {}  # (vhost, exchange, key) -> groups
        self._version: tuple[int, int] | None = None  # the view's (identity, meta_seq) they hold for
        # The group of each session subscription this node routed: conn -> {(channel, destination):
        # group}, so that a 1.0 link's credit goes to its subscription's group alone (not known after
        # a durable link resumed here: then every group, each ignoring what it does not hold).
        self.subscriptions: dict[str, dict[tuple[int, str], int]] = {}

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
            if op == Op.CONNECTION_CLOSE:
                self.subscriptions.pop(command.conn, None)
            return [(group, command) for group in self.every]
        if op >= Op.SESSION_ATTACH and op <= Op.MESSAGE_MODIFY:  # (the session ops' numbers, commands.Op)
            routed = self._session(command)
            if routed is not None:
                return routed
        if op == Op.TX_COMMIT:
            return self._transaction(command)
        # Metadata (decided and forwarded by the metadata group), 0-10 sessions, 1.0 links' own
        # commands, queries: the metadata group.
        return [(META_GROUP, command)]

    def _transaction(self, command: TxCommit) -> list[tuple[int, Any]] | Refused:
        """A transaction within one group goes to it as it is (one log entry, as with one group);
        one over several groups goes to the metadata group as ``TxBegin``, split by group, for the
        two-phase commit (store/core/tx_groups.py)."""
        parts: dict[int, list[list]] = {}
        total = 0
        for operation in command.operations:
            routed = self.route(operation)
            if isinstance(routed, Refused):
                return routed
            for group, part in routed:
                ops_index = parts.setdefault(group, [[], []])
                ops_index[0].append(part)
                if operation.op == Op.PUBLISH:
                    ops_index[1].append(total)
            if operation.op == Op.PUBLISH:
                total += 1
        if len(parts) <= 1:
            return [(next(iter(parts), META_GROUP), command)]
        return [(META_GROUP, TxBegin(command.conn, None, command.channel, command.token, total,
                                     [[group, ops, index] for group, (ops, index) in sorted(parts.items())]))]

    def _session(self, command: Any) -> list[tuple[int, Any]] | Refused | None:
        """AMQP 0-10 sessions and 1.0 links (store/core/group_sessions.py): the session's life and its
        commands to every group (each executes its part), a 1.0 link's subscription to its queue's
        group, credit to the subscription's group, settlements to the groups that numbered the
        transfers.  None: not a session command (routed as the others)."""
        op = command.op
        if op == Op.SESSION_COMMAND:
            inner = command.inner
            if inner.op == Op.TX_COMMIT:
                routed = self._transaction(inner)
                if isinstance(routed, Refused):
                    return routed
                if routed[0][1].op == Op.TX_BEGIN:
                    # A 0-10 tx.commit across groups: the two-phase commit, its TxBegin in the session
                    # command (every group keeps the id in its barrier; the metadata group coordinates:
                    # store/core/tx_groups.py ``begin_session``).
                    command = command._replace(inner=routed[0][1])
            elif inner.op == Op.MESSAGE_SUBSCRIBE:
                self._subscribed(command.conn, command.channel, inner)
            return [(group, command) for group in self.every]
        if op in _SESSION_LIFE:
            if op == Op.SESSION_DETACH:
                subs = self.subscriptions.get(command.conn)
                if subs:
                    for key in [key for key in subs if key[0] == command.channel]:
                        del subs[key]
            return [(group, command) for group in self.every]
        if op == Op.MESSAGE_SUBSCRIBE:
            return [(self._subscribed(command.conn, command.channel, command), command)]
        if op in SUBSCRIPTION_OPS:
            group = self.subscriptions.get(command.conn, {}).get((command.channel, command.destination))
            if group is None:
                return [(group, command) for group in self.every]
            return [(group, command)]
        if op == Op.MESSAGE_SETTLE or op == Op.MESSAGE_MODIFY:
            return self._split_ranges(command)
        return None

    def _subscribed(self, conn: str, channel: int, subscribe: Any) -> int:
        group = self.queue_group(subscribe.vhost, subscribe.queue)
        self.subscriptions.setdefault(conn, {})[(channel, subscribe.destination)] = group
        return group

    def _split_ranges(self, command: Any) -> list[tuple[int, Any]]:
        """A settlement's transfer ids to the groups that numbered them (id mod G)."""
        parts: dict[int, list[int]] = {}
        count = self.count
        for transfer_id in rs.ids(command.ranges):
            parts.setdefault(transfer_group(transfer_id, count), []).append(transfer_id)
        if len(parts) <= 1:
            return [(next(iter(parts), META_GROUP), command)]
        return [(group, command._replace(ranges=[list(r) for r in rs.from_ids(ids)]))
                for group, ids in sorted(parts.items())]

    def queue_group(self, vhost_name: str, name: str) -> int:
        vhost = self.view().vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue.group if queue is not None else META_GROUP

    def publish_groups(self, command: Any) -> list[int]:
        """The groups holding a queue the publish routes to (in the view), or the metadata group
        alone, which answers unroutable (or the exchange's refusal).

        Remembered per (vhost, exchange, routing key) while the view's topology is unchanged (its
        metadata outbox sequence, which every topology change of the metadata group moves) and
        the route did not depend on the message (no headers exchange, no local-random exchange on
        the way): routing each publish again was a fifth of the main process's CPU under a
        confirm flood (py-spy, session 20)."""
        m = self.view()
        version = (id(m), m.meta_seq)
        if version != self._version:
            self._version = version
            self._routes.clear()
        key = (command.vhost, command.exchange, command.routing_key)
        groups = self._routes.get(key)
        if groups is not None:
            return groups
        vhost = m.vhosts.get(command.vhost)
        exchange = vhost.exchanges.get(command.exchange) if vhost is not None else None
        if vhost is None or exchange is None or exchange.type in PLUGIN_TYPES:
            # (a deduplicating or delayed exchange: the metadata group holds its cache and its
            # held messages, and sends the copies on through its message outbox)
            return [META_GROUP]
        found = m.topology.route_static(vhost, exchange, command.routing_key)
        static = found is not None
        if found is None:
            probe = Message(0, command.exchange, command.routing_key, command.properties, 0, False, 0, 0, 0,
                            command.properties_format)
            found = m.topology.route(vhost, exchange, command.routing_key, probe)
        groups = sorted({queue.group for queue in found}) or [META_GROUP]
        if static:
            if len(self._routes) >= ROUTES_REMEMBERED:
                self._routes.clear()
            self._routes[key] = groups
        return groups

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
    direct: int  # replies still owed by the groups the command went to
    channel: int | None
    echoes: int = 0  # echoes still owed (announced by GroupPending; below 0 when one came first)
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
        """An ``OUT_REPLY`` output: the reply to hand on (None while other groups still owe one).

        A group's own reply (``direct``) may announce echoes to come (``GroupPending.more``); an
        echo (``GroupEcho``) is another group's reply to the same token.  In a cluster the
        groups' replicas on the client's node apply at their own pace, so an echo may come before
        the reply that announces it: the join ends when both counts are zero."""
        key = (out[0], out[2])
        join = self.pending.get(key)
        result = out[3]
        value = result[1] if result[0] == OK else None
        if join is None:
            if isinstance(value, GroupEcho):  # (no join: nobody waits for it)
                return None
            if isinstance(value, GroupPending):  # a lone group's pending reply: no join was expected
                return (out[0], OUT_REPLY, out[2], Ok(OK, value.value), out[4])
            return out
        if isinstance(value, GroupEcho):
            join.echoes -= 1
            result = value.result
        else:
            join.direct -= 1
            if isinstance(value, GroupPending):
                join.echoes += value.more
                result = Ok(OK, value.value)
        join.result = result if join.result is None else merge(join.op, join.result, result)
        if join.direct > 0 or join.echoes != 0:
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
    if op == Op.SESSION_COMMAND:
        return Ok(OK, merge_session_values(va, vb))
    if op == Op.SESSION_ATTACH:
        return Ok(OK, merge_attached(va, vb))
    if isinstance(va, DeclaredQueue) and isinstance(vb, DeclaredQueue):
        return Ok(OK, DeclaredQueue(va.queue, max(va.message_count, vb.message_count),
                                    max(va.consumer_count, vb.consumer_count)))
    if isinstance(va, int) and isinstance(vb, int):
        return Ok(OK, max(va, vb))
    return Ok(OK, va if va is not None else vb)


def merge_session_values(va: Any, vb: Any) -> Any:
    """Two groups' values for one 0-10 session command: the group that executed it answers (the
    others' None); a replay's ``Duplicate`` yields to a value; publishes merge as a publish."""
    if va is None or isinstance(va, Duplicate):
        return vb if vb is not None else va
    if vb is None or isinstance(vb, Duplicate):
        return va
    if type(va) is int and type(vb) is int:
        return merge(Op.PUBLISH, Ok(OK, va), Ok(OK, vb))[1]
    return merge(Op.QUEUE_DECLARE, Ok(OK, va), Ok(OK, vb))[1]


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


def outbox_messages(entries: Any, bodies: Any, group: int, max_bytes: int = REPORT_BYTES) -> list:
    """Message outbox ``entries`` (a ``GroupReport``'s, bounded in count) as the forwarder sends
    them on: (target, seq, qids, fields, body), bounded in body bytes too (the rest goes with a
    later report)."""
    out, size = [], 0
    for target, seq, qids, message, expiration in entries:
        body = bodies.for_send(message.id)
        if body is None:  # (gone or damaged: the target gets what the source can prove)
            log.error("group %d: no body for message %d sent to group %d", group, message.id, target)
            continue
        out.append((target, seq, qids, (message.exchange, message.routing_key, message.properties,
                                        message.persistent, message.priority, expiration, message.format,
                                        message.published_at), body))
        size += len(body)
        if size >= max_bytes:
            break
    return out


def plain_replies(outputs: list) -> list:
    """A worker's outputs with each reply's result as a plain tuple: pickle packs a tuple in C, a
    NamedTuple (``Ok``) through Python-level calls on both sides (~3 µs against ~0.3 µs per reply
    measured, session 20).  ``typed_replies`` undoes it in the main process."""
    return [(out[0], OUT_REPLY, out[2], tuple(out[3]), out[4]) if out[1] == OUT_REPLY else out for out in outputs]


def typed_replies(outputs: list) -> list:
    """``plain_replies`` undone: an ``Ok`` is two items, a ``Refused`` three."""
    new = tuple.__new__
    return [(out[0], OUT_REPLY, out[2], new(Ok if len(out[3]) == 2 else Refused, out[3]), out[4])
            if out[1] == OUT_REPLY else out for out in outputs]
