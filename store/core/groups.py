"""Queue groups (issue 34): the metadata outbox, queue placement and stubs.

A cluster with ``G > 1`` groups runs ``G`` Raft logs, each applied by its own ``StateMachine``: the
*metadata group* (0), where every metadata command (vhosts, users, permissions, limits, members,
exchanges, bindings, queue declares) is decided, and the *queue groups* ``1..G-1``.  Every group's
machine holds the whole topology -- so a front end can route with any of them, and a queue group
routes its own publishes at apply as a single group does -- but a queue's messages, consumers and
deliveries live only in the group it was *placed* in; everywhere else the queue is a *stub* (name,
arguments, bindings; no messages).  ``G == 1`` is today's broker: nothing here runs.

How the topology reaches the queue groups, in order and exactly once (docs/design.md, "Sharded Raft
groups"):

- **The metadata outbox.**  The metadata group appends every metadata command it applied without
  refusing to ``meta_outbox`` as ``(seq, command, placed)``: replicated state, so every replica of
  the metadata group holds the same outbox.  ``placed`` is the ``(qid, group)`` a queue declare was
  given: placement is decided once, here, from replicated state (deterministic).
- **The forwarder** (node side, ``node/groups.py``) proposes each entry to every queue group as
  ``MetaApply(seq, command, placed)``; a queue group applies ``seq == meta_applied + 1`` and ignores
  the rest (a duplicate, or a gap the forwarder fills by resending), so a resent entry has effect
  once.  ``MetaTrim(up_to)`` drops entries every queue group has applied.
- **Deletions flow back.**  A queue group that deletes one of its own queues for a reason of its own
  (queue.delete, auto-delete after the last consumer, x-expires) appends ``(seq, qid)`` to its
  ``gone_outbox``; the forwarder proposes ``QueueGone(source, seq, qid)`` to the metadata group,
  which applies each ``(source, seq)`` once and turns it into ``QueueForget(qid)`` -- a metadata
  command like the others, so the stubs and bindings go everywhere.  ``GoneTrim`` drops what the
  metadata group took in.  Queues are forgotten by id, never by name: a queue declared again under
  the same name (a new id) is not touched by the old one's deletion.

A forwarded command is applied as its issuer's, so its reply (``OUT_REPLY`` to the issuer's
connection and token) comes from every group: the front end answers the client once all have
(``node/groups.py`` joins them), so a client that saw declare-ok can use the queue from any group.
A forwarded command does not need its issuer's channel to be open in the queue group (the
connection may have closed since): ``StateMachine.channel`` lends a scratch channel while one
applies.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple

from . import events as EV
from .commands import (
    OK,
    OUT_GROUP_REPORT,
    OUT_REPLY,
    ExchangeBind,
    ExchangeDeclare,
    GoneTrim,
    GroupEcho,
    GroupPending,
    GroupsSet,
    LimitsSet,
    MemberSet,
    MessageDone,
    MessageIn,
    MetaApply,
    MetaTrim,
    Ok,
    Op,
    PermissionSet,
    QueueBind,
    QueueDeclare,
    QueueForget,
    QueueGone,
    UserPut,
    VhostAdd,
)
from .entries import Message
from .errors import CommandError
from .tx_groups import participant_report

# GroupPending and GroupEcho, the groups' reply values, live in commands.py with the other reply
# values (tx_groups.py gives them, and this module imports it); imported from here as before.


class GroupReport(NamedTuple):
    """A group's outbox positions at the end of an applied batch, for the forwarder (an output,
    ``OUT_GROUP_REPORT``: the node acts on it once the batch is released).  The outboxes' first
    entries are copied (bounded by ``REPORT_ENTRIES``: the rest comes with a later report)."""

    meta_seq: int  # the metadata group: its last outbox entry
    meta_applied: int  # a queue group: the last metadata entry it applied
    gone: list  # a queue group: its deletion outbox's first entries (seq, qid, conn, token)
    msgs: list  # its message outbox's first entries (target, seq, qids, message, expiration)
    msg_seq: dict  # target group -> the last message outbox entry for it
    msg_applied: dict  # source group -> the last of its messages applied here
    gone_applied: dict  # the metadata group: queue group -> the last of its deletions taken in
    tx_next: int  # the metadata group: the last transaction id given (store/core/tx_groups.py)
    tx: tuple  # this group's part in transactions across groups (tx_groups.participant_report)


REPORT_ENTRIES = 256  # outbox entries a report carries at most


if TYPE_CHECKING:
    from .machine import StateMachine
    from .model import Queue

# The operations the metadata group decides and forwards.
META_OPS = frozenset((
    Op.EXCHANGE_DECLARE, Op.EXCHANGE_DELETE, Op.EXCHANGE_BIND, Op.EXCHANGE_UNBIND, Op.QUEUE_DECLARE,
    Op.QUEUE_BIND, Op.QUEUE_UNBIND, Op.VHOST_ADD, Op.VHOST_DELETE, Op.USER_PUT, Op.USER_DELETE,
    Op.PERMISSION_SET, Op.PERMISSION_CLEAR, Op.LIMITS_SET, Op.MEMBER_SET, Op.MEMBER_REMOVE,
    Op.GROUPS_SET, Op.QUEUE_FORGET,
))
# The operations that act on one queue's contents: applied by the queue's own group only.
QUEUE_OPS = frozenset((Op.CONSUME, Op.GET, Op.QUEUE_PURGE, Op.QUEUE_DELETE))

PLACEMENT_ARGUMENT = "x-queue-group"  # a queue argument choosing the group (an int in 0..G-1)
META_GROUP = 0
DUMP_CHANNEL = 0  # the channel number of the commands a bootstrap dump replays (a scratch channel)


class Groups:
    """The machine's part in queue groups.  State lives on the machine (``m.group`` ... below) so
    that snapshots carry it with the rest; this class holds code only, as the other concerns."""

    def __init__(self, machine: StateMachine) -> None:
        self.m = machine
        self._placed: tuple[int, int] | None = None  # the queue declare being applied: its (qid, group)
        self.deleting_for: tuple[str, int | None] | None = None  # the client's queue.delete being applied
        self.persisted: tuple | None = None  # a single node: the fingerprint of what its mirror holds
        self.reported: tuple | None = None  # the positions of the last GroupReport output

    def handlers(self, table: dict[int, Callable[[Any], object]]) -> dict[int, Callable[[Any], object]]:
        """The metadata handlers wrapped to append to the outbox, and the groups' own commands."""
        wrapped: dict[int, Callable[[Any], object]] = {
            op: self._outboxed(table[op]) for op in META_OPS if op in table}
        wrapped.update({
            Op.GROUPS_SET: self._outboxed(self.groups_set),
            Op.QUEUE_FORGET: self._outboxed(self.queue_forget),
            Op.META_APPLY: self.meta_apply,
            Op.META_TRIM: self.meta_trim,
            Op.QUEUE_GONE: self.queue_gone,
            Op.GONE_TRIM: self.gone_trim,
            Op.MESSAGE_IN: self.message_in,
            Op.MESSAGE_DONE: self.message_done,
        })
        return wrapped

    def _outboxed(self, handler: Callable[[Any], object]) -> Callable[[Any], object]:
        def apply(cmd: Any) -> object:
            self._placed = None
            value = handler(cmd)  # a refusal raises: nothing is appended
            m = self.m
            if m.group == META_GROUP and m.group_count > 1 and not m.forwarding:
                m.meta_seq += 1
                m.meta_outbox.append((m.meta_seq, cmd, self._placed))
                if cmd.token is not None:
                    value = GroupPending(value, m.group_count - 1)  # each queue group answers too
            self._placed = None
            return value
        return apply

    def fingerprint(self) -> tuple:
        m = self.m
        return (m.group_count, m.meta_seq, m.meta_applied, m.gone_seq, tuple(sorted(m.gone_applied.items())),
                m.meta_outbox[0][0] if m.meta_outbox else 0, m.gone_outbox[0][0] if m.gone_outbox else 0,
                m.next_qid, len(m.queues_by_id), tuple(sorted(m.msg_seq.items())),
                tuple(sorted(m.msg_applied.items())))

    def report(self, outputs: list) -> None:
        """End of a batch: a ``GroupReport`` output if an outbox position moved since the last one.
        Not state (a node that restarts reports again at its first batch)."""
        m = self.m
        gone, msgs = m.gone_outbox, m.msg_outbox
        key = (m.meta_seq, m.meta_applied, m.gone_seq, gone[0][0] if gone else 0, len(msgs),
               (msgs[0][0], msgs[0][1]) if msgs else None, tuple(m.msg_seq.items()), tuple(m.msg_applied.items()),
               tuple(m.gone_applied.items()), m.tx_next, m.tx_prep_applied,
               tuple((txid, held.finished) for txid, held in m.tx_held.items()) if m.tx_held else ())
        if key == self.reported:
            return
        self.reported = key
        outputs.append((None, OUT_GROUP_REPORT, self.current_report()))

    def current_report(self) -> GroupReport:
        m = self.m
        gone, msgs = m.gone_outbox, m.msg_outbox
        return GroupReport(m.meta_seq, m.meta_applied, list(islice(gone, REPORT_ENTRIES)),
                           list(islice(msgs, REPORT_ENTRIES)), dict(m.msg_seq), dict(m.msg_applied),
                           dict(m.gone_applied), m.tx_next, participant_report(m))

    def persist(self, recorder: Any) -> None:
        """A single node: write the group state to the mirror if this batch changed it."""
        key = self.fingerprint()
        if key != self.persisted:
            self.persisted = key
            recorder.put_groups(persisted_state(self.m))

    # ----------------------------------------------------------------------------- placement

    def place(self, arguments: dict, conn: str | None = None, channel: int | None = None) -> tuple[int, int]:
        """The id and group of a new queue.  In a queue group applying a forwarded declare, the
        metadata group's decision; in the metadata group, the group with the fewest queues (ties to
        the lowest number), or the one the ``x-queue-group`` argument names."""
        m = self.m
        if m.forwarded_placement is not None:
            qid, group = m.forwarded_placement
            m.next_qid = max(m.next_qid, qid + 1)
            self._placed = (qid, group)
            return qid, group
        qid = m.next_qid
        m.next_qid += 1
        group = META_GROUP
        if m.group_count > 1:
            wanted = arguments.get(PLACEMENT_ARGUMENT) if arguments else None
            if wanted is not None:
                if type(wanted) is not int or not 0 <= wanted < m.group_count:
                    raise CommandError(406, f"invalid arg '{PLACEMENT_ARGUMENT}': {wanted!r} is not a group "
                                            f"number below {m.group_count}")
                group = wanted
            elif m._caller_owner is not None or self._on_session(conn, channel):
                # Declared in an AMQP 0-10 session or for a 1.0 link: in the metadata group, which
                # decides the declare, so that a subscribe pipelined right after it finds the queue
                # (docs/design.md, "Sessions and links with queue groups").
                group = META_GROUP
            else:
                counts = self.queue_counts()
                # Queue groups first: the metadata group keeps the queues of an older data directory.
                group = min(range(1, m.group_count), key=lambda g: (counts.get(g, 0), g))
        self._placed = (qid, group)
        return qid, group

    def _on_session(self, conn: str | None, channel: int | None) -> bool:
        """Whether the declare comes on a session's channel (a 1.0 link's core session)."""
        ch = self.m.channels.get(conn or "", {}).get(channel) if channel is not None else None
        return ch is not None and ch.session is not None

    def placed_existing(self, queue: Queue) -> None:
        """A declare of an existing queue forwards the queue's placement with it."""
        self._placed = (queue.qid, queue.group)

    def queue_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for queue in self.m.queues_by_id.values():
            counts[queue.group] = counts.get(queue.group, 0) + 1
        return counts

    def check_own(self, queue: Queue) -> None:
        """Refuse an operation on a queue's contents where the queue is a stub (the router sends
        them to the queue's group: this is a command that raced a placement change)."""
        if queue.group != self.m.group:
            raise CommandError(404, f"queue '{queue.name}' in vhost '{queue.vhost}' is in group {queue.group}, "
                                    f"not {self.m.group}")

    def deleted(self, queue: Queue) -> None:
        """``queue`` was deleted here (topology.delete_queue): tell the other groups if it was ours
        and the deletion was ours to decide (not a forwarded metadata command, which every group
        applies anyway).  A client's queue.delete (``deleting_for``) is answered by every group."""
        m = self.m
        if m.group_count <= 1 or m.forwarding or queue.group != m.group:
            return
        conn, token = self.deleting_for or (None, None)
        self.deleting_for = None
        if m.group == META_GROUP:
            m.meta_seq += 1
            m.meta_outbox.append((m.meta_seq, QueueForget(conn, token, queue.qid), None))
        else:
            m.gone_seq += 1
            m.gone_outbox.append((m.gone_seq, queue.qid, conn, token))

    def delete_reply(self, count: int, deleted: bool) -> int | GroupPending:
        """The value of a client's queue.delete: with several groups, the other groups still answer
        (their QueueForget) before the client may be told (``GroupPending``)."""
        m = self.m
        if m.group_count <= 1 or not deleted:
            return count
        return GroupPending(count, m.group_count if m.group != META_GROUP else m.group_count - 1)

    # ------------------------------------------------------------------- messages between groups

    def route_remote(self, message: Message, queues: list[Queue], expiration: int | None) -> list[Queue]:
        """Of the queues a dead-lettered, released or deduplicated message routes to, the ones
        of this group; the others' groups get it through the message outbox (one entry per group,
        holding the message -- and so its body -- until that group has it)."""
        m = self.m
        own: list[Queue] = []
        remote: dict[int, list[int]] = {}
        for queue in queues:
            if queue.group == m.group:
                own.append(queue)
            else:
                remote.setdefault(queue.group, []).append(queue.qid)
        for target, qids in remote.items():
            seq = m.msg_seq.get(target, 0) + 1
            m.msg_seq[target] = seq
            m.msg_outbox.append((target, seq, qids, message, expiration))
            message.live += 1
            if m._persist is not None:  # a single node: the outbox is in its mirror, body and all
                m._persist.put_group_message(target, seq, [
                    qids, message.id, message.exchange, message.routing_key, message.properties, None,
                    message.persistent, message.priority, message.published_at, message.format, expiration])
        return own

    def message_in(self, cmd: MessageIn) -> None:
        m = self.m
        if cmd.seq != m.msg_applied.get(cmd.source, 0) + 1:
            return None  # a duplicate or a gap: the forwarder resends from the applied one
        m.msg_applied[cmd.source] = cmd.seq
        message = Message(m.next_msg_id, cmd.exchange, cmd.routing_key, cmd.properties, len(cmd.body),
                          bool(cmd.persistent), cmd.priority or 0, cmd.published_at, 0, cmd.properties_format, 1)
        m.next_msg_id += 1
        m.event(EV.PUBLISHED, None, message, f"group:{cmd.source}:{cmd.seq}")
        for qid in cmd.qids:
            queue = m.queues_by_id.get(qid)
            if queue is not None and queue.group == m.group:
                m.delivery.enqueue(queue, message, cmd.expiration)
        m.delivery.keep_body(message, cmd.body)
        return None

    def message_done(self, cmd: MessageDone) -> None:
        m = self.m
        kept: deque[tuple[int, int, list[int], Message, int | None]] = deque()
        for entry in m.msg_outbox:
            target, seq, _qids, message, _expiration = entry
            if target == cmd.target and seq <= cmd.up_to:
                message.live -= 1
                if not message.live:
                    m._body_deletes.append(message.id)
                if m._persist is not None:
                    m._persist.delete_group_message(target, seq)
            else:
                kept.append(entry)
        m.msg_outbox = kept

    # ------------------------------------------------------------------------- the commands

    def groups_set(self, cmd: GroupsSet) -> None:
        m = self.m
        if cmd.groups < 1:
            raise CommandError(406, f"a cluster needs at least one group, not {cmd.groups}")
        if cmd.groups < m.group_count:
            raise CommandError(406, f"groups cannot be removed ({m.group_count} -> {cmd.groups})")
        grown = cmd.groups > m.group_count
        m.group_count = cmd.groups
        if grown and cmd.groups > 1:
            # Sessions' next outgoing ids to this group's residue (store/core/group_sessions.py: group
            # g numbers g mod G), so ids numbered from now on never meet another group's.
            for session in m.sessions.values():
                session.next_transfer += (m.group - session.next_transfer) % cmd.groups
        if grown and m.group == META_GROUP and not m.forwarding and cmd.groups > 1:
            # New queue groups start empty: the outbox first replays the topology as it is (the
            # commands are idempotent for groups that had it), then goes on.
            for command, placed in metadata_dump(m):
                m.meta_seq += 1
                m.meta_outbox.append((m.meta_seq, command, placed))

    def meta_apply(self, cmd: MetaApply) -> object:
        """A queue group applies metadata entry ``seq`` once, in order, as its issuer's command."""
        m = self.m
        if cmd.seq != m.meta_applied + 1:
            return None  # a duplicate (<=) or a gap (>): the forwarder resends from meta_applied + 1
        m.meta_applied = cmd.seq
        m.forwarding = True
        m.forwarded_placement = cmd.placed
        start = len(m._out)
        try:
            m.apply_forwarded(cmd.command)
        finally:
            m.forwarding = False
            m.forwarded_placement = None
        _echo(m._out, start, cmd.command.conn, cmd.command.token)
        return None

    def meta_trim(self, cmd: MetaTrim) -> None:
        outbox = self.m.meta_outbox
        while outbox and outbox[0][0] <= cmd.up_to:
            outbox.popleft()

    def queue_gone(self, cmd: QueueGone) -> None:
        m = self.m
        if m.group != META_GROUP:
            raise CommandError(540, "QueueGone is for the metadata group")
        if cmd.seq != m.gone_applied.get(cmd.source, 0) + 1:
            return None
        m.gone_applied[cmd.source] = cmd.seq
        # As a metadata command of its own: applied here and forwarded (the outboxed handler).
        self._outboxed(self.queue_forget)(QueueForget(cmd.reply_conn, cmd.reply_token, cmd.qid))
        if cmd.reply_token is not None:
            # The metadata group's answer to the client's queue.delete, on every replica (the
            # forwarder's node proposed this command, the client's node answers it).
            m._out.append((cmd.reply_conn, OUT_REPLY, cmd.reply_token, Ok(OK, GroupEcho(Ok(OK, None))), None))
        return None

    def gone_trim(self, cmd: GoneTrim) -> None:
        outbox = self.m.gone_outbox
        while outbox and outbox[0][0] <= cmd.up_to:
            outbox.popleft()

    def queue_forget(self, cmd: QueueForget) -> None:
        m = self.m
        queue = m.queues_by_id.get(cmd.qid)
        if queue is not None:
            m.topology.delete_queue(queue)


def _echo(outputs: list, start: int, conn: str | None, token: int | None) -> None:
    """The replies to (conn, token) appended since ``start``, marked as echoes (``GroupEcho``)."""
    if token is None:
        return
    for i in range(start, len(outputs)):
        out = outputs[i]
        if out[1] == OUT_REPLY and out[2] == token and out[0] == conn:
            outputs[i] = (out[0], OUT_REPLY, token, Ok(OK, GroupEcho(out[3])), out[4])


def persisted_state(m: StateMachine) -> list:
    """A single node's group state for its LMDB mirror (the mirror has no snapshots: the
    outboxes, positions and placements are written whole when they change; issue 34)."""
    return [m.group_count, m.meta_seq, m.meta_applied, m.gone_seq, sorted(m.gone_applied.items()),
            [[seq, list(command), list(placed) if placed else None] for seq, command, placed in m.meta_outbox],
            [list(entry) for entry in m.gone_outbox],
            sorted((q.qid, q.group) for q in m.queues_by_id.values() if q.group),
            sorted(m.msg_seq.items()), sorted(m.msg_applied.items())]


def restore_state(m: StateMachine, state: list) -> None:
    """``persisted_state`` back into a machine restored from the mirror."""
    from .commands import COMMAND_TYPES, _typed_v2

    (m.group_count, m.meta_seq, m.meta_applied, m.gone_seq, gone_applied, meta_outbox, gone_outbox,
     placements, msg_seq, msg_applied) = state
    m.gone_applied = {int(k): v for k, v in gone_applied}
    m.msg_seq = {int(k): v for k, v in msg_seq}
    m.msg_applied = {int(k): v for k, v in msg_applied}
    m.meta_outbox = deque((seq, _typed_v2(command) if command[-1] in COMMAND_TYPES else command,
                           tuple(placed) if placed else None) for seq, command, placed in meta_outbox)
    m.gone_outbox = deque(tuple(entry) for entry in gone_outbox)
    for qid, group in placements:
        queue = m.queues_by_id.get(qid)
        if queue is not None:
            queue.group = group
            if group != m.group:  # a stub: it does not expire on its own
                m.idle_expiring.pop(qid, None)
                m.queue_last_used.pop(qid, None)


def restore_messages(m: StateMachine, records: list[tuple[int, int, list]]) -> list[tuple[int, bytes]]:
    """A single node's message outbox back from its mirror; returns the bodies to store.  A
    message also queued here is the same object (one ``live`` count per id, or its body would go
    with the first holder)."""
    if not records:
        return []
    known = {entry.message.id: entry.message for queue in m.queues_by_id.values()
             for entry in queue.ready.entries()}
    bodies = []
    for target, seq, record in records:
        (qids, msg_id, exchange, routing_key, props, body, persistent, priority, published_at, fmt,
         expiration) = record
        message = known.get(msg_id)
        if message is None:
            message = known[msg_id] = Message(msg_id, exchange, routing_key, props, len(body), persistent,
                                              priority, published_at, 0, fmt, 0)
            bodies.append((msg_id, body))
        message.live += 1
        m.msg_outbox.append((target, seq, list(qids), message, expiration))
    return bodies


def metadata_dump(m: StateMachine) -> list[tuple[Any, tuple[int, int] | None]]:
    """The topology as metadata commands, for queue groups that start empty: vhosts, users,
    permissions, limits, members, exchanges, queues (with their placement), bindings.  Queues the
    metadata group holds itself (an older data directory's) are stubs in the queue groups."""
    out: list[tuple[Any, tuple[int, int] | None]] = [(GroupsSet(None, None, m.group_count), None)]
    for node_id, (raft, amqp) in m.members.items():
        out.append((MemberSet(None, None, node_id, raft, amqp), None))
    for name in m.vhosts:
        out.append((VhostAdd(None, None, name), None))
    for user in m.users.values():
        out.append((UserPut(None, None, None, user.name, user.password_hash, list(user.tags), user.loopback_only),
                    None))
        for vhost_name, (configure, write, read) in user.permissions.items():
            out.append((PermissionSet(None, None, None, user.name, vhost_name, configure, write, read), None))
    for name, overlay in m.permission_overlay.items():
        for vhost_name, perms in overlay.items():
            if perms is not None:
                out.append((PermissionSet(None, None, None, name, vhost_name, *perms), None))
    for scope, table in (("vhost", m.vhost_limits), ("user", m.user_limits)):
        for name, limits in table.items():
            out.append((LimitsSet(None, None, None, scope, name, dict(limits)), None))
    for vhost in m.vhosts.values():
        for exchange in vhost.exchanges.values():
            if exchange.name == "" or exchange.name.startswith("amq."):
                continue  # every vhost is made with them
            out.append((ExchangeDeclare("", None, DUMP_CHANNEL, vhost.name, exchange.name, exchange.type, False,
                                        exchange.durable, exchange.auto_delete, exchange.internal,
                                        dict(exchange.arguments)), None))
        for queue in vhost.queues.values():
            owner = queue.exclusive_owner
            out.append((QueueDeclare(owner or "", None, DUMP_CHANNEL, vhost.name, queue.name, False, queue.durable,
                                     owner is not None, queue.auto_delete, dict(queue.arguments), True),
                        (queue.qid, queue.group)))
        for exchange in vhost.exchanges.values():
            for b in exchange.bindings:
                if b.dest_is_queue:
                    out.append((QueueBind("", None, DUMP_CHANNEL, vhost.name, b.destination, b.source,
                                          b.routing_key, dict(b.arguments or {})), None))
                else:
                    out.append((ExchangeBind("", None, DUMP_CHANNEL, vhost.name, b.destination, b.source,
                                             b.routing_key, dict(b.arguments or {})), None))
    return out


def new_outbox() -> deque:
    return deque()


__all__ = ["Groups", "GroupEcho", "GroupPending", "GroupReport", "REPORT_ENTRIES", "META_OPS", "QUEUE_OPS", "PLACEMENT_ARGUMENT", "META_GROUP",
           "metadata_dump", "GoneTrim", "MetaTrim", "QueueGone"]
