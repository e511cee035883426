"""Who may connect: the connection limits every protocol front end shares (issue 17).

Each AMQP connection (0-9-1 or 0-10) is counted from the moment its protocol header is read until
its socket is gone, whether or not it ever authenticates: an unauthenticated socket holds a file
descriptor and buffers as much as an open one.  A connection that would exceed ``max_connections``
(all protocols together) or ``max_connections_per_address`` (per source IP address; 0 = no limit)
is still counted while it lives, and its front end refuses it after authentication with its
protocol's close code (0-9-1: 530 NOT_ALLOWED, reference 1.2; 0-10: 320 connection-forced, the only
connection.close code of 0-10 (spec L3777ff) that tells a client to retry later).  The handshake
timeout (``handshake_timeout``) bounds how long any of them is counted without opening.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from raftmq.node.config import Config


@dataclass
class Admission:
    """Counts of live protocol connections, in total and per source address."""

    config: Config
    total: int = 0
    by_address: Counter[str] = field(default_factory=Counter)

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; the reason to refuse it, or None.

        The connection is counted either way: call :meth:`release` exactly once when it is gone."""
        limit, per_address = self.config.max_connections, self.config.max_connections_per_address
        reason = None
        if self.total >= limit:
            reason = f"connection limit reached ({limit})"
        elif per_address and self.by_address[address] >= per_address:
            reason = f"connection limit per address reached ({per_address} from {address})"
        self.total += 1
        self.by_address[address] += 1
        return reason

    def release(self, address: str) -> None:
        self.total -= 1
        left = self.by_address[address] - 1
        if left > 0:
            self.by_address[address] = left
        else:
            del self.by_address[address]
