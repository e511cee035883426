"""Polling for the cluster tests, whose waits (elections, replication over three processes) need
longer than tests/integration/helpers.wait_until's cap."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    """Poll ``predicate`` every 0.2 s until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
