"""Bounds on what one AMQP 1.0 connection may hold: sessions, links, durable links, /management replies.

Why: each 1.0 link is a core session of its own (connection.py), a log entry to attach and one to
detach, and a few KB on the node; a client needing no permission at all (a null-target sender) could
attach 60,000 of them on one connection (+105 MB, other clients stalled 2 s), and durable links
(recovery.py) outlive their connection in the replicated state.  The bounds, each a Config setting:

* ``amqp10_session_max`` sessions per connection (RabbitMQ 4's ``session_max_per_connection``, 64):
  announced in our open as channel-max = the bound - 1 (2.7.1: "this value plus one is the maximum
  number of sessions"), lower if ``channel_max`` or the client's channel-max is lower.  A begin on a
  channel beyond closes the connection with ``amqp:connection:framing-error``, as 2.7.1 requires.
* ``amqp10_link_max_per_session`` links per session (RabbitMQ 4's ``link_max_per_session``, 256):
  announced in our begin as handle-max = the bound - 1 (2.7.2); a handle beyond is a framing-error (2.7.2).
* ``amqp10_link_max_per_connection`` links of all sessions of a connection together (64 x 256 would
  still be 16,384): an attach beyond is refused -- our attach with a null terminus, then a detach with
  ``amqp:resource-limit-exceeded`` (2.6.3, 2.8.15); the session and the other links go on.
* ``amqp10_durable_links_per_user`` durable links (terminus-durability unsettled-state) of one user
  kept in the replicated state, attached or waiting for their client: a new one beyond is refused as
  above; re-attaching an existing one is always allowed.  Counted from this node's copy of the state
  when the attach arrives (no log entry for a refusal), and again where it is exact: when SESSION_ATTACH
  is applied (store/core/sessions.py; attaches racing on one or several nodes), which needs the same value on
  every cluster member, as ``max_delayed_messages``.
* ``amqp10_management_pending_max`` /management replies a connection holds (management.py).

Refusals are logged at most once per :data:`LOG_INTERVAL` per kind (a flood logs one line and the count
it suppressed) and counted per kind (``raftmq_amqp10_limit_refusals`` in ops/metrics.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

from raftmq.store.core import queries as Q
from raftmq.store.core.sessions import session_key

if TYPE_CHECKING:
    from raftmq.node.config import Config

log = logging.getLogger(__name__)

LOG_INTERVAL = 10.0  # seconds between two log lines of one refusal kind


def channel_max(config: Config, client: int | None) -> int:
    """The channel-max of our open: sessions - 1, never above ``channel_max`` or the client's."""
    ours = min(config.channel_max, max(1, config.amqp10_session_max) - 1, 0xFFFF)
    return min(ours, client if client is not None else 0xFFFF)


def handle_max(config: Config, client: int | None) -> int:
    """The handle-max of our begin: links per session - 1, never above the client's."""
    ours = min(max(1, config.amqp10_link_max_per_session) - 1, 0xFFFFFFFF)
    return min(ours, client if client is not None else 0xFFFFFFFF)


def links_of(conn) -> int:
    """Links attached on all sessions of ``conn`` (at most 64 sessions: counted, not tracked)."""
    return sum(len(session.links) for session in conn.sessions.values())


def link_refusal(session) -> str | None:
    """Why one more link may not be attached on ``session``'s connection (counted, logged), or None."""
    conn = session.conn
    limit = conn.config.amqp10_link_max_per_connection
    if links_of(conn) < limit:
        return None
    text = f"{limit} links on this connection (amqp10_link_max_per_connection)"
    refusals(conn.broker).refused("link", conn.peer, text)
    return text


def durable_refusal(conn, name: bytes) -> str | None:
    """Why the durable link whose core session is ``name`` may not be created, or None."""
    limit = conn.config.amqp10_durable_links_per_user
    machine = conn.broker.machine
    if Q.has_session(machine, session_key(conn.vhost, conn.principal.name, name)):
        return None  # a re-attach: it exists already
    if Q.durable_link_count(machine, conn.principal.name) >= limit:
        text = f"user '{conn.principal.name}' has {limit} durable links (amqp10_durable_links_per_user)"
        refusals(conn.broker).refused("durable link", conn.peer, text)
        return text
    return None


#: Kinds counted by :class:`Refusals` (the label ``kind`` of raftmq_amqp10_limit_refusals): attaches
#: and /management requests refused by a bound above; deliveries rejected because their sections do
#: not decode within ``amqp10_max_message_elements`` or at all (node/amqp10/links.py); connections
#: closed because a frame does not decode or frame (decode-error, framing-error: connection.py).
KINDS = ("link", "durable link", "management request", "undecodable delivery", "undecodable frame")


class Refusals:
    """Counts refusals per kind and logs them rate-limited (one line per kind per LOG_INTERVAL)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._logged: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def count(self, kind: str) -> None:
        """Count without a log line (the caller logs already, once per connection)."""
        self.counts[kind] += 1

    def refused(self, kind: str, peer: str, text: str) -> None:
        self.counts[kind] += 1
        now = time.monotonic()
        last = self._logged.get(kind)
        if last is not None and now - last < LOG_INTERVAL:
            self._suppressed[kind] += 1
            return
        self._logged[kind] = now
        more = self._suppressed.pop(kind, 0)
        log.warning("1.0 connection %s: %s refused: %s%s", peer, kind, text,
                    f" ({more} more refused since the last line)" if more else "")


def refusals(broker) -> Refusals:
    """The node's refusal counter (created on first use: node/broker.py stays untouched)."""
    found = getattr(broker, "amqp10_refusals", None)
    if found is None:
        found = broker.amqp10_refusals = Refusals()
    return found
