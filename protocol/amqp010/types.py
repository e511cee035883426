"""The AMQP 0-10 type system (spec chapter 3 and 7): primitive values, maps, lists and arrays.

Every primitive type of :data:`.spec_table.TYPES` gets an encoder and a decoder here, keyed by the
type's name.  Python values:

==========================================  ==============================================
0-10                                        Python
==========================================  ==============================================
int8 ... uint64, sequence-no, datetime      int
boolean                                     bool
float, double                               float
dec32, dec64                                decimal.Decimal
str8, str16 (utf8), -latin, -utf16          str
char                                        str of one character
vbin8/16/32, binN                           bytes
uuid                                        uuid.UUID
map / list / array                          dict / list / list (elements typed on the wire)
sequence-set, byte-ranges                   list of (lower, upper) inclusive ranges
void                                        None
bit                                         bool (a packing flag: no data of its own)
==========================================  ==============================================

Maps and lists carry a type code per value; :func:`type_of` picks the code for a Python value
(int -> int64, str -> str16, bytes -> vbin32, ...).  Decoding raises :class:`FramingError` on any
truncation or unknown type code: 0-10 has no other code for an undecodable frame.

Bounds (issue 17): no declared count is trusted before the bytes present back it.  A map, list or
array whose count could not fit in its size (each element takes at least its type's minimum width:
a map entry 2 octets, a list item 1, an array element its type's fixed width or size prefix) is a
framing error before any element is decoded.  Elements of the zero-width types ``void`` and ``bit``
take no octets at all, so nothing backs their count: an array of them may declare at most
:data:`MAX_ZERO_WIDTH_ELEMENTS` (a 2^32-1 count of them once froze the event loop for seconds and
allocated gigabytes before login).  Maps, lists, arrays and struct32 values nest at most
:data:`MAX_DEPTH` deep (no RecursionError, a framing error instead).
"""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import Any

from .errors import FramingError
from .spec_table import parse

SPEC = parse()

_FIXED_INT = {
    "int8": ">b", "uint8": ">B", "int16": ">h", "uint16": ">H", "int32": ">i", "uint32": ">I",
    "int64": ">q", "uint64": ">Q", "sequence-no": ">I", "datetime": ">Q", "float": ">f", "double": ">d",
}
_STRINGS = {"str8": "utf-8", "str16": "utf-8", "str8-latin": "latin-1", "str16-latin": "latin-1",
            "str8-utf16": "utf-16-be", "str16-utf16": "utf-16-be"}
_SIZE = {1: Struct(">B"), 2: Struct(">H"), 4: Struct(">I")}
_U32 = Struct(">I")
_U8 = Struct(">B")

Encoder = Callable[[Any], bytes]
#: ``(buf, pos) -> (value, pos after it)``; the decoders of :data:`NESTED` types take a third argument,
#: ``depth``, hence the open parameter list.
Decoder = Callable[..., tuple[Any, int]]

ENCODERS: dict[str, Encoder] = {}
DECODERS: dict[str, Decoder] = {}
TYPE_BY_CODE: dict[int, str] = {t.code: t.name for t in SPEC.types.values() if t.code is not None}
CODE_OF = {name: t.code for name, t in SPEC.types.items()}

#: Most elements an array of a zero-width type (void, bit) may declare: they take no octets, so no
#: received byte backs their count.  No client we know sends such arrays at all; 1024 Nones cost ~8 KB.
MAX_ZERO_WIDTH_ELEMENTS = 1024
#: Deepest nesting of maps, lists, arrays and struct32 values (a map at depth 0 holding a list is 1 deep).
MAX_DEPTH = 64
#: The composite types whose decoders take a nesting depth.
NESTED = frozenset(("map", "list", "array", "struct32"))
#: Fewest octets one value of each type takes: its fixed width, or the width of its size prefix.
MIN_WIDTH = {name: t.width for name, t in SPEC.types.items()}
_MAP_ENTRY_MIN = 2  # a str8 key's size octet + a type code
_LIST_ITEM_MIN = 1  # a type code


def _fixed(fmt: str) -> tuple[Encoder, Decoder]:
    st = Struct(fmt)

    def enc(value) -> bytes:
        return st.pack(value)

    def dec(buf, pos):
        return st.unpack_from(buf, pos)[0], pos + st.size

    return enc, dec


def _binary(width: int) -> tuple[Encoder, Decoder]:
    def enc(value) -> bytes:
        raw = bytes(value)
        if len(raw) != width:
            raise ValueError(f"bin{width * 8} needs {width} octets, got {len(raw)}")
        return raw

    def dec(buf, pos):
        end = pos + width
        if end > len(buf):
            raise FramingError("truncated fixed-width value")
        return bytes(buf[pos:end]), end

    return enc, dec


def _sized(width: int, to_bytes: Callable[[Any], bytes], from_bytes: Callable[[bytes], Any]) -> tuple[Encoder, Decoder]:
    size = _SIZE[width]
    limit = (1 << (8 * width)) - 1

    def enc(value) -> bytes:
        raw = to_bytes(value)
        if len(raw) > limit:
            raise ValueError(f"value of {len(raw)} octets does not fit a {width}-octet size")
        return size.pack(len(raw)) + raw

    def dec(buf, pos):
        (n,) = size.unpack_from(buf, pos)
        start = pos + width
        end = start + n
        if end > len(buf):
            raise FramingError("variable-width value overruns its frame")
        return from_bytes(bytes(buf[start:end])), end

    return enc, dec


def _text(codec: str) -> tuple[Callable[[Any], bytes], Callable[[bytes], str]]:
    """A string type's conversions to and from its octets (bytes pass through as they are)."""
    def to_bytes(value: Any) -> bytes:
        return value.encode(codec) if isinstance(value, str) else bytes(value)

    def from_bytes(raw: bytes) -> str:
        return raw.decode(codec)
    return to_bytes, from_bytes


def _ranges(fmt: str):
    pair = Struct(fmt)

    def to_bytes(ranges) -> bytes:
        return b"".join(pair.pack(lo, hi) for lo, hi in ranges)

    def from_bytes(raw: bytes):
        if len(raw) % pair.size:
            raise FramingError("range list length is not a whole number of ranges")
        return [pair.unpack_from(raw, i) for i in range(0, len(raw), pair.size)]

    return _sized(2, to_bytes, from_bytes)


def _decimal(fmt: str):
    st = Struct(fmt)

    def enc(value) -> bytes:
        value = decimal.Decimal(value)
        exponent = max(0, -value.as_tuple().exponent)
        return st.pack(exponent, int(value.scaleb(exponent)))

    def dec(buf, pos):
        exponent, mantissa = st.unpack_from(buf, pos)
        return decimal.Decimal(mantissa).scaleb(-exponent), pos + st.size

    return enc, dec


def type_of(value) -> str:
    """The 0-10 type used for a Python value inside a map, list or untyped array."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "int64" if -(1 << 63) <= value < (1 << 63) else "uint64"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "str16"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "vbin32"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, uuid.UUID):
        return "uuid"
    if isinstance(value, decimal.Decimal):
        return "dec64"
    raise ValueError(f"no AMQP 0-10 type for {type(value).__name__}")


def _typed_value(buf, pos: int, depth: int):
    code = buf[pos]
    name = TYPE_BY_CODE.get(code)
    if name is None:
        raise FramingError(f"unknown type code {code:#04x}")
    if name in NESTED:
        return DECODERS[name](buf, pos + 1, depth + 1)
    return DECODERS[name](buf, pos + 1)


def check_depth(depth: int) -> None:
    """Refuse a composite value nested deeper than :data:`MAX_DEPTH` (before recursing further)."""
    if depth > MAX_DEPTH:
        raise FramingError(f"maps, lists, arrays or structs nested more than {MAX_DEPTH} deep")


def _check_count(count: int, min_width: int, available: int, what: str) -> None:
    """A declared element count must be backed by the octets present (see the module docstring)."""
    if min_width:
        if count * min_width > available:
            raise FramingError(f"{what} declares {count} elements, more than its {available} octets can hold")
    elif count > MAX_ZERO_WIDTH_ELEMENTS:
        raise FramingError(f"{what} declares {count} zero-width elements (at most {MAX_ZERO_WIDTH_ELEMENTS})")


def encode_map(value: dict | None) -> bytes:
    parts = []
    for key, item in (value or {}).items():
        name = type_of(item)
        parts.append(ENCODERS["str8"](key))
        parts.append(_U8.pack(CODE_OF[name]))
        parts.append(ENCODERS[name](item))
    body = _U32.pack(len(parts) // 3) + b"".join(parts)
    return _U32.pack(len(body)) + body


def decode_map(buf, pos: int, depth: int = 0):
    if depth > MAX_DEPTH:
        check_depth(depth)
    (size,) = _U32.unpack_from(buf, pos)
    end = pos + 4 + size
    if end > len(buf) or size < 4:
        raise FramingError("map overruns its frame")
    (count,) = _U32.unpack_from(buf, pos + 4)
    pos += 8
    if count * _MAP_ENTRY_MIN > end - pos:
        _check_count(count, _MAP_ENTRY_MIN, end - pos, "map")
    out = {}
    for _ in range(count):
        key, pos = DECODERS["str8"](buf, pos)
        out[key], pos = _typed_value(buf, pos, depth)
        if pos > end:
            raise FramingError("map entry overruns the map")
    if pos != end:
        raise FramingError("map size does not match its entries")
    return out, end


def encode_list(value) -> bytes:
    parts = []
    for item in value or ():
        name = type_of(item)
        parts.append(_U8.pack(CODE_OF[name]))
        parts.append(ENCODERS[name](item))
    body = _U32.pack(len(value or ())) + b"".join(parts)
    return _U32.pack(len(body)) + body


def decode_list(buf, pos: int, depth: int = 0):
    if depth > MAX_DEPTH:
        check_depth(depth)
    (size,) = _U32.unpack_from(buf, pos)
    end = pos + 4 + size
    if end > len(buf) or size < 4:
        raise FramingError("list overruns its frame")
    (count,) = _U32.unpack_from(buf, pos + 4)
    pos += 8
    if count * _LIST_ITEM_MIN > end - pos:
        _check_count(count, _LIST_ITEM_MIN, end - pos, "list")
    out = []
    for _ in range(count):
        item, pos = _typed_value(buf, pos, depth)
        out.append(item)
        if pos > end:
            raise FramingError("list item overruns the list")
    if pos != end:
        raise FramingError("list size does not match its items")
    return out, end


def encode_array(value, element: str | None = None) -> bytes:
    """An array of ``element`` values (a type name; inferred from the first item when None)."""
    items = list(value or ())
    if element is None:
        element = type_of(items[0]) if items else "void"
    enc = ENCODERS[element]
    body = _U8.pack(CODE_OF[element] if CODE_OF.get(element) is not None else CODE_OF["struct32"])
    body += _U32.pack(len(items)) + b"".join(enc(i) for i in items)
    return _U32.pack(len(body)) + body


def decode_array(buf, pos: int, depth: int = 0):
    if depth > MAX_DEPTH:
        check_depth(depth)
    (size,) = _U32.unpack_from(buf, pos)
    end = pos + 4 + size
    if end > len(buf) or size < 5:
        raise FramingError("array overruns its frame")
    code = buf[pos + 4]
    name = TYPE_BY_CODE.get(code)
    if name is None:
        raise FramingError(f"unknown array element type code {code:#04x}")
    (count,) = _U32.unpack_from(buf, pos + 5)
    pos += 9
    width = MIN_WIDTH[name]
    if count * width > end - pos or (not width and count > MAX_ZERO_WIDTH_ELEMENTS):
        _check_count(count, width, end - pos, f"array of {name}")
    dec = DECODERS[name]
    out = []
    nested = name in NESTED
    for _ in range(count):
        item, pos = dec(buf, pos, depth + 1) if nested else dec(buf, pos)
        out.append(item)
        if pos > end:
            raise FramingError("array element overruns the array")
    if pos != end:
        raise FramingError("array size does not match its elements")
    return out, end


def _build() -> None:
    for name, t in SPEC.types.items():
        if name in _FIXED_INT:
            ENCODERS[name], DECODERS[name] = _fixed(_FIXED_INT[name])
        elif name in ("bin8", "bin16", "bin32", "bin40", "bin64", "bin72", "bin128", "bin256", "bin512", "bin1024"):
            ENCODERS[name], DECODERS[name] = _binary(t.width)
        elif name == "boolean":
            ENCODERS[name] = lambda v: b"\x01" if v else b"\x00"
            DECODERS[name] = lambda buf, pos: (buf[pos] != 0, pos + 1)
        elif name == "char":
            ENCODERS[name] = lambda v: v.encode("latin-1") if isinstance(v, str) else bytes(v)
            DECODERS[name] = lambda buf, pos: (chr(buf[pos]), pos + 1)
        elif name == "char-utf32":
            ENCODERS[name] = lambda v: v.encode("utf-32-be")
            DECODERS[name] = lambda buf, pos: (bytes(buf[pos:pos + 4]).decode("utf-32-be"), pos + 4)
        elif name == "uuid":
            ENCODERS[name] = lambda v: v.bytes if isinstance(v, uuid.UUID) else bytes(v)
            DECODERS[name] = lambda buf, pos: (uuid.UUID(bytes=bytes(buf[pos:pos + 16])), pos + 16)
        elif name in ("dec32", "dec64"):
            ENCODERS[name], DECODERS[name] = _decimal(">Bi" if name == "dec32" else ">Bq")
        elif name in _STRINGS:
            ENCODERS[name], DECODERS[name] = _sized(t.width, *_text(_STRINGS[name]))
        elif name in ("vbin8", "vbin16", "vbin32"):
            ENCODERS[name], DECODERS[name] = _sized(t.width, bytes, bytes)
        elif name == "sequence-set":
            ENCODERS[name], DECODERS[name] = _ranges(">II")
        elif name == "byte-ranges":
            ENCODERS[name], DECODERS[name] = _ranges(">QQ")
        elif name == "void":
            ENCODERS[name] = lambda v: b""
            DECODERS[name] = lambda buf, pos: (None, pos)
        elif name == "bit":
            ENCODERS[name] = lambda v: b""
            DECODERS[name] = lambda buf, pos: (True, pos)
        elif name == "map":
            ENCODERS[name], DECODERS[name] = encode_map, decode_map
        elif name == "list":
            ENCODERS[name], DECODERS[name] = encode_list, decode_list
        elif name == "array":
            ENCODERS[name], DECODERS[name] = encode_array, decode_array
        elif name == "struct32":
            pass  # needs the struct registry: installed by codec.py
        else:  # pragma: no cover - every type of the table is handled above
            raise AssertionError(f"unhandled 0-10 type {name}")


_build()


def decode(name: str, buf, pos: int, depth: int = 0):
    """Decode one value of primitive type ``name`` at ``pos``; truncation is a FramingError.

    ``depth``: how deep inside maps, lists, arrays and struct32 values this value sits."""
    try:
        if name in NESTED:
            return DECODERS[name](buf, pos, depth)
        return DECODERS[name](buf, pos)
    except (StructError, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise FramingError(f"cannot decode {name}: {exc}") from exc


def decode_flat(name: str, buf, pos: int):
    """:func:`decode` for a type that holds no nested values (not in :data:`NESTED`)."""
    try:
        return DECODERS[name](buf, pos)
    except (StructError, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise FramingError(f"cannot decode {name}: {exc}") from exc
