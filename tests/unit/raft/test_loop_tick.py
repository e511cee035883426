"""raft_in_loop (raft/loop_tick.py): pysyncobj's poller over asyncio, the loop's tick scheduler, and
three Replicas ticking in one event loop (real pysyncobj over real loopback sockets)."""

from __future__ import annotations

import asyncio
import socket
import time

from pysyncobj.poller import POLL_EVENT_TYPE

from raftmq.ops.local.node import free_port
from raftmq.raft.loop_tick import AsyncioPoller, LoopTicker
from raftmq.raft.replica import ENTRY, Replica
from raftmq.store.core.machine import StateMachine  # noqa: F401 (imported before the snapshot module, as the node does)

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR


def run_until(loop: asyncio.AbstractEventLoop, done, timeout: float = 10.0) -> None:
    async def wait() -> None:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    loop.run_until_complete(wait())


def test_the_poller_maps_subscriptions_onto_the_loop_and_asks_for_a_tick_after_each_event():
    """A READ subscription dispatches the socket's readability to pysyncobj's callback (with the
    READ bit) and asks for a tick; adding WRITE (pysyncobj does while bytes are queued) dispatches
    writability too, and dropping it again stops that; a descriptor closed *before* it is
    unsubscribed (pysyncobj's TcpConnection.disconnect order) is forgotten without an error."""
    loop = asyncio.new_event_loop()
    a, b = socket.socketpair()
    a.setblocking(False)
    events: list[tuple[int, int]] = []
    ticks: list[int] = []
    poller = AsyncioPoller(loop, on_event=lambda: ticks.append(1))
    try:
        fd = a.fileno()
        poller.subscribe(fd, lambda d, e: (events.append((d, e)), e & READ and a.recv(100)), READ | ERROR)
        b.send(b"x")
        run_until(loop, lambda: events)
        assert events == [(fd, READ)] and len(ticks) == 1
        events.clear()
        poller.subscribe(fd, lambda d, e: events.append((d, e)), READ | WRITE | ERROR)
        run_until(loop, lambda: events)
        assert (fd, WRITE) in events and poller.descriptors == {fd: READ | WRITE}
        poller.subscribe(fd, lambda d, e: events.append((d, e)), READ | ERROR)
        events.clear()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert events == [] and poller.descriptors == {fd: READ}  # writable, but no longer watched
        poller.subscribe(fd, lambda d, e: events.append((d, e)), READ | WRITE | ERROR)
        a.close()
        poller.unsubscribe(fd)
        assert poller.descriptors == {}
        assert fd not in loop._selector.get_map()  # (asyncio's selector forgot it too)
        events.clear()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert events == []
    finally:
        b.close()
        loop.close()


def test_the_ticker_coalesces_requests_and_ticks_again_when_the_poll_timeout_runs_out():
    """Many requests in one loop iteration make one tick; a tick that "polls" for t seconds (pysyncobj's
    _onTick ends with poller.poll(t)) gets the next one about t later with no request; stop() ends it."""
    loop = asyncio.new_event_loop()
    ticks: list[float] = []
    ticker: LoopTicker

    def tick(period: float) -> None:
        ticks.append(time.monotonic())
        ticker.arm(0.05)  # what AsyncioPoller.poll does

    ticker = LoopTicker(loop, tick, 0.02)
    try:
        for _ in range(5):
            ticker.request()
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(asyncio.sleep(0))
        assert len(ticks) == 1
        run_until(loop, lambda: len(ticks) >= 3, timeout=2.0)
        assert len(ticks) >= 3
        assert ticks[2] - ticks[1] >= 0.04  # the armed timeout, not a busy loop
        ticker.stop()
        count = len(ticks)
        ticker.request()
        loop.run_until_complete(asyncio.sleep(0.1))
        assert len(ticks) == count
    finally:
        loop.close()


def test_three_replicas_in_one_event_loop_elect_a_leader_and_commit_a_follower_proposal(tmp_path):
    """With ``loop=`` a Replica has no tick thread: three of them in one asyncio loop (one thread)
    elect a leader over loopback TCP, and a batch proposed on a follower is forwarded, committed
    and handed to every member's sink in order, each sink called in the loop's thread."""
    import threading

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    sinks: list[list[tuple]] = [[], [], []]
    threads: set[int] = set()
    replicas: list[Replica] = []

    def sink_for(i: int):
        def sink(item: tuple) -> None:
            threads.add(threading.get_ident())
            sinks[i].append(item)
        return sink

    try:
        before = threading.active_count()
        for i, address in enumerate(addresses):
            replicas.append(Replica(address, [a for a in addresses if a != address], str(tmp_path / f"n{i}"),
                                    "secret", sink=sink_for(i), loop=loop))
        assert threading.active_count() == before + 3  # the three scrubbers only: no tick threads
        run_until(loop, lambda: any(r.is_leader for r in replicas)
                  and all(r.leader_address for r in replicas), timeout=15)
        follower = next(r for r in replicas if not r.is_leader)
        follower.propose(1, "origin", 1, b"payload", None)
        run_until(loop, lambda: all(any(it[0] == ENTRY for it in s) for s in sinks), timeout=10)
        for s in sinks:
            entries = [it for it in s if it[0] == ENTRY]
            assert len(entries) == 1 and bytes(entries[0][5]) == b"payload" and entries[0][3:5] == ("origin", 1)
        assert threads == {threading.get_ident()}
    finally:
        for r in replicas:
            r.scrubber.stop()
            r.destroy()
        loop.run_until_complete(asyncio.sleep(0))
        asyncio.set_event_loop(None)
        loop.close()
