"""The read API on the state machine: what node/ and ops/ may know of the model (issue 33).

RabbitMQ's rabbit_fifo answers reads with ``query_*`` functions of its state: read only, plain
values out.  These are the same for raftmq's machine, so that the management API, the metrics, the
admin service, the status file and the front ends' early checks no longer reach into
``broker.machine``'s dicts and entities (``vhosts[v].queues[q].ready``...): the model can change
shape without them changing, and nothing outside apply can mutate the model through what it read.

Plain functions taking the machine, not a facade object: like rabbit_fifo's, they hold nothing, so
there is no second object to keep pointing at the right machine (a node builds its machine once
but installs snapshots into it), and a caller pays one function call, no attribute hop.  Every
result is a NamedTuple of plain values or a fresh dict/list (copied: a caller that changes it
changes nothing in the model), but ``exchange_names``, a read-only view of the keys for a membership
test at once; results keep the model's order, which the callers' JSON order relies on (vhosts,
queues, exchanges in creation order; the callers sort where RabbitMQ sorts).  Nothing here writes,
reads a clock or does I/O, so calling a query between two applies is always safe, and on the event
loop (the model's only thread) a result is consistent.

Whole-table scans (``queue_depths``, ``consumers``) list the vhosts and each vhost's queues before
yielding, so a caller that pauses between items (ops/metrics.py yields the loop every 1,000 queues)
meets a stale number after a change, never a dict changed under its iteration.

Reads kept direct, and why (each on a per-message path, where a call and a NamedTuple per message
would add cost for nothing; they read, never write):

* node/amqp091/channel.py ``_submit_publish``: the target exchange exists, per basic.publish;
* node/amqp10/links.py ``_check``: the target exchange (and default-exchange queue) exists, per
  transfer of an anonymous-relay link (``to`` per message), and per attach through the same code;
* node/amqp010/session.py ``_window_mode``: the subscription's flow mode, per message.transfer sent.

node/broker.py, which builds and configures the machine, keeps its wiring: the configuration it sets
(``delayed_limit``, ``durable_links_limit``, ``event_sink``, ``limit_commands.on_refused``, the
audit ``event_seq`` aligned with the history at start), the bodies loaded at start, the machine's own timer methods (``next_expiry_due``, ``next_deadline``), and
the limit and user tables it hands to node/limits.py's Usage and node/auth.py's Authenticator, read at
each connection open and login through their own interfaces.  The model digest and the live body ids
(node/status.py) are store/disk/snapshot.py's ``digest`` and ``live_bodies``: storage-side functions
of the machine, not model reaches.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, NamedTuple

from .sessions import DURABLE_LINK_PREFIX, durable_links_of

if TYPE_CHECKING:
    from .machine import StateMachine
    from .model import Queue, VHost


#: Builds a NamedTuple from a tuple of its fields without the generated __new__'s argument
#: handling (0.13 µs against 0.30 µs): the scans of every queue build one per queue.
_new = tuple.__new__


# ------------------------------------------------------------------ result types

class QueueInfo(NamedTuple):
    """A queue as the management API and the admin service show it."""

    qid: int
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    exclusive_owner: str | None  # the owning connection's id, or None
    arguments: dict
    messages_ready: int
    messages_unacknowledged: int
    message_bytes_ready: int
    consumers: int
    published: int  # messages enqueued: its entries are numbered from 1, so the next number less one


class QueueDepth(NamedTuple):
    """A queue's numbers only, for the periodic scans of every queue (metrics, rates)."""

    qid: int
    vhost: str
    name: str
    messages_ready: int
    messages_unacknowledged: int
    consumers: int
    published: int  # as QueueInfo's: since the queue was declared (on a single node restarted, since
    # its oldest surviving message: its entries are renumbered)


class ConsumerInfo(NamedTuple):
    vhost: str
    queue: str
    tag: str
    connection: str | None  # the consuming connection's id (None: a detached 0-10 session's)
    channel: int
    prefetch: int
    unacked: int
    no_ack: bool
    exclusive: bool


class ExchangeInfo(NamedTuple):
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict
    bindings: int
    messages_delayed: int  # held by an x-delayed-message exchange (store/core/delayed.py); else 0
    cache_entries: int | None  # an x-message-deduplication exchange's cache (store/core/dedup.py):
    cache_size: int | None  # entries and its x-cache-size; None for other exchanges or no cache yet


class BindingInfo(NamedTuple):
    """The attribute names are routing.Binding's, so views written for bindings take either."""

    vhost: str
    source: str
    destination: str
    dest_is_queue: bool
    routing_key: str
    arguments: dict


class VhostInfo(NamedTuple):
    name: str
    queues: int
    exchanges: int
    consumers: int
    messages_ready: int
    messages_unacknowledged: int


class UserInfo(NamedTuple):
    """A replicated user (store/core/users.py); users of the configuration file are the node's."""

    name: str
    password_hash: str
    tags: tuple[str, ...]
    loopback_only: bool
    permissions: dict[str, tuple[str, str, str]]  # vhost -> (configure, write, read)


class ChannelInfo(NamedTuple):
    """One channel of a connection as the machine holds it (an AMQP 0-10 session's or a 1.0 core
    session's channel state too)."""

    number: int
    active: bool  # channel.flow
    consumers: int
    messages_unacknowledged: int
    prefetch_count: int  # channel-wide (basic.qos global=true)
    consumer_prefetch: int  # for consumers created after basic.qos global=false


class SessionInfo(NamedTuple):
    """A resumable session (store/core/sessions.py): an AMQP 0-10 session, or an AMQP 1.0 durable
    link (kept as a session whose name starts with DURABLE_LINK_PREFIX)."""

    kind: str  # "0-10 session" or "1.0 durable link"
    vhost: str
    principal: str
    name: str  # the session's name (a link's: the container's and the link's, after the prefix)
    detached_at: int | None  # microseconds (leader time); None while attached
    timeout: int  # seconds its state outlives a detach
    unsettled: int  # transfers sent and not yet accepted, released or rejected: replayed on resume
    subscriptions: int  # consumers on its channel


class Counters(NamedTuple):
    """The machine's own counters, as node/status.py and the metrics report them."""

    applied_index: int
    event_seq: int
    internal_errors: int  # commands whose apply raised a bug (541)
    delayed_messages: int
    sessions: int  # AMQP 0-10 / 1.0 core sessions, attached or detached


# ------------------------------------------------------------------ vhosts

def vhost_names(m: StateMachine) -> list[str]:
    """Every vhost, in the order they were created."""
    return list(m.vhosts)


def has_vhost(m: StateMachine, vhost: str) -> bool:
    return vhost in m.vhosts


def vhost(m: StateMachine, name: str) -> VhostInfo | None:
    v = m.vhosts.get(name)
    if v is None:
        return None
    queues = list(v.queues.values())
    return VhostInfo(v.name, len(queues), len(v.exchanges), sum(len(q.consumers) for q in queues),
                     sum(len(q.ready) for q in queues), sum(q.unacked_count for q in queues))


def vhosts(m: StateMachine) -> list[VhostInfo]:
    """Every vhost's totals, in creation order."""
    return [info for info in (vhost(m, name) for name in list(m.vhosts)) if info is not None]


# ------------------------------------------------------------------ queues

def _queue_info(q: Queue) -> QueueInfo:
    return _new(QueueInfo, (q.qid, q.vhost, q.name, q.durable, q.auto_delete, q.exclusive_owner,
                            dict(q.arguments or {}), len(q.ready), q.unacked_count, q.ready_bytes, len(q.consumers),
                            q.next_seq - 1))


def has_queue(m: StateMachine, vhost: str, name: str) -> bool:
    v = m.vhosts.get(vhost)
    return v is not None and name in v.queues


def queue(m: StateMachine, vhost: str, name: str) -> QueueInfo | None:
    v = m.vhosts.get(vhost)
    q = v.queues.get(name) if v is not None else None
    return _queue_info(q) if q is not None else None


def queues(m: StateMachine, vhost: str) -> list[QueueInfo]:
    """The vhost's queues in model order (as declared; [] for an unknown vhost)."""
    v = m.vhosts.get(vhost)
    if v is None:
        return []
    return [_queue_info(q) for q in list(v.queues.values())]


def queue_count(m: StateMachine, vhost: str) -> int:
    v = m.vhosts.get(vhost)
    return len(v.queues) if v is not None else 0


def queue_name(m: StateMachine, qid: int) -> str | None:
    """The name of the queue with internal id ``qid`` (bodies' log lines), or None."""
    q = m.queues_by_id.get(qid)
    return q.name if q is not None else None


def _listed(m: StateMachine, vhost: str | None) -> list[VHost]:
    if vhost is None:
        return list(m.vhosts.values())
    v = m.vhosts.get(vhost)
    return [v] if v is not None else []


def queue_depths(m: StateMachine, vhost: str | None = None) -> Iterator[QueueDepth]:
    """Every queue's numbers (of one vhost, or all), in model order; see the module docstring on
    pausing between items."""
    for v in _listed(m, vhost):
        name = v.name
        for q in list(v.queues.values()):
            yield _new(QueueDepth, (q.qid, name, q.name, len(q.ready), q.unacked_count, len(q.consumers),
                                    q.next_seq - 1))


def consumers(m: StateMachine, vhost: str | None = None, queue: str | None = None) -> Iterator[ConsumerInfo]:
    """The consumers of every queue (of one vhost, or all; of one queue), in model order."""
    for v in _listed(m, vhost):
        if queue is None:
            listed = list(v.queues.values())
        else:
            one = v.queues.get(queue)
            listed = [one] if one is not None else []
        for q in listed:
            for c in list(q.consumers):
                yield ConsumerInfo(v.name, q.name, c.tag, c.channel.conn, c.channel.number, c.prefetch, c.unacked,
                                   c.no_ack, c.exclusive)


# ------------------------------------------------------------------ exchanges and bindings

def has_exchange(m: StateMachine, vhost: str, name: str) -> bool:
    v = m.vhosts.get(vhost)
    return v is not None and name in v.exchanges


def exchange_names(m: StateMachine, vhost: str) -> AbstractSet[str]:
    """The vhost's exchange names: a read-only live view (no copy: an AMQP 1.0 attach asks it once),
    to test membership in at once, not to keep."""
    v = m.vhosts.get(vhost)
    return v.exchanges.keys() if v is not None else frozenset()


def exchange(m: StateMachine, vhost: str, name: str) -> ExchangeInfo | None:
    v = m.vhosts.get(vhost)
    e = v.exchanges.get(name) if v is not None else None
    if e is None:
        return None
    delayed = m.delayed.held_by(e.vhost, e.name) if e.type == "x-delayed-message" else 0
    cache = m.exchange_caches.get((e.vhost, e.name)) if e.type == "x-message-deduplication" else None
    return ExchangeInfo(e.vhost, e.name, e.type, e.durable, e.auto_delete, e.internal, dict(e.arguments or {}),
                        len(e.bindings), delayed, len(cache.entries) if cache is not None else None,
                        cache.size if cache is not None else None)


def exchanges(m: StateMachine, vhost: str) -> list[ExchangeInfo]:
    """The vhost's exchanges in model order (as declared; [] for an unknown vhost)."""
    v = m.vhosts.get(vhost)
    if v is None:
        return []
    return [info for info in (exchange(m, vhost, name) for name in list(v.exchanges)) if info is not None]


def bindings(m: StateMachine, vhost: str, source: str | None = None) -> list[BindingInfo]:
    """The explicit bindings of the vhost (from its exchanges in name order, as RabbitMQ lists them,
    each exchange's in binding order), or of exchange ``source`` only.  The default exchange's implicit binding to every queue is not one:
    callers that show it build it from the queue (RabbitMQ lists it)."""
    v = m.vhosts.get(vhost)
    if v is None:
        return []
    if source is None:
        listed = sorted(v.exchanges.values(), key=lambda e: e.name)
    else:
        one = v.exchanges.get(source)
        listed = [one] if one is not None else []
    return [BindingInfo(vhost, b.source, b.destination, b.dest_is_queue, b.routing_key, dict(b.arguments or {}))
            for e in listed for b in e.bindings]


# ------------------------------------------------------------------ users, permissions, limits

def _user_info(record) -> UserInfo:
    return UserInfo(record.name, record.password_hash, tuple(record.tags), record.loopback_only,
                    dict(record.permissions))


def users(m: StateMachine) -> list[UserInfo]:
    """The replicated users, in creation order."""
    return [_user_info(u) for u in list(m.users.values())]


def user(m: StateMachine, name: str) -> UserInfo | None:
    record = m.users.get(name)
    return _user_info(record) if record is not None else None


def has_user(m: StateMachine, name: str) -> bool:
    """A replicated user of that name (users of the configuration file are the node's to know)."""
    return name in m.users


def permission_overlay(m: StateMachine, name: str) -> dict[str, tuple[str, str, str] | None]:
    """The permissions set through the cluster for a user of the configuration file (store/core/users.py):
    vhost -> patterns, None where the file's were cleared; {} when none."""
    return dict(m.permission_overlay.get(name) or {})


def vhost_limits(m: StateMachine, vhost: str) -> dict[str, int]:
    """The vhost's limits ({} when none), store/core/limits.py."""
    return dict(m.vhost_limits.get(vhost) or {})


def user_limits(m: StateMachine, user: str) -> dict[str, int]:
    return dict(m.user_limits.get(user) or {})


def limited_vhosts(m: StateMachine) -> list[str]:
    """The vhosts with at least one limit, by name."""
    return sorted(name for name, limits in m.vhost_limits.items() if limits)


def limited_users(m: StateMachine) -> list[str]:
    return sorted(name for name, limits in m.user_limits.items() if limits)


# ------------------------------------------------------------------ connections and sessions

def channels(m: StateMachine, conn_id: str) -> list[ChannelInfo]:
    """The connection's channels by number."""
    held = m.channels.get(conn_id) or {}
    return [ChannelInfo(number, ch.active, len(ch.consumers), len(ch.unacked), ch.prefetch_count, ch.consumer_prefetch)
            for number, ch in sorted(held.items())]


def channel_count(m: StateMachine, conn_id: str) -> int:
    """The channels (0-10 sessions' included) the machine holds for connection ``conn_id``."""
    return len(m.channels.get(conn_id) or {})


def has_session(m: StateMachine, key: str) -> bool:
    return key in m.sessions


def durable_link_count(m: StateMachine, principal: str) -> int:
    """The AMQP 1.0 durable links of ``principal`` (store/core/sessions.py), every vhost."""
    return durable_links_of(m.sessions, principal)


# ------------------------------------------------------------------ cluster and counters

def sessions(m: StateMachine) -> list[SessionInfo]:
    """Every resumable session, attached or detached (0-10 sessions and 1.0 durable links)."""
    out = []
    for session in list(m.sessions.values()):
        name = bytes(session.name)
        link = name.startswith(DURABLE_LINK_PREFIX)
        if link:
            name = name[len(DURABLE_LINK_PREFIX):]
        out.append(_new(SessionInfo, ("1.0 durable link" if link else "0-10 session", session.vhost,
                                      session.principal, name.decode("utf-8", "replace").replace("\x00", " / "),
                                      session.detached_at, session.timeout, len(session.transfers),
                                      len(session.channel.consumers))))
    return out


def dedup_queues(m: StateMachine) -> list[tuple[str, str, int]]:
    """(vhost, queue, entries) of every queue with an x-message-deduplication cache."""
    return [(v.name, q.name, len(q.dedup.entries)) for v in list(m.vhosts.values())
            for q in list(v.queues.values()) if q.dedup is not None]


def members(m: StateMachine) -> dict[str, tuple[str, str]]:
    """The replicated member list: node id -> (raft address, amqp address); {} for a single node."""
    return dict(m.members)


def counters(m: StateMachine) -> Counters:
    return Counters(m.applied_index, m.event_seq, m.internal_errors, len(m.delayed), len(m.sessions))


def message_stats(m: StateMachine) -> dict[str, int]:
    """The message counters since this node started applying (published, delivered, acked...)."""
    return dict(m.stats)


def queue_counts(m: StateMachine, qid: int) -> tuple[int, int]:
    """(delivered or got, acked) of one queue since this node started applying (machine.queue_counts)."""
    counts = m.queue_counts.get(qid)
    return (counts[0], counts[1]) if counts is not None else (0, 0)


def all_queue_counts(m: StateMachine) -> dict[int, tuple[int, int]]:
    """Every queue's (delivered or got, acked) that has any, by qid (a copy: for periodic samples)."""
    return {qid: (c[0], c[1]) for qid, c in m.queue_counts.items()}


def next_delayed_due(m: StateMachine) -> int | None:
    """When the first message held by an x-delayed-message exchange is due (microseconds), or None."""
    return m.delayed.next_due()
