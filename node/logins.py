"""The login pool: password hashing off the event loop, with a bounded number of logins pending.

A login costs one PBKDF2 (~5 ms, node/auth.py ``check_password``).  On the loop, a flood of
logins moved every other client's round trip (issue 31: p50 from 2 to 37 ms).  ``hashlib``
releases the GIL while it hashes (measured here: a spinning thread kept ~86 % of its pace beside a
hashing thread), so a few worker threads take the cost off the loop and off the other clients.

The pool is bounded twice: ``workers`` threads hash at once (CPU for logins is capped, whatever
the flood), and at most ``limit`` logins are pending (hashing or queued); the next one is refused
at once with the caller's ``busy`` exception (node/auth.py ``LoginBusy``, an ``AuthError``: every
front end answers it as a failed login), rather than queued without bound (memory, and clients waiting longer than they wait to
retry).  Refusals are counted (``refused``) and logged at most once per 10 seconds.

Used from the event loop's thread only (``pending`` is not locked); the work runs in the threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from raftmq.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoginPool:
    """A few hashing threads and a bound on pending logins (see the module docstring)."""

    def __init__(self, busy: type[Exception], workers: int = 2, limit: int = 64) -> None:
        self.workers = max(1, workers)
        self.limit = max(1, limit)
        self.pending = 0
        self.completed = 0
        self.refused = 0
        self._busy = busy
        self._executor: ThreadPoolExecutor | None = None
        self._refusals = RateLimitedLog(log)  # one line per 10 s in a flood

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in a pool thread; ``busy`` when ``limit`` are pending.  The slot
        is held until the thread is done, even if the awaiting task is cancelled (a closed
        connection): the bound counts the threads' real work, not the waiters."""
        if self.pending >= self.limit:
            self.refused += 1
            self._refusals.warning("login refused: %d logins already pending (login_queue_limit)", self.pending)
            raise self._busy(f"too many logins in progress ({self.pending}); try again")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="raftmq-login")
        loop = asyncio.get_running_loop()
        future = self._executor.submit(fn, *args)
        self.pending += 1
        future.add_done_callback(lambda _f: self._call_done(loop))
        return await asyncio.wrap_future(future, loop=loop)

    def _call_done(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._done)
        except RuntimeError:  # the loop is closed: the node is stopping
            pass

    def _done(self) -> None:
        self.pending -= 1
        self.completed += 1

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
