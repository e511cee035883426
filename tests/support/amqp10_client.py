"""A small blocking AMQP 1.0 client that follows ``amqp:connection:redirect`` (tests only).

Why our own: neither real client we can install follows a redirect.  python-qpid-proton 0.40's Python
package mentions redirect only in a docstring (proton/_condition.py) and its reactor reconnects to
the URLs it was given; rhea 3's lib/ has no redirect handling at all (a close with that condition is
an error event).  Qpid JMS does follow it, but no Java client is installable here.

What it does (spec /work/shared/specs/amqp-1-0.txt): SASL PLAIN (5.3), open (2.7.1), and when the
server closes the connection with ``amqp:connection:redirect`` (2.8.16: "The peer SHOULD attempt
reconnection to the container using the details provided in the info map": ``hostname``,
``network-host``, ``port``), it connects to ``network-host``:``port``, sending ``hostname`` in its
open, at most ``max_redirects`` times.  Then one session with a sender or receiver link at a time,
unsettled transfers (2.6.12) and accepted dispositions.  Every read is bounded by ``timeout``.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, FrameReader, encode_frame

REDIRECT = "amqp:connection:redirect"


class Redirected(Exception):
    def __init__(self, info: dict) -> None:
        super().__init__(f"redirected to {info}")
        self.info = info


class ClosedByPeer(Exception):
    pass


@dataclass
class RedirectingClient:
    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    timeout: float = 10.0
    max_redirects: int = 3
    redirects: list[tuple[str, int]] = field(default_factory=list)  # where each redirect sent us
    opened: p.Open | None = None

    def __post_init__(self) -> None:
        self._sock: socket.socket | None = None
        self._reader = FrameReader(1 << 20)
        self._pending: list = []
        self._next_handle = 0
        self._delivery_id = 0
        self._hostname: str | None = None

    # ------------------------------------------------------------------ connection
    def connect(self) -> RedirectingClient:
        """Open a connection with a session, following redirects."""
        while True:
            self._open_socket()
            try:
                self._login()
                self._send(p.Begin(next_outgoing_id=0, incoming_window=10_000, outgoing_window=10_000))
                self._expect(p.Begin)
                return self
            except Redirected as exc:
                self.close()
                if len(self.redirects) >= self.max_redirects:
                    raise
                info = exc.info
                self.host, self.port = str(info["network-host"]), int(info["port"])
                self._hostname = str(info.get("hostname") or self.host)
                self.redirects.append((self.host, self.port))

    def _open_socket(self) -> None:
        self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        self._reader = FrameReader(1 << 20)
        self._pending = []
        self._buf = b""

    def _login(self) -> None:
        self._sock.sendall(SASL_HEADER)
        assert self._header() == SASL_HEADER
        self._expect(p.SaslMechanisms)
        response = b"\0" + self.user.encode() + b"\0" + self.password.encode()
        self._sock.sendall(encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"), initial_response=response), 0,
                                        frame_type=TYPE_SASL))
        outcome = self._expect(p.SaslOutcome)
        if outcome.code != 0:
            raise ClosedByPeer(f"SASL outcome {outcome.code}")
        self._sock.sendall(AMQP_HEADER)
        assert self._header() == AMQP_HEADER
        self._send(p.Open(container_id="redirecting-client", hostname=self._hostname))
        self.opened = self._expect(p.Open)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._send(p.Close())
            except OSError:
                pass
            self._sock.close()
            self._sock = None

    # ------------------------------------------------------------------ links
    def send(self, address: str, bodies: list[bytes]) -> list:
        """Attach a sender to ``address``, send each body unsettled, return each delivery's outcome."""
        handle = self._attach(address, sender=True)
        flow = self._expect(p.Flow)
        assert flow.link_credit >= len(bodies), flow
        first = self._delivery_id
        for i, body in enumerate(bodies):
            transfer = p.Transfer(handle=handle, delivery_id=self._delivery_id, delivery_tag=i.to_bytes(4, "big"),
                                  message_format=0, settled=False)
            self._send(transfer, p.encode_sections([p.Header(durable=True), p.Data(body)]))
            self._delivery_id += 1
        outcomes: dict[int, object] = {}
        while len(outcomes) < len(bodies):
            frame = self._frame()
            d = frame.performative
            if isinstance(d, p.Disposition) and d.role:  # from the receiving end: the server
                for delivery_id in range(d.first, (d.last if d.last is not None else d.first) + 1):
                    outcomes[delivery_id] = d.state
        self._detach(handle)
        return [outcomes[first + i] for i in range(len(bodies))]

    def receive(self, address: str, count: int) -> list[bytes]:
        """Attach a receiver to ``address`` with credit ``count``, accept and return ``count`` bodies."""
        handle = self._attach(address, sender=False)
        self._send(p.Flow(next_incoming_id=0, incoming_window=10_000, next_outgoing_id=self._delivery_id,
                          outgoing_window=10_000, handle=handle, delivery_count=0, link_credit=count))
        bodies = []
        while len(bodies) < count:
            frame = self._frame()
            if isinstance(frame.performative, p.Transfer):
                data = [s for s in p.decode_sections(frame.payload) if isinstance(s, p.Data)]
                bodies.append(bytes(data[0].value))
                self._send(p.Disposition(role=True, first=frame.performative.delivery_id, settled=True,
                                         state=p.Accepted()))
        self._detach(handle)
        return bodies

    def _attach(self, address: str, sender: bool) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._send(p.Attach(name=f"link-{handle}", handle=handle, role=not sender, snd_settle_mode=0,
                            rcv_settle_mode=0, source=p.Source(address=None if sender else address),
                            target=p.Target(address=address if sender else None),
                            initial_delivery_count=0 if sender else None))
        attach = self._expect(p.Attach)
        assert (attach.target if sender else attach.source) is not None, "the attach was refused"
        return handle

    def _detach(self, handle: int) -> None:
        self._send(p.Detach(handle=handle, closed=True))
        self._expect(p.Detach)

    # ------------------------------------------------------------------ frames
    def _send(self, performative, payload: bytes = b"") -> None:
        self._sock.sendall(encode_frame(performative, 0, payload))

    def _header(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        while len(self._buf) < 8:
            self._sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self._sock.recv(4096)
            if not chunk:
                raise ClosedByPeer("closed before a protocol header")
            self._buf += chunk
        head, self._buf = self._buf[:8], self._buf[8:]
        return head

    def _frame(self):
        deadline = time.monotonic() + self.timeout
        while True:
            while not self._pending:
                if self._buf:
                    self._pending.extend(self._reader.feed(self._buf))
                    self._buf = b""
                    continue
                if time.monotonic() >= deadline:
                    raise TimeoutError("no frame from the server")
                self._sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise ClosedByPeer("connection closed")
                self._pending.extend(self._reader.feed(chunk))
            frame = self._pending.pop(0)
            if frame.performative is None:
                continue  # an empty frame (heartbeat)
            if isinstance(frame.performative, p.Close):
                error = frame.performative.error
                if error is not None and error.condition == REDIRECT:
                    raise Redirected(dict(error.info or {}))
                raise ClosedByPeer(f"closed by the server: {error}")
            return frame

    def _expect(self, cls):
        frame = self._frame()
        assert isinstance(frame.performative, cls), frame.performative
        return frame.performative
