"""An asyncio AMQP 0-10 client that survives broker failover without losing or duplicating commands.

No maintained Python 3 client speaks 0-10, so raftmq ships one. It follows ``connection.redirect``,
remembers the cluster's ``known-hosts``, and when its connection breaks it reconnects to another
host and *resumes its session* (spec 3.6.2): it re-attaches with ``force``, asks the broker which of
its commands were completed, replays the others under their original ids (the broker's
idempotence barrier applies each once), and drops transfers it had already received (its own
barrier), so a publisher and a consumer each see every message exactly once.

Usage::

    conn = await Connection.connect(["127.0.0.1:5672", "127.0.0.1:5673"], "guest", "guest")
    session = await conn.session(b"orders-producer", timeout=60)
    await session.queue_declare("orders", durable=True)
    await session.publish("", "orders", b"...", persistent=True)   # returns once completed
    async for message in await session.subscribe("orders"):
        ...
        await message.accept()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections import OrderedDict
from collections.abc import Iterable

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010.frames import PROTOCOL_HEADER, FrameReader, encode_assembly
from raftmq.store.core import ranges as rs

log = logging.getLogger(__name__)

UNLIMITED = 0xFFFFFFFF
ANSWER_TIMEOUT = 10.0  # seconds to wait for session.attached and other answers during a resume


class ClientError(Exception):
    pass


class SessionException(ClientError):
    """The broker answered a command with execution.exception (the session is gone)."""

    def __init__(self, exc: c.ExecutionException) -> None:
        super().__init__(f"{exc.error_code}: {exc.description}")
        self.error_code = exc.error_code
        self.description = exc.description


class ConnectionLost(ClientError):
    """The connection dropped while the client waited for the broker's answer."""


class AttachRefused(ClientError):
    """The broker answered session.attach with session.detached: resuming elsewhere will not help."""


class TransactionAborted(ClientError):
    """The session failed over while a transaction was open: its work is lost; do it again."""


class Message:
    def __init__(self, session: Session, transfer_id: int, transfer: c.MessageTransfer) -> None:
        self._session = session
        self.id = transfer_id
        self.body = bytes(transfer.body or b"")
        self.destination = transfer.destination
        self.delivery_properties = next((h for h in transfer.headers or () if isinstance(h, c.DeliveryProperties)), None)
        self.message_properties = next((h for h in transfer.headers or () if isinstance(h, c.MessageProperties)), None)

    @property
    def routing_key(self) -> str | None:
        return self.delivery_properties.routing_key if self.delivery_properties else None

    @property
    def redelivered(self) -> bool:
        return bool(self.delivery_properties and self.delivery_properties.redelivered)

    @property
    def headers(self) -> dict:
        mp = self.message_properties
        return dict(mp.application_headers or {}) if mp else {}

    async def accept(self) -> None:
        await self._session.execute(c.MessageAccept(transfers=[(self.id, self.id)]))

    async def release(self, redelivered: bool = True) -> None:
        await self._session.execute(c.MessageRelease(transfers=[(self.id, self.id)], set_redelivered=redelivered))


class Subscription:
    def __init__(self, session: Session, destination: str) -> None:
        self.session = session
        self.destination = destination
        self.queue: asyncio.Queue[Message] = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        return await self.queue.get()

    async def get(self, timeout: float | None = None) -> Message | None:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except TimeoutError:
            return None


class Session:
    """A named session whose state the broker keeps for ``timeout`` seconds across failures."""

    def __init__(self, conn: Connection, name: bytes, timeout: int) -> None:
        self.conn = conn
        self.name = name
        self.timeout = timeout
        self.channel = 1
        self.out_next = 0
        self.pending: OrderedDict[int, tuple[c.Command, asyncio.Future]] = OrderedDict()
        self.in_next = 0
        self.in_completed: list[list[int]] = []  # transfers received: our idempotence barrier
        self.subscriptions: dict[str, Subscription] = {}
        self.attached: asyncio.Future | None = None
        self.state_reply: asyncio.Future | None = None
        self.error: ClientError | None = None  # set when the session is over
        self.duplicates_dropped = 0
        self.results: dict[int, object] = {}  # command id -> execution.result value
        self.transactional = False
        self.tx_aborted = False
        # Between a reconnect and the end of this session's resume, new commands wait in
        # ``pending`` (the resume sends them after the replay, in order) instead of overtaking it.
        self.resuming = False
        self._aborted_commits: set[int] = set()  # tx.commit ids replaced by a rollback on resume

    # ------------------------------------------------------------------ public API

    async def execute(self, command: c.Command):
        """Send a command and wait until the broker completed it (exactly once, across failovers).

        Returns the command's result struct (execution.result) for queries, else None.
        """
        command_id, future = self.send(command, sync=True)
        await future
        return self.results.pop(command_id, None)

    def send(self, command: c.Command, sync: bool = False) -> tuple[int, asyncio.Future]:
        """Send without waiting: (command id, future done when the broker completed the command).

        Many commands in flight is how a publisher goes fast; the broker reports completions in
        batches (and at once for commands with ``sync``).
        """
        if self.error is not None:
            raise self.error
        command.sync = sync
        future = asyncio.get_running_loop().create_future()
        command_id = self.out_next
        self.out_next += 1
        if not self.pending:
            self.conn.note_waiting()
        self.pending[command_id] = (command, future)
        if not self.resuming:
            self.conn.send_if_connected(self.channel, command)
        return command_id, future

    async def tx_select(self) -> None:
        await self.execute(c.TxSelect())
        self.transactional = True

    async def tx_commit(self) -> None:
        """Commit the open transaction; TransactionAborted if a failover lost it (it is then rolled back)."""
        if self.tx_aborted:
            self.tx_aborted = False
            await self.execute(c.TxRollback())
            raise TransactionAborted("the session failed over during the transaction; nothing was committed")
        await self.execute(c.TxCommit())

    async def tx_rollback(self) -> None:
        self.tx_aborted = False
        await self.execute(c.TxRollback())

    async def acquire(self, messages: list[Message]) -> list[Message]:
        """message.acquire: take browsed messages; the ones actually acquired (others were taken)."""
        result = await self.execute(c.MessageAcquire(transfers=[(m.id, m.id) for m in messages]))
        got = {i for lo, hi in (result.transfers or ()) for i in range(lo, hi + 1)}
        return [m for m in messages if m.id in got]

    async def queue_query(self, queue: str) -> c.QueueQueryResult:
        return await self.execute(c.QueueQuery(queue=queue))

    async def queue_declare(self, queue: str, durable: bool = False, exclusive: bool = False,
                            auto_delete: bool = False, arguments: dict | None = None) -> None:
        await self.execute(c.QueueDeclare(queue=queue, durable=durable, exclusive=exclusive,
                                          auto_delete=auto_delete, arguments=arguments))

    async def exchange_declare(self, exchange: str, type: str = "direct", durable: bool = False) -> None:
        await self.execute(c.ExchangeDeclare(exchange=exchange, type=type, durable=durable))

    async def bind(self, queue: str, exchange: str, binding_key: str, arguments: dict | None = None) -> None:
        await self.execute(c.ExchangeBind(queue=queue, exchange=exchange, binding_key=binding_key,
                                          arguments=arguments))

    async def publish(self, exchange: str, routing_key: str, body: bytes, *, persistent: bool = False,
                      headers: dict | None = None, message_id: uuid.UUID | None = None) -> None:
        """Publish and wait until the broker completed the transfer (it is replicated)."""
        await self.publish_nowait(exchange, routing_key, body, persistent=persistent, headers=headers,
                                  message_id=message_id, sync=True)

    def publish_nowait(self, exchange: str, routing_key: str, body: bytes, *, persistent: bool = False,
                       headers: dict | None = None, message_id: uuid.UUID | None = None,
                       sync: bool = False) -> asyncio.Future:
        """Publish; the returned future completes when the broker has completed the transfer."""
        dp = c.DeliveryProperties(routing_key=routing_key, delivery_mode=2 if persistent else 1)
        mp = c.MessageProperties(application_headers=headers, message_id=message_id)
        return self.send(c.MessageTransfer(destination=exchange, accept_mode=1, acquire_mode=0,
                                           headers=[dp, mp], body=body), sync=sync)[1]

    async def subscribe(self, queue: str, destination: str | None = None, window: int = 100,
                        acquire: bool = True) -> Subscription:
        """Subscribe in window mode: at most ``window`` unaccepted messages in flight (like a prefetch).

        ``acquire=False`` browses (acquire-mode not-acquired): messages stay on the queue for others
        unless taken with :meth:`acquire`.
        """
        destination = destination or f"sub-{queue}"
        subscription = self.subscriptions[destination] = Subscription(self, destination)
        await self.execute(c.MessageSubscribe(queue=queue, destination=destination, accept_mode=0,
                                              acquire_mode=0 if acquire else 1))
        await self.execute(c.MessageSetFlowMode(destination=destination, flow_mode=1))
        await self.execute(c.MessageFlow(destination=destination, unit=0, value=window))
        await self.execute(c.MessageFlow(destination=destination, unit=1, value=UNLIMITED))
        return subscription

    # ------------------------------------------------------------------ from the connection

    def on_control(self, control) -> None:
        if isinstance(control, c.SessionAttached) and self.attached and not self.attached.done():
            self.attached.set_result(True)
        elif isinstance(control, c.SessionDetached):
            if self.attached and not self.attached.done():
                self.attached.set_exception(AttachRefused(f"attach refused (detach code {control.code})"))
        elif isinstance(control, c.SessionCommandPoint):
            self.in_next = control.command_id
        elif isinstance(control, c.SessionCompleted):
            self._completed(control.commands or ())
            if self.state_reply and not self.state_reply.done():
                self.state_reply.set_result(control.commands or [])
        elif isinstance(control, c.SessionKnownCompleted):
            for lo, hi in control.commands or ():
                rs.remove(self.in_completed, lo, hi)
        elif isinstance(control, c.SessionDetach):
            self.conn.send_if_connected(self.channel, c.SessionDetached(name=self.name, code=0))

    def _completed(self, ranges: Iterable) -> None:
        done = []
        for command_id, (_command, future) in self.pending.items():
            if any(lo <= command_id <= hi for lo, hi in ranges):
                done.append(command_id)
                if future.done():
                    continue
                if command_id in self._aborted_commits:
                    self._aborted_commits.discard(command_id)
                    future.set_exception(TransactionAborted(
                        "the session failed over during the transaction; nothing was committed"))
                else:
                    future.set_result(None)
        for command_id in done:
            del self.pending[command_id]
        if done:
            self.conn.send_if_connected(self.channel, c.SessionKnownCompleted(commands=list(ranges)))

    def on_command(self, command) -> None:
        command_id = self.in_next
        self.in_next += 1
        if rs.contains(self.in_completed, command_id):
            self.duplicates_dropped += 1  # a replay of a transfer we already have
            return
        rs.add(self.in_completed, command_id, command_id)
        if isinstance(command, c.MessageTransfer):
            subscription = self.subscriptions.get(command.destination or "")
            if subscription is not None:
                subscription.queue.put_nowait(Message(self, command_id, command))
        elif isinstance(command, c.ExecutionResult):
            self.results[command.command_id] = command.value
        elif isinstance(command, c.ExecutionException):
            self.error = SessionException(command)
            for _cmd, future in self.pending.values():
                if not future.done():
                    future.set_exception(self.error)
            self.pending.clear()
        self.conn.send_if_connected(self.channel, c.SessionCompleted(commands=[(command_id, command_id)],
                                                                                timely_reply=True))

    def fail(self, error: ClientError) -> None:
        """The session is over (its connection could not be re-established): every pending command
        and every later one fails with ``error`` instead of waiting for a resume that will not come."""
        self.error = error
        self.resuming = False
        for _cmd, future in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()

    async def resume(self, first_attach: bool) -> None:
        """(Re-)attach on the current connection and replay what the broker has not completed."""
        loop = asyncio.get_running_loop()
        self.attached = loop.create_future()
        self.conn.send(self.channel, c.SessionAttach(name=self.name, force=not first_attach))
        await self.conn.answer(self.attached)
        if not first_attach and self.transactional:
            self.tx_aborted = True  # the broker lost the buffered work with the node
        self.conn.send(self.channel, c.SessionRequestTimeout(timeout=self.timeout))
        if not first_attach:
            self.state_reply = loop.create_future()
            self.conn.send(self.channel, c.SessionFlush(completed=True))
            self._completed(await self.conn.answer(self.state_reply))
        first = next(iter(self.pending), self.out_next)
        self.conn.send(self.channel, c.SessionCommandPoint(command_id=first, command_offset=0))
        for command_id, (command, future) in list(self.pending.items()):
            if self.tx_aborted and isinstance(command, c.TxCommit):
                # A commit of the transaction that died with the node: the broker would refuse
                # it with an execution exception (409), which ends the session.  Roll back under
                # the same id instead, and fail the caller's commit with TransactionAborted.
                command = c.TxRollback()
                command.sync = True
                self.pending[command_id] = (command, future)
                self._aborted_commits.add(command_id)
                self.tx_aborted = False
            self.conn.send(self.channel, command)
        self.resuming = False


class Connection:
    """A failover connection: ``hosts`` first, then whatever known-hosts the brokers announce."""

    def __init__(self, hosts: list[str], user: str, password: str, vhost: str = "/",
                 reconnect_timeout: float = 60.0, stall_timeout: float = 3.0) -> None:
        """``stall_timeout``: fail over when commands have waited this long with nothing heard from
        the broker (a frozen node or a network black hole never closes the connection); 0: never."""
        self.hosts = list(hosts)
        self.user, self.password, self.vhost = user, password, vhost
        self.reconnect_timeout = reconnect_timeout
        self.stall_timeout = stall_timeout
        self.stalls = 0  # connections left for silence
        self._last_heard = 0.0  # loop time of the last bytes read, or of the start of a wait
        self._watchdog: asyncio.Task | None = None
        self.known_hosts: list[str] = list(hosts)
        self.current: str | None = None
        self.sessions: list[Session] = []
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._opened: asyncio.Future | None = None
        self._closing = False
        self._lost = asyncio.Event()
        self._supervisor: asyncio.Task | None = None
        self.reconnects = 0

    @classmethod
    async def connect(cls, hosts: list[str], user: str = "guest", password: str = "guest", vhost: str = "/",
                      **kwargs) -> Connection:
        conn = cls(hosts, user, password, vhost, **kwargs)
        await conn._establish()
        loop = asyncio.get_running_loop()
        conn._supervisor = loop.create_task(conn._supervise())
        if conn.stall_timeout > 0:
            conn._watchdog = loop.create_task(conn._watch_for_stalls())
        return conn

    async def session(self, name: bytes | None = None, timeout: int = 60) -> Session:
        session = Session(self, name or uuid.uuid4().hex.encode(), timeout)
        session.channel = len(self.sessions) + 1
        self.sessions.append(session)
        await session.resume(first_attach=True)
        return session

    async def close(self) -> None:
        self._closing = True
        if self._supervisor:
            self._supervisor.cancel()
        if self._watchdog:
            self._watchdog.cancel()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                for s in self.sessions:
                    self.send(s.channel, c.SessionDetach(name=s.name))
                self.send(0, c.ConnectionClose(reply_code=200, reply_text="bye"))
                await self._writer.drain()
            self._writer.close()
        if self._reader_task:
            self._reader_task.cancel()

    # ------------------------------------------------------------------ sending

    def send(self, channel: int, method) -> None:
        if self._writer is None:
            raise ClientError("not connected")
        track, segments = c.segments_of(method)
        self._writer.write(encode_assembly(channel, track, segments))

    def send_if_connected(self, channel: int, method) -> None:
        if self._writer is not None and not self._lost.is_set():
            self.send(channel, method)

    async def answer(self, future: asyncio.Future, timeout: float = ANSWER_TIMEOUT):
        """``future``'s result once the broker answered; ConnectionLost as soon as the connection
        drops (a resume on a node that died need not wait out the timeout); TimeoutError after
        ``timeout`` seconds of silence."""
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            await asyncio.wait({future, lost}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if future.done():
            return future.result()
        if self._lost.is_set():
            raise ConnectionLost(f"connection to {self.current} lost while waiting for the broker")
        raise TimeoutError(f"no answer from {self.current} in {timeout} s")

    def _drop_transport(self) -> None:
        """Abandon the current connection at once (abort: unsent data to a silent peer would hold
        a graceful close open); its reader then reports the loss."""
        if self._writer is not None:
            self._writer.transport.abort()

    def note_waiting(self) -> None:
        """A session starts waiting for the broker: silence counts from now, not from the last
        time an idle connection heard anything."""
        self._last_heard = max(self._last_heard, asyncio.get_running_loop().time())

    async def _watch_for_stalls(self) -> None:
        """Leave a connection on which commands wait and nothing has been heard for
        ``stall_timeout``: the node is frozen (SIGSTOP, a VM pause, a stalled disk) or cut off
        by a network black hole, and would hold the client until it comes back, if ever.  The
        supervisor then fails over and the sessions resume elsewhere; nothing is done twice."""
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(self.stall_timeout / 4)
            if self._lost.is_set() or self._writer is None:
                continue
            if not any(s.pending and not s.resuming for s in self.sessions):
                continue
            silent = loop.time() - self._last_heard
            if silent > self.stall_timeout:
                self.stalls += 1
                log.warning("nothing heard from %s for %.1f s with commands waiting; failing over",
                            self.current, silent)
                self._drop_transport()

    # ------------------------------------------------------------------ connecting

    async def _establish(self) -> None:
        """Connect to some host (following redirects), then resume every session."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_timeout
        candidates: list[str] = []
        last_error: Exception | None = None
        while loop.time() < deadline:
            if not candidates:
                candidates = list(dict.fromkeys([*self.known_hosts, *self.hosts]))
                if last_error is not None:
                    await asyncio.sleep(0.2 + random.random() * 0.2)
            host = candidates.pop(0)
            try:
                redirect = await self._open(host)
            except (TimeoutError, OSError, ClientError) as exc:
                last_error = exc
                continue
            if redirect is not None:
                candidates.insert(0, redirect)
                continue
            for session in self.sessions:
                session.resuming = True
            try:
                for session in self.sessions:
                    await session.resume(first_attach=False)
            except (TimeoutError, OSError, ConnectionLost) as exc:
                # This node failed (or went silent) in the middle of the resume.  The sessions
                # are still resuming, their commands still pending: resume them on another node.
                log.info("resume on %s failed (%s); trying another node", host, exc)
                last_error = exc
                self._drop_transport()
                continue
            return
        raise ClientError(f"could not connect to any of {self.known_hosts}: {last_error}")

    async def _open(self, host: str) -> str | None:
        """Open a connection to ``host``; the redirect target if the broker redirected us."""
        address, _, port = host.rpartition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(address, int(port)), 5)
        self._writer = writer
        self.current = host
        loop = asyncio.get_running_loop()
        self._opened = loop.create_future()
        writer.write(PROTOCOL_HEADER)
        if self._reader_task:
            self._reader_task.cancel()
        self._lost.clear()  # the old reader no longer reports (see _read): only this one counts
        self._reader_task = loop.create_task(self._read(reader))
        try:
            result = await asyncio.wait_for(self._opened, 10)
        except BaseException:
            writer.close()
            raise
        if isinstance(result, c.ConnectionRedirect):
            writer.close()
            return result.host
        return None

    async def _read(self, reader: asyncio.StreamReader) -> None:
        frames = FrameReader()
        try:
            header = await reader.readexactly(8)
            if header != PROTOCOL_HEADER:
                raise ClientError(f"broker answered with protocol header {header!r}")
            loop = asyncio.get_running_loop()
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                self._last_heard = loop.time()
                for assembly in frames.feed(data):
                    self._on_method(assembly.channel, c.decode_assembly(assembly))
        except (OSError, asyncio.IncompleteReadError, ClientError) as exc:
            log.debug("connection to %s lost: %s", self.current, exc)
        finally:
            if self._reader_task is asyncio.current_task():  # not a reader replaced by a reconnect
                if self._opened is not None and not self._opened.done():
                    self._opened.set_exception(ClientError(f"connection to {self.current} closed"))
                self._lost.set()

    def _on_method(self, channel: int, method) -> None:
        if channel == 0 and isinstance(method, c.Control):
            self._connection_control(method)
            return
        session = next((s for s in self.sessions if s.channel == channel), None)
        if session is None:
            return
        if isinstance(method, c.Control):
            session.on_control(method)
        else:
            session.on_command(method)

    def _connection_control(self, m) -> None:
        if isinstance(m, c.ConnectionStart):
            response = b"\x00" + self.user.encode() + b"\x00" + self.password.encode()
            self.send(0, c.ConnectionStartOk(client_properties={"product": "raftmq-client",
                                                                "raftmq.follows-redirect": True}, mechanism="PLAIN",
                                             response=response, locale="en_US"))
        elif isinstance(m, c.ConnectionTune):
            self.send(0, c.ConnectionTuneOk(channel_max=m.channel_max or 256, max_frame_size=0xFFFF,
                                            heartbeat=0))
            self.send(0, c.ConnectionOpen(virtual_host=self.vhost))
        elif isinstance(m, (c.ConnectionOpenOk, c.ConnectionRedirect)):
            if m.known_hosts:
                self.known_hosts = list(m.known_hosts)
            self._opened.set_result(m)
        elif isinstance(m, c.ConnectionClose):
            with contextlib.suppress(ClientError):
                self.send(0, c.ConnectionCloseOk())
            if self._opened is not None and not self._opened.done():
                self._opened.set_exception(ClientError(f"broker closed: {m.reply_code} {m.reply_text}"))
            if self._writer is not None:
                self._writer.close()

    async def _supervise(self) -> None:
        """Reconnect and resume whenever the connection drops."""
        while not self._closing:
            await self._lost.wait()
            if self._closing:
                return
            self.reconnects += 1
            log.info("connection to %s lost; failing over (known hosts %s)", self.current, self.known_hosts)
            try:
                await self._establish()
            except Exception as exc:  # whatever it was, callers must not wait for a resume forever
                error = exc if isinstance(exc, ClientError) else ClientError(f"failover failed: {exc!r}")
                log.error("failover failed: %s", exc)
                for session in self.sessions:
                    session.fail(error)
                return


class BlockingConnection:
    """A synchronous wrapper: the asyncio client runs in a private event-loop thread.

    ::

        conn = BlockingConnection(["127.0.0.1:5672"], "guest", "guest")
        session = conn.session(b"sync-producer", timeout=60)
        session.queue_declare("orders", durable=True)
        session.publish("", "orders", b"...", persistent=True)
        message = session.subscribe("orders").get(timeout=5)
        message.accept()
        conn.close()
    """

    def __init__(self, hosts: list[str], user: str = "guest", password: str = "guest", vhost: str = "/",
                 timeout: float = 60.0) -> None:
        import threading

        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raftmq-0-10-client", daemon=True)
        self._thread.start()
        self._conn = self.call(Connection.connect(hosts, user, password, vhost))

    def call(self, coro):
        """Run a coroutine of the async client in the client thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout)

    def session(self, name: bytes | None = None, timeout: int = 60) -> _BlockingProxy:
        return _BlockingProxy(self, self.call(self._conn.session(name, timeout)))

    def close(self) -> None:
        try:
            self.call(self._conn.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)


class _BlockingProxy:
    """Wraps an async object (session, subscription, message): coroutine methods become blocking."""

    def __init__(self, owner: BlockingConnection, target) -> None:
        self._owner = owner
        self._target = target

    def __getattr__(self, name: str):
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            result = attr(*args, **kwargs)
            if asyncio.iscoroutine(result):
                result = self._owner.call(result)
            if isinstance(result, (Subscription, Message)):
                return _BlockingProxy(self._owner, result)
            if isinstance(result, list) and result and isinstance(result[0], Message):
                return [_BlockingProxy(self._owner, m) for m in result]
            return result

        return call
