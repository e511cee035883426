"""A log line per interval for events that may come as a flood (refused logins, refused sockets).

Refusals are logged once per event, except where an attacker chooses the rate: then one line per
``every`` seconds says how many were not logged in between, so that a flood cannot fill the disk
or spend the loop on logging.
"""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """One log line per ``every`` seconds about an event that may come as a flood, with how many
    were not logged in between."""

    def __init__(self, logger: logging.Logger, every: float = 10.0) -> None:
        self._log = logger
        self._every = every
        self._next = 0.0
        self._quiet = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._quiet += 1
            return
        quiet, self._quiet, self._next = self._quiet, 0, now + self._every
        suffix = f" ({quiet} more since the last report)" if quiet else ""
        self._log.warning(message + suffix, *args)
