"""The cost of the hop between a connection's process and a Raft group's process (issue 34).

Issue 34 runs Raft groups in worker processes (the GIL makes a process one core), so a message
published on a connection may have to cross from the process that reads its socket to the process
of its queue's group, and the group's outputs (the confirm, a delivery) cross back.  This measures
that hop on this machine, with two real processes and the real code on both sides:

- the *front* (this process) builds batches of real ``Publish`` commands (256 B bodies, a confirm
  token each), encodes them with ``store/core/commands.encode_batch`` and sends them;
- the *group* (a forked child) decodes them (``decode_batch``), applies them through the one applier
  (``store/applier.Applier``: ``StateMachine.apply``, bodies put into memory, bodies filled into the
  outputs), encodes the outputs (msgpack; a delivery's ``Message`` as the list of its fields) and
  sends them back; the front decodes them and dispatches each output by kind (counted, checked).

Two scenarios: ``confirm`` (publishes into a queue without consumers: one confirm back per
publish; the group purges the queue every 10,000 messages to stay bounded) and ``deliver`` (the
queue has an auto-ack consumer on the front's connection: a confirm and a delivery with its 256 B
body back per publish).

Transports:

- ``inproc``: no hop, the typed commands applied in this process (what a leader does today);
- ``codec``: no hop, but the hop's serialisation (encode the batch, decode it, encode the outputs,
  decode them) in this process: what any hop costs before the transport;
- ``uds-asyncio``: a Unix domain socket, asyncio streams at both ends, 4-byte length prefixes (a
  real front and a real group are asyncio processes);
- ``uds-protocol``: the same socket read by an ``asyncio.Protocol`` at both ends (each read
  parsed for every whole frame in it; the group answers all of them in one write);
- ``uds-sync``: a ``socketpair``, blocking reads and writes at both ends (the kernel's share of the
  socket row, without asyncio);
- ``pipe``: an ``os.pipe`` pair (1 MiB pipe buffers), blocking, length-prefixed;
- ``shm``: two single-producer single-consumer byte rings in ``multiprocessing.shared_memory``, one
  ``eventfd`` per ring for wake-ups (the writer adds 1 per record after writing it; the reader
  consumes exactly as many records as its ``eventfd_read`` counted, so it never reads a record that
  was not fully written: the two system calls order the copies).  The reader publishes how far it
  read as an aligned 8-byte word that only it writes; the writer polls it (20 µs sleeps, bounded)
  when the ring is full.  x86-64 only (stores are not reordered with earlier loads there).

Figures: (a) round-trip latency p50/p99 of one batch of one command, lock-step; (b) throughput
(commands/s, wall clock) and CPU µs per command of the front and the group (each process's
``time.process_time``, i.e. getrusage user+system of that process) for batches of 1, 10 and 100
commands with up to ``--window`` batches in flight.  Every loop is bounded by a count and by
seconds; the processes run under ``nice``.  The CPU figures are what to compare: the machine is
shared, so the wall-clock rates move with other load.

    .venv/bin/python -m bench.ipc_hop                       # the default table (~1-2 minutes)
    .venv/bin/python -m bench.ipc_hop --count 2000 --latency 200 --transports inproc,pipe
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import multiprocessing as mp
import os
import platform
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import msgpack

from raftmq.store.applier import Applier
from raftmq.store.core.commands import (
    OUT_DELIVER,
    OUT_REPLY,
    ChannelOpen,
    Consume,
    Publish,
    QueueDeclare,
    QueuePurge,
    VhostAdd,
    decode_batch,
    encode_batch,
)
from raftmq.store.core.entries import Message
from raftmq.store.core.machine import StateMachine

NOW = 1_700_000_000_000_000
CONN = "n1.front.1"
PROPS = b"\x10\x00\x02"  # 0-9-1 properties: delivery mode 2
BODY = b"x" * 256
PURGE_EVERY = 10_000  # confirm scenario: messages between purges of the queue
TRANSPORTS = ("inproc", "codec", "uds-asyncio", "uds-protocol", "uds-sync", "pipe", "shm")
ASYNC = ("uds-asyncio", "uds-protocol")
SCENARIOS = ("confirm", "deliver")
BATCHES = (1, 10, 100)
LEN = struct.Struct("<I")
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named in the fcntl module from Python 3.10 only on some builds
WAIT_LIMIT = 10.0  # seconds a ring writer waits for room before it gives up


# ---------------------------------------------------------------------------------- the group's side

class Group:
    """A queue group's state: a real machine behind the one applier, bodies in memory."""

    def __init__(self, scenario: str) -> None:
        self.machine = StateMachine()
        self.applier = Applier(self.machine)
        self.now = NOW
        self.since_purge = 0
        self.scenario = scenario
        setup = [VhostAdd(None, None, "/"), ChannelOpen(CONN, None, 1),
                 QueueDeclare(CONN, None, 1, "/", "q", False, True, False, False, {})]
        if scenario == "deliver":
            setup.append(Consume(CONN, None, 1, "/", "q", "ctag", True, False, {}))  # auto-ack
        self.applier.release(self.applier.apply(self.now, setup))

    def apply(self, commands: list, handle: Callable[[list], None]) -> None:
        """Apply a batch; ``handle`` gets its outputs (encode and send, or dispatch in process)
        before the applier releases the batch (the order a log keeps: outputs out, then release)."""
        self.now += 1
        applied = self.applier.apply(self.now, commands)
        handle(applied.outputs)
        self.applier.release(applied)
        self.since_purge += len(commands)
        if self.scenario == "confirm" and self.since_purge >= PURGE_EVERY:
            self.since_purge = 0
            self.applier.release(self.applier.apply(self.now, [QueuePurge(CONN, None, 1, "/", "q")]))


def _pack_message(obj: object) -> object:
    if isinstance(obj, Message):  # what a front end needs to write the delivery
        return [obj.id, obj.exchange, obj.routing_key, obj.properties, obj.size, obj.persistent,
                obj.priority, obj.published_at, obj.format]
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode_outputs(outputs: list) -> bytes:
    return msgpack.packb(outputs, default=_pack_message, use_bin_type=True)


def decode_outputs(blob: bytes) -> list:
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


# Requests: one kind byte, then the payload.  B: a batch (encode_batch's bytes) -> its outputs;
# S: the group's CPU seconds so far -> msgpack float; Q: stop.
BATCH, STATS, QUIT = b"B", b"S", b"Q"


def serve_request(group: Group, request: bytes | memoryview, send: Callable[[bytes], None]) -> bool:
    """One request on the group's side; False to stop."""
    kind = request[0:1]
    if kind == BATCH:
        group.apply(decode_batch(memoryview(request)[1:]), lambda outputs: send(encode_outputs(outputs)))
    elif kind == STATS:
        send(msgpack.packb(time.process_time()))
    else:
        return False
    return True


# ---------------------------------------------------------------------------------- blocking links

class FdLink:
    """Length-prefixed messages over a pair of file descriptors (a pipe pair or a socketpair)."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.buf = bytearray()
        self.pos = 0

    def send(self, data: bytes) -> None:
        parts = [LEN.pack(len(data)), data]
        total = 4 + len(data)
        written = os.writev(self.wfd, parts)
        if written < total:  # a partial write (a full buffer): the rest, blocking
            view = memoryview(b"".join(parts))[written:]
            while view:
                view = view[os.write(self.wfd, view):]

    def recv(self) -> bytes:
        buf = self.buf
        while True:
            have = len(buf) - self.pos
            if have >= 4:
                (n,) = LEN.unpack_from(buf, self.pos)
                if have >= 4 + n:
                    start = self.pos + 4
                    data = bytes(buf[start:start + n])
                    self.pos = start + n
                    if self.pos == len(buf):
                        buf.clear()
                        self.pos = 0
                    elif self.pos > 1 << 20:
                        del buf[:self.pos]
                        self.pos = 0
                    return data
            chunk = os.read(self.rfd, 1 << 18)
            if not chunk:
                raise EOFError("the other process closed the link")
            buf += chunk


class Ring:
    """One direction of the shared-memory link: an SPSC byte ring and its eventfd (module docstring)."""

    HEADER = 64  # the reader's position (u64) at offset 0; data from HEADER on

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.shm = shared_memory.SharedMemory(create=True, size=self.HEADER + capacity)
        self.efd = os.eventfd(0)
        self.tail_word = self.shm.buf[0:8].cast("Q")
        self.tail_word[0] = 0
        self.data = self.shm.buf[self.HEADER:self.HEADER + capacity]
        self.head = 0  # writer's own: bytes written so far
        self.tail = 0  # reader's own: bytes read so far
        self.pending = 0  # reader's own: records counted by eventfd_read and not yet read

    def _put(self, pos: int, data: bytes | memoryview) -> None:
        data = memoryview(data)
        off = pos % self.capacity
        first = min(len(data), self.capacity - off)
        self.data[off:off + first] = data[:first]
        if first < len(data):
            self.data[0:len(data) - first] = data[first:]

    def _get(self, pos: int, n: int) -> bytes:
        off = pos % self.capacity
        first = min(n, self.capacity - off)
        if first == n:
            return bytes(self.data[off:off + n])
        return bytes(self.data[off:off + first]) + bytes(self.data[0:n - first])

    def write(self, data: bytes) -> None:
        need = 4 + len(data)
        if need > self.capacity:
            raise ValueError(f"a {need} B record does not fit a {self.capacity} B ring")
        deadline = 0.0
        while self.capacity - (self.head - self.tail_word[0]) < need:
            now = time.monotonic()
            if not deadline:
                deadline = now + WAIT_LIMIT
            elif now > deadline:
                raise TimeoutError("the ring's reader made no room")
            time.sleep(20e-6)
        self._put(self.head, LEN.pack(len(data)))
        self._put(self.head + 4, data)
        self.head += need
        os.eventfd_write(self.efd, 1)

    def read(self) -> bytes:
        if not self.pending:
            self.pending = os.eventfd_read(self.efd)  # blocks until at least one record
        (n,) = LEN.unpack(self._get(self.tail, 4))
        data = self._get(self.tail + 4, n)
        self.tail += 4 + n
        self.pending -= 1
        self.tail_word[0] = self.tail  # room for the writer, after the copies above
        return data

    def close(self, unlink: bool) -> None:
        self.tail_word.release()
        self.data.release()
        self.shm.close()
        if unlink:
            self.shm.unlink()
        os.close(self.efd)


class ShmLink:
    def __init__(self, out: Ring, into: Ring) -> None:
        self.out, self.into = out, into

    def send(self, data: bytes) -> None:
        self.out.write(data)

    def recv(self) -> bytes:
        return self.into.read()


def _group_sync(scenario: str, link: FdLink | ShmLink) -> None:
    group = Group(scenario)
    while serve_request(group, link.recv(), link.send):
        pass


def split_frames(buf: bytearray) -> list[bytes]:
    """The whole length-prefixed frames at the start of ``buf``, taken out of it."""
    frames, pos, end = [], 0, len(buf)
    while end - pos >= 4:
        (n,) = LEN.unpack_from(buf, pos)
        if end - pos - 4 < n:
            break
        frames.append(bytes(buf[pos + 4:pos + 4 + n]))
        pos += 4 + n
    if pos:
        del buf[:pos]
    return frames


class GroupProtocol(asyncio.Protocol):
    """The group's end of ``uds-protocol``: every whole request of a read served, the answers
    written together."""

    def __init__(self, group: Group, done: asyncio.Event) -> None:
        self.group, self.done = group, done
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        out: list[bytes] = []

        def send(reply: bytes) -> None:
            out.append(LEN.pack(len(reply)))
            out.append(reply)

        stop = False
        for request in split_frames(self.buf):
            if not serve_request(self.group, request, send):
                stop = True
                break
        assert self.transport is not None
        if out:
            self.transport.write(b"".join(out))
        if stop:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.done.set()


async def _group_asyncio(scenario: str, path: str, ready: mp.synchronize.Event, protocol: bool) -> None:
    group = Group(scenario)
    done = asyncio.Event()
    if protocol:
        server = await asyncio.get_running_loop().create_unix_server(lambda: GroupProtocol(group, done), path)
        ready.set()
        await done.wait()
        server.close()
        return

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        def send(data: bytes) -> None:
            writer.write(LEN.pack(len(data)) + data)

        try:
            while True:
                (n,) = LEN.unpack(await reader.readexactly(4))
                if not serve_request(group, await reader.readexactly(n), send):
                    break
                await writer.drain()
        finally:
            writer.close()
            done.set()

    server = await asyncio.start_unix_server(handle, path)
    ready.set()
    await done.wait()
    server.close()


def _group_main(transport: str, scenario: str, ends: tuple, nice: int) -> None:
    """The group process (forked): serve until told to stop."""
    os.nice(nice)
    if transport in ASYNC:
        path, ready = ends
        asyncio.run(_group_asyncio(scenario, path, ready, transport == "uds-protocol"))
    elif transport == "shm":
        to_group, to_front = ends
        _group_sync(scenario, ShmLink(to_front, to_group))
    else:
        rfd, wfd = ends
        _group_sync(scenario, FdLink(rfd, wfd))


# ---------------------------------------------------------------------------------- the front's side

@dataclass
class Tally:
    """What the front saw come back: checked against what it sent."""

    replies: int = 0
    deliveries: int = 0
    other: int = 0

    def dispatch(self, outputs: list) -> None:
        for out in outputs:  # the broker's dispatch by kind, reduced to counting
            kind = out[1]
            if kind == OUT_REPLY:
                self.replies += 1
            elif kind == OUT_DELIVER:
                self.deliveries += 1
            else:
                self.other += 1


@dataclass
class Run:
    """One measured run: ``commands`` publishes in batches of ``batch``."""

    scenario: str
    transport: str
    batch: int
    commands: int = 0
    seconds: float = 0.0
    front_cpu: float = 0.0
    group_cpu: float = 0.0
    tally: Tally = field(default_factory=Tally)

    @property
    def rate(self) -> float:
        return self.commands / self.seconds if self.seconds else 0.0

    def us(self, cpu: float) -> float:
        return cpu / self.commands * 1e6 if self.commands else 0.0


@dataclass
class Latency:
    scenario: str
    transport: str
    samples: list[float]

    def pct(self, p: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e6 if ordered else 0.0


def make_batches(count: int, batch: int, first_token: int) -> list[list]:
    return [[Publish(CONN, first_token + b * batch + i, 1, "/", "", "q", False, PROPS, BODY, True, 0, None)
             for i in range(batch)] for b in range(max(1, count // batch))]


class StreamLink:
    """The front's end of ``uds-asyncio``: asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def send(self, data: bytes) -> None:
        self.writer.write(LEN.pack(len(data)) + data)

    async def drain(self) -> None:
        await self.writer.drain()

    async def recv(self) -> bytes:
        (n,) = LEN.unpack(await self.reader.readexactly(4))
        return await self.reader.readexactly(n)

    def close(self) -> None:
        self.writer.close()


class FrontProtocol(asyncio.Protocol):
    """The front's end of ``uds-protocol``: frames parsed as they arrive, awaited one by one."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.frames: deque[bytes] = deque()
        self.waiter: asyncio.Future | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.frames.extend(split_frames(self.buf))
        if self.frames and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(EOFError("the group closed the link"))

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(LEN.pack(len(data)) + data)

    async def drain(self) -> None:
        return None  # the requests in flight are bounded by the window

    async def recv(self) -> bytes:
        while not self.frames:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.frames.popleft()

    def close(self) -> None:
        assert self.transport is not None
        self.transport.close()


async def _connect(transport: str, path: str) -> StreamLink | FrontProtocol:
    if transport == "uds-protocol":
        _, protocol = await asyncio.get_running_loop().create_unix_connection(FrontProtocol, path)
        return protocol
    return StreamLink(*await asyncio.open_unix_connection(path))


class Front:
    """The front's end of one transport (blocking calls; the asyncio one runs its own loop)."""

    def __init__(self, transport: str, scenario: str, nice: int, ring: int) -> None:
        self.transport = transport
        self.process: mp.process.BaseProcess | None = None
        self.group: Group | None = None
        self.link: FdLink | ShmLink | None = None
        self.rings: list[Ring] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self.alink: StreamLink | FrontProtocol | None = None
        self.tmp: tempfile.TemporaryDirectory | None = None
        ctx = mp.get_context("fork")
        if transport in ("inproc", "codec"):
            self.group = Group(scenario)
            return
        if transport in ASYNC:
            self.tmp = tempfile.TemporaryDirectory(prefix="ipc_hop.")
            path = os.path.join(self.tmp.name, "group.sock")
            ready = ctx.Event()
            self.process = ctx.Process(target=_group_main, args=(transport, scenario, (path, ready), nice))
            self.process.start()
            if not ready.wait(30):
                raise RuntimeError("the group process did not start listening")
            self.loop = asyncio.new_event_loop()
            self.alink = self.loop.run_until_complete(_connect(transport, path))
            return
        if transport == "shm":
            to_group, to_front = Ring(ring), Ring(ring)
            self.rings = [to_group, to_front]
            self.process = ctx.Process(target=_group_main, args=(transport, scenario, (to_group, to_front), nice))
            self.process.start()
            self.link = ShmLink(to_group, to_front)
            return
        if transport == "pipe":
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            for fd in (req_w, rep_w):
                try:
                    fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)
                except OSError:
                    pass  # the default 64 KiB: still no deadlock at the default window (see run)
            group_ends, front_ends, close = (req_r, rep_w), (rep_r, req_w), (req_r, rep_w)
        elif transport == "uds-sync":
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            a.setblocking(True)
            b.setblocking(True)
            fa, fb = a.detach(), b.detach()
            group_ends, front_ends, close = (fb, fb), (fa, fa), (fb,)
        else:
            raise ValueError(f"unknown transport {transport!r}")
        self.process = ctx.Process(target=_group_main, args=(transport, scenario, group_ends, nice))
        self.process.start()
        for fd in close:
            os.close(fd)
        self.link = FdLink(*front_ends)
        self.fds = set(front_ends)

    # -- requests

    def group_cpu(self) -> float:
        if self.group is not None:
            return 0.0  # in process: counted in the front's own CPU
        return msgpack.unpackb(self._roundtrip(STATS))

    def _roundtrip(self, request: bytes) -> bytes:
        if self.alink is not None:
            assert self.loop is not None
            return self.loop.run_until_complete(self._roundtrip_async(request))
        assert self.link is not None
        self.link.send(request)
        return self.link.recv()

    async def _roundtrip_async(self, request: bytes) -> bytes:
        alink = self.alink
        assert alink is not None
        alink.send(request)
        await alink.drain()
        return await alink.recv()

    def latency(self, scenario: str, samples: int, seconds: float) -> Latency:
        """Lock-step round trips of one batch of one publish, each timed."""
        batches = make_batches(samples, 1, 1)
        times: list[float] = []
        tally = Tally()
        deadline = time.monotonic() + seconds
        if self.alink is not None:
            assert self.loop is not None
            self.loop.run_until_complete(self._latency_async(batches, times, tally, deadline))
        else:
            clock = time.perf_counter
            for batch in batches:
                started = clock()
                self._one_sync(batch, tally)
                times.append(clock() - started)
                if clock() > deadline:
                    break
        if tally.replies != len(times):
            raise AssertionError(f"{self.transport}: {len(times)} publishes, {tally.replies} confirms")
        return Latency(scenario, self.transport, times)

    async def _latency_async(self, batches: list[list], times: list[float], tally: Tally, deadline: float) -> None:
        clock = time.perf_counter
        for batch in batches:
            started = clock()
            tally.dispatch(decode_outputs(await self._roundtrip_async(BATCH + encode_batch(batch))))
            times.append(clock() - started)
            if clock() > deadline:
                break

    def _one_sync(self, batch: list, tally: Tally) -> None:
        if self.transport == "inproc":
            assert self.group is not None
            self.group.apply(batch, tally.dispatch)
        elif self.transport == "codec":
            assert self.group is not None
            group = self.group
            blob = BATCH + encode_batch(batch)
            replies: list[bytes] = []
            serve_request(group, blob, replies.append)
            tally.dispatch(decode_outputs(replies[0]))
        else:
            assert self.link is not None
            self.link.send(BATCH + encode_batch(batch))
            tally.dispatch(decode_outputs(self.link.recv()))

    def throughput(self, scenario: str, count: int, batch: int, window: int, seconds: float) -> Run:
        """``count`` publishes in batches of ``batch``, up to ``window`` batches in flight, bounded by
        ``seconds``; wall time and both processes' CPU seconds."""
        batches = make_batches(count, batch, 1_000_000)
        run = Run(scenario, self.transport, batch)
        group0 = self.group_cpu()
        front0 = time.process_time()
        started = time.perf_counter()
        deadline = time.monotonic() + seconds
        if self.alink is not None:
            assert self.loop is not None
            sent = self.loop.run_until_complete(self._pipeline_async(batches, window, run.tally, deadline))
        elif self.group is not None:
            sent = 0
            while sent < len(batches):
                self._one_sync(batches[sent], run.tally)
                sent += 1
                if time.monotonic() > deadline:
                    break
        else:
            sent = self._pipeline_sync(batches, window, run.tally, deadline)
        run.seconds = time.perf_counter() - started
        run.front_cpu = time.process_time() - front0
        run.group_cpu = self.group_cpu() - group0
        run.commands = sent * batch
        expected_deliveries = run.commands if scenario == "deliver" else 0
        if run.tally.replies != run.commands or run.tally.deliveries != expected_deliveries:
            raise AssertionError(f"{self.transport} {scenario} batch {batch}: sent {run.commands}, got "
                                 f"{run.tally.replies} confirms and {run.tally.deliveries} deliveries")
        return run

    def _pipeline_sync(self, batches: list[list], window: int, tally: Tally, deadline: float) -> int:
        """Keep up to ``window`` batches in flight.  With blocking ends this cannot deadlock while
        ``window`` requests fit the link's buffer (the front never blocks writing, so it reads)."""
        link = self.link
        assert link is not None
        sent = in_flight = 0
        total = len(batches)
        while sent < total or in_flight:
            while in_flight < window and sent < total:
                link.send(BATCH + encode_batch(batches[sent]))
                sent += 1
                in_flight += 1
                if time.monotonic() > deadline:
                    total = sent
            tally.dispatch(decode_outputs(link.recv()))
            in_flight -= 1
        return sent

    async def _pipeline_async(self, batches: list[list], window: int, tally: Tally, deadline: float) -> int:
        alink = self.alink
        assert alink is not None
        sent = in_flight = 0
        total = len(batches)
        while sent < total or in_flight:
            while in_flight < window and sent < total:
                alink.send(BATCH + encode_batch(batches[sent]))
                sent += 1
                in_flight += 1
                if time.monotonic() > deadline:
                    total = sent
            await alink.drain()
            tally.dispatch(decode_outputs(await alink.recv()))
            in_flight -= 1
        return sent

    def close(self) -> None:
        if self.process is None:
            return
        try:
            if self.alink is not None:
                assert self.loop is not None
                self.alink.send(QUIT)
                self.loop.run_until_complete(self.alink.drain())
                self.alink.close()
            elif self.link is not None:
                self.link.send(QUIT)
        finally:
            self.process.join(10)
            if self.process.is_alive():  # our own child, by its pid
                self.process.kill()
                self.process.join(5)
            if self.loop is not None:
                self.loop.close()
            for fd in getattr(self, "fds", ()):
                os.close(fd)
            for ring in self.rings:
                ring.close(unlink=True)
            if self.tmp is not None:
                self.tmp.cleanup()


# ---------------------------------------------------------------------------------- the runs and the table

@dataclass
class Results:
    latencies: list[Latency] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)


def measure(transports: list[str], scenarios: list[str], count: int, latency_samples: int, window: int,
            seconds: float, nice: int, ring: int, rounds: int = 1,
            progress: Callable[[str], None] | None = None) -> Results:
    """Every transport in every scenario, ``rounds`` times (alternating the transports within a
    round, so that the machine's load falls on all of them alike)."""
    results = Results()
    for _ in range(rounds):
        for scenario in scenarios:
            for transport in transports:
                front = Front(transport, scenario, nice, ring)
                try:
                    front.latency(scenario, max(20, latency_samples // 10), seconds)  # warm-up
                    results.latencies.append(front.latency(scenario, latency_samples, seconds))
                    for batch in BATCHES:
                        front.throughput(scenario, min(count, 20 * batch * window), batch, window, seconds)  # warm
                        results.runs.append(front.throughput(scenario, count, batch, window, seconds))
                finally:
                    front.close()
                if progress:
                    progress(f"{scenario} {transport} done")
    return results


def table(results: Results) -> str:
    """The figures as markdown: latency, then throughput and CPU per command (medians over rounds)."""
    lines = ["| scenario | transport | round trip p50 µs | p99 µs |", "|---|---|---|---|"]
    keys: dict[tuple[str, str], list[Latency]] = {}
    for lat in results.latencies:
        keys.setdefault((lat.scenario, lat.transport), []).append(lat)
    for (scenario, transport), lats in keys.items():
        samples = [s for lat in lats for s in lat.samples]
        merged = Latency(scenario, transport, samples)
        lines.append(f"| {scenario} | {transport} | {merged.pct(0.5):.1f} | {merged.pct(0.99):.1f} |")
    lines += ["", "| scenario | transport | batch | kcmd/s | front µs/cmd | group µs/cmd | total µs/cmd "
              "| hop µs/cmd (total - inproc) |", "|---|---|---|---|---|---|---|---|"]
    runs: dict[tuple[str, str, int], list[Run]] = {}
    for run in results.runs:
        runs.setdefault((run.scenario, run.transport, run.batch), []).append(run)

    def med(rs: list[Run], f: Callable[[Run], float]) -> float:
        return statistics.median(f(r) for r in rs)

    for (scenario, transport, batch), rs in runs.items():
        total = med(rs, lambda r: r.us(r.front_cpu + r.group_cpu))
        base = runs.get((scenario, "inproc", batch))
        hop = f"{total - med(base, lambda r: r.us(r.front_cpu + r.group_cpu)):+.1f}" if base else "n/a"
        lines.append(f"| {scenario} | {transport} | {batch} | {med(rs, lambda r: r.rate) / 1e3:.1f} "
                     f"| {med(rs, lambda r: r.us(r.front_cpu)):.1f} | {med(rs, lambda r: r.us(r.group_cpu)):.1f} "
                     f"| {total:.1f} | {hop} |")
    return "\n".join(lines)


def codec_split(batch: int = 100, rounds: int = 200) -> dict[str, float]:
    """CPU µs per command of each serialisation step, in process, for batches of ``batch``: which
    of them a hop adds.  A cluster already pays ``encode_batch`` (the proposer, for the log) and
    ``decode_batch`` (every member applies the entry's bytes, raft/cluster.py); the outputs' codec
    is new with a hop."""
    commands = make_batches(batch, batch, 1)[0]
    blob = encode_batch(commands)
    figures: dict[str, float] = {}
    outputs = {}
    for scenario in SCENARIOS:
        out: list = []
        Group(scenario).apply(commands, out.extend)
        outputs[scenario] = out
    steps: dict[str, Callable[[], object]] = {
        "encode_batch": lambda: encode_batch(commands),
        "decode_batch": lambda: decode_batch(blob),
    }
    for scenario, out in outputs.items():
        packed = encode_outputs(out)
        steps[f"encode outputs ({scenario})"] = lambda out=out: encode_outputs(out)
        steps[f"decode outputs ({scenario})"] = lambda packed=packed: decode_outputs(packed)
    for name, step in steps.items():
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            for _ in range(rounds):
                step()
            best = min(best, (time.process_time() - started) / (rounds * batch) * 1e6)
        figures[name] = best
    return figures


def main(argv: list[str] | None = None) -> Results:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--count", type=int, default=20_000, help="publishes per throughput run")
    parser.add_argument("--latency", type=int, default=2_000, help="round trips for the latency figures")
    parser.add_argument("--window", type=int, default=4, help="batches in flight in a throughput run")
    parser.add_argument("--seconds", type=float, default=8.0, help="bound on each run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--ring", type=int, default=4 << 20, help="bytes per shared-memory ring")
    args = parser.parse_args(argv)
    transports = [t for t in args.transports.split(",") if t]
    for t in transports:
        if t not in TRANSPORTS:
            parser.error(f"unknown transport {t!r}: {', '.join(TRANSPORTS)}")
    if "shm" in transports and platform.machine() not in ("x86_64", "AMD64"):
        print("shm skipped: its ring relies on x86-64's store ordering", file=sys.stderr)
        transports.remove("shm")
    os.nice(args.nice)
    print(f"ipc_hop: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, python "
          f"{platform.python_version()}, {args.count} publishes of {len(BODY)} B per run, window {args.window}",
          flush=True)
    results = measure(transports, [s for s in args.scenarios.split(",") if s], args.count, args.latency,
                      args.window, args.seconds, 0, args.ring, args.rounds,
                      progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(results))
    split = codec_split()
    print("\nserialisation, in process, batches of 100, µs per command (best of 5): "
          + ", ".join(f"{name} {us:.2f}" for name, us in split.items()))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return results


if __name__ == "__main__":
    main()
