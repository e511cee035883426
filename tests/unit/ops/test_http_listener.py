"""ops/http/listener.py on a real aiohttp server and real loopback sockets (issue 31 item 4).

Checks: connections beyond ``http_max_connections`` get 503 and are closed, and counted; a connection
that has not sent its first request's headers within ``http_header_timeout`` is closed and counted;
one that sent them in pieces in time gets its answer; the descriptor reserve refuses while exhausted.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from raftmq.node.config import Config
from raftmq.node.descriptors import DescriptorReserve, ListenerStats
from raftmq.ops.http.listener import HttpListener


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def _serve(config: Config, reserve: DescriptorReserve | None = None):
    server = web.Server(_hello)
    stats = ListenerStats("test")
    listener = HttpListener(server, config, reserve or DescriptorReserve(0), stats)
    tcp = await asyncio.get_running_loop().create_server(listener, "127.0.0.1", 0)
    return tcp, tcp.sockets[0].getsockname()[1], stats


async def _closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sent before closing the socket (raises TimeoutError if it stays open)."""
    data = b""
    async with asyncio.timeout(within):
        while chunk := await reader.read(4096):
            data += chunk
    return data


def test_connections_beyond_the_cap_get_503_and_are_counted():
    async def main():
        tcp, port, stats = await _serve(Config(http_max_connections=3, http_header_timeout=30))
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = await _closed(reader, 2)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert stats.open == 3 and stats.refused == {"connections": 1}
        for _, w in held:
            w.close()
        writer.close()
        await asyncio.sleep(0.05)
        assert stats.open == 0
        tcp.close()

    asyncio.run(main())


def test_half_sent_headers_are_closed_after_the_header_timeout():
    async def main():
        tcp, port, stats = await _serve(Config(http_header_timeout=0.3, http_idle_timeout=30))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no empty line: the headers never end
        try:
            await _closed(reader, 2)
        except ConnectionResetError:
            pass  # aborted: an RST is as closed as a FIN
        assert stats.timed_out == 1 and stats.open == 0
        tcp.close()

    asyncio.run(main())


def test_headers_sent_in_pieces_within_the_timeout_are_answered():
    async def main():
        tcp, port, stats = await _serve(Config(http_header_timeout=1.0))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for piece in (b"GET / HTTP/1.1\r\nHo", b"st: x\r", b"\nConnection: close\r\n\r", b"\n"):
            writer.write(piece)
            await asyncio.sleep(0.05)
        answer = await _closed(reader, 2)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"hello")
        await asyncio.sleep(1.2)  # past the header timeout: nothing timed out
        assert stats.timed_out == 0
        tcp.close()

    asyncio.run(main())


def test_an_exhausted_descriptor_reserve_refuses():
    async def main():
        reserve = DescriptorReserve(reserve=64, limit=128)
        reserve._counted, reserve._counted_at = 100, float("inf")  # 100 open: 28 left, fewer than 64
        tcp, port, stats = await _serve(Config(), reserve)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await _closed(reader, 2)).startswith(b"HTTP/1.1 503 ")
        assert stats.refused == {"descriptors": 1}
        writer.close()
        tcp.close()

    asyncio.run(main())
