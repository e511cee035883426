"""Time: message TTLs, idle queues, detached sessions and delayed messages due at the batch time,
and dead-lettering.

A concern of the state machine: how the concerns meet is in store/core/machine.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import events as EV
from .commands import (
    Tick,
)
from .headers import add_x_death
from .model import Message, Queue
from .values import as_int

if TYPE_CHECKING:
    from .machine import StateMachine



class Expiry:
    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def tick(self, cmd: Tick) -> None:
        """Expire message heads, idle queues and detached sessions as of the batch time."""
        m = self.m
        if m.detached_sessions:
            m.session_commands.expire_sessions()
        if m.delayed.heap:
            m.plugin_exchanges.release_delayed()
        if m.rescan:  # filtered consumers go on scanning where the last dispatch's bound stopped them
            rescan, m.rescan = m.rescan, {}
            m._dirty.update(rescan)
        for queue in list(m.expiring.values()):
            self.expire_head(queue)
        for qid, queue in list(m.idle_expiring.items()):
            expires = as_int(queue.arguments.get("x-expires"))
            idle_for = m._now - m.queue_last_used.get(qid, m._now)
            if not queue.consumers and expires is not None and idle_for >= expires * 1000:
                m.topology.delete_queue(queue)

    def next_expiry_due(self) -> bool:
        m = self.m
        return (bool(m.expiring) or bool(m.idle_expiring) or bool(m.detached_sessions)
                or bool(m.delayed.heap) or bool(m.rescan))

    def next_deadline(self) -> int | None:
        """The earliest time (microseconds) at which a TICK would change something, or None.

        The node proposes a TICK only once its clock passes this: an idle cluster with detached
        sessions or TTLs far in the future does not fill the log with ticks.
        """
        m = self.m
        best = m.delayed.next_due()  # released once the stamped time reaches it
        if m.rescan:
            best = m._now  # a filtered consumer's scan is unfinished: due at once
        for queue in m.expiring.values():
            head = queue.ready.peek()
            if head is not None and head.expires_at is not None:
                candidate = head.expires_at + 1  # expiry is strictly after expires_at
                best = candidate if best is None or candidate < best else best
        for qid, queue in m.idle_expiring.items():
            expires = as_int(queue.arguments.get("x-expires"))
            if expires is not None and not queue.consumers:
                candidate = m.queue_last_used.get(qid, m._now) + expires * 1000
                best = candidate if best is None or candidate < best else best
        for session in m.detached_sessions.values():
            if session.detached_at is not None:
                candidate = session.detached_at + session.timeout * 1_000_000
                best = candidate if best is None or candidate < best else best
        return best

    def expire_head(self, queue: Queue) -> None:
        m = self.m
        ready = queue.ready
        while True:
            entry = ready.peek()
            if entry is None:
                m.expiring.pop(queue.qid, None)
                return
            # Strictly past: a TTL of 0 still lets a consumer that is ready right now take it.
            if entry.expires_at is None or entry.expires_at >= m._now:
                return
            ready.pop()
            queue.ready_bytes -= entry.message.size
            self.dead_letter(queue, entry.message, "expired")
            m.delivery.drop(queue, entry)

    def dead_letter(self, queue: Queue, message: Message, reason: str, conn: str | None = None) -> None:
        """``conn``: the connection that rejected it, if one did (the event's ``conn``, issue 36)."""
        m = self.m
        if reason == "expired":
            m.stats["expired"] += 1
        elif reason == "rejected":
            m.stats["rejected"] += 1
        elif reason == "delivery_limit":
            m.stats["delivery_limited"] = m.stats.get("delivery_limited", 0) + 1
        kind = {"expired": EV.EXPIRED, "rejected": EV.REJECTED}.get(reason, EV.DROPPED)
        m.event(kind, queue, message, reason, "", conn)
        dlx_name = queue.dead_letter_exchange
        if dlx_name is None:
            return
        m.stats["dead_lettered"] += 1
        m.event(EV.DEAD_LETTERED, queue, message, f"{reason}->{dlx_name}")
        vhost = m.vhosts[queue.vhost]
        dlx = vhost.exchanges.get(dlx_name)
        if dlx is None:
            return
        routing_key = queue.dead_letter_routing_key
        if routing_key is None:
            routing_key = message.routing_key
        props = add_x_death(message, queue, reason, m._now)
        # The copy shares the original's body (the node stores it again under the copy's id);
        # live=1 holds it while it is routed, as a publish does (Delivery.keep_body).
        dead = Message(m.next_msg_id, dlx_name, routing_key, props, message.size, message.persistent,
                       message.priority, m._now, 0, message.format, 1)
        m.next_msg_id += 1
        # The copy is a new message: its history links back to the original through the detail.
        m.event(EV.PUBLISHED, None, dead, f"dead-letter:{message.id}:{queue.name}", queue.vhost)
        targets = [target for target in m.topology.route(vhost, dlx, routing_key, dead)
                   # RabbitMQ drops a dead-letter cycle back to the same queue (not on reject)
                   if target is not queue or reason == "rejected"]
        if m.group_count > 1 and targets:
            targets = m.groups.route_remote(dead, targets, None)  # other groups' queues: the outbox
        for target in targets:
            m.delivery.enqueue(target, dead, None)
        m.delivery.keep_body(dead, m.delivery.body_source(message))
