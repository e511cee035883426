"""ops/http/bodies.py on a real aiohttp server and loopback sockets (issue 31 item 9).

Checks: the value count is an upper bound of the values json.loads builds; a body over its value
budget is 413 before parsing; a body trickled in slower than ``http_idle_timeout`` once its turn has
come is 408 and frees the gate of large bodies for the next one; malformed JSON is 400.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from raftmq.node.config import Config
from raftmq.ops.http.bodies import BodyError, json_values, read_json


def _count(value) -> int:
    if isinstance(value, list):
        return 1 + sum(_count(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(_count(v) for v in value.values())
    return 1


def test_json_values_bounds_what_is_parsed():
    for text in ('{"a": [1, 2, {"b": []}], "c": "x,y"}', "[[],[],[[]]]", '"s"', "7", '{"k": {}}'):
        assert json_values(text.encode()) >= _count(json.loads(text)), text


async def _answer(port: int, raw: bytes, then_wait: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await asyncio.sleep(then_wait)
    try:
        async with asyncio.timeout(5):
            return await reader.read(65536)
    finally:
        writer.close()


def _serve(config: Config, max_values: int):
    async def handler(request: web.Request) -> web.Response:
        try:
            data = await read_json(request, config, max_values)
        except BodyError as exc:
            return web.Response(status=exc.status, text=exc.reason)
        return web.Response(text=json.dumps(data))

    return web.Server(handler)


def _post(body: bytes) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_value_budget_malformed_json_and_a_trickled_body():
    async def main():
        config = Config(http_idle_timeout=0.5, http_max_body=1 << 20)
        server = await asyncio.get_running_loop().create_server(_serve(config, 100), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        assert b" 200 " in await _answer(port, _post(b"[1, 2, 3]"))
        assert b" 413 " in await _answer(port, _post(b"[" + b"0," * 200 + b"0]"))
        assert b" 400 " in await _answer(port, _post(b"[1, 2"))
        # Chunked (length unknown): through the gate of large bodies; one chunk, then nothing.
        trickle = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[1\r\n"
        first = asyncio.ensure_future(_answer(port, trickle))
        await asyncio.sleep(0.1)
        complete = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n[2]\r\n0\r\n\r\n"
        second = await _answer(port, complete)  # waits for the gate, then is answered
        assert b" 408 " in await first
        assert b" 200 " in second and second.endswith(b"[2]")
        server.close()

    asyncio.run(main())
