"""pysyncobj driven by the node's asyncio loop (``raft_in_loop``, issue 30's one-thread experiment).

By default pysyncobj runs its own tick thread (``autoTick``): every Raft message and every
proposal crosses between that thread and the loop (``call_soon_threadsafe`` one way, a pipe write
the other), and the two threads hand the GIL back and forth.  With ``raft_in_loop`` the loop is
the tick thread: pysyncobj's sockets are watched by the loop itself (:class:`AsyncioPoller` maps
pysyncobj's poller ``subscribe``/``unsubscribe`` onto ``loop.add_reader``/``add_writer``), and
:class:`LoopTicker` runs ``doTick`` after every batch of socket events, after every proposal, and
on a timer for heartbeats, elections and ``tick_period``.  A committed entry is then applied in
the thread that received its commit index, and a proposal is forwarded without waking anyone.

The price: whatever pysyncobj does now runs on the loop, the journal's ``fdatasync`` included,
and a long loop stall (a big apply, a snapshot's checkpoint) also delays heartbeats and votes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pysyncobj.poller import POLL_EVENT_TYPE, Poller

log = logging.getLogger(__name__)

_READ, _WRITE = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE


class AsyncioPoller(Poller):
    """pysyncobj's poller interface over an asyncio loop's selector.

    ``subscribe`` may be called again for the same descriptor with another mask (pysyncobj adds
    WRITE while a connection has bytes queued and drops it after): only the difference is applied.
    ERROR needs no registration (epoll reports errors and hang-ups to readers and writers; the
    connection then finds the error on ``recv``/``SO_ERROR``).  Callbacks are looked up when an
    event is dispatched, like pysyncobj's ``PollPoller``, and every dispatch asks ``on_event`` for
    a tick.  ``poll(timeout)`` does not wait (the loop does): it tells ``on_poll`` when pysyncobj
    wants its next tick at the latest.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_event: Callable[[], None] = lambda: None,
                 on_poll: Callable[[float], None] = lambda _t: None) -> None:
        self._loop = loop
        self.on_event = on_event
        self.on_poll = on_poll
        self._callbacks: dict[int, Callable[[int, int], None]] = {}
        self._masks: dict[int, int] = {}  # fd -> READ|WRITE bits registered with the loop

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:  # noqa: N803
        self._callbacks[descr] = callback
        old = self._masks.get(descr, 0)
        new = eventMask & (_READ | _WRITE)
        if new & _READ and not old & _READ:
            self._loop.add_reader(descr, self._dispatch, descr, _READ)
        if new & _WRITE and not old & _WRITE:
            self._loop.add_writer(descr, self._dispatch, descr, _WRITE)
        if old & _WRITE and not new & _WRITE:
            self._remove(self._loop.remove_writer, descr)
        if old & _READ and not new & _READ:
            self._remove(self._loop.remove_reader, descr)
        self._masks[descr] = new

    def unsubscribe(self, descr: int) -> None:
        mask = self._masks.pop(descr, 0)
        self._callbacks.pop(descr, None)
        # pysyncobj closes a connection's socket *before* unsubscribing it: the selector's modify
        # (removing one direction of two) then fails with EBADF, and asyncio has already dropped
        # the descriptor from its map -- which is what we want.
        if mask & _WRITE:
            self._remove(self._loop.remove_writer, descr)
        if mask & _READ:
            self._remove(self._loop.remove_reader, descr)

    @staticmethod
    def _remove(remove: Callable[[int], bool], descr: int) -> None:
        try:
            remove(descr)
        except (OSError, ValueError, KeyError):
            pass

    def _dispatch(self, descr: int, event: int) -> None:
        callback = self._callbacks.get(descr)
        if callback is not None:
            callback(descr, event)
        self.on_event()

    def poll(self, timeout: float) -> None:
        self.on_poll(timeout)

    def close(self) -> None:
        for descr in list(self._masks):
            self.unsubscribe(descr)

    @property
    def descriptors(self) -> dict[int, int]:
        """fd -> registered READ/WRITE bits (for tests and status)."""
        return dict(self._masks)


class LoopTicker:
    """Runs ``tick(timeout)`` in the loop: soon after ``request()`` (coalesced: many requests in one
    loop iteration make one tick), and at the latest ``timeout`` after the last tick, where
    ``timeout`` is what the tick last passed to the poller (pysyncobj's ``tick_period`` shortened
    to the next heartbeat or election deadline by ``Replica._onTick``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: Callable[[float], None], period: float) -> None:
        self._loop = loop
        self._tick = tick
        self.period = period
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._ticking = False
        self.stopped = False
        self.ticks = 0
        self.failures = 0

    def request(self) -> None:
        """A tick soon (in the next loop iteration), once however often asked."""
        if self._soon is None and not self.stopped:
            self._soon = self._loop.call_soon(self._run)

    def arm(self, timeout: float) -> None:
        """The poller's ``poll(timeout)``: the next tick at the latest ``timeout`` seconds from now."""
        if self.stopped:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(max(0.0, timeout), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._run()

    def _run(self) -> None:
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if self.stopped or self._ticking:
            return
        self._ticking = True
        try:
            self._tick(self.period)
        except Exception:
            # pysyncobj's own tick thread logs and carries on after a pause; so do we.
            self.failures += 1
            log.exception("Raft tick failed in the event loop")
            self.arm(self.period)
        finally:
            self._ticking = False
        self.ticks += 1
        if self._timer is None and not self.stopped:
            self.arm(self.period)

    def stop(self) -> None:
        self.stopped = True
        for handle in (self._soon, self._timer):
            if handle is not None:
                handle.cancel()
        self._soon = self._timer = None
