"""One AMQP 0-10 connection (spec 4 and class connection): negotiation, redirect, sessions.

After the protocol header the server sends its own header and connection.start; the client
authenticates (SASL PLAIN), tunes, and opens a virtual host. In a cluster, a node that is not the
leader answers connection.open with connection.redirect to the leader (clients then talk to the
node that sequences everything, one network hop less) unless the client set ``insist``;
connection.open-ok always lists every member's client address in known-hosts.

Framing and decoding errors close the connection with 501 (framing-error); an unknown command is an
execution exception (540) on its session; everything else is the sessions' business.

Limits before the connection is open (issue 17): unfinished assemblies of all channels and tracks
together may hold at most :data:`PRE_OPEN_PENDING_BYTES` (0-9-1 limits a frame to 4 KiB before
tune-ok; a 0-10 client may send 64 KiB frames from the start, so the bound is one such frame),
and afterwards ``max_message_size`` plus :data:`PENDING_MARGIN` -- per connection, not per channel
and track.  Beyond either, the connection is closed with 501.  The connection must be open within
``handshake_timeout`` (else closed with 320), and the connection limits of
:mod:`..admission` refuse it after authentication with 320 connection-forced (spec L3777ff: the
only close code that tells the client to retry later).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from raftmq import __version__
from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010.errors import FramingError
from raftmq.protocol.amqp010.frames import PROTOCOL_HEADER, FrameReader, encode_assembly
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import OK, Command, Flow, Result
from raftmq.store.disk.bodies import READ_AHEAD

from ..auth import AuthError, Principal
from ..core.access import Access, AccessRefused
from ..peer import peer_of
from ..writeflow import DEFAULT_HIGH, Parking, ReadGate, peer_closed, reader_bytes, set_write_limits
from .session import ServerSession, SessionHost

if TYPE_CHECKING:
    from ..broker import Broker, ClientEndpoint

log = logging.getLogger(__name__)

AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(6)
CLOSE_NORMAL, CLOSE_FORCED, CLOSE_INVALID_PATH, CLOSE_FRAMING = 200, 320, 402, 501
MAX_FRAME_SIZE = 0xFFFF
CLOSE_OK_TIMEOUT = 2.0
PRE_OPEN_PENDING_BYTES = 64 * 1024  # unfinished assemblies before connection.open-ok (one whole frame fits)
FOLLOWS_REDIRECT = "raftmq.follows-redirect"  # client-properties key: true asks for connection.redirect
PENDING_MARGIN = 64 * 1024  # unfinished assemblies once open: max_message_size + this (command + header)


class Amqp010Connection(asyncio.Protocol):
    def __init__(self, broker: Broker, transport: asyncio.Transport) -> None:
        self.broker = broker
        self.counts = broker.counts_for("AMQP 0-10")  # [published, delivered]
        self.config = broker.config
        self.transport = transport
        self.peer, self.peer_host = peer_of(transport)
        self.reader = FrameReader(MAX_FRAME_SIZE, max_assembly_size=self.config.max_message_size + PENDING_MARGIN,
                                  max_pending_bytes=PRE_OPEN_PENDING_BYTES)
        self.state = AWAIT_START_OK
        self._login: asyncio.Future | None = None  # start-ok's password in the login pool (node/logins.py)
        self._held: list | None = None  # what followed a start-ok being checked: assemblies, then bytes read
        self._assemblies: Iterator = iter(())
        self.conn_id: str | None = None
        self.principal: Principal | None = None
        self.access: Access | None = None  # set by connection.open: what the principal may do in the vhost
        self.vhost = "/"
        self.follows_redirect = False  # the client said (client-properties) that it handles redirect
        self.max_frame_size = MAX_FRAME_SIZE
        self.sessions: dict[int, ServerSession] = {}
        self.completion_due: dict[int, ServerSession] = {}
        self.is_publisher = False  # sent a message.transfer: the one kind of client an alarm stops reading
        self.reading = ReadGate(transport)  # why reading is paused: an alarm, the broker's backlog
        self.pending: dict[int, tuple] = {}
        self._next_token = 0
        self._wbuf: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self._close_handle: asyncio.TimerHandle | None = None
        self._handshake_handle: asyncio.TimerHandle | None = None
        self._refusal: str | None = None  # why the connection limits refuse this connection
        self._admitted_as: str | None = None  # the address counted in broker.admission
        # Transfers held while the client's socket is full (writeflow.py).
        self._parking = Parking(stop_after=self.config.write_buffer_high or DEFAULT_HIGH)
        set_write_limits(transport, self.config.write_buffer_high)

    # ------------------------------------------------------------------ asyncio.Protocol

    def start(self, leftover: bytes, handshake_deadline: float | None = None) -> None:
        """Called once the 0-10 protocol header was read; ``handshake_deadline`` (loop time): close
        the connection if it is not open by then."""
        self._admitted_as = self.peer_host or "?"
        self._refusal = self.broker.admission.admit(self._admitted_as)
        if handshake_deadline is not None:
            self._handshake_handle = self._loop.call_at(handshake_deadline, self._handshake_expired)
        self.conn_id = self.broker.register(self)
        self.transport.write(PROTOCOL_HEADER)
        self.send(0, c.ConnectionStart(
            server_properties={"product": "raftmq", "version": __version__, "platform": "Python",
                               "known-hosts": self.broker.known_hosts},
            mechanisms=["PLAIN"], locales=["en_US"]))
        self.flush()
        if leftover:
            self.data_received(leftover)

    def data_received(self, data: bytes) -> None:
        if self.state == CLOSED:
            return
        if self._held is not None:  # start-ok is being checked: what follows it waits (_logged_in)
            self._held.append(data)
            self.transport.pause_reading()
            return
        self._on_input(data)

    def _on_input(self, data: bytes, held: list | None = None) -> None:
        try:
            # start-ok takes the rest of this iterator while its password is checked
            self._assemblies = assemblies = iter(held if held is not None else self.reader.feed(data))
            for assembly in assemblies:
                if self.state == CLOSED:
                    break
                try:
                    method = c.decode_assembly(assembly)
                except c.UnknownCommand as exc:
                    session = self.sessions.get(assembly.channel)
                    if session is not None:
                        session.in_next += 1
                        session._exception(session.in_next - 1, _Unknown(exc), 540, str(exc))
                    continue
                self._on_method(assembly.channel, method)
        except FramingError as exc:
            self.close(CLOSE_FRAMING, f"framing-error: {exc.text}")
        except Exception:
            log.exception("0-10 connection %s: internal error", self.peer)
            self.close(CLOSE_FORCED, "internal error")
        self.flush()
        self.broker.maybe_check_alarms()  # input read may be held (partial assemblies): memory grew
        if self.broker.alarm and self.is_publisher and not self.reading.alarm and self.state != CLOSED:
            self.set_blocked(self.broker.alarm)
        if self.broker.flow_throttled and not self.reading.flow and self.state != CLOSED:
            self.reading.pause_for_flow()
            self.broker.pause_for_flow(self)

    def resume_flow(self) -> None:
        if self.state != CLOSED:
            self.reading.resume_flow()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        if self._login is not None:
            self._login.cancel()
            self._login = None
        for handle in (self._close_handle, self._handshake_handle):
            if handle is not None:
                handle.cancel()
        if self._admitted_as is not None:
            self.broker.admission.release(self._admitted_as)
            self._admitted_as = None
        if self.conn_id is not None:
            self.broker.unregister(self.conn_id)
        self.sessions.clear()
        self.pending.clear()
        self._parking.clear()

    def pause_writing(self) -> None:
        """The write buffer passed ``write_buffer_high``: park transfers from now on (writeflow.py)."""
        self._parking.paused = True

    def resume_writing(self) -> None:
        """Below the low-water mark again: write the parked transfers in order, then re-enable
        assignment. A transfer of a session detached meanwhile is dropped here: the session keeps
        it unsettled in the state machine and replays it when it is resumed."""
        self._parking.release(self.state == OPEN, self._write_parked, self.flush, self._restart_flow)

    def _write_parked(self, item: tuple) -> None:
        channel, destination, transfer, _owned = item
        session = self.sessions.get(channel)
        if session is not None:
            self._transfer_now(session, destination, transfer, self._parked_next)

    def _parked_next(self) -> list[int]:
        """Ids of the next parked transfers without a body: read with one that missed the cache."""
        return [item[2][4].id for item in islice(self._parking.items, READ_AHEAD) if len(item[2]) == 5]

    def _restart_flow(self, channel: int) -> None:
        if channel in self.sessions:
            self._submit_flow(channel, True)

    def _submit_flow(self, channel: int, active: bool) -> None:
        """Stop or restart assignment to a session, in the log (an error, session gone, is ignored)."""
        self.broker.submit(Flow(self.conn_id, None, channel, active))

    def held_bytes(self) -> int:
        """What this connection holds for the memory alarm: write buffer, parked accept-mode-none
        bodies, and input not yet decoded (partial frames and assemblies)."""
        return self.transport.get_write_buffer_size() + self._parking.owned_bytes + reader_bytes(self.reader)

    # ------------------------------------------------------------------ writing

    def send(self, channel: int, method) -> None:
        track, segments = c.segments_of(method)
        self._wbuf.append(encode_assembly(channel, track, segments, self.max_frame_size))

    def flush(self) -> None:
        self._parking.unflushed = 0
        if self.completion_due:
            for session in self.completion_due.values():
                session.send_completion()
            self.completion_due.clear()
        if self._wbuf and self.state != CLOSED:
            data = b"".join(self._wbuf)
            self._wbuf.clear()
            self.transport.write(data)
        else:
            self._wbuf.clear()

    # ------------------------------------------------------------------ the broker's endpoint interface

    def submit(self, command: Command, deferrable: bool = False) -> None:
        self.broker.submit(command, deferrable)

    def request(self, session: ServerSession, command: Command, on_ok, on_error=None,
                deferrable: bool = False) -> None:
        self._next_token += 1
        command = command._replace(token=self._next_token)
        self.pending[self._next_token] = (session, on_ok, on_error)
        self.broker.submit(command, deferrable)

    def on_reply(self, token: int | None, result: Result, channel_no: int | None) -> None:
        entry = self.pending.pop(token, None) if token is not None else None
        if entry is None:
            return
        session, on_ok, on_error = entry
        if self.sessions.get(session.channel) is not session:
            return
        if result.status == OK:
            on_ok(result.value)
        elif on_error is not None:
            on_error(result.code, result.text)
        else:
            session._exception(-1, _Unknown(None), result.code, result.text, destroy=False)

    def on_transfer(self, channel_no: int, destination: str, transfer: tuple) -> None:
        session = self.sessions.get(channel_no)
        if session is not None:
            self.counts[1] += 1
            if self._parking.holding:
                size = transfer[4].size
                # Parked with its body (accept-mode none, or browsed: store/disk/bodies.fill_bodies), it
                # is held only here; without one (to be accepted), it is read when written.
                owned = size if len(transfer) > 5 else 0
                if self._parking.park(channel_no, destination, transfer, owned, size):
                    self._submit_flow(channel_no, False)
                return
            self._transfer_now(session, destination, transfer)

    def _transfer_now(self, session: ServerSession, destination: str, transfer: tuple,
                      following: Callable[[], list[int]] | None = None) -> None:
        """Write a transfer; flush once a high-water mark's worth is written, so that the
        transport can pause us in the middle of a large batch (writeflow.py)."""
        session.on_transfer(destination, transfer, following)
        if self._parking.wrote(transfer[4].size):
            self.flush()

    def on_session_detached(self, channel_no: int, name: bytes) -> None:
        """The session was taken over by another attachment (attach with force)."""
        session = self.sessions.pop(channel_no, None)
        if session is not None:
            self.broker.usage.channel_closed(self.conn_id)
            session.attached = False
            self.send(channel_no, c.SessionDetached(name=name, code=1))

    def on_deliver(self, channel_no: int, consumer_tag: str, delivery: tuple) -> None:
        pass  # 0-9-1 deliveries never target a 0-10 connection

    def on_cancel(self, channel_no: int, consumer_tag: str) -> None:
        pass  # 0-10 has no server-initiated cancel: the subscription just stops

    def on_forced_close(self, reply_code: int, reply_text: str) -> None:
        self.close(CLOSE_FORCED, reply_text)

    def set_blocked(self, reason: str | None) -> None:
        """A resource alarm stops reading publishers only (as 0-9-1 does): a subscriber that
        could not be read could not accept, and its accepts are what frees the memory."""
        self.reading.set_alarm(bool(reason) and self.is_publisher)

    def drop_if_peer_gone(self) -> None:
        """While its reading is paused the connection cannot see its client leave: look (writeflow.py)."""
        if self.reading.paused and self.state != CLOSED and peer_closed(self.transport):
            log.info("0-10 connection %s: client closed while blocked", self.peer)
            self.state = CLOSED
            self.transport.abort()

    def close_connection(self, code: int, text: str) -> None:  # the broker's shutdown path
        self.close(CLOSE_FORCED, text)

    def drop_session(self, channel: int) -> None:
        if self.sessions.pop(channel, None) is not None:
            self.broker.usage.channel_closed(self.conn_id)

    # ------------------------------------------------------------------ dispatch

    def _on_method(self, channel: int, method) -> None:
        if isinstance(method, c.Control) and method.CLASS_CODE == 0x01:
            self._connection_control(method)
            return
        if self.state == CLOSING:
            return
        if self.state != OPEN:
            raise FramingError(f"{method.NAME} before the connection was open")
        if isinstance(method, c.SessionAttach):
            held = self.sessions.get(channel)
            if held is not None and (held.attached or held.attaching):
                self.send(channel, c.SessionDetached(name=method.name, code=1))
                return
            if held is None:  # a session counts as a channel of the user's max-channels (node/limits.py)
                refusal = self.broker.usage.channel_opened(self.conn_id)
                if refusal:  # a connection error, as a 0-9-1 channel.open over the limit
                    self.close(CLOSE_FORCED, refusal)
                    return
            # A session that an execution exception detached (3.4.1.3) leaves the channel free.
            session = self.sessions[channel] = ServerSession(self, channel, bytes(method.name or b""))
            session.attach(bool(method.force))
            # A session detached while its connection's writing was paused may have kept its
            # assignment stopped (Op.FLOW is state of the session): restart it for this attachment.
            self._submit_flow(channel, True)
            return
        session = self.sessions.get(channel)
        if method.__class__ is c.MessageTransfer:
            self.is_publisher = True
        if session is None:
            if isinstance(method, c.Control) and not isinstance(method, (c.SessionDetached, c.SessionDetach)):
                self.send(channel, c.SessionDetached(name=getattr(method, "name", b"") or b"", code=3))
            return  # commands on a detached channel are dropped (spec: not-attached)
        if isinstance(method, c.Control):
            session.on_control(method)
        else:
            session.on_command(method)

    def _connection_control(self, m) -> None:
        if isinstance(m, c.ConnectionStartOk) and self.state == AWAIT_START_OK and self._login is None:
            # The password is hashed in the login pool; what follows start-ok (the rest of this
            # read, and reading) waits for the answer, as it waited before the hash moved off the loop.
            self._held = list(self._assemblies)
            self.transport.pause_reading()
            self._login = login = asyncio.ensure_future(
                self.broker.auth.login(m.mechanism or "", bytes(m.response or b""), self.peer_host))
            login.add_done_callback(lambda done: self._logged_in(done, m))
        elif isinstance(m, c.ConnectionTuneOk) and self.state == AWAIT_TUNE_OK:
            size = m.max_frame_size or MAX_FRAME_SIZE
            if size < 4096:
                self.close(CLOSE_FRAMING, f"max-frame-size {size} below the 4096 minimum")
                return
            self.max_frame_size = min(size, MAX_FRAME_SIZE)
            self.reader.max_frame_size = self.max_frame_size
            self.state = AWAIT_OPEN
        elif isinstance(m, c.ConnectionOpen) and self.state == AWAIT_OPEN:
            self._open(m)
        elif isinstance(m, c.ConnectionHeartbeat):
            pass
        elif isinstance(m, c.ConnectionClose):
            self.send(0, c.ConnectionCloseOk())
            self.flush()
            self.state = CLOSED
            self.transport.close()
        elif isinstance(m, c.ConnectionCloseOk) and self.state == CLOSING:
            self._finish_close()
        elif self.state != CLOSING:
            raise FramingError(f"unexpected {m.NAME}")

    def _logged_in(self, login: asyncio.Future, m) -> None:
        """start-ok's check, back from the login pool: connection.tune, or the refusal."""
        self._login = None
        if self.state != AWAIT_START_OK or login.cancelled():
            return
        held, self._held = self._held or [], None
        self.transport.resume_reading()  # a refusal below waits for the client's close-ok
        try:
            self.principal = login.result()
        except AuthError as exc:
            self.close(CLOSE_FORCED, f"authentication failed: {exc}")
            return
        except Exception:
            log.exception("0-10 connection %s: internal error", self.peer)
            self.close(CLOSE_FORCED, "internal error")
            return
        if self._refusal:
            self.close(CLOSE_FORCED, self._refusal)
            return
        self.follows_redirect = bool((m.client_properties or {}).get(FOLLOWS_REDIRECT))
        self.state = AWAIT_TUNE_OK
        self.send(0, c.ConnectionTune(channel_max=self.config.channel_max, max_frame_size=MAX_FRAME_SIZE,
                                      heartbeat_min=0, heartbeat_max=self.config.heartbeat or 0))
        self._on_input(b"", [a for a in held if not isinstance(a, bytes)])  # the rest of start-ok's read ...
        for data in (d for d in held if isinstance(d, bytes)):
            self.data_received(data)  # ... then what was read after it
        self.flush()

    def _open(self, m) -> None:
        vhost = m.virtual_host or "/"
        hosts = [h for h in self.broker.known_hosts.split(",") if h]
        if not Q.has_vhost(self.broker.machine, vhost):
            if not self.broker.accepting:
                # A node that has not caught up yet knows no vhost at all: that is not the
                # client's fault (402 would end a failing-over client), so send it elsewhere.
                self.close(CLOSE_FORCED, f"this node has no cluster leader; try {self.broker.known_hosts}")
            else:
                self.close(CLOSE_INVALID_PATH, f"virtual host '{vhost}' not found")
            return
        try:
            access = Access.open(self.principal, vhost)
        except AccessRefused as exc:
            self.broker.audit.vhost_refused(self.conn_id, "AMQP 0-10", self.principal.name, self.peer, vhost)
            self.close(CLOSE_FORCED, exc.text)
            return
        leader_amqp = self.broker.leader_client_address()
        me = self.broker.client_address()
        if leader_amqp and leader_amqp != me and not m.insist and self.follows_redirect:
            # Spec L4135ff: redirect unless the client insists. Only clients that say they follow
            # a redirect get one: Qpid's clients (Python and C++) fail on connection.redirect
            # although the spec says a client MUST handle it; any node serves them instead (as with
            # insist: commands go to the leader through the log).
            self.send(0, c.ConnectionRedirect(host=leader_amqp, known_hosts=hosts))
            self.state = CLOSING
            self._close_handle = self._loop.call_later(CLOSE_OK_TIMEOUT, self._finish_close)
            return
        if not self.broker.accepting:
            self.close(CLOSE_FORCED, f"this node has no cluster leader; try {self.broker.known_hosts}")
            return
        refusal = self.broker.usage.open(self.conn_id, self.principal.name, vhost)  # node/limits.py
        if refusal:  # connection-forced, as the node-wide limits (node/admission.py)
            self.close(CLOSE_FORCED, refusal)
            return
        self.vhost = vhost
        self.access = access
        self.state = OPEN
        self.broker.audit.opened(self.conn_id, "AMQP 0-10", access, self.peer)
        self.reader.max_pending_bytes = self.config.max_message_size + PENDING_MARGIN
        if self._handshake_handle is not None:
            self._handshake_handle.cancel()
            self._handshake_handle = None
        self.send(0, c.ConnectionOpenOk(known_hosts=hosts))

    # ------------------------------------------------------------------ closing

    def close(self, code: int, text: str) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        log.info("0-10 connection %s: closing with %s %s", self.peer, code, text)
        self.state = CLOSING
        self.send(0, c.ConnectionClose(reply_code=code, reply_text=text[:255]))
        self.flush()
        self._close_handle = self._loop.call_later(CLOSE_OK_TIMEOUT, self._finish_close)

    def _handshake_expired(self) -> None:
        """handshake_timeout passed before connection.open-ok: say why, then hang up at once."""
        self._handshake_handle = None
        if self.state >= OPEN:
            return
        log.info("0-10 connection %s: handshake not finished within handshake_timeout, closing", self.peer)
        self.state = CLOSING
        self.send(0, c.ConnectionClose(reply_code=CLOSE_FORCED, reply_text="handshake not finished in time"))
        self._finish_close()

    def _finish_close(self) -> None:
        if self.state == CLOSED:
            return
        self.flush()
        self.state = CLOSED
        self.transport.close()


class _Unknown:
    """Stands for a command that could not be decoded, in an execution exception."""

    NAME = "unknown"

    def __init__(self, exc: c.UnknownCommand | None) -> None:
        self.CLASS_CODE = exc.class_code if exc else 0
        self.CODE = exc.code if exc else 0


if TYPE_CHECKING:  # the broker's interface to a client connection (node/broker.py), checked by mypy
    _endpoint: type[ClientEndpoint] = Amqp010Connection
    _session_host: type[SessionHost] = Amqp010Connection  # session.py
