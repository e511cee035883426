"""The HTTP API's socket: a bounded number of connections, a header timeout, a descriptor reserve.

aiohttp's request handler closes a connection that sends no complete request within its
``keepalive_timeout`` -- 3,630 s by default in aiohttp 3.14, which is how 1,000 half-open requests
were still held after 31 s in issue 31 and took the node's last descriptors.  This module wraps
aiohttp's protocol factory (``web.Server``) with a protocol that, per connection:

* refuses it at once (``503``, closed) while ``http_max_connections`` are open, or while the node has
  fewer than ``fd_reserve`` descriptors left (node/descriptors.py): those are kept for AMQP logins;
* closes it when the first request's headers (up to the empty line) have not arrived within
  ``http_header_timeout`` seconds;
* afterwards leaves it to aiohttp's idle timer, set to ``http_idle_timeout``: a keep-alive
  connection with no complete request for that long (idle, or sending the headers of a later
  request slowly) is closed.

Refusals and timeouts are counted (``ListenerStats``, exported by ops/metrics.py) and logged at most
once per 10 s per kind.  Over TLS the handshake is bounded by ``ssl_handshake_timeout`` (the same
header timeout: ops/http/server.py) before this protocol sees the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from raftmq.node.config import Config
from raftmq.node.descriptors import DescriptorReserve, ListenerStats, RefusalLog, listener_stats

log = logging.getLogger(__name__)

HEADER_ENDS = (b"\r\n\r\n", b"\n\n")


def _refusal(reason: str) -> bytes:
    body = json.dumps({"error": "service_unavailable", "reason": reason}).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n" % len(body)) + body


class HttpListener:
    """Protocol factory for ``loop.create_server``: each connection gets a :class:`_Bounded` in front
    of the protocol aiohttp's ``server`` makes.  ``what`` names the listener in log lines and
    ``cap_setting`` is the Config field bounding its open connections (ops/metrics_server.py sets both)."""

    what = "HTTP"
    cap_setting = "http_max_connections"

    def __init__(self, server: Callable[[], asyncio.Protocol], config: Config,
                 reserve: DescriptorReserve | None = None, stats: ListenerStats | None = None) -> None:
        self.server = server
        self.config = config
        self.reserve = reserve or DescriptorReserve(config.fd_reserve)
        self.stats = stats or listener_stats("http")
        self.refusals = RefusalLog(log)

    def __call__(self) -> asyncio.Protocol:
        return _Bounded(self)

    def admit(self) -> str | None:
        """Why a new connection is refused, or None (then it is counted open)."""
        if self.stats.open >= getattr(self.config, self.cap_setting):
            return "connections"
        if self.reserve.exhausted():
            return "descriptors"
        self.stats.open += 1
        self.reserve.kept()
        return None

    def refused(self, kind: str, peer: object) -> None:
        self.stats.refuse(kind)
        if kind == "connections":
            self.refusals.warning(kind, "%s connection from %s refused: %d %s connections open (%s)",
                                  self.what, peer, self.stats.open, self.what, self.cap_setting)
        else:
            self.refusals.warning(kind, "%s connection from %s refused: %s of %d file descriptors in use, "
                                  "%d kept for AMQP logins (fd_reserve)", self.what, peer, self.reserve.in_use(),
                                  self.reserve.limit, self.reserve.reserve)

    def timed_out(self, peer: object) -> None:
        self.stats.timed_out += 1
        self.refusals.warning("header-timeout", "%s connection from %s closed: no complete request headers "
                              "within %.1f s (http_header_timeout)", self.what, peer, self.config.http_header_timeout)


class _Bounded(asyncio.Protocol):
    """One HTTP connection: admitted or refused, its first headers timed, the rest forwarded."""

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes seen while waiting for the end of the first headers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        refusal = self.listener.admit()
        if refusal is not None:
            self.listener.refused(refusal, transport.get_extra_info("peername"))
            reason = ("too many HTTP connections" if refusal == "connections"
                      else "the node is short of file descriptors")
            self.transport.write(_refusal(reason))
            self.transport.close()
            return
        timeout = self.listener.config.http_header_timeout
        if timeout > 0:
            self.timer = asyncio.get_running_loop().call_later(timeout, self._header_timeout)
        self.inner = self.listener.server()
        self.inner.connection_made(transport)

    def _header_timeout(self) -> None:
        self.timer = None
        assert self.transport is not None
        self.listener.timed_out(self.transport.get_extra_info("peername"))
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.timer is not None:
            seen = self.tail + data
            if any(end in seen for end in HEADER_ENDS):
                self.timer.cancel()
                self.timer = None
                self.tail = b""
            else:
                self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.inner is not None:
            self.listener.stats.open -= 1
            inner, self.inner = self.inner, None
            inner.connection_lost(exc)
