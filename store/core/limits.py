"""Vhost and user limits (RabbitMQ's ``set_vhost_limits``/``set_user_limits``), replicated (issue 31).

Limits are state like permissions: set through the admin API (``PUT /api/vhost-limits/...``,
``PUT /api/user-limits/...``, definitions) as one command, ``LIMITS_SET(scope, name, {limit: value
or None})``, that sets the values given and clears those given as None.  The limits and their
meaning are RabbitMQ's (rabbit_vhost_limit, rabbit_auth_backend_internal):

  vhost  max-queues       queues in the vhost, checked here at declare (deterministic: the count
                          at apply); 0 = no queue may be declared
         max-connections  client connections open on the vhost (node/limits.py)
  user   max-connections  connections of the user, all vhosts together (node/limits.py)
         max-channels     channels of the user over all its connections (0-9-1 channels, 0-10
                          sessions, 1.0 sessions; node/limits.py)

A negative value means no limit (kept, and shown, as RabbitMQ does).  ``max-queues`` counts every
queue of the vhost, exclusive and server-named ones included, whichever protocol declares it (1.0
dynamic nodes and /management declares go through the same QUEUE_DECLARE): RabbitMQ exempts none.

A vhost's limits go with the vhost (VHOST_DELETE), a managed user's with the user (USER_DELETE).
Users of the configuration file may have limits too (the admin API checks that the name is a user,
as for permissions).  A snapshot or LMDB store written before limits existed loads as "no limits".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .commands import LimitsSet, Op
from .errors import CommandError

if TYPE_CHECKING:
    from .machine import StateMachine

VHOST_LIMITS = ("max-connections", "max-queues")
USER_LIMITS = ("max-channels", "max-connections")
SCOPES = {"vhost": VHOST_LIMITS, "user": USER_LIMITS}


def limit_of(limits: dict[str, int] | None, name: str) -> int | None:
    """The limit ``name`` in force, or None when there is none (unset or negative)."""
    if not limits:
        return None
    value = limits.get(name)
    return value if value is not None and value >= 0 else None


def check_limits(scope: str, limits: dict) -> str | None:
    """Why ``limits`` is not a valid change for ``scope``, or None (the admin API asks first)."""
    known = SCOPES.get(scope)
    if known is None:
        return f"unknown limit scope '{scope}'"
    for key, value in limits.items():
        if key not in known:
            return f"unknown {scope} limit '{key}' (known: {', '.join(known)})"
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"limit '{key}' must be an integer, not {value!r}"
    return None


class LimitCommands:
    """LIMITS_SET and the max-queues check of queue declares."""

    def __init__(self, machine: StateMachine) -> None:
        self.m = machine
        # Told of each max-queues refusal (connection, reason): the node counts and logs those of its
        # own clients (node/limits.py).  Not state; None in a bare machine (tests, tools).
        self.on_refused: Callable[[str | None, str], None] | None = None

    def handlers(self) -> dict:
        return {Op.LIMITS_SET: self.limits_set}

    def table(self, scope: str) -> dict[str, dict[str, int]]:
        return self.m.vhost_limits if scope == "vhost" else self.m.user_limits

    def limits_set(self, cmd: LimitsSet) -> None:
        m = self.m
        reason = check_limits(cmd.scope, cmd.limits)
        if reason is not None:
            raise CommandError(406, reason)
        if cmd.scope == "vhost" and cmd.name not in m.vhosts:
            raise CommandError(404, f"no vhost '{cmd.name}'")
        table = self.table(cmd.scope)
        limits = dict(table.get(cmd.name, {}))
        for key in sorted(cmd.limits):
            value = cmd.limits[key]
            if value is None:
                limits.pop(key, None)
            else:
                limits[key] = int(value)
        self._store(cmd.scope, cmd.name, limits)

    def forget(self, scope: str, name: str) -> None:
        """A vhost or user is deleted: its limits go with it."""
        if name in self.table(scope):
            self._store(scope, name, {})

    def _store(self, scope: str, name: str, limits: dict[str, int]) -> None:
        m = self.m
        table = self.table(scope)
        if limits:
            table[name] = limits
        else:
            table.pop(name, None)
        if m._persist is not None:
            m._persist.put_limits(scope, name, limits)

    def check_queue_limit(self, conn: str | None, vhost: str, count: int, queue: str) -> None:
        """Refuse a new queue when the vhost has ``max-queues`` already (rabbit_queue_type:
        check_vhost_queue_limit: precondition_failed, the same text)."""
        limit = limit_of(self.m.vhost_limits.get(vhost), "max-queues")
        if limit is not None and count >= limit:
            text = f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached"
            if self.on_refused is not None:
                self.on_refused(conn, text)
            raise CommandError(406, text)
