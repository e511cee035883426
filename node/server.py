"""The node's TCP server: reads the protocol header and hands the socket to the matching front end."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raftmq.node.config import Config
from raftmq.protocol.amqp010.frames import PROTOCOL_HEADER as AMQP010_HEADER
from raftmq.protocol.amqp091.constants import PROTOCOL_HEADER as AMQP091_HEADER
from raftmq.protocol.amqp10.frames import AMQP_HEADER as AMQP10_HEADER
from raftmq.protocol.amqp10.frames import SASL_HEADER as AMQP10_SASL_HEADER
from raftmq.store.disk.sealed import EXIT_STORE_DAMAGED, StoreDamaged
from raftmq.versions import EXIT_FORMAT_TOO_NEW, FormatTooNew

from .amqp010.connection import Amqp010Connection
from .amqp091.connection import Amqp091Connection
from .amqp10.connection import Amqp10Connection
from .broker import Broker
from .descriptors import DescriptorReserve, raise_nofile_limit
from .status import status_loop

log = logging.getLogger(__name__)

HEADER_TIMEOUT = 10.0  # seconds a client may take to send its protocol header when handshake_timeout = 0


class HeaderSniffer(asyncio.Protocol):
    """Reads the 8-byte protocol header, then swaps in the front end's protocol object.

    0-9-1 general spec 4.2.2: a server that does not support the requested protocol writes back
    the header of a protocol it does support and closes the socket.

    The handshake timeout runs from here: the front end gets the deadline by which its connection
    must be open (connection.open-ok sent), so that a socket that sends the header and then
    nothing is closed like one that sends nothing (issue 17: 10,050 such sockets held every
    connection slot).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None  # loop time by which the connection must be open

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        loop = asyncio.get_running_loop()
        timeout = self.broker.config.handshake_timeout
        if timeout > 0:
            self._deadline = loop.time() + timeout
        self._timer = loop.call_later(timeout if timeout > 0 else HEADER_TIMEOUT, transport.close)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) < 8:
            if not AMQP091_HEADER.startswith(self._buffer[:8]) and not self._buffer.startswith(b"AMQP"[: len(self._buffer)]):
                self._refuse()
            return
        if self._timer is not None:
            self._timer.cancel()
        header, rest = self._buffer[:8], self._buffer[8:]
        front_ends = {AMQP091_HEADER: Amqp091Connection, AMQP010_HEADER: Amqp010Connection,
                      AMQP10_SASL_HEADER: Amqp10Connection,
                      AMQP10_HEADER: lambda broker, transport: Amqp10Connection(broker, transport, sasl=False)}
        if header in front_ends:
            front_end = front_ends[header](self.broker, self._transport)
            if self.broker.tracer is not None:  # (before set_protocol: uvloop caches data_received)
                front_end.data_received = self.broker.tracer.on_rx(front_end.data_received)
                front_end.flush = self.broker.tracer.on_flush(front_end.flush)
            self._transport.set_protocol(front_end)
            front_end.start(rest, self._deadline)
        else:
            self._refuse()

    def _refuse(self) -> None:
        log.info("refusing connection with protocol header %r", self._buffer[:8])
        if self._timer is not None:
            self._timer.cancel()
        self._transport.write(AMQP091_HEADER)
        self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


def tls_context(config: Config) -> ssl.SSLContext:
    """The server side of amqps: TLS 1.2+, the configured certificate, optional client certificates."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_ca:
        context.load_verify_locations(config.tls_ca)
        context.verify_mode = ssl.CERT_REQUIRED if config.tls_verify_peer else ssl.CERT_OPTIONAL
    return context


# A service started beside the broker once it runs (the admin API, metrics: ops/services.py),
# given the broker; it returns the function that stops it.  The composition root (ops/cli.py)
# chooses them, so that node/ never imports the operations packages that import node/.
Service = Callable[[Broker], Callable[[], None]]


@dataclass
class ListeningService:
    """A service's stop function with the task that opens its port (the HTTP API, /metrics).

    :func:`serve` opens the AMQP port only once every such task is done, so a node that answers
    AMQP has its other ports open too: a test (or a supervisor) that waited for AMQP and then
    called the HTTP API found it refused on a loaded machine, the API's listener still starting.
    A service that failed to open its port has logged why; the node starts without it, as before."""

    stop: Callable[[], None]
    listening: asyncio.Future[None]

    def __call__(self) -> None:
        self.stop()


async def serve(config: Config, ready: asyncio.Event | None = None, services: Sequence[Service] = ()) -> int | None:
    """Run the node until SIGTERM/SIGINT; returns the exit status it must leave with (None: 0)."""
    broker = Broker(config)
    await broker.start()
    # status.json and digest.json (node/status.py) beside the broker: started here, so that the
    # broker, which status.py reads, does not import it.
    status = asyncio.create_task(status_loop(broker, config.resolved_data_dir()))
    stops = [start(broker) for start in services]
    await asyncio.gather(*(s.listening for s in stops if isinstance(s, ListeningService)), return_exceptions=True)
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(lambda: HeaderSniffer(broker), config.host, config.port,
                                        reuse_address=True, backlog=1024)]
    log.info("raftmq node %s listening on %s:%d (data in %s)", config.node_id, config.host, config.port,
             config.resolved_data_dir())
    if config.tls_port:
        # The TLS handshake comes before the sniffer's clock starts: bound it by the same timeout.
        servers.append(await loop.create_server(lambda: HeaderSniffer(broker), config.host, config.tls_port,
                                                ssl=tls_context(config), reuse_address=True, backlog=1024,
                                                ssl_handshake_timeout=config.handshake_timeout or None))
        log.info("AMQP over TLS (amqps) on %s:%d", config.host, config.tls_port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        for server in servers:
            server.close()
        for endpoint in list(broker.endpoints.values()):
            close = getattr(endpoint, "close_connection", None)
            if close is not None:
                close(320, "CONNECTION_FORCED - broker shutdown")
        await asyncio.sleep(0.05)
        for stop_service in stops:
            stop_service()
        status.cancel()
        await asyncio.gather(status, return_exceptions=True)
        await broker.stop()
    # Issue 34: stopped because a queue group's worker failed: the node leaves with its status.
    return broker.group_host.exit_status if broker.group_host is not None else None

GC_THRESHOLDS = (50_000, 20, 20)  # see tune_gc


def tune_gc() -> None:
    """Run the cyclic garbage collector far less often than CPython's default.

    Every queued message is a handful of container objects, so under publish load the default
    thresholds (700, 10, 10) collect every 700 net allocations, and full collections walk the whole
    growing model while holding the GIL (the Raft thread's too).  Measured by applying publishes to
    a state machine: 300k messages spent 33 % of the time in the collector (pauses up to 94 ms);
    1M messages spent 35 %, with a 319 ms pause, longer than the minimum election timeout.  With
    (50,000, 20, 20): 6 % and 13 %, pauses of at most 6 and 129 ms.  End to end, publishing
    300k messages into one queue on one node ran at the same rate either way (the client is
    the limit there).  Reference counting still frees nearly everything at once; only cycles
    wait for a collection.  Objects alive after start-up are frozen out of every collection.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def use_batch_scheduling() -> None:
    """SCHED_BATCH for this thread and every thread it starts later (Linux threads inherit it).

    Measured with publisher confirms through a follower, client and three nodes on two cores: the
    client (aio-pika) waited for a CPU 10 % of the time and was preempted ~1,000 times a second by
    the nodes' wake-ups; under SCHED_BATCH 3-4 % and 260-440 times, and it confirmed ~13 % more.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError) as exc:
        log.warning("sched_batch: cannot use SCHED_BATCH here (%s); running with the default policy", exc)


def run(config: Config, services: Sequence[Service] = ()) -> None:
    # SIGUSR1 asks for digest.json (node/status.py): ignored until the status loop can answer it,
    # rather than ending a node still starting (its default action); the queue groups' workers
    # inherit the ignored disposition while they start (issue 34, node/worker.py).
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    tune_gc()
    old_soft, soft = raise_nofile_limit()  # issue 31: every socket is a descriptor (node/descriptors.py)
    log.info("file descriptor limit %d (raised from %d); %d kept free of HTTP for AMQP logins",
             soft, old_soft, DescriptorReserve(config.fd_reserve, soft).reserve)
    if config.sched_batch:
        use_batch_scheduling()
    if config.clustered:
        # The Raft tick thread and the event loop share the GIL. With the default 5 ms switch
        # interval, a message arriving for the idle thread waits up to 5 ms whenever the other one
        # is busy, at every hop of a commit; 0.5 ms keeps commit latency near network + fsync.
        sys.setswitchinterval(0.0005)
    if config.use_uvloop:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            log.info("uvloop not available; using the default asyncio loop")
    try:
        code = asyncio.run(serve(config, services=services))
    except FormatTooNew as exc:  # its data was written by a newer raftmq (raftmq/versions.py)
        log.critical("stopping: %s", exc)
        raise SystemExit(EXIT_FORMAT_TOO_NEW) from exc
    except StoreDamaged as exc:  # its state or audit history failed their checksums (store/disk/sealed.py)
        log.critical("stopping: %s", exc)
        raise SystemExit(EXIT_STORE_DAMAGED) from exc
    if code:
        raise SystemExit(code)
