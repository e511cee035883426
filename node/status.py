"""A node's status in its data directory: ``status.json`` twice a second, ``digest.json`` on SIGUSR1.

These files are how tests and operators on the same machine look inside a running node without
a client protocol (the gRPC admin service builds on the same fields).  Both are written atomically
(temporary file + rename).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import time
from typing import TYPE_CHECKING

from raftmq.store.core import queries as Q
from raftmq.store.disk.snapshot import digest, live_bodies

from .group_bodies import link_bodies_status
from .group_status import group_views

if TYPE_CHECKING:
    from .broker import Broker

STATUS_INTERVAL = 0.5


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def status_of(broker: Broker) -> dict:
    log = broker.log
    counters = Q.counters(broker.machine)
    status = {
        "node_id": broker.config.node_id,
        "pid": os.getpid(),
        "boot": broker.boot,
        "time": time.time(),
        "applied_index": counters.applied_index,
        "batches_applied": log.batches_applied,
        "commands_applied": log.commands_applied,
        "connections": len(broker.endpoints),
        "clustered": broker.config.clustered,
        "event_seq": counters.event_seq,
        "apply_internal_errors": counters.internal_errors,
        "delayed_messages": counters.delayed_messages,  # held by x-delayed-message exchanges
        # The login pool (node/logins.py): logins hashing or queued, done, refused as too many.
        "logins_pending": broker.auth.pool.pending, "logins_completed": broker.auth.pool.completed,
        "logins_refused_busy": broker.auth.pool.refused,
        "logins_refused": broker.auth.refused,  # wrong password, unknown user... (node/auth.py)
        # Audit notes proposed by this node, and refusal notes held back by their bound (node/audit.py).
        "audit_notes": broker.audit.noted, "audit_notes_suppressed": broker.audit.suppressed,
        **bodies_status(broker),
        **link_bodies_status(broker),  # issue 34: held deliveries' bodies across a worker's link
    }
    if broker.group_host is not None:  # issue 34: each worker's status is <data>/groups/g<N>/status.json
        status["groups"] = {str(g): {"pid": w.process.pid, "meta_applied": w.meta_applied,
                                     "outbox_messages": len(w.msgs)}
                            for g, w in broker.group_host.workers.items()}
        status["group_count"] = broker.machine.group_count
        # Every group's role, term, commit/applied index, lag and leader as this node sees it (node/group_status.py).
        status["group_status"] = group_views(broker)
    if broker.events is not None:
        # Equal to event_seq once the audit writer has caught up with everything applied.
        status.update(audit_last_seq=broker.events.last_seq, audit_raft_index=broker.events.raft_index,
                      audit_written=broker.events.written, audit_trimmed=broker.events.trimmed)
    raft = log.raft_status()
    if raft is not None:
        status.update(
            role="leader" if log.is_leader else "follower",
            leader=log.leader,
            leader_node=broker.node_of_raft(log.leader),
            ready=log.ready,
            members=sorted(Q.members(broker.machine)),  # the replicated list (announced members)
            term=raft.term,
            commit_index=raft.commit_index,
            raft_applied=raft.applied_index,
            journal_entries=raft.journal_entries,
            journal_bytes=raft.journal_bytes,
            journal_reads=raft.journal_reads,  # entries read back from disk (not kept in memory)
            journal_flushes=raft.journal_flushes,
            connected_partners=list(raft.connected_partners),
            batches_proposed=raft.batches_proposed,
            commands_proposed=raft.commands_proposed,
            commit_latency_avg_ms=round(1000 * raft.commit_latency_total / max(1, raft.commit_latency_count), 3),
            commit_latency_total_s=raft.commit_latency_total,
            commit_latency_count=raft.commit_latency_count,
            member_lags=raft.lags,
            prevote_rounds=raft.prevote[0], prevote_won=raft.prevote[1],
            prevote_granted=raft.prevote[2], prevote_refused=raft.prevote[3],
            # Issue 29: null, or why this node takes part in no election until repaired.
            storage_repair=raft.repair, snapshots_damaged=raft.snapshots_damaged,
            storage_scrub_passes=raft.scrub[0], storage_scrub_bytes=raft.scrub[1],
            storage_damage_found=raft.scrub[2], storage_last_damage=raft.scrub[3],
            # Issue 31 (raft/gate.py): sockets on the Raft port that have not authenticated.
            raft_port_unauthenticated=raft.peer_gate[0], raft_port_timed_out=raft.peer_gate[1],
            raft_port_evicted=raft.peer_gate[2], raft_port_stalled=raft.peer_gate[3],
        )
    else:
        status.update(role="single", leader=None, leader_node=broker.config.node_id, ready=True)
    return status


def bodies_status(broker: Broker) -> dict:
    """The node's message bodies (store/disk/bodies.py): memory held, disk, and what moved."""
    bodies = broker.bodies
    stats, cache = bodies.stats, bodies.cache
    return {"body_held_bytes": bodies.held_bytes, "body_cache_bytes": cache.bytes,
            "body_cache_limit": cache.limit, "body_pending_bytes": bodies.pending_bytes,
            "body_cache_hits": cache.hits, "body_cache_misses": cache.misses, "body_cache_loaded": cache.loaded,
            "bodies_written": stats.written, "bodies_cancelled": stats.cancelled,
            "bodies_deleted": stats.deleted, "body_checkpoints": stats.checkpoints,
            "bodies_fetched": stats.fetched, "bodies_lost": stats.lost,
            "bodies_gone_unsent": stats.gone,
            # Damaged bodies (issue 29): found (read or scrub), replaced from a member, deliveries refused.
            "bodies_damaged": bodies.damaged, "bodies_repaired": stats.repaired,
            "bodies_refused": stats.refused, "body_store_damage_at_open": len(bodies.store.damage),
            "body_scrub_bytes": broker.scrubber.bytes if hasattr(broker, "scrubber") else 0}


def bodies_digest(broker: Broker) -> str:
    """SHA-256 over the body of every message the model holds, in id order, as this node has
    them: equal on every replica that has every body (a follower after a snapshot install too)."""
    h = hashlib.sha256()
    live = sorted(live_bodies(broker.machine))
    for start in range(0, len(live), 4096):
        ids = live[start:start + 4096]
        found = broker.bodies.peek(ids)
        for msg_id in ids:
            body = found.get(msg_id)
            h.update(msg_id.to_bytes(8, "big"))
            h.update(b"-" if body is None else len(body).to_bytes(8, "big") + body)
    return h.hexdigest()


def state_digest(broker: Broker) -> dict:
    """digest.json's body (also the management UI's digests, ops/http/members.py): ``digest``
    covers the model and the bodies this node has for it (issue 18: bodies live outside the model,
    and a replica without them is not identical), at ``applied_index``."""
    model, bodies = digest(broker.machine), bodies_digest(broker)
    combined = hashlib.sha256(f"{model}:{bodies}".encode()).hexdigest()
    return {"applied_index": Q.counters(broker.machine).applied_index, "digest": combined,
            "model_digest": model, "bodies_digest": bodies, "time": time.time()}


async def status_loop(broker: Broker, data_dir: str) -> None:
    path = os.path.join(data_dir, "status.json")
    loop = asyncio.get_running_loop()

    def write_digest() -> None:
        if broker.group_host is not None:  # issue 34: each queue group's worker writes its own
            for worker in broker.group_host.workers.values():
                try:
                    os.kill(worker.process.pid, signal.SIGUSR1)
                except OSError:
                    pass
        _write_json(os.path.join(data_dir, "digest.json"), state_digest(broker))

    try:
        loop.add_signal_handler(signal.SIGUSR1, write_digest)
    except (NotImplementedError, RuntimeError):
        pass
    while True:
        try:
            _write_json(path, status_of(broker))
        except OSError:
            pass
        await asyncio.sleep(STATUS_INTERVAL)
