"""The link between a node's main process and one of its queue-group workers (issue 34).

One ``socketpair`` per worker, made by the main process before it starts the worker (so nothing
else can connect to it), carrying length-prefixed frames: a 4-byte big-endian length, then a
pickle of ``(kind, payload)``.  Pickle, because both ends are the same program on the same node
and the values are the broker's own (commands, outputs with their messages and bodies): a
socketpair never faces a network, so the trust boundary of the Raft port (sealed frames,
raft/gate.py) does not apply here.

Frames are batched: everything sent during one event-loop iteration leaves as one frame
(``bench/ipc_hop.py``: a batched hop costs ~2-4 µs per command, an unbatched one 14-40 µs).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a frame beyond this is a bug on the other side: the link closes


class GroupLink(asyncio.Protocol):
    """Either end of a link: ``send`` queues an item, the loop's next iteration writes the frame;
    ``on_items`` gets each frame's items in order; ``on_closed`` once, when the other side went."""

    def __init__(self, on_items: Callable[[list[Any]], None], on_closed: Callable[[], None]) -> None:
        self.on_items = on_items
        self.on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._out: list[Any] = []
        self._flush_scheduled = False
        self._buffer = bytearray()
        self.frames_sent = 0
        self.frames_received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def send(self, item: Any) -> None:
        self._out.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self.transport.is_closing():
            self._out.clear()
            return
        items, self._out = self._out, []
        blob = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
        self.transport.write(_LENGTH.pack(len(blob)) + blob)
        self.frames_sent += 1

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        offset = 0
        while len(buffer) - offset >= 4:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > MAX_FRAME:
                log.error("group link: a frame of %d bytes; closing", length)
                assert self.transport is not None
                self.transport.close()
                return
            if len(buffer) - offset - 4 < length:
                break
            items = pickle.loads(memoryview(buffer)[offset + 4:offset + 4 + length])  # noqa: S301 - see the module docstring
            offset += 4 + length
            self.frames_received += 1
            try:
                self.on_items(items)
            except Exception:  # a bug handling one frame must not cut the link (and stop the node)
                log.exception("group link: handling a frame failed")
        if offset:
            del buffer[:offset]

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_closed()
