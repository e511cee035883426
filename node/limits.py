"""Connection and channel counts of this node's clients, checked against vhost and user limits.

The limits are replicated state (store/core/limits.py); the counts are not.  Connections open no state in
the log (a connection's user and vhost are known only to the node it is connected to), and nodes do
not exchange their client counts, so each node enforces every limit against *its own* clients:

  vhost max-connections   connections open on the vhost through this node
  user  max-connections   connections of the user through this node
  user  max-channels      channels of the user over its connections to this node: 0-9-1 channels,
                          0-10 sessions and 1.0 sessions alike

In a cluster of N nodes a vhost or user can therefore hold up to N times a limit in total when its
clients spread over the nodes (RabbitMQ counts over the cluster).  It is an approximation in the
permissive direction, and plainly so: a client pinned to one node, as the flood of issue 31 was,
meets the exact limit.  A limit of 0 admits nothing anywhere; lowering a limit closes nothing that
is open (RabbitMQ neither).

Each front end asks :meth:`Usage.open` once its connection has a user and a vhost (0-9-1
connection.open, 0-10 connection.open, 1.0 open) and :meth:`Usage.channel_opened` for each channel;
:meth:`Usage.close` (from ``Broker.unregister``, for every protocol) forgets a connection with its
channels.  Refusals are counted per limit (``refused``, ops/metrics.py) and logged at most once a
second per limit, with the number not logged: a flood of refused logins must not flood the log.  The
state machine's max-queues refusals of this node's clients are counted and logged here too
(``Broker`` hooks ``LimitCommands.on_refused``).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from raftmq.store.core.limits import limit_of

log = logging.getLogger(__name__)

LOG_INTERVAL = 1.0  # seconds between two log lines about the same limit


@dataclass(slots=True)
class _Held:
    user: str
    vhost: str
    channels: int = 0


@dataclass
class Usage:
    """This node's open connections per vhost and per user, and channels per user.

    ``vhost_limits``/``user_limits``: the replicated tables (read at each check, so a change through
    the log applies to the next login or channel at once)."""

    vhost_limits: Callable[[], dict[str, dict[str, int]]]
    user_limits: Callable[[], dict[str, dict[str, int]]]
    held: dict[str, _Held] = field(default_factory=dict)
    by_vhost: Counter[str] = field(default_factory=Counter)
    by_user: Counter[str] = field(default_factory=Counter)
    channels_by_user: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # "vhost max-connections" -> refusals
    _logged_at: dict[str, float] = field(default_factory=dict)
    _unlogged: Counter[str] = field(default_factory=Counter)

    def open(self, conn_id: str, user: str, vhost: str) -> str | None:
        """Count ``conn_id`` as ``user``'s on ``vhost``; or the reason to refuse it (not counted).

        The reasons are RabbitMQ's texts (rabbit_reader is_over_vhost_connection_limit and
        is_over_user_connection_limit), vhost first as there."""
        if conn_id in self.held:
            return None
        limit = limit_of(self.vhost_limits().get(vhost), "max-connections")
        if limit is not None and self.by_vhost[vhost] >= limit:
            return self.refuse("vhost max-connections", f"access to vhost '{vhost}' refused for user "
                                                         f"'{user}': connection limit ({limit}) is reached")
        limit = limit_of(self.user_limits().get(user), "max-connections")
        if limit is not None and self.by_user[user] >= limit:
            return self.refuse("user max-connections", f"connection refused for user '{user}': "
                                                        f"user connection limit ({limit}) is reached")
        self.held[conn_id] = _Held(user, vhost)
        self.by_vhost[vhost] += 1
        self.by_user[user] += 1
        return None

    def channel_opened(self, conn_id: str) -> str | None:
        """Count a new channel (or session) of ``conn_id``; or the reason to refuse it (not counted).
        A connection not counted by :meth:`open` (not open yet) is not limited here."""
        held = self.held.get(conn_id)
        if held is None:
            return None
        limit = limit_of(self.user_limits().get(held.user), "max-channels")
        if limit is not None and self.channels_by_user[held.user] >= limit:
            return self.refuse("user max-channels", f"number of channels opened for user '{held.user}' has "
                                                     f"reached the maximum allowed user limit of {limit}")
        held.channels += 1
        self.channels_by_user[held.user] += 1
        return None

    def channel_closed(self, conn_id: str) -> None:
        held = self.held.get(conn_id)
        if held is not None and held.channels > 0:
            held.channels -= 1
            _decrement(self.channels_by_user, held.user)

    def close(self, conn_id: str) -> None:
        """The connection is gone: it and its channels stop counting."""
        held = self.held.pop(conn_id, None)
        if held is None:
            return
        _decrement(self.by_vhost, held.vhost)
        _decrement(self.by_user, held.user)
        for _ in range(held.channels):
            _decrement(self.channels_by_user, held.user)

    def refuse(self, limit: str, reason: str) -> str:
        """Count and (rate-limited) log a refusal of ``limit``; the reason back."""
        self.refused[limit] += 1
        now = time.monotonic()
        if now - self._logged_at.get(limit, -LOG_INTERVAL) >= LOG_INTERVAL:
            more = self._unlogged.pop(limit, 0)
            log.warning("refused (%s): %s%s", limit, reason, f" (and {more} more not logged)" if more else "")
            self._logged_at[limit] = now
        else:
            self._unlogged[limit] += 1
        return reason


def _decrement(counter: Counter[str], key: str) -> None:
    left = counter[key] - 1
    if left > 0:
        counter[key] = left
    else:
        del counter[key]
