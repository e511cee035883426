"""One AMQP 1.0 connection (spec part 2.4 and 5.3): protocol headers, SASL, open/close, idle timeout.

The front end translates; the broker core decides.  Each 1.0 link becomes a core session of its
own (``SESSION_ATTACH`` on a core channel numbered by this connection, see session.py), so that a
core refusal -- which destroys the core session it happened on -- ends that link only, as 1.0
wants, and every command a link submits is authorized by ``Access.authorize`` like the other front
ends' commands.

Handshake (5.3.1, 2.4.1): the client sends ``AMQP 3 1 0 0`` and SASL follows (PLAIN; ANONYMOUS only
when ``amqp10_anonymous_user`` is set), then ``AMQP 0 1 0 0`` and open.  A client that starts with
``AMQP 0 1 0 0`` skips SASL: allowed only when ANONYMOUS is configured, else we answer with the SASL
header and close (2.2: a peer answers an unsupported header with the one it supports).

Limits before authentication: SASL frames are at most 512 octets (the frame reader's bound, 5.3.1),
frames before open at most :data:`PRE_OPEN_FRAME_SIZE`; the connection limits of
:mod:`..admission` are counted from the protocol header and refuse the login (SASL outcome
``sys-temp``); the connection must be open within ``handshake_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raftmq import __version__
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import Amqp10Error, DecodeError, FramingError
from raftmq.protocol.amqp10.frames import (
    ALL_CHANNELS,
    AMQP_HEADER,
    SASL_HEADER,
    TYPE_SASL,
    FrameReader,
    encode_frame,
)
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import Command, Flow

from ..auth import AuthError, Principal
from ..core.access import Access, AccessRefused
from ..peer import peer_of
from ..writeflow import ReadGate, peer_closed, set_write_limits
from .attach import attach_link
from .failover import failover_server_list, redirect_info
from .limits import channel_max, refusals
from .session import Session, error
from .settling import SETTLE_BATCH, SETTLE_DELAY

if TYPE_CHECKING:
    from ..broker import Broker, ClientEndpoint
    from .links import Link

log = logging.getLogger(__name__)

SASL, AWAIT_HEADER, AWAIT_OPEN, OPEN, CLOSE_SENT, CLOSED = range(6)
SASL_CHECKING = 6  # sasl-init read, its password being hashed in the login pool: input is held
PRE_OPEN_FRAME_SIZE = 4096  # open frames carry client properties: a bound above 2.7.1's 512
MAX_FRAME_SIZE = 131072  # what we announce in open
SASL_OK, SASL_AUTH, SASL_SYS_TEMP = 0, 1, 4
CLOSE_TIMEOUT = 2.0
# 2.4.5 idle timeout: checks per threshold (twice our idle-time-out), and how early a timer may fire
IDLE_CHECKS = 8
IDLE_EARLY = 0.005
RABBITMQ_COMPAT_VERSION = "4.2.0"  # what amqp10_rabbitmq_compat announces: see _server_properties
# Open's offered-capabilities (2.7.1): what this broker really does, named as Qpid, Artemis and RabbitMQ 4
# name it.  ANONYMOUS-RELAY: a sender with a null target routes each message by its 'to' (links.py;
# Proton's request/response examples refuse a broker without it).  LINK_PAIR_V1_0: the /management node's
# paired links (management.py), as RabbitMQ 4.  Not announced until they exist: DELAYED_DELIVERY,
# SHARED-SUBS, transactions (the coordinator announces its own capabilities on attach).
OFFERED_CAPABILITIES = ("ANONYMOUS-RELAY", "LINK_PAIR_V1_0")


class Amqp10Connection(asyncio.Protocol):
    PROTOCOL = "AMQP 1-0"  # how the HTTP API lists it (RabbitMQ's name for 1.0 connections)
    def __init__(self, broker: Broker, transport: asyncio.Transport, sasl: bool = True) -> None:
        self.broker = broker
        self.counts = broker.counts_for(self.PROTOCOL)  # [published, delivered]
        self.config = broker.config
        self.transport = transport
        self.peer, self.peer_host = peer_of(transport)
        self.sasl = sasl
        self.reader = FrameReader(PRE_OPEN_FRAME_SIZE, self.config.amqp10_max_frame_elements)
        self.state = SASL if sasl else AWAIT_OPEN
        self.conn_id: str | None = None
        self.principal: Principal | None = None
        self.access: Access | None = None
        self.vhost = "/"
        self.container_id = ""
        self.remote_max_frame = 512
        self.channel_max = channel_max(self.config, None)  # amqp10_session_max - 1 (limits.py)
        self.sessions: dict[int, Session] = {}
        self._uncounted: set[int] = set()  # sessions refused by the user's max-channels (node/limits.py)
        self.discarding: set[int] = set()  # channels of sessions we ended: frames unread till the end (2.5.5)
        self.management_pending = 0  # /management replies held or in flight (management.py bounds it)
        self.links_by_core: dict[int, object] = {}  # core channel number -> link (session.py)
        self.settle_due: dict[int, object] = {}  # links with settlements to submit at the next flush
        self.settles_pending = 0  # settlements in settle_due (links.py adds; flush decides when they go)
        self.next_core_channel = 1
        self.assembling = 0  # octets of unfinished incoming deliveries, all links (links.py bounds it)
        self.pending: dict[int, object] = {}  # token -> callback(result)
        self._next_token = 0
        self._wbuf: list[bytes] = []
        self._buffer = b""  # octets before the AMQP header that follows SASL
        self._loop = asyncio.get_running_loop()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._refusal: str | None = None
        self._admitted_as: str | None = None
        self.reading = ReadGate(transport)  # why reading is paused: an alarm, the broker's backlog
        self.is_publisher = False
        self._write_paused = False
        # Deliveries the links and sessions hold with their bytes (pre-settled bodies, deliveries
        # waiting for a window): the memory alarm counts them (held_bytes).  ``_unflushed``: delivery
        # octets written since the last flush (``wrote``).
        self.delivery_bytes = 0
        self._unflushed = 0
        self._flush_at = self.config.write_buffer_high or 64 * 1024
        self._received = True  # a frame arrived since the last idle check
        self._written = False
        self._idle_threshold = 0.0  # seconds without a frame before we close (2.4.5)
        self._idle_seen = 0.0  # loop time octets were last seen, to within one idle check
        self._open_sent = False
        self._login: asyncio.Future | None = None  # a PLAIN login in the login pool
        set_write_limits(transport, self.config.write_buffer_high)

    # ------------------------------------------------------------------ asyncio.Protocol

    def start(self, leftover: bytes, handshake_deadline: float | None = None) -> None:
        self._admitted_as = self.peer_host or "?"
        self._refusal = self.broker.admission.admit(self._admitted_as)
        if handshake_deadline is not None:
            self._timers["handshake"] = self._loop.call_at(handshake_deadline, self._handshake_expired)
        self.conn_id = self.broker.register(self)
        if self.sasl:
            self.send_raw(SASL_HEADER)
            mechanisms = ["PLAIN"] + (["ANONYMOUS"] if self.config.amqp10_anonymous_user else [])
            self._send_sasl(p.SaslMechanisms(sasl_server_mechanisms=[t.Symbol(m) for m in mechanisms]))
        elif not self.config.amqp10_anonymous_user:
            log.info("1.0 connection %s: no SASL and ANONYMOUS is not enabled; refusing", self.peer)
            self.send_raw(SASL_HEADER)
            self._abort()
            return
        else:
            if not self._login_anonymous():
                return
            self.send_raw(AMQP_HEADER)
        self.flush()
        if leftover:
            self.data_received(leftover)

    def data_received(self, data: bytes) -> None:
        if self.state == CLOSED:
            return
        if self.state == SASL_CHECKING:  # the header the client may pipeline (5.3.2) waits for the outcome
            self._buffer += data
            if len(self._buffer) > PRE_OPEN_FRAME_SIZE + 8:  # more than a header and an open
                log.info("1.0 connection %s: %d octets sent before the SASL outcome", self.peer, len(self._buffer))
                self._abort()
            return
        try:
            if self.state == SASL:
                data = self._sasl_frames(data)
                if data is None:
                    return self.flush()
            if self.state == AWAIT_HEADER:
                self._buffer += data
                if len(self._buffer) < 8:
                    return self.flush()
                header, data = self._buffer[:8], self._buffer[8:]
                self._buffer = b""
                if header != AMQP_HEADER:
                    log.info("1.0 connection %s: header %r after SASL", self.peer, header)
                    self.send_raw(AMQP_HEADER)
                    self._abort()
                    return
                self.send_raw(AMQP_HEADER)
                self.state = AWAIT_OPEN
            self._received = True
            # 2.5.5 / 2.4.6 DISCARDING: frames of a session we ended, and after our close all but a
            # close, are dropped unread (frames.py looks at their descriptor only)
            discard = ALL_CHANNELS if self.state == CLOSE_SENT else self.discarding
            for frame in self.reader.frames(data, discard):
                if self.state == CLOSED:
                    break
                self._on_frame(frame)
        except Amqp10Error as exc:
            if isinstance(exc, (DecodeError, FramingError)):  # counted (ops/metrics.py); close logs it
                refusals(self.broker).count("undecodable frame")
            self.close(exc.condition, exc.text)
        except Exception:
            log.exception("1.0 connection %s: internal error", self.peer)
            self.close("amqp:internal-error", "internal error")
        self.flush()
        self.broker.maybe_check_alarms()
        if self.broker.alarm and self.is_publisher and not self.reading.alarm and self.state == OPEN:
            self.set_blocked(self.broker.alarm)
        if self.broker.flow_throttled and not self.reading.flow and self.state == OPEN:
            self.reading.pause_for_flow()
            self.broker.pause_for_flow(self)

    def connection_lost(self, exc: Exception | None) -> None:
        # Settlements read before the socket went are final (2.6.12): submitted ahead of the close,
        # not dropped with the batching timer (they would return to the queue and be delivered again).
        if self.settle_due and self.conn_id is not None:
            self.flush_settles()
        self.state = CLOSED
        if self._login is not None:
            self._login.cancel()
            self._login = None
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._admitted_as is not None:
            self.broker.admission.release(self._admitted_as)
            self._admitted_as = None
        if self.conn_id is not None:
            self.broker.unregister(self.conn_id)  # CONNECTION_CLOSE: every core session of ours goes
        self.sessions.clear()
        self.links_by_core.clear()
        self.pending.clear()

    def pause_writing(self) -> None:
        """The client reads slower than we deliver: links hold what the core assigns by reference
        (session.blocked) and the core stops assigning to them."""
        self._write_paused = True
        for number, link in self.links_by_core.items():
            if getattr(link, "sends", False):
                self.broker.submit(Flow(self.conn_id, None, number, False))

    def resume_writing(self) -> None:
        """Drained: what the links held goes out first (stopping again if the buffer refills), then
        the core assigns again."""
        self._write_paused = False
        if self.state == OPEN:
            for session in list(self.sessions.values()):
                if not self._write_paused:
                    session.resume_sending()
            self.flush()
            if self._write_paused:
                return  # paused again while writing what was held: the core stays stopped
            for number, link in self.links_by_core.items():
                if getattr(link, "sends", False) and not getattr(link, "window_stop", False):
                    self.broker.submit(Flow(self.conn_id, None, number, True))

    def resume_flow(self) -> None:
        if self.state != CLOSED:
            self.reading.resume_flow()

    def held_bytes(self) -> int:
        return (self.transport.get_write_buffer_size() + self.reader.buffered + self.assembling
                + self.delivery_bytes)

    # ------------------------------------------------------------------ writing

    def send(self, channel: int, performative, payload: bytes = b"") -> None:
        self._wbuf.append(encode_frame(performative, channel, payload))

    def send_raw(self, data: bytes) -> None:
        self._wbuf.append(data)

    def _send_sasl(self, body) -> None:
        self._wbuf.append(encode_frame(body, 0, frame_type=TYPE_SASL))

    def attach_link(self, session: Session, attach) -> Link | None:
        """The link for a client's attach on one of our sessions (attach.py chooses its kind; the
        session asks here so that session.py imports no link module)."""
        return attach_link(session, attach)

    def flush_settles(self) -> None:
        """Submit the settlements read so far: one MESSAGE_SETTLE per link and outcome."""
        timer = self._timers.pop("settle", None)
        if timer is not None:
            timer.cancel()
        due, self.settle_due = self.settle_due, {}
        self.settles_pending = 0
        for link in due.values():
            link.flush_settles()

    def wrote(self, size: int) -> None:
        """Delivery octets were queued: flush once a high-water mark's worth waits, so that the
        transport can pause us in the middle of a large batch (node/writeflow.py)."""
        self._unflushed += size
        if self._unflushed >= self._flush_at:
            self.flush()

    def flush(self) -> None:
        self._unflushed = 0
        if self.settle_due:
            if self.settles_pending >= SETTLE_BATCH or self.state != OPEN:
                self.flush_settles()
            elif "settle" not in self._timers:
                self._timers["settle"] = self._loop.call_later(SETTLE_DELAY, self.flush_settles)
        for session in self.sessions.values():
            session.flush_dispositions()
        if self._wbuf and self.state != CLOSED:
            data = b"".join(self._wbuf)
            self._wbuf.clear()
            self._written = True
            self.transport.write(data)
        else:
            self._wbuf.clear()

    # ------------------------------------------------------------------ the broker's endpoint interface

    def request(self, command: Command, callback) -> None:
        """Submit ``command`` and call ``callback(result)`` with the core's answer."""
        self._next_token += 1
        command = command._replace(token=self._next_token)
        self.pending[self._next_token] = callback
        self.broker.submit(command)

    def on_reply(self, token: int | None, result: tuple, channel_no: int | None) -> None:
        callback = self.pending.pop(token, None) if token is not None else None
        if callback is not None and self.state == OPEN:
            callback(result)

    def on_transfer(self, channel_no: int, destination: str, transfer: tuple) -> None:
        link = self.links_by_core.get(channel_no)
        if link is not None and self.state == OPEN:
            self.counts[1] += 1
            link.on_core_transfer(transfer)

    def on_session_detached(self, channel_no: int, name: bytes) -> None:
        link = self.links_by_core.get(channel_no)
        if link is not None:
            link.session.detach_link(link, error("amqp:link:stolen", "link taken over"))

    def on_deliver(self, channel_no: int, consumer_tag: str, delivery: tuple) -> None:
        pass  # 0-9-1 deliveries never target a 1.0 connection

    def on_cancel(self, channel_no: int, consumer_tag: str) -> None:
        link = self.links_by_core.get(channel_no)
        if link is not None:
            link.session.detach_link(link, error("amqp:resource-deleted", "the queue was deleted"))

    def on_forced_close(self, reply_code: int, reply_text: str) -> None:
        self.close("amqp:connection:forced", reply_text)

    def close_connection(self, code: int, text: str) -> None:  # the broker's shutdown path
        self.close("amqp:connection:forced", text)

    def set_blocked(self, reason: str | None) -> None:
        """A resource alarm stops reading publishers only (their receivers' settlements free memory)."""
        self.reading.set_alarm(bool(reason) and self.is_publisher)

    def drop_if_peer_gone(self) -> None:
        if self.reading.paused and self.state != CLOSED and peer_closed(self.transport):
            self.state = CLOSED
            self.transport.abort()

    def core_channel(self, link) -> int:
        number = self.next_core_channel
        self.next_core_channel += 1
        self.links_by_core[number] = link
        return number

    # ------------------------------------------------------------------ frames

    def _on_frame(self, frame) -> None:
        body = frame.performative
        if self.state == SASL:
            if frame.type != TYPE_SASL or not isinstance(body, p.SaslInit):
                self.close("amqp:not-allowed", "expected sasl-init")
                return
            self._sasl_init(body)
            return
        if frame.type == TYPE_SASL:
            raise _framing("a SASL frame after SASL")
        if body is None:
            return  # an empty frame: keeps the idle timeout alive (2.4.5)
        if self.state == AWAIT_OPEN:
            if not isinstance(body, p.Open):
                self.close("amqp:not-allowed", f"{body.NAME} before open")
                return
            self._open(body)
            return
        if self.state == CLOSE_SENT:
            if isinstance(body, p.Close):
                self._abort()
            return
        if isinstance(body, p.Close):
            self.send(0, p.Close())
            self.flush()
            self._abort()
            return
        if isinstance(body, p.Open):
            raise _framing("a second open")
        channel = frame.channel
        if channel > self.channel_max:
            raise _framing(f"channel {channel} is beyond channel-max {self.channel_max}")
        if isinstance(body, p.Begin):
            if channel in self.sessions:
                raise _framing(f"begin on channel {channel}, which has a session")
            refusal = self.broker.usage.channel_opened(self.conn_id)  # the user's max-channels
            session = self.sessions[channel] = Session(self, channel, body)
            session.begin()
            if refusal:  # begun and ended with the error at once: the connection's other sessions go on
                self._uncounted.add(channel)
                session.end("amqp:resource-limit-exceeded", refusal)
            return
        session = self.sessions.get(channel)
        if session is None:
            raise _framing(f"{body.NAME} on channel {channel} without a session")
        if isinstance(body, p.End):
            session.on_end(body)
            del self.sessions[channel]
            if channel in self._uncounted:
                self._uncounted.discard(channel)
            else:
                self.broker.usage.channel_closed(self.conn_id)
            self.discarding.discard(channel)
            return
        session.on_frame(body, frame.payload)

    def _sasl_frames(self, data: bytes) -> bytes | None:
        """Feed the reader whole SASL frames only, so that the AMQP header the client may pipeline
        after its sasl-init is not read as a frame; the octets after SASL, or None (more needed)."""
        self._buffer += data
        while self.state == SASL:
            if len(self._buffer) < 4:
                return None
            size = int.from_bytes(self._buffer[:4], "big")
            if size < 8 or size > 512:  # 5.3.1: SASL frames are at most 512 octets
                log.info("1.0 connection %s: SASL frame of %d octets", self.peer, size)
                self._abort()
                return None
            if len(self._buffer) < size:
                return None
            frame, self._buffer = self._buffer[:size], self._buffer[size:]
            for decoded in self.reader.feed(frame):
                self._on_frame(decoded)
        if self.state == SASL_CHECKING:
            return None  # the rest stays in the buffer until the login is decided
        rest, self._buffer = self._buffer, b""
        return rest if self.state != CLOSED else None

    def _sasl_init(self, init) -> None:
        mechanism = str(init.mechanism)
        if mechanism == "PLAIN":  # the password is hashed in the login pool (node/logins.py)
            self.state = SASL_CHECKING
            login = asyncio.ensure_future(self.broker.auth.login("PLAIN", bytes(init.initial_response or b""),
                                                                 self.peer_host))
            self._login = login
            login.add_done_callback(self._sasl_checked)
            return
        try:
            if mechanism == "ANONYMOUS" and self.config.amqp10_anonymous_user:
                self.principal = self.broker.auth.principal_named(self.config.amqp10_anonymous_user, self.peer_host)
            else:
                refused = AuthError(f"unsupported mechanism {mechanism}")
                self.broker.auth.note_refused(None, self.peer_host, refused, str(mechanism))  # counted, logged, audited there
                raise refused
        except AuthError as exc:
            self._sasl_outcome(exc)
            return
        self._sasl_outcome(None)

    def _sasl_checked(self, login: asyncio.Future) -> None:
        """The login pool's answer to a PLAIN sasl-init; then the input held meanwhile."""
        self._login = None
        if self.state != SASL_CHECKING or login.cancelled():
            return
        exc = login.exception()
        if exc is not None and not isinstance(exc, AuthError):
            log.error("1.0 connection %s: login failed: %r", self.peer, exc)
            exc = AuthError("internal error")
        if exc is None:
            self.principal = login.result()
        self.state = SASL
        self._sasl_outcome(exc)
        held, self._buffer = self._buffer, b""
        if held and self.state == AWAIT_HEADER:
            self.data_received(held)
        else:
            self.flush()

    def _sasl_outcome(self, exc: AuthError | None) -> None:
        if exc is not None:
            log.debug("1.0 connection %s: authentication failed: %s", self.peer, exc)  # node/auth.py logs it
            self._send_sasl(p.SaslOutcome(code=SASL_AUTH))
            self.flush()
            self._abort()
            return
        if self._refusal:
            log.info("1.0 connection %s: refused: %s", self.peer, self._refusal)
            self._send_sasl(p.SaslOutcome(code=SASL_SYS_TEMP, additional_data=self._refusal.encode()))
            self.flush()
            self._abort()
            return
        self._send_sasl(p.SaslOutcome(code=SASL_OK))
        self.state = AWAIT_HEADER

    def _login_anonymous(self) -> bool:
        try:
            self.principal = self.broker.auth.principal_named(self.config.amqp10_anonymous_user, self.peer_host)
        except AuthError as exc:
            log.debug("1.0 connection %s: anonymous login refused: %s", self.peer, exc)  # node/auth.py logs it
            self.send_raw(SASL_HEADER)
            self._abort()
            return False
        return True

    def _open(self, m) -> None:
        self.container_id = str(m.container_id)  # with a link's name, what identifies a durable link (2.6.1)
        hostname = m.hostname or ""
        vhost = hostname[len("vhost:"):] if hostname.startswith("vhost:") else "/"
        self.remote_max_frame = max(512, min(m.max_frame_size or 0xFFFFFFFF, 0xFFFFFFFF))
        self.channel_max = min(self.channel_max, m.channel_max if m.channel_max is not None else 0xFFFF)
        our_idle = int(self.config.heartbeat * 1000)
        if self.config.amqp10_rabbitmq_compat and self._refused_as_rabbitmq(vhost):
            return
        self._open_sent = True
        self.send(0, p.Open(container_id=f"raftmq-{self.config.node_id}", hostname=None,
                            max_frame_size=MAX_FRAME_SIZE, channel_max=self.channel_max,
                            idle_time_out=our_idle or None,
                            offered_capabilities=[t.Symbol(c) for c in OFFERED_CAPABILITIES],
                            properties=self._server_properties()))
        if self._refusal:
            self.close("amqp:resource-limit-exceeded", self._refusal)
            return
        if not Q.has_vhost(self.broker.machine, vhost) or not self.broker.accepting:
            if not self.broker.accepting:
                self.close("amqp:connection:forced", f"this node has no cluster leader; try {self.broker.known_hosts}")
            else:
                self.close("amqp:not-found", f"virtual host '{vhost}' not found")
            return
        try:
            self.access = Access.open(self.principal, vhost)
        except AccessRefused as exc:
            self.broker.audit.vhost_refused(self.conn_id, "AMQP 1.0", self.principal.name, self.peer, vhost)
            self.close("amqp:unauthorized-access", exc.text)
            return
        refusal = self.broker.usage.open(self.conn_id, self.principal.name, vhost)  # node/limits.py
        if refusal:  # as rabbit_amqp_reader check_vhost/user_connection_limit
            self.close("amqp:resource-limit-exceeded", refusal)
            return
        leader = self.broker.leader_client_address()
        if self.config.amqp10_redirect_to_leader and leader and leader != self.broker.client_address():
            self.close("amqp:connection:redirect", f"the leader is {leader}", redirect_info(leader))
            return
        self.vhost = vhost
        self.state = OPEN
        self.broker.audit.opened(self.conn_id, "AMQP 1.0", self.access, self.peer, self.container_id)
        self.reader.max_frame_size = MAX_FRAME_SIZE
        handshake = self._timers.pop("handshake", None)
        if handshake is not None:
            handshake.cancel()
        if m.idle_time_out:  # 2.4.5: send something at least every half of the peer's timeout
            self._schedule("keepalive", max(0.05, m.idle_time_out / 2000), self._keepalive)
        if our_idle:  # 2.4.5: we announce half our threshold, so the threshold is twice ours
            self._idle_threshold = our_idle / 1000 * 2
            self._idle_seen = self._loop.time()
            self._schedule("idle", self._idle_threshold / IDLE_CHECKS, self._idle_check)

    def _refused_as_rabbitmq(self, vhost: str) -> bool:
        """A virtual host that does not exist or that the user may not use, refused as RabbitMQ 4 does:
        the socket is closed with no open and no close (rabbit_amqp_reader checks the vhost before its
        open; a handshake error closes the socket).  RabbitMQ 4's clients count on it: an open then a
        close looks like a lost connection to rabbitmq-amqp-python-client, which reconnects again and
        again instead of raising from dial().  Without ``amqp10_rabbitmq_compat`` the refusal is the
        spec's open then close with the error (2.4.4), below."""
        if not self.broker.accepting or self._refusal:
            return False  # answered with a close: no leader, or a connection limit
        if Q.has_vhost(self.broker.machine, vhost):
            try:
                Access.open(self.principal, vhost)
                return False
            except AccessRefused as exc:
                text = exc.text
                self.broker.audit.vhost_refused(self.conn_id, "AMQP 1.0", self.principal.name, self.peer, vhost)
        else:
            text = f"virtual host '{vhost}' not found"
        log.info("1.0 connection %s: refused before open (as RabbitMQ 4): %s", self.peer, text)
        self._abort()
        return True

    def _server_properties(self) -> dict:
        """Open's properties. RabbitMQ 4's client libraries refuse a server whose ``product`` is not
        ``RabbitMQ`` at version 4 or later: ``amqp10_rabbitmq_compat`` says so (raftmq's own version
        stays in ``raftmq-version``), so that they run unchanged."""
        props = {"product": "raftmq", "version": __version__, "platform": "Python",
                 "known-hosts": self.broker.known_hosts,
                 "failover-server-list": failover_server_list(self.broker.known_hosts)}
        if self.config.amqp10_rabbitmq_compat:
            props.update({"product": "RabbitMQ", "version": RABBITMQ_COMPAT_VERSION, "raftmq-version": __version__})
        return props

    # ------------------------------------------------------------------ idle timeout (2.4.5)

    def _schedule(self, name: str, delay: float, callback) -> None:
        self._timers[name] = self._loop.call_later(delay, callback, delay)

    def _keepalive(self, delay: float) -> None:
        if self.state != OPEN:
            return
        if not self._written:
            self.transport.write(encode_frame(None, 0))
        self._written = False
        self._schedule("keepalive", delay, self._keepalive)

    def _idle_check(self, delay: float) -> None:
        """Every threshold / IDLE_CHECKS: note when octets were last seen (to within one period; the
        read path only sets a flag) and close once nothing came for the threshold -- between 2 and
        2 + 2 / IDLE_CHECKS times our idle-time-out after the last frame.  (Checking once per
        threshold closed between 2 and 4 times it.)"""
        if self.state != OPEN:
            return
        now = self._loop.time()
        if self._received:
            self._received = False
            self._idle_seen = now
        elif now - self._idle_seen >= self._idle_threshold - IDLE_EARLY:
            self.close("amqp:resource-limit-exceeded", "local-idle-timeout expired")
            self.flush()
            return
        self._schedule("idle", delay, self._idle_check)

    # ------------------------------------------------------------------ closing

    def close(self, condition: str, description: str, info: dict | None = None) -> None:
        """Close with an error (2.4.3): our close, then wait briefly for the peer's."""
        if self.state in (CLOSE_SENT, CLOSED):
            return
        log.info("1.0 connection %s: closing with %s %s", self.peer, condition, description)
        if self.state in (SASL, AWAIT_HEADER):
            self._abort()
            return
        if self.state == AWAIT_OPEN and not self._open_sent:  # 2.4.4: an open must precede the close
            self.send(0, p.Open(container_id=f"raftmq-{self.config.node_id}"))
        self.state = CLOSE_SENT
        err = error(condition, description)
        err.info = info
        self.send(0, p.Close(error=err))
        self.flush()
        self._timers["close"] = self._loop.call_later(CLOSE_TIMEOUT, self._abort)

    def _handshake_expired(self) -> None:
        self._timers.pop("handshake", None)
        if self.state in (OPEN, CLOSE_SENT, CLOSED):
            return
        log.info("1.0 connection %s: handshake not finished within handshake_timeout", self.peer)
        if self.state == AWAIT_OPEN:
            self.close("amqp:resource-limit-exceeded", "handshake not finished in time")
        self._abort()

    def _abort(self) -> None:
        if self.state == CLOSED:
            return
        self.flush()
        self.state = CLOSED
        self.transport.close()


def _framing(text: str) -> Amqp10Error:
    exc = Amqp10Error(text)
    exc.condition = "amqp:connection:framing-error"
    return exc


if TYPE_CHECKING:  # the broker's interface to a client connection (node/broker.py), checked by mypy
    _endpoint: type[ClientEndpoint] = Amqp10Connection
