"""One AMQP 0-9-1 connection: handshake, frame dispatch, heartbeats, errors, flushing writes.

The connection owns the frame reader and the write buffer; channels (``channel.py``) translate
methods into broker commands. Every bad input ends in the reply code the spec gives it (a channel
exception closes the channel, a connection exception the connection) and never in an exception
escaping into the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from raftmq import __version__
from raftmq.protocol.amqp091 import methods as m
from raftmq.protocol.amqp091.constants import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
)
from raftmq.protocol.amqp091.errors import AMQPError
from raftmq.protocol.amqp091.frames import (
    FRAME_PUBLISH,
    HEARTBEAT_FRAME,
    FrameReader,
    encode_method_frame,
    frames_at,
)
from raftmq.protocol.amqp091.methods import decode_method
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import OK, Command, Flow, Publish, Result
from raftmq.store.disk.bodies import READ_AHEAD

from ..auth import MECHANISMS, AuthError, Principal
from ..core.access import Access, AccessRefused
from ..peer import peer_of
from ..writeflow import DEFAULT_HIGH, Parking, peer_closed, reader_bytes, set_write_limits
from .channel import Channel, ChannelHost
from .errors import ConnectionException

if TYPE_CHECKING:
    from ..broker import Broker, ClientEndpoint

log = logging.getLogger(__name__)

CLOSE_OK_TIMEOUT = 2.0  # seconds to wait for connection.close-ok after a server-initiated close
HANDSHAKE_TIMEOUT_CLOSE = (320, "CONNECTION_FORCED - handshake not finished in time")
# After our close-ok to a client's connection.close, the client closes the socket (reference
# 1.4.2.10); we wait for that as RabbitMQ does (its heartbeat timeout, at most 30 s) instead of
# closing first: a socket closed with the client's later frames unread is reset, and the reset can
# destroy the close-ok before the client reads it.
CLOSE_LINGER_MAX = 30.0

# Connection states.
AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(6)

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": False,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}


class Amqp091Connection(asyncio.Protocol):
    def __init__(self, broker: Broker, transport: asyncio.Transport) -> None:
        self.broker = broker
        self.counts = broker.counts_for("AMQP 0-9-1")  # [published, delivered]
        self.config = broker.config
        self.transport = transport
        self.peer, self.peer_host = peer_of(transport)
        self.reader = FrameReader(FRAME_MIN_SIZE, whole_publishes=True)
        self.state = AWAIT_START_OK
        self.conn_id: str | None = None
        self.principal: Principal | None = None
        self.access: Access | None = None  # set by connection.open: what the principal may do in the vhost
        self.vhost = "/"
        self.channel_max = self.config.channel_max
        self.frame_max = self.config.frame_max
        self.heartbeat = 0
        self.client_properties: dict = {}
        self.client_capabilities: dict = {}
        self.channels: dict[int, Channel] = {}
        self._wbuf: list[bytes] = []
        self.confirm_dirty: dict[int, Channel] = {}
        self._next_token = 0
        self.pending: dict[int, tuple] = {}
        self._loop = asyncio.get_running_loop()
        self._heartbeat_handle: asyncio.TimerHandle | None = None
        self._close_handle: asyncio.TimerHandle | None = None
        self._handshake_handle: asyncio.TimerHandle | None = None
        self._login: asyncio.Future | None = None  # start-ok's password in the login pool (node/logins.py)
        self._held: list | None = None  # frames read after a start-ok or update-secret being checked
        self._frames: Iterator = iter(())  # the frames being processed
        self._refusal: str | None = None  # why the connection limits refuse this connection
        self._admitted_as: str | None = None  # the address counted in broker.admission
        self._received = True
        self._sent = False
        self._missed_beats = 0
        self.blocked_reason: str | None = None
        self.is_publisher = False
        self._reading_paused = False
        # Channels whose input held behind a topology change passed its bound (channel.py _hold):
        # reading stops until they release it.
        self._holding: set[int] = set()
        # Deliveries held while the client's socket is full (writeflow.py).
        self._parking = Parking(stop_after=self.config.write_buffer_high or DEFAULT_HIGH)
        self.write_high = self.config.write_buffer_high or DEFAULT_HIGH  # auto-ack credit (autoack.py)
        set_write_limits(transport, self.config.write_buffer_high)

    # ------------------------------------------------------------------ asyncio.Protocol

    def start(self, leftover: bytes, handshake_deadline: float | None = None) -> None:
        """Called once the 0-9-1 protocol header was read: offer connection.start.

        ``handshake_deadline`` (loop time): close the connection if it is not open by then."""
        self._admitted_as = self.peer_host or "?"
        self._refusal = self.broker.admission.admit(self._admitted_as)
        if handshake_deadline is not None:
            self._handshake_handle = self._loop.call_at(handshake_deadline, self._handshake_expired)
        self.conn_id = self.broker.register(self)
        self.send_method(0, m.ConnectionStart(
            version_major=0,
            version_minor=9,
            server_properties={
                "product": "raftmq",
                "version": __version__,
                "platform": "Python",
                "cluster_name": "raftmq",
                "capabilities": SERVER_CAPABILITIES,
                "known_hosts": self.broker.known_hosts,
            },
            mechanisms=" ".join(MECHANISMS).encode(),
            locales=b"en_US",
        ))
        self.flush()
        if leftover:
            self.data_received(leftover)

    def data_received(self, data: bytes) -> None:
        self._received = True
        if self.state == CLOSED:
            return
        try:
            frames = self.reader.feed(data)
        except AMQPError as exc:
            self.close_connection(exc.reply_code, exc.reply_text)
            self.flush()
            return
        if self._held is not None:  # a login is being checked: what follows it waits (see _hold)
            self._held += frames
            self.transport.pause_reading()
            return
        self._on_frames(frames)

    def _on_frames(self, frames: list) -> None:
        self._frames = frames = iter(frames)  # _hold takes the rest of it
        try:
            channels = self.channels
            for frame in frames:
                if self.state == CLOSED:
                    break
                if frame[0] == FRAME_PUBLISH:
                    # A publish that came whole: one step, or frame by frame if the channel says no.
                    channel = channels.get(frame[1])
                    if channel is None or self.state != OPEN or not channel.publish_whole(frame):
                        for part in frames_at(frame.source, frame.offset, 3):
                            self._on_frame(part)
                    continue
                self._on_frame(frame)
        except ConnectionException as exc:
            self.close_connection(exc.code, exc.text, exc.class_id, exc.method_id)
        except AMQPError as exc:
            self.close_connection(exc.reply_code, exc.reply_text, exc.class_id, exc.method_id)
        except Exception:
            log.exception("connection %s: internal error", self.peer)
            self.close_connection(541, "INTERNAL_ERROR - internal error")
        self.flush()
        self.broker.maybe_check_alarms()  # input read may be held (partial publishes): memory grew
        if self.is_publisher and not self._reading_paused and self.state != CLOSED:
            if self.blocked_reason:
                self._pause_reading()
            elif self.broker.flow_throttled:
                self._pause_reading()
                self.broker.pause_for_flow(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        self._cancel_timers()
        if self._login is not None:
            self._login.cancel()
            self._login = None
        if self._admitted_as is not None:
            self.broker.admission.release(self._admitted_as)
            self._admitted_as = None
        if self.conn_id is not None:
            self.broker.unregister(self.conn_id)
        self.pending.clear()
        self.channels.clear()
        self._parking.clear()

    def pause_writing(self) -> None:
        """The write buffer passed ``write_buffer_high``: park deliveries from now on (writeflow.py)."""
        self._parking.paused = True

    def resume_writing(self) -> None:
        """The buffer drained below the low-water mark: write what was parked, then let the state
        machine assign to the stopped channels again (unless the client paused them itself)."""
        self._parking.release(self.state == OPEN, self._write_parked, self.flush, self._restart_flow)

    def _write_parked(self, item: tuple) -> None:
        number, consumer_tag, delivery, _owned = item
        channel = self.channels.get(number)
        if channel is None or not channel.is_open:
            return  # closing the channel returned its unacked deliveries to their queues
        if channel.consumer_no_ack(consumer_tag) is None:
            channel.return_unsent([delivery])  # cancelled meanwhile (auto-ack ones are gone)
            return
        self._deliver_now(channel, consumer_tag, delivery, self._parked_next)

    def _parked_next(self) -> list[int]:
        """Ids of the next parked deliveries without a body: read with one that missed the cache."""
        return [item[2][3].id for item in islice(self._parking.items, READ_AHEAD) if len(item[2]) == 4]

    def _restart_flow(self, number: int) -> None:
        channel = self.channels.get(number)
        if channel is not None and channel.is_open and channel.client_flow_active:
            self._submit_flow(number, True)

    def _submit_flow(self, number: int, active: bool) -> None:
        """channel.flow through the log: the only way a node-local pause can change assignment
        identically on every replica. Token-less: an error (channel gone) is ignored."""
        self.broker.submit(Flow(self.conn_id, None, number, active))

    def held_bytes(self) -> int:
        """What this connection holds for the memory alarm: its write buffer, parked auto-ack
        bodies, unparsed input and publishes being assembled."""
        held = self.transport.get_write_buffer_size() + self._parking.owned_bytes + reader_bytes(self.reader)
        for channel in self.channels.values():
            held += channel.assembling_bytes + channel.held_input_bytes
        return held

    def hold_full(self, number: int) -> None:
        """Channel ``number`` holds as much input behind a topology change as it may (channel.py
        ``_hold``): read no more until it released it."""
        self._holding.add(number)
        if not self._reading_paused and self.state != CLOSED:
            self._pause_reading()

    def hold_released(self, number: int) -> None:
        """Channel ``number`` ran (or dropped) its held input: read again unless something else
        keeps the connection paused (an alarm, the log's backlog, another channel's held input)."""
        self._holding.discard(number)
        if self._holding or not self._reading_paused or self.blocked_reason or self.state == CLOSED:
            return  # (set_blocked reads again once unblocked)
        if self.is_publisher and self.broker.flow_throttled:
            self.broker.pause_for_flow(self)  # read again with the other publishers (resume_flow)
        else:
            self._reading_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Queue channel traffic (replies, returns, deliveries, confirms) for the next flush.

        Once we sent connection.close the peer discards every method but close and close-ok
        (reference 1.4.2.9), so channel traffic from then on -- outputs of commands applied after
        the close, such as a return for a publish read in the same chunk -- is dropped here.
        """
        if self.state < CLOSING:
            self._wbuf.append(data)

    def send_method(self, channel: int, method) -> None:
        self._wbuf.append(encode_method_frame(channel, method))

    def flush(self) -> None:
        self._parking.unflushed = 0
        if self.confirm_dirty:
            for channel in self.confirm_dirty.values():
                channel.flush_confirms()
            self.confirm_dirty.clear()
        if self._wbuf and self.state != CLOSED:
            data = b"".join(self._wbuf) if len(self._wbuf) > 1 else self._wbuf[0]
            self._wbuf.clear()
            self._sent = True
            self.transport.write(data)
        elif self._wbuf:
            self._wbuf.clear()

    # ------------------------------------------------------------------ requests to the broker

    def issue_token(self) -> int:
        """A new request id, for a command built with its token (the publish path)."""
        self._next_token += 1
        return self._next_token

    def request(self, channel: Channel, command: Command, method_cls, on_ok, deferrable: bool = False,
                size: int = 0) -> None:
        """Submit ``command`` with a token; ``on_ok(value)`` runs when its OK result arrives.
        ``size``: the bytes it carries, if known."""
        if command.token is None:
            command = command._replace(token=self.issue_token())
        self.pending[command.token] = (channel, on_ok, method_cls)
        self.broker.submit(command, deferrable, size)

    def request_publish(self, channel: Channel, command: Publish, seq: int, deferrable: bool, size: int) -> None:
        """Submit a confirm-mode publish (built with ``issue_token()``) that asks for no return: its
        outcome goes to ``channel.settle_publish(seq, result)``, with no closure made per message."""
        self.pending[command.token] = (channel, None, seq)
        self.broker.submit(command, deferrable, size)

    def on_reply(self, token: int | None, result: Result, channel_no: int | None) -> None:
        if token is None:
            # An error for a command sent without a reply (a publish without confirms).
            channel = self.channels.get(channel_no)
            if channel is not None and channel.is_open:
                channel.fail_from_broker(result.code, result.text, None)
            return
        entry = self.pending.pop(token, None)
        if entry is None:
            return
        channel, on_ok, method_cls = entry  # (channel, None, confirm seq) from request_publish
        if not channel.accepts_replies:
            return
        try:
            if on_ok is None:
                channel.settle_publish(method_cls, result)
            elif result.status == OK:
                on_ok(result.value)
            else:
                channel.fail_from_broker(result.code, result.text, method_cls)
        except ConnectionException as exc:
            self.close_connection(exc.code, exc.text, exc.class_id, exc.method_id)

    def on_deliver(self, channel_no: int, consumer_tag: str, delivery: tuple) -> None:
        channel = self.channels.get(channel_no)
        if channel is not None:
            self.counts[1] += 1
            if self._parking.holding and channel.is_open:
                size = delivery[3].size
                # Parked with its body (auto-ack: store/disk/bodies.fill_bodies), it is held only here;
                # without one (manual ack), it is read when written.
                owned = size if len(delivery) > 4 else 0
                # A channel under a basic.qos limit parks at most its credit: no stop needed.
                counted = 0 if channel.assignment_bounded else size
                if self._parking.park(channel_no, consumer_tag, delivery, owned, counted):
                    self._submit_flow(channel_no, False)
                return
            self._deliver_now(channel, consumer_tag, delivery)

    def _deliver_now(self, channel: Channel, consumer_tag: str, delivery: tuple,
                     following: Callable[[], list[int]] | None = None) -> None:
        """Hand a delivery to its channel; flush once a high-water mark's worth is written, so
        that the transport can pause us in the middle of a large batch (writeflow.py)."""
        channel.deliver(consumer_tag, delivery, following)
        if self._parking.wrote(delivery[3].size):
            self.flush()

    def on_cancel(self, channel_no: int, consumer_tag: str) -> None:
        channel = self.channels.get(channel_no)
        if channel is not None:
            channel.server_cancel(consumer_tag)

    def on_forced_close(self, reply_code: int, reply_text: str) -> None:
        """The cluster released this connection (its node was declared down): tell the client."""
        self.close_connection(reply_code, reply_text)

    def on_transfer(self, channel_no: int, destination: str, transfer: tuple) -> None:
        pass  # 0-10 and 1.0 transfers never target a 0-9-1 connection (it attaches no core session)

    def on_session_detached(self, channel_no: int, name: bytes) -> None:
        pass  # as on_transfer: a 0-9-1 connection has no core session to lose

    # ------------------------------------------------------------------ frames

    def _on_frame(self, frame) -> None:
        ftype, number, payload = frame  # three times per published message: no attribute lookups
        if ftype == FRAME_METHOD:
            method = decode_method(payload)
            if number == 0:
                self._on_connection_method(method)
                return
            if self.state != OPEN:
                if self.state == CLOSING:
                    return
                raise ConnectionException(503, "COMMAND_INVALID - channel method before connection.open",
                                          method.CLASS_ID, method.METHOD_ID)
            self._channel_for(number, method).on_method(method)
        elif ftype in (FRAME_BODY, FRAME_HEADER):
            state = self.state
            if state == CLOSING:
                return
            if number == 0:
                # General spec 4.2.6: a content frame on channel zero is a 504 channel error.
                raise ConnectionException(504, "CHANNEL_ERROR - content frame on channel 0")
            channel = self.channels.get(number) if state == OPEN else None
            if channel is None:
                raise ConnectionException(
                    505, f"UNEXPECTED_FRAME - content frame on channel {number} with no content expected"
                )
            if ftype == FRAME_BODY:
                channel.on_body(payload)
            else:
                channel.on_header(payload)
        elif ftype == FRAME_HEARTBEAT:
            if number != 0:
                raise ConnectionException(501, "FRAME_ERROR - heartbeat frame on a non-zero channel")
        else:  # the frame reader already refuses unknown types; kept as a guard
            raise ConnectionException(501, f"FRAME_ERROR - unknown frame type {ftype}")

    def _channel_for(self, number: int, method) -> Channel:
        channel = self.channels.get(number)
        if channel is not None:
            return channel
        if not isinstance(method, m.ChannelOpen):
            if isinstance(method, m.ChannelCloseOk):
                return _IGNORE_CHANNEL
            raise ConnectionException(504, f"CHANNEL_ERROR - expected 'channel.open' on channel {number}",
                                      method.CLASS_ID, method.METHOD_ID)
        if self.channel_max and len(self.channels) >= self.channel_max:  # 0: no limit (1.4.2.5.1)
            # channel_max bounds how many channels are open at once, not their numbers (1..65535),
            # as in RabbitMQ: see "Channel numbers" in docs/design.md.
            raise ConnectionException(
                530, f"NOT_ALLOWED - number of channels opened ({len(self.channels)}) has reached the "
                     f"negotiated channel_max ({self.channel_max})")
        refusal = self.broker.usage.channel_opened(self.conn_id)  # the user's max-channels (node/limits.py)
        if refusal:  # a connection error in RabbitMQ too (rabbit_reader create_channel: not_allowed)
            raise ConnectionException(530, f"NOT_ALLOWED - {refusal}", method.CLASS_ID, method.METHOD_ID)
        channel = Channel(self, number)
        self.channels[number] = channel
        return channel

    def forget_channel(self, number: int) -> None:
        if self.channels.pop(number, None) is not None:
            self.broker.usage.channel_closed(self.conn_id)

    # ------------------------------------------------------------------ connection class

    def _on_connection_method(self, method) -> None:
        state = self.state
        if state == CLOSING:
            if isinstance(method, m.ConnectionCloseOk):
                self._finish_close()
            elif isinstance(method, m.ConnectionClose):
                self.send_method(0, m.ConnectionCloseOk())
            return
        if isinstance(method, m.ConnectionClose):
            self.send_method(0, m.ConnectionCloseOk())
            self._finish_close(linger=True)
            return
        if isinstance(method, m.ConnectionUpdateSecret) and state == OPEN:
            self._on_update_secret(method)
            return
        expected = {
            AWAIT_START_OK: m.ConnectionStartOk,
            AWAIT_TUNE_OK: m.ConnectionTuneOk,
            AWAIT_OPEN: m.ConnectionOpen,
        }.get(state)
        if expected is not None and not isinstance(method, expected):
            raise ConnectionException(
                503, f"COMMAND_INVALID - expected '{expected.NAME}', got '{method.NAME}'",
                method.CLASS_ID, method.METHOD_ID,
            )
        if isinstance(method, m.ConnectionStartOk):
            self._on_start_ok(method)
        elif isinstance(method, m.ConnectionTuneOk):
            self._on_tune_ok(method)
        elif isinstance(method, m.ConnectionOpen):
            self._on_open(method)
        else:
            raise ConnectionException(
                503, f"COMMAND_INVALID - unexpected method '{method.NAME}' on channel 0",
                method.CLASS_ID, method.METHOD_ID,
            )

    def _on_update_secret(self, method) -> None:
        """connection.update-secret (RabbitMQ 3.8+, clients refresh OAuth 2 tokens with it).

        Asked of the authenticator (node/auth.py ``Authenticator.update_secret``): for raftmq's
        password users it accepts any secret and keeps the principal, as RabbitMQ's internal user
        store does (the connection is already authenticated; a secret matters only to a token
        backend, which would check it there).  A refusal closes the connection with 530, RabbitMQ's
        answer when a backend refuses.
        """
        secret = method.new_secret if isinstance(method.new_secret, bytes) else str(method.new_secret).encode()
        update = asyncio.ensure_future(self.broker.auth.update_secret(self.principal, secret, self.peer_host))
        self._hold(update, self._updated_secret, method)

    def _updated_secret(self, update: asyncio.Future, method) -> None:
        """update-secret's answer, back from the authenticator (the connection went on meanwhile)."""
        if self.state != OPEN:
            return
        name = self.principal.name
        try:
            principal = update.result()
        except AuthError as exc:
            log.info("connection %s: update-secret refused for user '%s': %s", self.peer, name, exc)
            raise ConnectionException(530, "NOT_ALLOWED - New secret was refused by one of the backends",
                                      method.CLASS_ID, method.METHOD_ID) from exc
        if principal is not self.principal:
            try:
                access = Access.open(principal, self.vhost)
            except AccessRefused as exc:
                raise ConnectionException(530, f"NOT_ALLOWED - {exc.text}", method.CLASS_ID,
                                          method.METHOD_ID) from None
            access.on_refused = self.access.on_refused if self.access is not None else None  # audit notes
            self.access = access
            self.principal = principal
        self.send_method(0, m.ConnectionUpdateSecretOk())

    @property
    def checking_login(self) -> bool:
        """A start-ok or update-secret is in the login pool: what the client sent after it waits."""
        return self._login is not None

    def _hold(self, login: asyncio.Future, then, method) -> None:
        """While ``login`` runs in the login pool, hold every frame after ``method`` (the rest of
        this read, and reading), so that the answer keeps its place: the client sees tune, or
        update-secret-ok, before the answers to what it pipelined after (as from RabbitMQ)."""
        self._login = login
        self._held = list(self._frames)
        self.transport.pause_reading()
        login.add_done_callback(lambda done: self._after_login(done, then, method))

    def _after_login(self, login: asyncio.Future, then, method) -> None:
        """Run ``then(login, method)`` with data_received's handling of what it raises, then the
        frames held meanwhile."""
        if self.state == CLOSED or login.cancelled():
            return
        self._login = None
        held, self._held = self._held or [], None
        try:
            then(login, method)
        except ConnectionException as exc:
            self.close_connection(exc.code, exc.text, exc.class_id, exc.method_id)
        except Exception:
            log.exception("connection %s: internal error", self.peer)
            self.close_connection(541, "INTERNAL_ERROR - internal error")
        if held and self.state != CLOSED:
            self._on_frames(held)  # may hold again (another update-secret)
        else:
            self.flush()
        if self._held is None and not self._reading_paused and self.state != CLOSED:
            self.transport.resume_reading()

    def _on_start_ok(self, method) -> None:
        self.client_properties = method.client_properties or {}
        capabilities = self.client_properties.get("capabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        response = method.response if isinstance(method.response, bytes) else str(method.response).encode()
        # The password is hashed in the login pool (node/logins.py); what the client sends
        # meanwhile waits (the client should wait for connection.tune anyway).
        self._hold(asyncio.ensure_future(self.broker.auth.login(method.mechanism, response, self.peer_host)),
                   self._logged_in, method)

    def _logged_in(self, login: asyncio.Future, method) -> None:
        if self.state != AWAIT_START_OK:
            return
        try:
            self.principal = login.result()
        except AuthError as exc:
            log.debug("connection %s: authentication failed: %s", self.peer, exc)  # node/auth.py logs it
            raise ConnectionException(403, f"ACCESS_REFUSED - {exc}", method.CLASS_ID, method.METHOD_ID) from exc
        if self._refusal:
            raise ConnectionException(530, f"NOT_ALLOWED - {self._refusal}", method.CLASS_ID, method.METHOD_ID)
        self.state = AWAIT_TUNE_OK
        self.send_method(0, m.ConnectionTune(
            channel_max=self.config.channel_max,
            frame_max=self.config.frame_max,
            heartbeat=self.config.heartbeat,
        ))

    def _on_tune_ok(self, method) -> None:
        frame_max = method.frame_max or self.config.frame_max
        if frame_max < FRAME_MIN_SIZE or frame_max > self.config.frame_max:
            raise ConnectionException(
                530, f"NOT_ALLOWED - frame_max={frame_max} outside [{FRAME_MIN_SIZE}, {self.config.frame_max}]",
                method.CLASS_ID, method.METHOD_ID,
            )
        channel_max = method.channel_max or self.config.channel_max
        if channel_max > self.config.channel_max:
            raise ConnectionException(
                530, f"NOT_ALLOWED - channel_max={channel_max} above {self.config.channel_max}",
                method.CLASS_ID, method.METHOD_ID,
            )
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = AWAIT_OPEN
        if self.heartbeat > 0:
            self._schedule_heartbeat()

    def _on_open(self, method) -> None:
        vhost = method.virtual_host or "/"
        if not self.broker.accepting:
            raise ConnectionException(
                320, f"CONNECTION_FORCED - this node has no cluster leader; try {self.broker.known_hosts}",
                method.CLASS_ID, method.METHOD_ID)
        if not Q.has_vhost(self.broker.machine, vhost):
            raise ConnectionException(530, f"NOT_ALLOWED - vhost '{vhost}' not found",
                                      method.CLASS_ID, method.METHOD_ID)
        try:
            self.access = Access.open(self.principal, vhost)
        except AccessRefused as exc:
            self.broker.audit.vhost_refused(self.conn_id, "AMQP 0-9-1", self.principal.name, self.peer, vhost)
            raise ConnectionException(530, f"NOT_ALLOWED - {exc.text}", method.CLASS_ID, method.METHOD_ID) from None
        refusal = self.broker.usage.open(self.conn_id, self.principal.name, vhost)  # node/limits.py
        if refusal:
            raise ConnectionException(530, f"NOT_ALLOWED - {refusal}", method.CLASS_ID, method.METHOD_ID)
        self.vhost = vhost
        self.state = OPEN
        name = self.client_properties.get("connection_name")  # pika's client_properties, RabbitMQ's UI name
        self.broker.audit.opened(self.conn_id, "AMQP 0-9-1", self.access, self.peer,
                                 name.decode(errors="replace") if isinstance(name, bytes) else str(name or ""))
        if self._handshake_handle is not None:
            self._handshake_handle.cancel()
            self._handshake_handle = None
        self.send_method(0, m.ConnectionOpenOk(known_hosts=self.broker.known_hosts))
        if self.broker.alarm:
            self.set_blocked(self.broker.alarm)

    # ------------------------------------------------------------------ closing

    def close_connection(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Server-initiated close: send connection.close, ignore all but close-ok, then hang up."""
        if self.state in (CLOSING, CLOSED):
            return
        log.info("connection %s: closing with %s %s", self.peer, code, text)
        if self.state == AWAIT_START_OK and code == 403:
            # Authentication failure: RabbitMQ's authentication_failure_close capability.
            pass
        self.state = CLOSING
        self.send_method(0, m.ConnectionClose(reply_code=code, reply_text=text[:255],
                                              class_id=class_id, method_id=method_id))
        self.flush()
        self._close_handle = self._loop.call_later(CLOSE_OK_TIMEOUT, self._finish_close)

    def _finish_close(self, linger: bool = False) -> None:
        """Send what is queued and end the connection; frames that arrive later are discarded.

        ``linger``: we answered the client's connection.close, so the client closes the socket;
        release the connection's resources now and close ours only if it has not done so within
        ``CLOSE_LINGER_MAX`` (or its heartbeat timeout, if shorter).
        """
        if self.state == CLOSED:
            return
        self.flush()
        self.state = CLOSED
        self._cancel_timers()
        if not linger:
            self.transport.close()
            return
        if self.conn_id is not None:
            self.broker.unregister(self.conn_id)
        if self._reading_paused:  # keep reading, to see the client's end of the stream
            self._reading_paused = False
            self.transport.resume_reading()
        wait = self.heartbeat if 0 < self.heartbeat < CLOSE_LINGER_MAX else CLOSE_LINGER_MAX
        self._close_handle = self._loop.call_later(wait, self.transport.close)

    def _cancel_timers(self) -> None:
        for handle in (self._heartbeat_handle, self._close_handle, self._handshake_handle):
            if handle is not None:
                handle.cancel()
        self._heartbeat_handle = self._close_handle = self._handshake_handle = None

    def _handshake_expired(self) -> None:
        """handshake_timeout passed before connection.open-ok: tell the client why, then hang up at
        once (a client that stalled its handshake is not waited for with close-ok)."""
        self._handshake_handle = None
        if self.state >= OPEN:
            return
        log.info("connection %s: handshake not finished within handshake_timeout, closing", self.peer)
        self.state = CLOSING
        code, text = HANDSHAKE_TIMEOUT_CLOSE
        self.send_method(0, m.ConnectionClose(reply_code=code, reply_text=text, class_id=0, method_id=0))
        self._finish_close()

    # ------------------------------------------------------------------ heartbeats

    def _schedule_heartbeat(self) -> None:
        self._heartbeat_handle = self._loop.call_later(self.heartbeat / 2, self._on_heartbeat_timer)

    def _on_heartbeat_timer(self) -> None:
        if self.state == CLOSED:
            return
        if self._received:
            self._received = False
            self._missed_beats = 0
        else:
            self._missed_beats += 1
            # 0-9-1 general 4.2.7: a peer silent for two heartbeat intervals is dead.
            if self._missed_beats >= 4:
                log.info("connection %s: missed heartbeats, closing", self.peer)
                self.state = CLOSED
                self.transport.close()
                return
        if not self._sent:
            self.transport.write(HEARTBEAT_FRAME)
        self._sent = False
        self._schedule_heartbeat()

    # ------------------------------------------------------------------ resource alarms

    def set_blocked(self, reason: str | None) -> None:
        if self.state != OPEN:
            return  # connection.open-ok is followed by set_blocked(broker.alarm)
        notify = bool(self.client_capabilities.get("connection.blocked"))
        if reason and not self.blocked_reason:
            self.blocked_reason = reason
            if notify:
                self.send_method(0, m.ConnectionBlocked(reason=reason))
            if self.is_publisher:
                self._pause_reading()
        elif not reason and self.blocked_reason:
            self.blocked_reason = None
            if notify:
                self.send_method(0, m.ConnectionUnblocked())
            if self._reading_paused and not self._holding:
                self._reading_paused = False
                self.transport.resume_reading()
        self.flush()

    def resume_flow(self) -> None:
        """The broker's backlog is low again (it paused this connection for flow, not an alarm)."""
        if self._reading_paused and not self.blocked_reason and not self._holding and self.state != CLOSED:
            self._reading_paused = False
            self.transport.resume_reading()

    def drop_if_peer_gone(self) -> None:
        """While its reading is paused the connection cannot see its client leave: look (writeflow.py)."""
        if self._reading_paused and self.state != CLOSED and peer_closed(self.transport):
            log.info("connection %s: client closed while blocked", self.peer)
            self.state = CLOSED
            self.transport.abort()

    def _pause_reading(self) -> None:
        self._reading_paused = True
        self.transport.pause_reading()


class _IgnoringChannel:
    """Swallows a stray channel.close-ok for a channel already forgotten."""

    def on_method(self, method) -> None:
        return None


_IGNORE_CHANNEL = _IgnoringChannel()


if TYPE_CHECKING:  # the broker's interface to a client connection (node/broker.py), checked by mypy
    _endpoint: type[ClientEndpoint] = Amqp091Connection
    _channel_host: type[ChannelHost] = Amqp091Connection  # channel.py
