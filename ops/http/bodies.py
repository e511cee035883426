"""Request bodies of the management API: size-capped, budgeted in JSON values, large ones parsed
one at a time in a worker thread (issue 31: 4 x 30 MB definitions in parallel took +542 MB and
stalled other clients for seconds).

* A body above ``http_max_body`` bytes (RabbitMQ: ``management.http.max_body_size``, 20 MB) is
  refused with 413 before it is read when its Content-Length says so, and otherwise as soon as the
  read passes the cap (aiohttp's ``client_max_size``, set to the same figure in ops/http/server.py).
* Parsed JSON costs far more than its text: 20 MB of ``[[],[],...]`` is 14 M values and 454 MB of
  Python objects; real definitions (200k queues, 24 MB) are 1.4 M values and 98 MB.  So before
  parsing, the values are counted as commas plus opening brackets (an over-estimate: those inside
  strings count too; 21 ms for 20 MB) and a body over ``http_max_json_elements`` is refused (413).
* Bodies over ``LARGE`` (or of unknown length) are read and parsed one at a time
  (``_large``): the others wait with their bytes in the kernel's socket buffers (TCP back-pressure).
  A body must arrive within ``http_idle_timeout`` of its turn (408), so a trickled one cannot keep
  the gate.
* json.loads holds the GIL for the whole parse, so a worker thread alone leaves the loop stalled
  (measured on the shared 2-core machine: 0.31-0.72 s gaps in the loop for the 24 MB definitions).
  Parsing with a Python ``object_pairs_hook`` gives the interpreter a switch point at every JSON
  object: the longest gap fell to 53-137 ms.  A body of arrays or strings only has no such point
  (20 MB of ``[[],...]``: 2.6-2.8 s gaps, in a thread or not) -- bench/http_json_parse.py prints these.
  So the value budget is what bounds such a stall, and the full ``http_max_json_elements`` (2 M
  values, ~0.3-0.4 s) applies to /api/definitions only, which needs the administrator tag; every other
  body may hold ``SMALL_BODY_VALUES`` (10,000 values: a few ms), whatever its byte size (a published
  payload is one string).  After a large parse the gate stays closed as long as the parse took, so
  back-to-back large bodies leave the loop at least half of the time.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref

from aiohttp import web

from raftmq.node.config import Config

LARGE = 1 << 20
SMALL_BODY_VALUES = 10_000
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _large() -> asyncio.Lock:
    """The gate of large bodies, one per event loop (a node has one; tests run several)."""
    return _gates.setdefault(asyncio.get_running_loop(), asyncio.Lock())


class BodyError(Exception):
    """A body refused: HTTP ``status`` with a reason (413 too large, 400 malformed)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def json_values(raw: bytes) -> int:
    """An upper bound of the values a JSON text holds (every value but the first follows a comma or
    opens an array or object)."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


async def read_json(request: web.Request, config: Config, max_values: int = SMALL_BODY_VALUES):
    """The request's JSON body, of at most ``http_max_body`` bytes and ``max_values`` JSON values;
    BodyError otherwise."""
    length = request.content_length
    if length is not None and length > config.http_max_body:
        raise BodyError(413, f"body of {length} bytes is above the limit of {config.http_max_body} (http_max_body)")
    if length is not None and length <= LARGE:
        return _parse(await _read(request, config), max_values, in_thread=False)
    async with _large():
        raw = await _read(request, config)
        start = time.monotonic()
        try:
            return await asyncio.to_thread(_parse, raw, max_values, in_thread=True)
        finally:
            del raw
            await asyncio.sleep(min(time.monotonic() - start, 5.0))  # the loop's share (see above)


async def _read(request: web.Request, config: Config) -> bytes:
    """The body's bytes, within http_max_body and, once its turn has come, http_idle_timeout seconds:
    a body trickled in must not hold the gate of large bodies for ever (408)."""
    try:
        async with asyncio.timeout(config.http_idle_timeout or None):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, f"body above the limit of {config.http_max_body} bytes (http_max_body)") from None
    except TimeoutError:
        raise BodyError(408, f"body not received within {config.http_idle_timeout} s (http_idle_timeout)") from None


def _parse(raw: bytes, max_values: int, *, in_thread: bool):
    values = json_values(raw)
    if values > max_values:
        what = "http_max_json_elements" if max_values != SMALL_BODY_VALUES else "this request's limit"
        raise BodyError(413, f"body of up to {values} JSON values is above the limit of {max_values} ({what})")
    try:
        if in_thread:
            return json.loads(raw, object_pairs_hook=_object)
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise BodyError(400, f"body is not JSON: {reason}") from None


def _object(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, built in Python: the interpreter may switch threads here (see above)."""
    return dict(pairs)
