"""AMQP 0-9-1 field tables and arrays.

Decoding accepts every type code RabbitMQ and its clients use (the 0-9-1 errata table): t b B s u I i
l L f d D S A T F V x.  Note ``s`` is a *signed 16-bit integer* there, not the short string of the
original 0-9-1 grammar; every real client follows the errata, so do we.

Encoding writes only the safe set that all clients decode: t b s I l f d D S A T F V x.

Values map to Python types as follows; the wrapper types keep a value's wire type across a
decode/encode round trip where Python has no distinct type for it.

====================  ===========================================
wire                  Python
====================  ===========================================
t                     bool
b B s u I i l L       int (encoded as I when it fits 32 bits, else l)
f d                   float (encoded as d)
D                     decimal.Decimal
S                     str when valid UTF-8, else :class:`LongBytes`
x                     bytes
A                     list
T                     :class:`Timestamp` (an int of seconds)
F                     dict
V                     None
====================  ===========================================
"""

from __future__ import annotations

import decimal
from struct import Struct
from struct import error as StructError

from .errors import AMQPSyntaxError, FrameError

_U8 = Struct(">B")
_I8 = Struct(">b")
_I16 = Struct(">h")
_U16 = Struct(">H")
_I32 = Struct(">i")
_U32 = Struct(">I")
_I64 = Struct(">q")
_U64 = Struct(">Q")
_F32 = Struct(">f")
_F64 = Struct(">d")
_DEC = Struct(">Bi")

MAX_NESTING = 64  # tables within arrays within tables...: deep enough for x-death, bounded for safety


class Timestamp(int):
    """A field-table timestamp (type ``T``): seconds since the epoch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


class LongBytes(bytes):
    """A long string (type ``S``) that is not valid UTF-8; re-encodes as ``S``, not as ``x``."""

    __slots__ = ()


# ---------------------------------------------------------------------------------------------- decode

def decode_table(buf: bytes | memoryview, offset: int, _depth: int = 0) -> tuple[dict, int]:
    """Decode the field table at ``offset`` (its 4-byte length first); return it and the next offset.

    Raises :class:`FrameError` when the table overruns the buffer and :class:`AMQPSyntaxError` for
    an unknown type code or invalid key.
    """
    try:
        (size,) = _U32.unpack_from(buf, offset)
    except StructError as exc:
        raise FrameError("truncated field table") from exc
    start = offset + 4
    end = start + size
    if end > len(buf):
        raise FrameError("field table longer than its frame")
    if _depth > MAX_NESTING:
        raise AMQPSyntaxError("field tables nested too deeply")
    table: dict = {}
    pos = start
    try:
        while pos < end:
            klen = buf[pos]
            key_bytes = bytes(buf[pos + 1:pos + 1 + klen])
            pos += 1 + klen
            try:
                key = key_bytes.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise AMQPSyntaxError("field table key is not UTF-8") from exc
            value, pos = _decode_value(buf, pos, end, _depth)
            table[key] = value
    except (StructError, IndexError) as exc:
        raise FrameError("truncated field table") from exc
    if pos != end:
        raise FrameError("field table value overruns the table")
    return table, end


def decode_array(buf: bytes | memoryview, offset: int, _depth: int = 0) -> tuple[list, int]:
    (size,) = _U32.unpack_from(buf, offset)
    start = offset + 4
    end = start + size
    if end > len(buf):
        raise FrameError("field array longer than its frame")
    if _depth > MAX_NESTING:
        raise AMQPSyntaxError("field arrays nested too deeply")
    items = []
    pos = start
    while pos < end:
        value, pos = _decode_value(buf, pos, end, _depth)
        items.append(value)
    if pos != end:
        raise FrameError("field array value overruns the array")
    return items, end


def _decode_value(buf, pos: int, end: int, depth: int):
    code = buf[pos]
    pos += 1
    if code == 0x53:  # S long string
        (n,) = _U32.unpack_from(buf, pos)
        pos += 4
        if pos + n > end:
            raise FrameError("long string overruns its table")
        raw = bytes(buf[pos:pos + n])
        value: str | LongBytes
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            value = LongBytes(raw)
        return value, pos + n
    if code == 0x49:  # I signed 32
        return _I32.unpack_from(buf, pos)[0], pos + 4
    if code == 0x74:  # t boolean
        return buf[pos] != 0, pos + 1
    if code == 0x46:  # F nested table
        return decode_table(buf, pos, depth + 1)
    if code == 0x6C:  # l signed 64
        return _I64.unpack_from(buf, pos)[0], pos + 8
    if code == 0x41:  # A array
        return decode_array(buf, pos, depth + 1)
    if code == 0x54:  # T timestamp
        return Timestamp(_U64.unpack_from(buf, pos)[0]), pos + 8
    if code == 0x56:  # V void
        return None, pos
    if code == 0x62:  # b signed 8
        return _I8.unpack_from(buf, pos)[0], pos + 1
    if code == 0x42:  # B unsigned 8
        return buf[pos], pos + 1
    if code == 0x73:  # s signed 16 (errata)
        return _I16.unpack_from(buf, pos)[0], pos + 2
    if code == 0x75:  # u unsigned 16
        return _U16.unpack_from(buf, pos)[0], pos + 2
    if code == 0x69:  # i unsigned 32
        return _U32.unpack_from(buf, pos)[0], pos + 4
    if code == 0x4C:  # L unsigned 64
        return _U64.unpack_from(buf, pos)[0], pos + 8
    if code == 0x66:  # f float
        return _F32.unpack_from(buf, pos)[0], pos + 4
    if code == 0x64:  # d double
        return _F64.unpack_from(buf, pos)[0], pos + 8
    if code == 0x44:  # D decimal: scale octet, then a signed 32-bit value
        scale, raw = _DEC.unpack_from(buf, pos)
        return decimal.Decimal(raw).scaleb(-scale), pos + 5
    if code == 0x78:  # x byte array
        (n,) = _U32.unpack_from(buf, pos)
        pos += 4
        if pos + n > end:
            raise FrameError("byte array overruns its table")
        return bytes(buf[pos:pos + n]), pos + n
    raise AMQPSyntaxError(f"unknown field table type code {code:#04x}")


# ---------------------------------------------------------------------------------------------- encode

def encode_table(table: dict | None) -> bytes:
    """Encode ``table`` with its 4-byte length prefix. ``None`` encodes as the empty table."""
    if not table:
        return b"\x00\x00\x00\x00"
    parts: list[bytes] = []
    for key, value in table.items():
        kb = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        if len(kb) > 255:
            raise ValueError(f"field table key longer than 255 bytes: {key!r}")
        parts.append(_U8.pack(len(kb)))
        parts.append(kb)
        _encode_value(value, parts)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def encode_array(items) -> bytes:
    parts: list[bytes] = []
    for value in items:
        _encode_value(value, parts)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _encode_value(value, parts: list[bytes]) -> None:
    if isinstance(value, str):
        raw = value.encode("utf-8")
        parts.append(b"S" + _U32.pack(len(raw)))
        parts.append(raw)
    elif isinstance(value, bool):
        parts.append(b"t\x01" if value else b"t\x00")
    elif isinstance(value, Timestamp):
        parts.append(b"T" + _U64.pack(value))
    elif isinstance(value, int):
        if -(1 << 31) <= value < (1 << 31):
            parts.append(b"I" + _I32.pack(value))
        elif -(1 << 63) <= value < (1 << 63):
            parts.append(b"l" + _I64.pack(value))
        else:
            raise ValueError(f"integer out of the 64-bit range: {value}")
    elif isinstance(value, dict):
        parts.append(b"F" + encode_table(value))
    elif isinstance(value, (list, tuple)):
        parts.append(b"A" + encode_array(value))
    elif isinstance(value, LongBytes):
        parts.append(b"S" + _U32.pack(len(value)))
        parts.append(bytes(value))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        parts.append(b"x" + _U32.pack(len(raw)))
        parts.append(raw)
    elif value is None:
        parts.append(b"V")
    elif isinstance(value, float):
        parts.append(b"d" + _F64.pack(value))
    elif isinstance(value, decimal.Decimal):
        parts.append(b"D" + _encode_decimal(value))
    elif hasattr(value, "timestamp"):  # datetime
        parts.append(b"T" + _U64.pack(int(value.timestamp())))
    else:
        raise ValueError(f"cannot encode {type(value).__name__} in a field table")


def _encode_decimal(value: decimal.Decimal) -> bytes:
    sign, digits, exponent = value.normalize().as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"cannot encode decimal {value}")
    scale = max(0, -exponent)
    raw = int(value.scaleb(scale))
    if scale > 255 or not -(1 << 31) <= raw < (1 << 31):
        raise ValueError(f"decimal out of range for a field table: {value}")
    return _DEC.pack(scale, raw)
