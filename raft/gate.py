"""The Raft port's gate: sockets that have not proved the cluster secret are few and short-lived.

pysyncobj accepts every connection on the Raft port and keeps it until it says something; its
``connectionTimeout`` is checked only when the socket has an event, so a socket that sends nothing
(or half a frame) is kept for ever (issue 31: 300 idle sockets still open after 15 s, each a file
descriptor the node's AMQP listeners then lack).

A socket *authenticates* with its first frame: pysyncobj's handshake sends a fresh random key
sealed under the cluster key (raft/wire.py), and a frame that fails AES-GCM closes the
connection.  Without a secret, a socket authenticates by naming a member (it then leaves
pysyncobj's unknown connections).  This gate, run on pysyncobj's tick thread:

* closes an accepted socket not authenticated ``handshake_timeout`` seconds after it was accepted;
* keeps at most ``max_unauthenticated`` of them: a new one beyond that closes the *oldest*.  An
  attacker then has to open sockets faster than a member completes its handshake (one round trip)
  to keep a member out, instead of merely holding ``max`` sockets for the timeout;
* closes any connection -- a member's too -- that has stopped in the middle of a frame: part of a
  frame buffered, no byte for ``stall_timeout`` seconds, and none waiting in the kernel (a node
  busy applying entries has not read its socket, so the kernel is asked with ``MSG_PEEK`` before
  the connection is called stalled).  A member that is slow but moving (catching up over a slow
  link) is never cut; a cut member reconnects as after any network error.

Counters (``timed_out``, ``evicted``, ``stalled``) feed the node's metrics; closes are logged at
most once per 10 s each (raftmq/ratelog.py).

:class:`GatedServer` replaces pysyncobj's listening socket (:func:`install`): pysyncobj accepts one
connection per poll and listens with a backlog of 5, so a flood of connects filled the backlog and
a member's connect waited for SYN retransmissions (seen: 40 connects took seconds); and on any
accept error but EAGAIN -- EMFILE when the process is out of descriptors -- it *unbinds* the
server for good (the transport still thinks it is bound and never binds again).  Here: a backlog
of ``BACKLOG``, up to ``ACCEPT_BATCH`` accepts per poll, and an accept error is logged
(rate-limited) and waited out, never an unbind.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any

from pysyncobj import tcp_server as _tcp_server
from pysyncobj import transport as _transport
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE

from raftmq.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

SWEEP_EVERY = 0.25  # seconds between two sweeps of the sockets (the tick runs every ~20 ms)
BACKLOG = 128
ACCEPT_BATCH = 64


class GatedServer(_tcp_server.TcpServer):
    """pysyncobj's ``TcpServer`` with a real backlog and batched, error-tolerant accepts."""

    _accept_errors = RateLimitedLog(log)

    def bind(self) -> None:
        super().bind()
        self._TcpServer__socket.listen(BACKLOG)  # listen again: Linux takes the new backlog

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:  # noqa: N802 (pysyncobj's name)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()
            return
        if not event & POLL_EVENT_TYPE.READ:
            return
        listener = self._TcpServer__socket
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _address = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ECONNABORTED...: try again at the next poll
                name = errno.errorcode.get(exc.errno, exc) if exc.errno is not None else exc
                self._accept_errors.warning("raft port: accept failed: %s", name)
                return
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpServer__sendBufferSize)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpServer__recvBufferSize)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(False)
            except OSError:  # the peer is already gone
                sock.close()
                continue
            conn = _transport.TcpConnection(poller=self._TcpServer__poller, socket=sock,
                                            timeout=self._TcpServer__connectionTimeout,
                                            sendBufferSize=self._TcpServer__sendBufferSize,
                                            recvBufferSize=self._TcpServer__recvBufferSize,
                                            keepalive=self._TcpServer__keepalive)
            self._TcpServer__onNewConnectionCallback(conn)


def install() -> None:
    """Make pysyncobj's transport listen with :class:`GatedServer` (idempotent, process-wide)."""
    _transport.TcpServer = GatedServer


class PeerGate:
    """Installed on a pysyncobj ``TCPTransport``; :meth:`tick` must be an on-tick callback."""

    def __init__(self, transport: Any, *, handshake_timeout: float = 5.0, max_unauthenticated: int = 64,
                 stall_timeout: float = 30.0) -> None:
        self.transport = transport
        self.handshake_timeout = handshake_timeout
        self.max_unauthenticated = max(1, max_unauthenticated)
        self.stall_timeout = stall_timeout
        self.timed_out = 0  # closed: not authenticated within handshake_timeout
        self.evicted = 0  # closed: the oldest unauthenticated socket, for a newer one beyond the cap
        self.stalled = 0  # closed: stopped mid-frame for stall_timeout
        self._accepted: dict[Any, float] = {}  # unauthenticated sockets -> accepted at; oldest first
        self._next_sweep = 0.0
        self._log_timeout = RateLimitedLog(log)
        self._log_evict = RateLimitedLog(log)
        self._log_stall = RateLimitedLog(log)
        accept = transport._onNewIncomingConnection

        def on_new_incoming(conn: Any) -> None:
            accept(conn)
            self._admit(conn)

        # pysyncobj's TcpServer keeps the bound method it was given: hook the server's callback.
        transport._onNewIncomingConnection = on_new_incoming
        server = transport._server
        if server is not None:
            server._TcpServer__onNewConnectionCallback = on_new_incoming

    @property
    def unauthenticated(self) -> int:
        """Sockets accepted and not yet authenticated (an upper bound until the next sweep)."""
        return len(self._accepted)

    def _authenticated(self, conn: Any) -> bool:
        if conn.sendRandKey is not None:  # its first frame opened under the cluster key
            return True
        return conn.encryptor is None and conn not in self.transport._unknownConnections

    def _admit(self, conn: Any) -> None:
        self._accepted[conn] = time.monotonic()
        if len(self._accepted) <= self.max_unauthenticated:
            return
        self._forget_settled()
        while len(self._accepted) > self.max_unauthenticated:
            oldest = next(iter(self._accepted))
            del self._accepted[oldest]
            self.evicted += 1
            self._log_evict.warning("raft port: more than %d unauthenticated sockets; closed the oldest "
                                    "(raft_max_unauthenticated)", self.max_unauthenticated)
            oldest.disconnect()

    def _forget_settled(self) -> None:
        """Drop the sockets that closed or authenticated since they were accepted."""
        for conn in [c for c in self._accepted if c.state == CONNECTION_STATE.DISCONNECTED or self._authenticated(c)]:
            del self._accepted[conn]

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY
        self._forget_settled()
        deadline = now - self.handshake_timeout
        for conn, accepted_at in list(self._accepted.items()):
            if accepted_at > deadline:
                break  # oldest first: the rest are younger
            del self._accepted[conn]
            self.timed_out += 1
            self._log_timeout.warning("raft port: closed a socket that did not authenticate within %.1f s "
                                      "(raft_handshake_timeout)", self.handshake_timeout)
            conn.disconnect()
        if self.stall_timeout > 0:
            self._close_stalled(now)

    def _close_stalled(self, now: float) -> None:
        transport = self.transport
        for conn in [*transport._connections.values(), *transport._unknownConnections]:
            if conn.state != CONNECTION_STATE.CONNECTED or not conn._TcpConnection__readBuffer:
                continue
            if now - getattr(conn, "last_byte_at", now) < self.stall_timeout or _bytes_waiting(conn):
                continue
            self.stalled += 1
            self._log_stall.warning("raft port: closed a connection stopped in the middle of a frame for %.0f s "
                                    "(raft_frame_stall_timeout)", self.stall_timeout)
            conn.disconnect()


def _bytes_waiting(conn: Any) -> bool:
    """Whether the kernel holds bytes for ``conn`` that its owner has not read yet."""
    sock = conn._TcpConnection__socket
    if sock is None:
        return False
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))  # b"": the peer closed
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True  # an error: pysyncobj's next read closes it
