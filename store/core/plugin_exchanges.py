"""The state machine's side of the plugin exchange types (store/core/exchange_types.py): a publish to an
``x-delayed-message`` exchange held until its time (store/core/delayed.py), released by TICK; a publish
to an ``x-message-deduplication`` exchange dropped when its header value was seen
(store/core/exchange_dedup.py).  A mixin of ``StateMachine``, kept apart so that machine.py only calls in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import events as EV
from .commands import REJECTED, UNROUTABLE
from .delayed import Held, delay_of, with_released_header
from .exchange_dedup import is_duplicate, new_cache
from .exchange_types import DEDUPLICATION, DELAYED
from .message import AMQP091
from .model import Exchange, Message, VHost

if TYPE_CHECKING:
    from .machine import StateMachine


class PluginExchanges:
    """The x-delayed-message and x-message-deduplication exchange types."""

    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def count(self, key: str, n: int = 1) -> None:
        # .get: the stats of a snapshot written before issue 21 lack these keys
        m = self.m
        m.stats[key] = m.stats.get(key, 0) + n

    def plugin_publish(self, vhost: VHost, exchange: Exchange, message: Message, conn: str | None,
                        expiration: int | None) -> int | None:
        """The outcome of a publish the plugin type takes over, or None to route it as usual."""
        m = self.m
        if exchange.type == DELAYED:
            delay = delay_of(message.properties, message.format)
            if delay is None:
                return None  # no (valid) x-delay: routed at once, as the plugin does
            self.count("published")
            m.event(EV.PUBLISHED, None, message, conn or "", vhost.name, conn)
            if len(m.delayed) >= m.delayed_limit:
                self.count("delay_refused")
                m.event(EV.DROPPED, None, message, f"delayed-limit {m.delayed_limit}", vhost.name)
                return REJECTED
            message.properties = with_released_header(message.properties, message.format, delay)
            held = m.delayed.hold(m._now + delay * 1000, vhost.name, exchange.name, message.routing_key,
                                     message, expiration, delay)
            self.count("delayed")
            message.live += 1  # the hold keeps the body (Delivery.keep_body stores it)
            m.message_bytes += message.size  # held bodies count toward the memory alarm
            m.event(EV.DELAYED, None, message, str(delay), vhost.name)
            if m._persist is not None:
                m._persist.put_delayed(held.due, held.seq, held_record(held))
            return UNROUTABLE  # no queue now: the plugin's route/2 returns [] for a delayed message
        if exchange.type == DEDUPLICATION:
            key = (vhost.name, exchange.name)
            cache = m.exchange_caches.get(key)
            if cache is None:
                cache = m.exchange_caches[key] = new_cache(exchange)
            if not is_duplicate(cache, message.properties, message.format, message.id, m._now):
                return None
            self.count("published")
            m.event(EV.PUBLISHED, None, message, conn or "", vhost.name, conn)
            self.count("deduplicated")
            m.event(EV.DEDUPLICATED, None, message, "exchange", vhost.name)
            return UNROUTABLE
        return None

    def release_delayed(self) -> None:
        """Route the held messages whose time has come (in a TICK), in due order."""
        m = self.m
        for held in m.delayed.pop_due(m._now):
            if m._persist is not None:
                m._persist.delete_delayed(held.due, held.seq)
            self.count("delay_released")
            message = held.message
            m.message_bytes -= message.size  # counted again if it is enqueued
            self._release(held)
            message.live -= 1  # the hold ends: the body goes unless a queue took the message
            if not message.live:
                m._body_deletes.append(message.id)

    def _release(self, held: Held) -> None:
        m = self.m
        message = held.message
        vhost = m.vhosts.get(held.vhost)
        exchange = vhost.exchanges.get(held.exchange) if vhost is not None else None
        if vhost is None or exchange is None:
            m.event(EV.DROPPED, None, message, "delayed exchange deleted", held.vhost)
            return
        m.event(EV.DELAY_RELEASED, None, message, str(m._now - held.due), held.vhost)
        queues = m.topology.route(vhost, exchange, held.routing_key, message)
        if not queues:
            self.count("unroutable")
            m.event(EV.UNROUTABLE, None, message, "dropped", held.vhost)
            return
        if m.group_count > 1:
            queues = m.groups.route_remote(message, queues, held.expiration)  # other groups': the outbox
        for queue in queues:
            m.delivery.enqueue(queue, message, held.expiration)

    def forget_exchange(self, exchange: Exchange) -> None:
        """A deleted exchange's deduplication cache goes with it (held delayed messages stay and are
        dropped at their time, as the plugin's would be, unless an exchange of that name is back)."""
        m = self.m
        m.exchange_caches.pop((exchange.vhost, exchange.name), None)

    def load_delayed(self, records: list) -> list[tuple[int, bytes]]:
        """Rebuild the held messages from the single-node store's ``delayed`` table; their bodies,
        for the node's body store."""
        m = self.m
        bodies = []
        for due, seq, record in records:
            (vhost, exchange, routing_key, msg_id, props, body, persistent, priority, published_at,
             expiration, delay, *fmt) = record
            message = Message(msg_id, exchange, routing_key, props, len(body), persistent, priority, published_at,
                              0, fmt[0] if fmt else AMQP091, 1)
            m.delayed.add(Held(due, seq, vhost, exchange, routing_key, message, expiration, delay))
            m.message_bytes += len(body)
            bodies.append((msg_id, body))
        return bodies


def held_record(held: Held) -> list:
    m = held.message
    # The body (index 5) is filled in by the node when it commits (DurableStore.commit).
    record = [held.vhost, held.exchange, held.routing_key, m.id, m.properties, None, m.persistent, m.priority,
              m.published_at, held.expiration, held.delay]
    if m.format != AMQP091:
        record.append(m.format)  # as a message record (store/disk/durable.py): only when not 0-9-1
    return record
