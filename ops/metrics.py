"""Prometheus metrics of a node, collected at scrape time from the broker's state.

Nothing is counted on the hot path except a few integers in the state machine (its message counters,
read with the rest of its state through store/core/queries.py);
everything else (queue depths, Raft indexes, connections) is read when Prometheus scrapes.
Enable with ``metrics_port`` (``raftmq cluster up`` serves 15692, 15693, ... per node).

Metric names (all prefixed ``raftmq_``): ``messages_published_total``, ``messages_unroutable_total``,
``messages_delivered_total``, ``messages_redelivered_total``, ``messages_acked_total``,
``messages_rejected_total``, ``messages_dead_lettered_total``, ``messages_expired_total``;
``queue_messages_ready``, ``queue_messages_unacked``, ``queue_consumers`` (labels vhost, queue);
``connections``, ``sessions``, ``commands_applied_total``, ``raft_is_leader``, ``raft_term``,
``raft_commit_index``, ``raft_applied_index``, ``raft_commit_latency_seconds_avg``,
``raft_leader_changes_total``, ``resource_alarm`` (1 while publishers are blocked);
``fd_limit``, ``fd_open``, ``listener_connections``, ``listener_refused_total`` (labels listener,
reason), ``listener_timed_out_total`` (the HTTP API's and this port's listeners, issue 31);
``amqp10_limit_refusals_total`` (label kind: link, durable link, management request, undecodable
delivery, undecodable frame); ``logins_refused_busy_total`` (node/logins.py), ``logins_refused_total``
(node/auth.py), ``audit_notes_total`` and ``audit_notes_suppressed_total`` (node/audit.py, issue 36),
``raft_port_sockets_closed_total`` (label reason: raft/gate.py); with raft_groups > 1 (issue 34),
per group (label group): ``group_is_leader``, ``group_raft_term``, ``group_raft_commit_index``,
``group_raft_applied_index``, ``group_raft_lag``, ``group_leader`` (label leader),
``group_status_age_seconds``.
Served by ops/metrics_server.py (bounded like the HTTP API's listener).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from raftmq.node.amqp10.limits import KINDS
from raftmq.node.group_figures import depth_with_figures
from raftmq.store.core import queries as Q

if TYPE_CHECKING:
    from raftmq.node.broker import Broker

log = logging.getLogger(__name__)


PAUSE = object()  # yielded by collect_in_steps between chunks of queues: the serving loop runs there
QUEUE_STEP = 1000  # queues per step (3 samples each: ~5 ms)


class BrokerCollector:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self):
        return (family for family in self.collect_in_steps() if family is not PAUSE)

    def collect_in_steps(self, figures: dict | None = None, totals: tuple[dict, dict] | None = None):
        """The families, with PAUSE between every QUEUE_STEP queues: ops/metrics_server.py collects on
        the event loop (the state is the loop's) and lets it run there; 60,000 queues in one go held
        it for ~280 ms.  Queues and vhosts are listed first, so a change during a pause costs a stale
        number, never an iteration over a changed dict."""
        broker = self.broker
        machine = broker.machine
        node = broker.config.node_id
        # totals: issue 34, the message counters and body figures of every group's process summed
        # (node/group_figures.py node_totals); None with one group.
        for key, value in (totals[0] if totals else Q.message_stats(machine)).items():
            family = CounterMetricFamily(f"raftmq_messages_{key}", f"messages {key.replace('_', ' ')}",
                                         labels=["node"])
            family.add_metric([node], value)
            yield family
        errors = CounterMetricFamily("raftmq_apply_internal_errors", "commands whose apply raised a bug (541)",
                                     labels=["node"])
        counters = Q.counters(machine)
        errors.add_metric([node], counters.internal_errors)
        yield errors
        ready = GaugeMetricFamily("raftmq_queue_messages_ready", "messages ready for delivery",
                                  labels=["node", "vhost", "queue"])
        unacked = GaugeMetricFamily("raftmq_queue_messages_unacked", "messages delivered, not acknowledged",
                                    labels=["node", "vhost", "queue"])
        consumers = GaugeMetricFamily("raftmq_queue_consumers", "consumers", labels=["node", "vhost", "queue"])
        for counted, queue in enumerate(Q.queue_depths(machine), 1):
            if figures:  # issue 34: a queue group's queue, as its worker has it (node/group_figures.py)
                queue = depth_with_figures(queue, figures.get(queue.qid))
            labels = [node, queue.vhost, queue.name]
            ready.add_metric(labels, queue.messages_ready)
            unacked.add_metric(labels, queue.messages_unacknowledged)
            consumers.add_metric(labels, queue.consumers)
            if counted % QUEUE_STEP == 0:
                yield PAUSE
        yield ready
        yield unacked
        yield consumers
        yield _gauge("raftmq_connections", "client connections on this node", node, len(broker.endpoints))
        yield _gauge("raftmq_delayed_messages", "messages held by x-delayed-message exchanges", node,
                     Q.counters(machine).delayed_messages)
        by_protocol = GaugeMetricFamily("raftmq_connections_by_protocol", "client connections on this node",
                                        labels=["node", "protocol"])
        counts = Counter(_protocol(endpoint) for endpoint in broker.endpoints.values())
        for protocol in ("AMQP 0-9-1", "AMQP 0-10", "AMQP 1-0"):
            by_protocol.add_metric([node, protocol], counts.get(protocol, 0))
        yield by_protocol
        published = CounterMetricFamily("raftmq_messages_published_by_protocol",
                                        "messages published through this node's connections", labels=["node", "protocol"])
        delivered = CounterMetricFamily("raftmq_messages_delivered_by_protocol",
                                        "messages delivered to this node's connections", labels=["node", "protocol"])
        for protocol in ("AMQP 0-9-1", "AMQP 0-10", "AMQP 1-0"):
            counts = broker.message_counts.get(protocol, (0, 0))
            published.add_metric([node, protocol], counts[0])
            delivered.add_metric([node, protocol], counts[1])
        yield published
        yield delivered
        limits = getattr(broker, "amqp10_refusals", None)  # node/amqp10/limits.py, created on first refusal
        refused = CounterMetricFamily("raftmq_amqp10_limit_refusals",
                                      "AMQP 1.0 attaches and /management requests refused by a per-connection "
                                      "or per-user bound", labels=["node", "kind"])
        for kind in KINDS:
            refused.add_metric([node, kind], limits.counts.get(kind, 0) if limits is not None else 0)
        yield refused
        yield _gauge("raftmq_sessions", "AMQP 0-10 sessions in the cluster", node, Q.counters(machine).sessions)
        yield _gauge("raftmq_resource_alarm", "1 while a resource alarm blocks publishers", node,
                     1 if broker.alarm else 0)
        yield from _body_metrics(broker, node, totals[1] if totals else None)
        yield from _listener_metrics(node)
        limited = CounterMetricFamily("raftmq_limit_refusals", "this node's clients' queues, connections and "
                                      "channels refused by a vhost or user limit (node/limits.py)",
                                      labels=["node", "limit"])
        for limit in ("vhost max-queues", "vhost max-connections", "user max-connections", "user max-channels"):
            limited.add_metric([node, limit], broker.usage.refused[limit])
        yield limited
        applied = CounterMetricFamily("raftmq_commands_applied", "commands applied by the state machine",
                                      labels=["node"])
        applied.add_metric([node], broker.log.commands_applied)
        yield applied
        busy = CounterMetricFamily("raftmq_logins_refused_busy", "logins refused: too many pending (node/logins.py)",
                                   labels=["node"])
        busy.add_metric([node], broker.auth.pool.refused)
        yield busy
        failed = CounterMetricFamily("raftmq_logins_refused", "client logins refused: wrong password, unknown "
                                     "user, loopback-only user, bad response (node/auth.py)", labels=["node"])
        failed.add_metric([node], broker.auth.refused)
        yield failed
        notes = CounterMetricFamily("raftmq_audit_notes", "audit notes proposed by this node: connections, "
                                    "refusals, admin changes (node/audit.py)", labels=["node"])
        notes.add_metric([node], broker.audit.noted)
        yield notes
        held = CounterMetricFamily("raftmq_audit_notes_suppressed", "refusal notes held back by the per-address "
                                   "bound and proposed as counts (node/audit.py)", labels=["node"])
        held.add_metric([node], broker.audit.suppressed)
        yield held
        raft = broker.log.raft_status()
        if raft is not None:
            closed = CounterMetricFamily("raftmq_raft_port_sockets_closed",
                                         "Raft port sockets closed by raft/gate.py, by reason", labels=["node", "reason"])
            for reason, count in zip(("handshake_timeout", "unauthenticated_cap", "frame_stall"), raft.peer_gate[1:], strict=True):
                closed.add_metric([node, reason], count)
            yield closed
            yield _gauge("raftmq_raft_is_leader", "1 on the Raft leader", node, 1 if broker.log.is_leader else 0)
            yield _gauge("raftmq_raft_term", "current Raft term", node, raft.term)
            yield _gauge("raftmq_raft_commit_index", "Raft commit index", node, raft.commit_index)
            yield _gauge("raftmq_storage_repair_pending",
                         "1 while this node's storage lost entries it may have acknowledged: it does not vote",
                         node, 0 if raft.repair is None else 1)
            damaged = CounterMetricFamily("raftmq_snapshots_damaged", "snapshots found damaged at start",
                                          labels=["node"])
            damaged.add_metric([node], raft.snapshots_damaged)
            yield damaged
            found = CounterMetricFamily("raftmq_storage_damage_found",
                                        "damaged journal records or snapshots the scrubber found", labels=["node"])
            found.add_metric([node], raft.scrub[2])
            yield found
            scrubbed = CounterMetricFamily("raftmq_storage_scrub_bytes",
                                           "journal and snapshot bytes read back and verified", labels=["node"])
            scrubbed.add_metric([node], raft.scrub[1])
            yield scrubbed
            yield _gauge("raftmq_raft_applied_index", "Raft index applied", node, raft.applied_index)
            avg = raft.commit_latency_total / raft.commit_latency_count if raft.commit_latency_count else 0.0
            yield _gauge("raftmq_raft_commit_latency_seconds_avg",
                         "average time from proposing a batch to applying it", node, avg)
            changes = CounterMetricFamily("raftmq_raft_leader_changes", "leader changes seen", labels=["node"])
            changes.add_metric([node], broker.leader_changes)
            yield changes
        if broker.group_host is not None:
            yield from _group_metrics(broker, node)


def _group_metrics(broker: Broker, node: str):
    """Issue 34: every Raft group's replica on this node (node/group_status.py), label ``group``;
    a group whose worker has not written its status lately is left out of the figures but for
    ``raftmq_group_status_age_seconds``."""
    from raftmq.node.group_status import group_views

    families = {
        "is_leader": GaugeMetricFamily("raftmq_group_is_leader", "1 where this node leads the group",
                                       labels=["node", "group"]),
        "term": GaugeMetricFamily("raftmq_group_raft_term", "the group's current Raft term", labels=["node", "group"]),
        "commit_index": GaugeMetricFamily("raftmq_group_raft_commit_index", "the group's Raft commit index",
                                          labels=["node", "group"]),
        "applied_index": GaugeMetricFamily("raftmq_group_raft_applied_index", "the group's Raft index applied here",
                                           labels=["node", "group"]),
        "lag": GaugeMetricFamily("raftmq_group_raft_lag", "entries committed and not applied here",
                                 labels=["node", "group"]),
    }
    leader = GaugeMetricFamily("raftmq_group_leader", "1 for the node this replica follows (or is)",
                               labels=["node", "group", "leader"])
    age = GaugeMetricFamily("raftmq_group_status_age_seconds", "age of the group worker's last status",
                            labels=["node", "group"])
    for view in group_views(broker):
        group = str(view["group"])
        if view.get("age") is not None:
            age.add_metric([node, group], view["age"])
        if view["role"] == "unknown":
            continue
        families["is_leader"].add_metric([node, group], 1 if view["role"] in ("leader", "single") else 0)
        for key in ("term", "commit_index", "applied_index", "lag"):
            if view.get(key) is not None:
                families[key].add_metric([node, group], view[key])
        if view.get("leader"):
            leader.add_metric([node, group, view["leader"]], 1)
    yield from families.values()
    yield leader
    yield age


def _body_metrics(broker: Broker, node: str, summed: dict | None = None):
    """The node's message bodies (store/disk/bodies.py): memory held, cache traffic, disk traffic.
    ``summed``: with queue groups, node/status.py bodies_status of every process added up (each
    group has a body store and a cache of its own: the limit is theirs together)."""
    bodies = broker.bodies
    b = summed or {"body_held_bytes": bodies.held_bytes, "body_cache_bytes": bodies.cache.bytes,
                   "body_cache_limit": bodies.cache.limit, "body_cache_hits": bodies.cache.hits,
                   "body_cache_misses": bodies.cache.misses, "body_cache_loaded": bodies.cache.loaded,
                   "bodies_written": bodies.stats.written, "bodies_deleted": bodies.stats.deleted,
                   "bodies_fetched": bodies.stats.fetched, "bodies_lost": bodies.stats.lost,
                   "bodies_damaged": bodies.damaged, "bodies_repaired": bodies.stats.repaired,
                   "bodies_refused": bodies.stats.refused}
    yield _gauge("raftmq_body_memory_bytes", "message body bytes held in memory (cache and not yet written)",
                 node, b["body_held_bytes"])
    yield _gauge("raftmq_body_cache_bytes", "message body bytes in the body cache", node, b["body_cache_bytes"])
    yield _gauge("raftmq_body_cache_limit_bytes", "body_cache_bytes", node, b["body_cache_limit"])
    counters = (("raftmq_body_cache_hits", "deliveries whose body was in memory", b["body_cache_hits"]),
                ("raftmq_body_cache_misses", "deliveries whose body was read from disk alone", b["body_cache_misses"]),
                ("raftmq_bodies_read", "bodies read from disk (misses and read-ahead)", b["body_cache_loaded"]),
                ("raftmq_bodies_written", "bodies written to disk", b["bodies_written"]),
                ("raftmq_bodies_deleted", "bodies deleted from disk", b["bodies_deleted"]),
                ("raftmq_bodies_fetched", "bodies fetched from other members after a snapshot install",
                 b["bodies_fetched"]),
                ("raftmq_bodies_lost", "deliveries or copies whose body this node lacked (never expected)",
                 b["bodies_lost"]),
                ("raftmq_bodies_damaged", "stored bodies found damaged (checksum mismatch or unreadable)",
                 b["bodies_damaged"]),
                ("raftmq_bodies_repaired", "damaged bodies replaced by an intact copy from a member",
                 b["bodies_repaired"]),
                ("raftmq_bodies_refused", "deliveries not sent: body damaged and not repaired",
                 b["bodies_refused"]))
    for name, doc, value in counters:
        family = CounterMetricFamily(name, doc, labels=["node"])
        family.add_metric([node], value)
        yield family


def _listener_metrics(node: str):
    """Descriptors, and the sockets of listeners other than AMQP's (node/descriptors.py, issue 31)."""
    from raftmq.node.descriptors import LISTENERS, nofile_limit, open_descriptors

    yield _gauge("raftmq_fd_limit", "the soft RLIMIT_NOFILE", node, nofile_limit())
    yield _gauge("raftmq_fd_open", "file descriptors open", node, open_descriptors() or 0)
    held = GaugeMetricFamily("raftmq_listener_connections", "connections a listener holds", labels=["node", "listener"])
    refused = CounterMetricFamily("raftmq_listener_refused", "connections refused at accept, by reason",
                                  labels=["node", "listener", "reason"])
    timed_out = CounterMetricFamily("raftmq_listener_timed_out", "connections closed for not sending a request "
                                    "(or handshake) in time", labels=["node", "listener"])
    for name, stats in list(LISTENERS.items()):
        held.add_metric([node, name], stats.open)
        for reason, count in list(stats.refused.items()):
            refused.add_metric([node, name, reason], count)
        timed_out.add_metric([node, name], stats.timed_out)
    yield from (held, refused, timed_out)


def _protocol(endpoint) -> str:
    """The protocol of a connection as the HTTP API names it (an endpoint's PROTOCOL, else by class)."""
    name = getattr(endpoint, "PROTOCOL", None)
    if name:
        return name
    return "AMQP 0-10" if type(endpoint).__name__.startswith("Amqp010") else "AMQP 0-9-1"


def _gauge(name: str, doc: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family
