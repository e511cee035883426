"""Sealed records: an LMDB value that proves itself intact (issue 29).

The single-node state (``durable.py``) and the audit history (``events.py``, ``event_writer.py``)
store each value *sealed*: ``0xC1`` + CRC32C (4 bytes, big-endian) + the payload, the CRC taken
over the record's key and then its payload -- ``integrity.checksum(key + payload)`` -- so that a
flipped byte in a key is caught as surely as one in a value (some records are all key).

Why 0xC1: it is the one byte msgpack never uses, and every value these stores wrote before they
had checksums is msgpack (or empty), so an old record can never be mistaken for a sealed one, and
a store that knows all its records are sealed treats an unsealed value as damage.

LMDB itself checks nothing of what it returns (no page checksums): this is the only check.
"""

from __future__ import annotations

import struct
from typing import overload

import crc32c

from raftmq.integrity import Damage

SEALED = 0xC1  # msgpack's never-used byte: the first byte of a sealed record, of no unsealed one
SEAL_HEAD = b"\xc1"
HEADER = 5  # marker + CRC32C
_HEAD = struct.Struct(">BI")  # marker, CRC32C
_pack_head = _HEAD.pack
_read_crc = struct.Struct(">I").unpack_from
_crc = crc32c.crc32c


class BadRecord(ValueError):
    """A stored value that does not prove itself intact (the text says why)."""


class StoreDamaged(Exception):
    """A store a node must read at start has damaged records: the node does not start on it
    (node/server.py: CRITICAL log line, exit status EXIT_STORE_DAMAGED)."""

    def __init__(self, message: str, damages: list[Damage]) -> None:
        super().__init__(message)
        self.damages = damages


EXIT_STORE_DAMAGED = 74  # EX_IOERR: the node's own files are damaged; it does not start


def seal(key: bytes, payload: bytes) -> bytes:
    """The stored form of ``payload`` under ``key``: marker, CRC32C over key then payload, payload.
    (``crc32c(payload, crc32c(key))`` is ``integrity.checksum(key + payload)`` without the copy.)"""
    return _pack_head(SEALED, _crc(payload, _crc(key))) + payload


def is_sealed(value: bytes | memoryview) -> bool:
    return len(value) > 0 and value[0] == SEALED


# A stored value as LMDB returns it: bytes, or a memoryview from a ``buffers=True`` transaction.
# ``unseal`` returns a slice of what it is given, so of the same type.
@overload
def unseal(key: bytes | memoryview, value: bytes, sealed_only: bool = True) -> bytes: ...
@overload
def unseal(key: bytes | memoryview, value: memoryview, sealed_only: bool = True) -> memoryview: ...
@overload
def unseal(key: bytes | memoryview, value: bytes | memoryview, sealed_only: bool = True) -> bytes | memoryview: ...
def unseal(key: bytes | memoryview, value: bytes | memoryview, sealed_only: bool = True) -> bytes | memoryview:
    """The payload of a stored value, checked; BadRecord if it is damaged.  ``sealed_only`` False
    (a store written before checksums) passes an unsealed value through unchanged (the same object:
    ``unseal(k, v, False) is v`` tells the caller it was not checked)."""
    if not value or value[0] != SEALED:
        if sealed_only:
            raise BadRecord("no checksum header (every record of this store format has one)")
        return value
    if len(value) < HEADER:
        raise BadRecord(f"truncated: {len(value)} bytes, shorter than the {HEADER}-byte header")
    payload = value[HEADER:]
    if _crc(payload, _crc(key)) != _read_crc(value, 1)[0]:
        raise BadRecord("checksum mismatch")
    return payload
