"""The link between a node's main process and one of its queue-group workers (issue 34).

One ``socketpair`` per worker, made by the main process before it starts the worker (so nothing
else can connect to it), carrying length-prefixed frames: a 4-byte big-endian length, a kind byte,
then the payload.  Frames are batched: everything sent during one event-loop iteration leaves in
as few frames as its kinds allow (``bench/ipc_hop.py``: a batched hop costs ~2-4 µs per command, an
unbatched one 14-40 µs).

- ``C``, commands for a group's log (the hot direction): a msgpack array of ``[command, deferrable,
  size]``, each command the array of its fields as the Raft log packs it (store/core/commands.py
  ``encode_batch``), rebuilt typed by ``typed_commands``.  msgpack packs a command (a tuple) in C;
  pickle calls the NamedTuple's Python-level ``__getnewargs__`` and ``__new__`` for each one, which
  made pickling a third of the main process's CPU under a confirm flood (py-spy, session 20).
- ``P``, anything else (outputs with their messages and bodies, outbox reports, control): a pickle
  of the items.  Pickle, because both ends are the same program on the same node and the values are
  the broker's own: a socketpair never faces a network, so the trust boundary of the Raft port
  (sealed frames, raft/gate.py) does not apply here.

Items keep their order across kinds: a run of commands between two other items is one ``C`` frame.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable
from typing import Any

import msgpack

from raftmq.store.core.commands import typed_commands

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a frame beyond this is a bug on the other side: the link closes
COMMANDS = 0x43  # b"C"
PICKLED = 0x50  # b"P"
COMMAND = "c"  # the item ``("c", command, deferrable, size)`` as ``on_items`` gets it


class GroupLink(asyncio.Protocol):
    """Either end of a link: ``send`` queues an item (``send_command`` a command), the loop's next
    iteration writes the frames; ``on_items`` gets each frame's items in order; ``on_closed`` once,
    when the other side went."""

    def __init__(self, on_items: Callable[[list[Any]], None], on_closed: Callable[[], None]) -> None:
        self.on_items = on_items
        self.on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._out: list[Any] = []  # items, in order; a command is a list [command, deferrable, size]
        self._flush_scheduled = False
        self._buffer = bytearray()
        self._packer = msgpack.Packer(use_bin_type=True)
        self.frames_sent = 0
        self.frames_received = 0
        #: Called with True when the write buffer passed its high-water mark, False when it drained
        #: (the main process throttles its publishers meanwhile: node/group_host.py).
        self.on_pause: Callable[[bool], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def send(self, item: tuple) -> None:
        self._out.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_command(self, command: Any, deferrable: bool = False, size: int = 0) -> None:
        self._out.append([command, deferrable, size])
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self.transport.is_closing():
            self._out.clear()
            return
        items, self._out = self._out, []
        frames = []
        start = 0
        for i, item in enumerate(items):  # runs of commands and of other items, in order
            if (item.__class__ is list) != (items[start].__class__ is list):
                frames.append(self._frame(items[start:i]))
                start = i
        frames.append(self._frame(items[start:]))
        self.transport.write(b"".join(frames))
        self.frames_sent += len(frames)

    def _frame(self, items: list) -> bytes:
        if items[0].__class__ is list:
            blob = self._packer.pack(items)
            kind = COMMANDS
        else:
            blob = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
            kind = PICKLED
        return _LENGTH.pack(len(blob) + 1) + bytes((kind,)) + blob

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
            payload = memoryview(buffer)[offset + 5:offset + 4 + length]
            kind = buffer[offset + 4]
            offset += 4 + length
            self.frames_received += 1
            try:
                if kind == COMMANDS:
                    triples = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                    commands = typed_commands([triple[0] for triple in triples])
                    items = [(COMMAND, command, triple[1], triple[2])
                             for command, triple in zip(commands, triples, strict=True)]
                else:
                    items = pickle.loads(payload)  # noqa: S301 - see the module docstring
                payload.release()  # (the buffer is resized below)
                self.on_items(items)
            except Exception:  # a bug handling one frame must not cut the link (and stop the node)
                payload.release()
                log.exception("group link: handling a frame failed")
        if offset:
            del buffer[:offset]

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(True)

    def resume_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_closed()
