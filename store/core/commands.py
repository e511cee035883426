"""Commands and results: the only way broker state changes, and what a change answers.

Every operation has one command type here: an immutable ``NamedTuple`` whose fields are the
operation's arguments, by name (a front end builds ``QueueDeclare(conn, token, channel, vhost, name,
...)``, the state machine reads ``command.name``).  Tuples rather than frozen dataclasses because a
command is built once per message on the publish path: a 12-field NamedTuple costs about 0.18 µs to
build, a frozen slotted dataclass about 0.9 µs (docs/benchmarks.md, session 11), and a tuple packs
with msgpack as it is.

Every command starts with the same fields: ``conn``, the id of the connection that issued it (None
for the node's own commands), ``token``, the issuer's request id to answer (None when no reply is
wanted), and, for operations on a channel or session, ``channel`` (then ``conn`` is a ``str``: a
channel belongs to a connection).  The field types say what a handler sees: a front end may build
a command as a template with conn and channel None and fill them in with ``_replace`` before it is
applied (the inner command of a 0-10 ``SessionCommand`` is filled in by apply itself,
store/core/sessions.py).  The last field, ``op``, has a
default and names the operation: it is what the log carries to pick the type back
(``decode_batch``).  The state machine applies a *batch* of commands with one timestamp stamped by
the proposer (the leader), so apply never reads a clock.

Results are ``Ok(value)`` or ``Refused(code, text)``, both tuples that start with their status
(``OK``/``ERR``); the reply codes are AMQP 0-9-1's, which every front end translates for its own
protocol.  Values with several parts are typed too (``DeclaredQueue``, ``GotMessage``...).
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, TypeAlias

import msgpack

from raftmq.versions import COMMAND_FORMAT, check

if TYPE_CHECKING:
    from .model import Message


class Op(IntEnum):
    CHANNEL_OPEN = 1
    CHANNEL_CLOSE = 2
    CONNECTION_CLOSE = 3
    QOS = 4
    FLOW = 5
    EXCHANGE_DECLARE = 10
    EXCHANGE_DELETE = 11
    EXCHANGE_BIND = 12
    EXCHANGE_UNBIND = 13
    QUEUE_DECLARE = 20
    QUEUE_BIND = 21
    QUEUE_UNBIND = 22
    QUEUE_PURGE = 23
    QUEUE_DELETE = 24
    CONSUME = 30
    CANCEL = 31
    PUBLISH = 32
    GET = 33
    ACK = 34
    NACK = 35
    RECOVER = 36
    TX_COMMIT = 40
    TICK = 50
    MEMBER_SET = 52  # (node_id, raft_address, amqp_address): a cluster member announces itself
    MEMBER_REMOVE = 53  # (node_id,): a member left the Raft configuration
    SESSION_ATTACH = 70  # AMQP 0-10 sessions and subscriptions: see store/core/sessions.py
    SESSION_DETACH = 71
    SESSION_TIMEOUT = 72
    SESSION_COMMAND = 73
    SESSION_KNOWN_COMPLETED = 74
    MESSAGE_SUBSCRIBE = 75
    MESSAGE_FLOW = 76
    MESSAGE_FLOW_MODE = 77
    MESSAGE_STOP = 78
    MESSAGE_FLUSH = 79
    MESSAGE_SETTLE = 80
    SESSION_TX_SELECT = 84
    MESSAGE_ACQUIRE = 85
    MESSAGE_RESUME = 86
    QUEUE_QUERY = 81  # read-only, through the log (linearizable): 0-10 queue.query
    EXCHANGE_QUERY = 82
    EXCHANGE_BOUND = 83
    NODE_RESET = 51  # (node_id, keep_boot): a node's old connections are gone (it died or restarted)
    VHOST_ADD = 60
    USER_PUT = 61  # users and permissions managed through the admin API: see store/core/users.py
    USER_DELETE = 62
    PERMISSION_SET = 63
    PERMISSION_CLEAR = 64
    VHOST_DELETE = 65  # (name): a vhost and everything in it, permissions included (store/core/topology.py)
    LIMITS_SET = 66  # (scope, name, {limit: value or None}): vhost and user limits, store/core/limits.py
    SESSION_WINDOW_CREDIT = 87  # (destination, messages, bytes): 0-10 window credit for completed transfers
    MESSAGE_MODIFY = 95  # AMQP 1.0 modified outcome with message-annotations: see store/core/modify.py
    AUDIT_NOTE = 96  # issue 36: who did what at a front end, for every node's history (store/core/audit.py)
    AUDIT_CHAIN_ON = 97  # issue 36: from this entry on, every event is chained (store/core/events.py)
    # Queue groups (issue 34): see store/core/groups.py
    GROUPS_SET = 100  # (groups): how many groups the cluster has (metadata group, forwarded)
    META_APPLY = 101  # (seq, command, placed): a metadata command forwarded to a queue group
    META_TRIM = 102  # (up_to): the metadata outbox entries every queue group has applied
    QUEUE_GONE = 103  # (source, seq, qid): a queue group deleted one of its queues
    GONE_TRIM = 104  # (up_to): the deletions the metadata group has taken in
    QUEUE_FORGET = 105  # (qid): the metadata group forgets a queue its group deleted (forwarded)
    MESSAGE_IN = 106  # (source, seq, qids, message...): a message another group routed to queues here
    MESSAGE_DONE = 107  # (target, up_to): the target group has the messages sent to it up to up_to
    # Transactions across groups (issue 34): a two-phase commit, see store/core/tx_groups.py
    TX_BEGIN = 108  # (reply_token, channel, total, parts): the metadata group coordinates a transaction
    TX_PREPARE = 109  # (txid, seq, ...): a participant checks its part, holds it and votes
    TX_VOTE = 110  # (txid, group, code, text): the coordinator records a participant's vote (and decides)
    TX_FINISH = 111  # (txid, commit, code, text): a participant applies the decision to its part
    TX_ENDED = 112  # (txid, group, outcomes): the coordinator learns a participant applied the decision
    TX_FORGET = 113  # (txid): a participant drops its finished part (the coordinator has it)


OK = 0
ERR = 1

# Publish outcomes (the value of an OK publish result).
ROUTED = 0
UNROUTABLE = 1
REJECTED = 2  # a queue with x-overflow=reject-publish refused it: nack the publisher
NOT_HERE = 3  # issue 34: every queue it routes to is in another group (the front end merges the answers)

# Output kinds, the second item of every output ``(conn, kind, ...)`` (the records below).
OUT_REPLY: Final = 0
OUT_DELIVER: Final = 1
OUT_CANCEL: Final = 2
OUT_CLOSE: Final = 3
OUT_TRANSFER: Final = 4
OUT_SESSION_DETACHED: Final = 5
OUT_VHOST_CLOSED: Final = 6
OUT_GROUP_REPORT: Final = 7  # issue 34: a group's outbox positions as of the batch (OutGroupReport)
# (None, OUT_TX_STEP, txid): a two-phase commit moved (store/core/tx_groups.py); no connection's,
# it only makes the node look again (a worker reports, the forwarder sends the next step).
OUT_TX_STEP: Final = 8


# ---------------------------------------------------------------------------------------- results

class Ok(NamedTuple):
    """A command succeeded; ``value`` is what it answers (None, a count, a typed value below)."""

    status: int
    value: Any = None


class Refused(NamedTuple):
    """A command was refused, nothing changed; ``code`` is an AMQP 0-9-1 reply code."""

    status: int
    code: int
    text: str


Result = Ok | Refused


def ok(value: object = None) -> Ok:
    return Ok(OK, value)


def err(code: int, text: str) -> Refused:
    return Refused(ERR, code, text)


class DeclaredQueue(NamedTuple):
    """QueueDeclare's value (queue.declare-ok)."""

    queue: str
    message_count: int
    consumer_count: int


class GotMessage(NamedTuple):
    """Get's value when a message was there (basic.get-ok); None when the queue was empty."""

    qid: int
    seq: int
    redelivered: bool
    message: Any  # store.core.model.Message
    message_count: int
    body: bytes | None = None  # filled in by the node (store/disk/bodies.fill_bodies): the model has none


class SessionBusy(NamedTuple):
    """SessionAttach's value: the session is attached to another live connection."""


class SessionAttached(NamedTuple):
    """SessionAttach's value: attached (``resumed`` if it existed), with what a resume needs."""

    resumed: bool
    completed: list  # the incoming commands already executed, as [lo, hi] ranges
    replay: list  # the unsettled transfers to send again
    transactional: bool
    # Issue 34: the session's 0-10 commits across groups that committed (the metadata group's
    # ``tx_decided``): complete whatever the other groups' barriers say (group_sessions.merge_attached).
    decided: list | tuple = ()


class GroupPending(NamedTuple):
    """A reply's value when ``more`` replies for the same token will come from other groups: the
    front end answers the client with ``value`` (merged with theirs) once all have come (issue 34,
    store/core/groups.py; here with the other reply values so that tx_groups.py can give it)."""

    value: Any
    more: int


class GroupEcho(NamedTuple):
    """A reply's value from a group that applied *another* group's decision for the same client
    token: a queue group applying a forwarded metadata command (``MetaApply``), the metadata group
    taking in a queue group's deletion (``QueueGone``).  Marked so that the front end's join counts
    it against the ``GroupPending`` that announces it, in whatever order the two reach the client's
    node (each group's replica there applies at its own pace: an echo can come first)."""

    result: Any  # the Ok or Refused it would have been


class Duplicate(NamedTuple):
    """SessionCommand's value for a command id already executed (the idempotence barrier)."""


class CommandResult(NamedTuple):
    """SessionCommand's value for a command that answers with execution.result."""

    result_id: int
    value: Any


class QueueInfo(NamedTuple):
    """QueueQuery's value (0-10 queue.query-result) when the queue exists."""

    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict
    message_count: int
    subscriber_count: int


class ExchangeInfo(NamedTuple):
    """ExchangeQuery's value (0-10 exchange.query-result) when the exchange exists."""

    type: str
    durable: bool
    arguments: dict


class BoundInfo(NamedTuple):
    """ExchangeBound's value (0-10 exchange.bound-result)."""

    exchange_not_found: bool
    queue_not_found: bool
    queue_not_matched: bool
    key_not_matched: bool
    args_not_matched: bool


# ---------------------------------------------------------------------------------------- outputs
# What apply tells the connections (``Effects.outputs``, in order): tuples that start with the
# connection id and the kind (``OUT_*``), so that a node routes them by ``out[0]`` and dispatches
# on ``out[1]`` (node/broker.py); the rest is typed below, per kind.
#
# The hot ones -- a reply per command with a token (every confirmed publish), a delivery or a
# transfer per message, each rebuilt once more when the node appends the body -- are plain tuples
# with a typed alias: an instance of a NamedTuple, even built with ``tuple.__new__`` (no Python-level
# ``__new__``), is a heap-type object that costs ~0.2 µs more to make and free than a tuple literal,
# and made them +1.1 µs per delivered confirmed publish on the leader (+15 %) and +0.5 µs on a
# follower (bench/apply_deliver.py, docs/benchmarks.md "Typed outputs").  The checker sees the
# aliases as precisely as records (a wrong item type or arity is an error); the rare outputs are
# NamedTuples.
#
# A delivery leaves apply as ``Delivered`` and a transfer as ``Transferred``; the node gives them
# their body (store/disk/bodies.fill_bodies: ``DeliveredWithBody``/``TransferredWithBody``, the
# body last) before they reach a front end -- except when the consumer holds the message until it
# settles it: then the tuple stays without one, and the front end reads the body when it writes the
# delivery (store/disk/bodies.body_to_send).  Front ends tell the two apart by length.

Delivered: TypeAlias = tuple[int, int, bool, "Message"]  # (qid, seq, redelivered, message)
DeliveredWithBody: TypeAlias = tuple[int, int, bool, "Message", bytes]  # ... and the body
# A 0-10 message.transfer: (transfer_id, qid, seq, redelivered, message), the id the session's
# command id for it.
Transferred: TypeAlias = tuple[int, int, int, bool, "Message"]
TransferredWithBody: TypeAlias = tuple[int, int, int, bool, "Message", bytes]

# (conn, OUT_REPLY, token, result, channel): the result of the command that carried ``token`` (or
# the error of a token-less one).
OutReply: TypeAlias = tuple[str | None, Literal[0], int | None, Result, int | None]
# (conn, OUT_DELIVER, channel, consumer_tag, delivery): a message for a consumer (basic.deliver; a
# 1.0 link's transfer).
OutDeliver: TypeAlias = tuple[str | None, Literal[1], int, str, Delivered | DeliveredWithBody]
# (conn, OUT_TRANSFER, channel, destination, transfer): a message for a 0-10 subscription.
OutTransfer: TypeAlias = tuple[str | None, Literal[4], int, str, Transferred | TransferredWithBody]


class OutCancel(NamedTuple):
    """A server-side consumer cancel (the queue went)."""

    conn: str | None
    kind: Literal[2]  # OUT_CANCEL
    channel: int
    consumer_tag: str


class OutClose(NamedTuple):
    """The cluster closed this connection."""

    conn: str
    kind: Literal[3]  # OUT_CLOSE
    reply_code: int
    reply_text: str


class OutSessionDetached(NamedTuple):
    """The 0-10 session ``name`` was taken over by another connection."""

    conn: str | None
    kind: Literal[5]  # OUT_SESSION_DETACHED
    channel: int
    name: bytes


class OutVhostClosed(NamedTuple):
    """A vhost was deleted; every node closes its own connections open on it.  Addressed to no
    connection: the machine does not know which connection opened which vhost (connections open
    no state in the log), each node does."""

    conn: None
    kind: Literal[6]  # OUT_VHOST_CLOSED
    vhost: str
    reply_code: int
    reply_text: str


class OutGroupReport(NamedTuple):
    """Queue groups (issue 34): the group's outbox positions at the end of the batch
    (store/core/groups.py ``GroupReport``), addressed to no connection.  An output rather than a
    read of the machine, because the node may act on them (forward a deletion, a message, trim an
    outbox) only once the batch is released, i.e. durable and answered: the machine may already
    have applied later batches that are not."""

    conn: None
    kind: Literal[7]  # OUT_GROUP_REPORT
    report: Any  # store/core/groups.GroupReport


OutTxStep = tuple[None, Literal[8], int]  # OUT_TX_STEP, txid (store/core/tx_groups.py)

Output = (OutReply | OutDeliver | OutCancel | OutClose | OutTransfer | OutSessionDetached | OutVhostClosed
          | OutGroupReport | OutTxStep)


# --------------------------------------------------------------------------- connections, channels

class ChannelOpen(NamedTuple):
    conn: str
    token: int | None
    channel: int
    op: Op = Op.CHANNEL_OPEN


class ChannelClose(NamedTuple):
    conn: str
    token: int | None
    channel: int
    op: Op = Op.CHANNEL_CLOSE


class ConnectionClose(NamedTuple):
    """A connection is gone: its channels close, unacked deliveries return to their queues."""

    conn: str
    token: int | None
    op: Op = Op.CONNECTION_CLOSE


class Qos(NamedTuple):
    conn: str
    token: int | None
    channel: int
    prefetch_count: int
    global_: bool
    op: Op = Op.QOS


class Flow(NamedTuple):
    """Stop or resume deliveries to a channel (channel.flow, or back-pressure from a slow socket)."""

    conn: str
    token: int | None
    channel: int
    active: bool
    op: Op = Op.FLOW


# ------------------------------------------------------------------------------------- topology

class ExchangeDeclare(NamedTuple):
    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict
    op: Op = Op.EXCHANGE_DECLARE


class ExchangeDelete(NamedTuple):
    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    if_unused: bool
    op: Op = Op.EXCHANGE_DELETE


class ExchangeBind(NamedTuple):
    conn: str
    token: int | None
    channel: int
    vhost: str
    destination: str
    source: str
    routing_key: str
    arguments: dict
    op: Op = Op.EXCHANGE_BIND


class ExchangeUnbind(NamedTuple):
    conn: str
    token: int | None
    channel: int
    vhost: str
    destination: str
    source: str
    routing_key: str
    arguments: dict
    op: Op = Op.EXCHANGE_UNBIND


class QueueDeclare(NamedTuple):
    """Value: ``DeclaredQueue``.  ``server_named``: the front end generated the name."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict
    server_named: bool = False
    op: Op = Op.QUEUE_DECLARE


class QueueBind(NamedTuple):
    conn: str
    token: int | None
    channel: int
    vhost: str
    queue: str
    exchange: str
    routing_key: str
    arguments: dict
    op: Op = Op.QUEUE_BIND


class QueueUnbind(NamedTuple):
    conn: str
    token: int | None
    channel: int
    vhost: str
    queue: str
    exchange: str
    routing_key: str
    arguments: dict
    op: Op = Op.QUEUE_UNBIND


class QueuePurge(NamedTuple):
    """Value: the number of messages purged."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    op: Op = Op.QUEUE_PURGE


class QueueDelete(NamedTuple):
    """Value: the number of messages deleted with the queue."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    if_unused: bool
    if_empty: bool
    op: Op = Op.QUEUE_DELETE


# -------------------------------------------------------------------------- messages, consumers

class Consume(NamedTuple):
    """Value: the consumer tag."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    queue: str
    consumer_tag: str
    no_ack: bool
    exclusive: bool
    arguments: dict
    op: Op = Op.CONSUME


class Cancel(NamedTuple):
    """Value: the consumer tag (also a 0-10 message.cancel: the destination)."""

    conn: str
    token: int | None
    channel: int
    consumer_tag: str
    op: Op = Op.CANCEL


class Publish(NamedTuple):
    """Value: ROUTED, UNROUTABLE or REJECTED.  ``properties`` are the message's properties as the
    publisher's protocol encodes them, ``properties_format`` says which (store/core/message.py);
    ``priority`` and ``expiration`` (ms, or None) are read from them by the front end."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: bytes
    persistent: bool
    priority: int | None
    expiration: int | None
    properties_format: int = 0  # store.message.AMQP091
    op: Op = Op.PUBLISH


class Get(NamedTuple):
    """Value: ``GotMessage`` or None (the queue was empty)."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    queue: str
    no_ack: bool
    op: Op = Op.GET


class Ack(NamedTuple):
    """``refs``: the deliveries acknowledged, as the channel's [qid, seq] pairs."""

    conn: str
    token: int | None
    channel: int
    refs: list
    op: Op = Op.ACK


class Nack(NamedTuple):
    """``unsent``: deliveries the front end never wrote to the client (not counted as redelivered)."""

    conn: str
    token: int | None
    channel: int
    refs: list
    requeue: bool
    unsent: bool = False
    op: Op = Op.NACK


class Recover(NamedTuple):
    conn: str
    token: int | None
    channel: int
    requeue: bool
    op: Op = Op.RECOVER


class TxCommit(NamedTuple):
    """``operations``: the Publish/Ack/Nack commands of the transaction, applied all or none.
    Value: the operations' results, in order."""

    conn: str
    token: int | None
    channel: int
    operations: list
    op: Op = Op.TX_COMMIT


# ------------------------------------------------------------------------- the node's own commands

class Tick(NamedTuple):
    """Time passes: expire messages, queues and detached sessions due at the batch's time."""

    conn: str | None = None
    token: int | None = None
    op: Op = Op.TICK


class NodeReset(NamedTuple):
    """A node's old connections are gone (it died or restarted); ``keep_boot``: its current boot."""

    conn: str | None
    token: int | None
    node_id: str
    keep_boot: str | None
    op: Op = Op.NODE_RESET


class MemberSet(NamedTuple):
    """A cluster member announces itself."""

    conn: str | None
    token: int | None
    node_id: str
    raft: str
    amqp: str
    op: Op = Op.MEMBER_SET


class MemberRemove(NamedTuple):
    """A member left the Raft configuration."""

    conn: str | None
    token: int | None
    node_id: str
    op: Op = Op.MEMBER_REMOVE


class VhostAdd(NamedTuple):
    conn: str | None
    token: int | None
    name: str
    op: Op = Op.VHOST_ADD


class VhostDelete(NamedTuple):
    """Delete a vhost: its queues, exchanges, bindings and everyone's permissions on it; its
    connections are closed (``OUT_VHOST_CLOSED``).  404 for an unknown vhost."""

    conn: str | None
    token: int | None
    name: str
    op: Op = Op.VHOST_DELETE


# ------------------------------------------------------------------- users (store/core/users.py)

class UserPut(NamedTuple):
    conn: str | None
    token: int | None
    channel: int | None
    name: str
    password_hash: str
    tags: list
    loopback_only: bool
    op: Op = Op.USER_PUT


class UserDelete(NamedTuple):
    conn: str | None
    token: int | None
    channel: int | None
    name: str
    op: Op = Op.USER_DELETE


class PermissionSet(NamedTuple):
    conn: str | None
    token: int | None
    channel: int | None
    user: str
    vhost: str
    configure: str
    write: str
    read: str
    op: Op = Op.PERMISSION_SET


class PermissionClear(NamedTuple):
    conn: str | None
    token: int | None
    channel: int | None
    user: str
    vhost: str
    op: Op = Op.PERMISSION_CLEAR


class LimitsSet(NamedTuple):
    """Set (an int; negative: no limit) or clear (None) limits of a vhost or a user: ``scope`` is
    ``"vhost"`` or ``"user"``, ``limits`` maps RabbitMQ's limit names to values (store/core/limits.py)."""

    conn: str | None
    token: int | None
    channel: int | None
    scope: str
    name: str
    limits: dict
    op: Op = Op.LIMITS_SET


# ------------------------------------------------------------------- audit (store/core/audit.py)

class AuditNote(NamedTuple):
    """Something a node's front end saw that the history must show on every node (issue 36): a
    connection opened or closed, a login or an operation refused, an administrative change.
    ``kind``: one of store/core/events.py's NOTE_KINDS; ``principal``: ``[user, protocol, address,
    connection name]``; ``queue``/``exchange``: the resource concerned, if any.  Changes no state
    but the event numbering; never refused, never answered (token None)."""

    conn: str | None
    token: int | None
    kind: int
    vhost: str
    queue: str
    exchange: str
    detail: str
    principal: list
    op: Op = Op.AUDIT_NOTE


class AuditChainOn(NamedTuple):
    """The cluster keeps an audit history: from this entry on every replica chains every event
    (the chain is replicated state, so all must start at the same entry).  Proposed by a node
    configured with a history; never turned off (a verifier follows the chain from here)."""

    conn: str | None
    token: int | None
    op: Op = Op.AUDIT_CHAIN_ON


# -------------------------------------------------------- AMQP 0-10 sessions (store/core/sessions.py)

class SessionAttach(NamedTuple):
    """Value: ``SessionBusy`` or ``SessionAttached``."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    principal: str
    name: bytes
    force: bool
    op: Op = Op.SESSION_ATTACH


class SessionDetach(NamedTuple):
    conn: str
    token: int | None
    channel: int
    op: Op = Op.SESSION_DETACH


class SessionTimeout(NamedTuple):
    """Value: the seconds granted."""

    conn: str
    token: int | None
    channel: int
    seconds: int
    op: Op = Op.SESSION_TIMEOUT


class SessionCommand(NamedTuple):
    """Apply ``inner`` once per (session, ``command_id``).  Value: inner's value, ``Duplicate``,
    or ``CommandResult`` for an inner query."""

    conn: str
    token: int | None
    channel: int
    command_id: int
    inner: Any  # a command of this module
    op: Op = Op.SESSION_COMMAND


class SessionKnownCompleted(NamedTuple):
    conn: str
    token: int | None
    channel: int
    ranges: list
    op: Op = Op.SESSION_KNOWN_COMPLETED


class SessionTxSelect(NamedTuple):
    conn: str
    token: int | None
    channel: int
    op: Op = Op.SESSION_TX_SELECT


class MessageSubscribe(NamedTuple):
    """Value: the destination."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    queue: str
    destination: str
    accept_none: bool
    exclusive: bool
    arguments: dict
    browse: bool = False
    op: Op = Op.MESSAGE_SUBSCRIBE


class MessageFlow(NamedTuple):
    conn: str
    token: int | None
    channel: int
    destination: str
    unit: int  # 0 messages, 1 bytes
    value: int
    op: Op = Op.MESSAGE_FLOW


class MessageFlowMode(NamedTuple):
    conn: str
    token: int | None
    channel: int
    destination: str
    window: bool
    op: Op = Op.MESSAGE_FLOW_MODE


class MessageStop(NamedTuple):
    conn: str
    token: int | None
    channel: int
    destination: str
    op: Op = Op.MESSAGE_STOP


class MessageFlush(NamedTuple):
    conn: str
    token: int | None
    channel: int
    destination: str
    op: Op = Op.MESSAGE_FLUSH


SETTLE_ACCEPT, SETTLE_RELEASE, SETTLE_RELEASE_REDELIVERED, SETTLE_REJECT = range(4)  # MessageSettle's ``how``


class MessageSettle(NamedTuple):
    """``how``: SETTLE_ACCEPT, _RELEASE, _RELEASE_REDELIVERED or _REJECT (above; also store.sessions')."""

    conn: str
    token: int | None
    channel: int
    ranges: list
    how: int
    op: Op = Op.MESSAGE_SETTLE


class MessageModify(NamedTuple):
    """AMQP 1.0's modified outcome with message-annotations (3.4.5): ``how`` as MessageSettle's
    (release, release counting the delivery, or reject), after ``annotations`` (``{"x-...": plain
    value}``, store/core/values.py's types) are merged into each message (store/core/modify.py).  A command of
    its own so that MessageSettle, one per batch of ordinary settlements, stays as it is."""

    conn: str
    token: int | None
    channel: int
    ranges: list
    how: int
    annotations: dict
    op: Op = Op.MESSAGE_MODIFY


class SessionWindowCredit(NamedTuple):
    """0-10 window mode: the client completed transfers; ``messages`` and ``bytes`` of credit back.
    Submitted without a token by the front end; never an error."""

    conn: str
    token: int | None
    channel: int
    destination: str
    messages: int
    bytes: int
    op: Op = Op.SESSION_WINDOW_CREDIT


class MessageAcquire(NamedTuple):
    """Value: the acquired transfer ranges."""

    conn: str
    token: int | None
    channel: int
    ranges: list
    op: Op = Op.MESSAGE_ACQUIRE


class MessageResume(NamedTuple):
    conn: str
    token: int | None
    channel: int
    op: Op = Op.MESSAGE_RESUME


class QueueQuery(NamedTuple):
    """Value: ``QueueInfo`` or None.  Read-only, through the log so that it is linearizable."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    op: Op = Op.QUEUE_QUERY


class ExchangeQuery(NamedTuple):
    """Value: ``ExchangeInfo`` or None."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    name: str
    op: Op = Op.EXCHANGE_QUERY


class ExchangeBound(NamedTuple):
    """Value: ``BoundInfo``.  ``routing_key``/``arguments`` None: not asked about."""

    conn: str
    token: int | None
    channel: int
    vhost: str
    exchange: str
    queue: str
    routing_key: str | None
    arguments: dict | None
    op: Op = Op.EXCHANGE_BOUND


# ------------------------------------------------------------------- queue groups (store/core/groups.py)

class GroupsSet(NamedTuple):
    """The cluster has ``groups`` groups: the metadata group (0) and ``groups - 1`` queue groups.
    Applied by the metadata group and forwarded to every queue group (placement reads it)."""

    conn: str | None
    token: int | None
    groups: int
    op: Op = Op.GROUPS_SET


class MetaApply(NamedTuple):
    """Metadata command ``seq`` of the metadata group's outbox, proposed to a queue group by the
    forwarder.  ``placed``: (qid, group) for a queue declare, as the metadata group decided it.
    A queue group applies each ``seq`` once, in order (a gap waits for the forwarder's resend)."""

    conn: str | None
    token: int | None
    seq: int
    command: Any
    placed: tuple | None
    op: Op = Op.META_APPLY


class MetaTrim(NamedTuple):
    """The metadata group drops outbox entries up to ``up_to``: every queue group applied them."""

    conn: str | None
    token: int | None
    up_to: int
    op: Op = Op.META_TRIM


class QueueGone(NamedTuple):
    """Queue group ``source`` deleted queue ``qid`` (auto-delete, x-expires, queue.delete): entry
    ``seq`` of its deletion outbox, applied once by the metadata group.  ``reply_conn`` and
    ``reply_token``: the client's queue.delete, answered by the metadata group too (None for a
    deletion no client asked for)."""

    conn: str | None
    token: int | None
    source: int
    seq: int
    qid: int
    reply_conn: str | None = None
    reply_token: int | None = None
    op: Op = Op.QUEUE_GONE


class GoneTrim(NamedTuple):
    """A queue group drops deletion-outbox entries up to ``up_to``: the metadata group has them."""

    conn: str | None
    token: int | None
    up_to: int
    op: Op = Op.GONE_TRIM


class QueueForget(NamedTuple):
    """Forget queue ``qid`` (deleted by its group) with its bindings; a no-op if gone already."""

    conn: str | None
    token: int | None
    qid: int
    op: Op = Op.QUEUE_FORGET


class MessageIn(NamedTuple):
    """A message group ``source`` routed to queues ``qids`` of this group (a dead-lettered copy,
    a delayed message released, a deduplicating exchange's publish): entry ``seq`` of the source's
    message outbox for this group, applied once.  The body travels with it."""

    conn: str | None
    token: int | None
    source: int
    seq: int
    qids: list
    exchange: str
    routing_key: str
    properties: bytes
    body: bytes
    persistent: bool
    priority: int
    expiration: int | None
    properties_format: int
    published_at: int
    op: Op = Op.MESSAGE_IN


class MessageDone(NamedTuple):
    """Group ``target`` has applied this group's messages for it up to ``up_to``: their outbox
    entries go, and with them their hold on the messages' bodies."""

    conn: str | None
    token: int | None
    target: int
    up_to: int
    op: Op = Op.MESSAGE_DONE


class TxBegin(NamedTuple):
    """A transaction over queues of several groups (the router split ``TxCommit`` by group), to
    the metadata group, which coordinates it: ``parts`` is ``[[group, operations, index]]``, where
    ``index`` gives the position of each of the part's publishes among the transaction's ``total``.
    ``token`` is None (no reply at apply): the coordinator answers ``reply_token`` once every
    participant applied the decision."""

    conn: str
    token: None
    channel: int
    reply_token: int | None
    total: int
    parts: list
    op: Op = Op.TX_BEGIN


class TxPrepare(NamedTuple):
    """Entry ``seq`` of the coordinator's prepares for this group (applied once, in order): check
    that part ``operations`` of transaction ``txid`` can commit, hold it, and vote."""

    conn: None
    token: None
    txid: int
    seq: int
    reply_conn: str  # the client's connection, or a 0-10 session's key (tx_groups.is_session_key)
    channel: int
    operations: list
    positions: list  # each publish's position among the transaction's (TxBegin's ``index``)
    op: Op = Op.TX_PREPARE


class TxVote(NamedTuple):
    """Participant ``group`` prepared (``code`` 0) or refused (an AMQP reply code, ``text``) ``txid``."""

    conn: None
    token: None
    txid: int
    group: int
    code: int
    text: str
    op: Op = Op.TX_VOTE


class TxFinish(NamedTuple):
    """The coordinator's decision on ``txid``: commit, or abort with the refusal ``code``/``text``."""

    conn: None
    token: None
    txid: int
    commit: bool
    code: int
    text: str
    op: Op = Op.TX_FINISH


class TxEnded(NamedTuple):
    """Participant ``group`` applied the decision on ``txid``; ``outcomes``: ``[[index, outcome]]``
    of its publishes (committed)."""

    conn: None
    token: None
    txid: int
    group: int
    outcomes: list
    op: Op = Op.TX_ENDED


class TxForget(NamedTuple):
    """A participant drops its finished record of ``txid``: the coordinator has its outcome."""

    conn: None
    token: None
    txid: int
    op: Op = Op.TX_FORGET


Command = (ChannelOpen | ChannelClose | ConnectionClose | Qos | Flow | ExchangeDeclare | ExchangeDelete
           | ExchangeBind | ExchangeUnbind | QueueDeclare | QueueBind | QueueUnbind | QueuePurge
           | QueueDelete | Consume | Cancel | Publish | Get | Ack | Nack | Recover | TxCommit | Tick
           | NodeReset | MemberSet | MemberRemove | VhostAdd | UserPut | UserDelete | PermissionSet
           | PermissionClear | SessionAttach | SessionDetach | SessionTimeout | SessionCommand
           | SessionKnownCompleted | SessionTxSelect | MessageSubscribe | MessageFlow | MessageFlowMode
           | MessageStop | MessageFlush | MessageSettle | MessageAcquire | MessageResume | QueueQuery
           | ExchangeQuery | ExchangeBound | SessionWindowCredit | MessageModify | VhostDelete
           | LimitsSet | GroupsSet | MetaApply | MetaTrim | QueueGone | GoneTrim | QueueForget | MessageIn
           | MessageDone | AuditNote | AuditChainOn | TxBegin | TxPrepare | TxVote | TxFinish | TxEnded
           | TxForget)

COMMAND_TYPES: dict[int, type[Command]] = {cls._field_defaults["op"]: cls for cls in Command.__args__}
assert len(COMMAND_TYPES) == len(Op), "every Op has exactly one command type"


def make(op: int, *fields: Any) -> Command:
    """The ``op`` command with these fields (conn, token, ...), for callers that choose the
    operation at run time (the admin API, tests); code that knows it builds the type itself."""
    return COMMAND_TYPES[op](*fields)


# -- a batch of commands as it travels through the Raft log -------------------------------------------
# One byte of format version, then the msgpack array of commands, each packed as the array of its
# fields.  Format 2 (typed commands) ends each command with its op; format 1 started it with the
# op and left optional trailing fields out.  A batch written before formats were numbered starts
# with msgpack's array header (0x90-0x9f, 0xdc, 0xdd), never with a byte below 0x80: version 1.
_MSGPACK_ARRAY_MIN = 0x90


def encode_batch(commands: list) -> bytes:
    return bytes((COMMAND_FORMAT,)) + msgpack.packb(commands, use_bin_type=True)


def decode_batch(blob: bytes | memoryview) -> list:
    """The typed commands of a batch; FormatTooNew for a batch from a newer raftmq."""
    version = blob[0]
    if version >= _MSGPACK_ARRAY_MIN:
        raws, version = msgpack.unpackb(blob, raw=False, strict_map_key=False), 1
    else:
        check("a batch in the log", version, COMMAND_FORMAT)
        raws = msgpack.unpackb(memoryview(blob)[1:], raw=False, strict_map_key=False)
    if version == 1:
        return [_typed_v1(raw) for raw in raws]
    return typed_commands(raws)


def typed_commands(raws: list) -> list:
    """Commands from the arrays of their fields (msgpack's view of what ``encode_batch`` or
    ``msgpack.packb`` of commands wrote).  Each is rebuilt without its type's Python-level
    constructor (every command, on every node: the log only holds what encode_batch wrote);
    nested commands are typed afterwards."""
    types, new = COMMAND_TYPES, tuple.__new__
    commands: list[Command] = [new(types[raw[-1]], raw) for raw in raws]
    for i, raw in enumerate(raws):
        if raw[-1] in _NESTING:
            commands[i] = _nested(commands[i], _typed_v2)
    return commands


def _typed_v2(raw: list) -> Command:
    command = COMMAND_TYPES[raw[-1]]._make(raw)
    return _nested(command, _typed_v2) if raw[-1] in _NESTING else command


def _typed_v1(raw: list) -> Command:
    """A format-1 command: ``[op, conn, token, *fields]``, optional trailing fields left out."""
    command = COMMAND_TYPES[raw[0]](*raw[1:])
    return _nested(command, _typed_v1) if raw[0] in _NESTING else command


_NESTING = frozenset((Op.SESSION_COMMAND, Op.TX_COMMIT, Op.META_APPLY, Op.TX_BEGIN, Op.TX_PREPARE))


def _nested(command: Any, typed) -> Command:
    if command.op == Op.SESSION_COMMAND:
        return command._replace(inner=typed(command.inner))
    if command.op == Op.META_APPLY:
        placed = tuple(command.placed) if command.placed is not None else None
        return command._replace(command=typed(command.command), placed=placed)
    if command.op == Op.TX_BEGIN:
        return command._replace(parts=[[group, [typed(raw) for raw in operations], list(index)]
                                       for group, operations, index in command.parts])
    return command._replace(operations=[typed(raw) for raw in command.operations])
