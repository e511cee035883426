"""The AMQP 1.0 type system (part 1): every encoding of :data:`.spec_table.ENCODINGS`, both ways.

Python values
=============

==============================================  ==================================================
AMQP 1.0 (1.6)                                  Python, as decoded
==============================================  ==================================================
null                                            None
boolean (true, false, boolean)                  bool
ubyte ushort uint ulong byte short int long     int (every width: uint0, smalluint, ... too)
float, double                                   float
decimal32, decimal64, decimal128                :class:`Decimal32` / 64 / 128: the raw IEEE octets
char                                            :class:`Char` (a str of one character)
timestamp                                       :class:`Timestamp` (an int: ms since the Unix epoch)
uuid                                            uuid.UUID
binary                                          bytes
string                                          str
symbol                                          :class:`Symbol` (a str subclass; ASCII only)
list (list0, list8, list32)                     list
map                                             dict (see "Maps" below)
array                                           :class:`Array` (element type name, items)
described value (0x00 descriptor value)         :class:`Described` (descriptor, value)
==============================================  ==================================================

Encoding infers the type of a plain Python value the other way round (int -> long, or ulong from
2^63 up; float -> double; str -> string; bytes -> binary; list/tuple -> list; dict -> map).  To send
another integer or float type, wrap the value: :class:`UByte`, :class:`UShort`, :class:`UInt`,
:class:`ULong`, :class:`Byte`, :class:`Short`, :class:`Int`, :class:`Long`, :class:`Float32` (int and
float subclasses, equal to the plain value).  Decoding returns plain ints and floats: a front end that
must forward a message section unchanged keeps its octets (3.2: the bare message is immutable) rather
than re-encode decoded values.  :func:`encode_as` encodes a value as a named primitive type, with the
smallest encoding that holds it (uint 0 -> uint0, 7 -> smalluint; a short string -> str8-utf8).

Maps
====
A map decodes to a dict, in wire order (1.6.23: maps are ordered).  Two identical keys make the map
invalid (1.6.23) and so a DecodeError.  Keys must be hashable: a map keyed by a list, a map or an
array is refused with a DecodeError too (and so is a described key whose value is one of those).  No
map of the specification (fields, annotations, application-properties, filter-set, the unsettled map of
delivery-tags) has such keys, and a broker has no use for them; refusing them keeps the decoded value a
plain dict.  Python's ``1 == True == 1.0`` makes such keys duplicates as well.

Bounds (the decoder trusts no count or size the bytes present do not back)
==========================================================================
Every size field must fit in the bytes of the enclosing value (the buffer, a list's size, an array's
size); every count must be satisfiable by the octets left at the least width of one element: one octet
per list item or map key/value (its constructor), an array element's fixed width or size prefix.  Array
elements of zero width (null, true, false, uint0, ulong0, list0 as element constructors) take no octets,
so nothing backs their count: at most :data:`MAX_ZERO_WIDTH_ELEMENTS` of them in one top-level value,
all its arrays together (a per-array cap would multiply: a list of 4-octet arrays of 255 empty lists
each would turn a 512-octet frame into megabytes).  Lists, maps, arrays and
described values nest at most :data:`MAX_DEPTH` deep.

Elements: the items that lists, maps and arrays declare are charged, when each compound is entered (one
subtraction per compound, not per item), against an element budget shared by everything one decode
reads -- a frame's performative (``amqp10_max_frame_elements``), a message's decoded sections
(``amqp10_max_message_elements``).  Decoding costs about 0.3 us and 70 octets of Python objects per
element, so a budget bounds the time a decode holds the event loop and the memory it builds, whatever
the octets: a 128 KiB attach of 130,000 empty lists is refused before any of them is built.  The
default budget (:func:`new_budget` without ``elements``) is unlimited, for values the node made itself.
Every violation, truncation, unknown format code,
invalid UTF-8 string or non-ASCII symbol is a :class:`DecodeError` (amqp:decode-error); nothing else
escapes :func:`decode_value`.  Decoding allocates at most a small multiple of the input: the worst cases
are a list of empty lists and an array of empty symbols, about 64 octets of Python objects per input
octet, plus at most :data:`MAX_ZERO_WIDTH_ELEMENTS` empty lists (~64 KB) for zero-width elements.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from struct import Struct
from typing import Any

from .errors import DecodeError
from .spec_table import parse

SPEC = parse()

#: Deepest nesting of lists, maps, arrays and described values (a list holding a list is 2 deep).
MAX_DEPTH = 64
#: Most elements an array of a zero-width element type may declare (no received octet backs them).
MAX_ZERO_WIDTH_ELEMENTS = 1024
#: The element budget of a decode given none (values the node encoded itself): no limit.
UNLIMITED = 1 << 62


def new_budget(elements: int | None = None) -> list[int]:
    """A decode budget: [zero-width array elements left, list/map/array elements left].

    ``elements``: the most items the lists, maps and arrays of the decode may declare together (None:
    :data:`UNLIMITED`).  Share one budget between decodes that one input pays for."""
    return [MAX_ZERO_WIDTH_ELEMENTS, UNLIMITED if elements is None else elements]


def _charge(budget: list[int], count: int, name: str) -> None:
    left = budget[1] - count
    if left < 0:
        raise DecodeError(f"{name} of {count} elements passes the element budget ({budget[1]} left)")
    budget[1] = left

ENCODING = SPEC.encodings  # code -> Encoding
CODE = {e.name: e.code for e in ENCODING.values()}  # encoding name -> code


# ------------------------------------------------------------------------------------------- Python values
class Symbol(str):
    """A symbol (1.6.21): an ASCII string from a constrained domain."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Symbol({str.__repr__(self)})"


class Char(str):
    """A char (1.6.16): one Unicode character, encoded as UTF-32BE."""

    __slots__ = ()


class Timestamp(int):
    """A timestamp (1.6.17): milliseconds since the Unix epoch (signed 64-bit)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


class Decimal32(bytes):
    """An IEEE 754-2008 decimal32 (1.6.13), kept as its 4 octets: the broker never computes with it."""

    WIDTH = 4


class Decimal64(bytes):
    """An IEEE 754-2008 decimal64 (1.6.14), kept as its 8 octets."""

    WIDTH = 8


class Decimal128(bytes):
    """An IEEE 754-2008 decimal128 (1.6.15), kept as its 16 octets."""

    WIDTH = 16


class UByte(int):
    __slots__ = ()
    TYPE = "ubyte"


class UShort(int):
    __slots__ = ()
    TYPE = "ushort"


class UInt(int):
    __slots__ = ()
    TYPE = "uint"


class ULong(int):
    __slots__ = ()
    TYPE = "ulong"


class Byte(int):
    __slots__ = ()
    TYPE = "byte"


class Short(int):
    __slots__ = ()
    TYPE = "short"


class Int(int):
    __slots__ = ()
    TYPE = "int"


class Long(int):
    __slots__ = ()
    TYPE = "long"


class Float32(float):
    """A float (1.6.11, binary32); a plain Python float encodes as double."""

    __slots__ = ()
    TYPE = "float"


@dataclass(frozen=True, slots=True)
class Described:
    """A described value (1.2): ``descriptor`` (a ulong or symbol, 1.5) and the described ``value``."""

    descriptor: object
    value: object


@dataclass(slots=True)
class Array:
    """An array (1.6.24): ``type`` is the primitive type name of every element (``"symbol"``), ``items``
    the values; ``descriptor`` is set when the elements are described values sharing one descriptor
    (``items`` then hold the described values' values)."""

    type: str
    items: list = field(default_factory=list)
    descriptor: object = None


class DescribedType:
    """Base of the classes :mod:`.performatives` generates: anything with ``encode() -> bytes``."""

    __slots__ = ()

    def encode(self) -> bytes:  # pragma: no cover - every subclass defines it
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------ decoding
Decoder = Callable[[bytes, int, int, int, list], tuple[object, int]]
_U8, _U32 = Struct(">B"), Struct(">I")
_STRUCTS = {
    "ubyte": ">B", "ushort": ">H", "uint": ">I", "ulong": ">Q", "byte": ">b", "short": ">h", "int": ">i",
    "long": ">q", "float": ">f", "double": ">d", "timestamp": ">q",
    "smalluint": ">B", "smallulong": ">B", "smallint": ">b", "smalllong": ">b",
}

#: The data decoder of each format code, after its constructor:
#: (buf, pos, end, depth, budget) -> (value, pos); ``budget`` is :func:`new_budget`'s list: the zero-width
#: array elements and the compound elements the whole decode may still hold.
DATA_DECODERS: list[Decoder | None] = [None] * 256
#: Fewest octets one value takes after its constructor (array elements): fixed width or size prefix.
MIN_WIDTH: dict[int, int] = {e.code: e.width for e in ENCODING.values()}


def _truncated(what: str, pos: int, need: int, end: int) -> DecodeError:
    return DecodeError(f"{what} needs {need} octets at {pos}, only {max(end - pos, 0)} present")


def _fixed(name: str, width: int, fmt: str | None, convert=None) -> Decoder:
    if fmt is None:  # raw octets: uuid and the decimals
        def dec_raw(buf, pos, end, depth, budget):
            nxt = pos + width
            if nxt > end:
                raise _truncated(name, pos, width, end)
            return convert(bytes(buf[pos:nxt])), nxt
        return dec_raw
    unpack = Struct(fmt).unpack_from

    if convert is None:
        def dec(buf, pos, end, depth, budget):
            nxt = pos + width
            if nxt > end:
                raise _truncated(name, pos, width, end)
            return unpack(buf, pos)[0], nxt
        return dec

    def dec_conv(buf, pos, end, depth, budget):
        nxt = pos + width
        if nxt > end:
            raise _truncated(name, pos, width, end)
        return convert(unpack(buf, pos)[0]), nxt
    return dec_conv


def _constant(value) -> Decoder:
    def dec(buf, pos, end, depth, budget):
        return value, pos
    return dec


def _boolean(buf, pos, end, depth, budget):
    if pos >= end:
        raise _truncated("boolean", pos, 1, end)
    octet = buf[pos]
    if octet > 1:
        raise DecodeError(f"boolean octet {octet:#04x} is neither 0x00 nor 0x01")
    return octet == 1, pos + 1


def _char(buf, pos, end, depth, budget):
    if pos + 4 > end:
        raise _truncated("char", pos, 4, end)
    point = _U32.unpack_from(buf, pos)[0]
    if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
        raise DecodeError(f"char {point:#x} is not a Unicode scalar value")
    return Char(chr(point)), pos + 4


def _variable(name: str, width: int, convert: Callable[[bytes], object]) -> Decoder:
    size_of = _U8.unpack_from if width == 1 else _U32.unpack_from
    empty = convert(b"")  # one shared object: an array of empty symbols would cost ~100 octets per octet

    def dec(buf, pos, end, depth, budget):
        start = pos + width
        if start > end:
            raise _truncated(name, pos, width, end)
        stop = start + size_of(buf, pos)[0]
        if stop > end:
            raise DecodeError(f"{name} of {stop - start} octets overruns the {end - start} present")
        if stop == start:
            return empty, stop
        return convert(buf[start:stop]), stop
    return dec


def _utf8(raw) -> str:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"string is not valid UTF-8: {exc.reason}") from None


def _ascii(raw) -> Symbol:
    try:
        return Symbol(bytes(raw).decode("ascii"))
    except UnicodeDecodeError:
        raise DecodeError("symbol is not ASCII") from None


def _deeper(depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise DecodeError(f"lists, maps, arrays and described values nested more than {MAX_DEPTH} deep")


def _header(name: str, width: int, buf, pos: int, end: int, least_size: int) -> tuple[int, int, int]:
    """(count, first element position, value end) of a compound or array value.

    ``least_size``: the fewest octets its size may declare (the count; an array's element constructor
    too).  The size must fit the ``end`` of the enclosing value."""
    head = pos + 2 * width
    if head > end:
        raise _truncated(name, pos, 2 * width, end)
    if width == 1:
        size, count = buf[pos], buf[pos + 1]
    else:
        size, count = _U32.unpack_from(buf, pos)[0], _U32.unpack_from(buf, pos + 4)[0]
    stop = pos + width + size
    if size < least_size or stop > end:
        raise DecodeError(f"{name} size {size} does not fit the {end - pos - width} octets present")
    return count, head, stop


def _compound(name: str, width: int, is_map: bool) -> Decoder:
    def dec(buf: bytes, pos: int, end: int, depth: int, budget: list) -> tuple[object, int]:
        _deeper(depth)
        count, pos, stop = _header(name, width, buf, pos, end, width)
        if count > stop - pos:  # every item takes at least its constructor octet
            raise DecodeError(f"{name} declares {count} items, more than its {stop - pos} octets can hold")
        left = budget[1] - count  # inline: every performative is a list, decoded on the hot path
        if left < 0:
            _charge(budget, count, name)  # raises
        budget[1] = left
        if is_map:
            if count & 1:
                raise DecodeError(f"{name} holds an odd number ({count}) of keys and values")
            out: dict = {}
            for _ in range(count >> 1):
                key, pos = decode_value(buf, pos, stop, depth + 1, budget)
                item, pos = decode_value(buf, pos, stop, depth + 1, budget)
                try:
                    if key in out:
                        raise DecodeError(f"{name} has the key {key!r} twice (1.6.23)")
                    out[key] = item
                except TypeError:
                    raise DecodeError(f"{name} key of type {type(key).__name__} is not hashable") from None
            value: object = out
        else:
            items = []
            for _ in range(count):
                item, pos = decode_value(buf, pos, stop, depth + 1, budget)
                items.append(item)
            value = items
        if pos != stop:
            raise DecodeError(f"{name} size does not match its {count} items ({stop - pos} octets left)")
        return value, stop
    return dec


def _array(name: str, width: int) -> Decoder:
    def dec(buf, pos, end, depth, budget):
        _deeper(depth)
        count, pos, stop = _header(name, width, buf, pos, end, width + 1)
        if pos >= stop:
            raise DecodeError(f"{name} has no element constructor")
        descriptor = None
        code = buf[pos]
        pos += 1
        if code == 0x00:
            descriptor, pos = decode_value(buf, pos, stop, depth + 1, budget)
            if pos >= stop:
                raise DecodeError(f"{name} of described elements has no element format code")
            code = buf[pos]
            pos += 1
        element = DATA_DECODERS[code]
        if element is None:
            raise DecodeError(f"unknown array element format code {code:#04x}")
        least = MIN_WIDTH[code]
        if least == 0:
            if count > budget[0]:
                raise DecodeError(f"{name} declares {count} zero-width elements (at most "
                                  f"{MAX_ZERO_WIDTH_ELEMENTS} in one value, {budget[0]} left)")
            budget[0] -= count
        elif count * least > stop - pos:
            raise DecodeError(f"{name} declares {count} elements, more than its {stop - pos} octets can hold")
        if count:
            _charge(budget, count, name)
        items = []
        for _ in range(count):
            item, pos = element(buf, pos, stop, depth + 1, budget)
            items.append(item)
        if pos != stop:
            raise DecodeError(f"{name} size does not match its {count} elements ({stop - pos} octets left)")
        return Array(ENCODING[code].type, items, descriptor), stop
    return dec


def _build_decoders() -> None:
    for code, e in ENCODING.items():
        name = e.name
        if e.type == "null":
            dec = _constant(None)
        elif name == "true":
            dec = _constant(True)
        elif name == "false":
            dec = _constant(False)
        elif name == "boolean":
            dec = _boolean
        elif name in ("uint0", "ulong0"):
            dec = _constant(0)
        elif name == "list0":
            dec = None  # a fresh list each time (lists are mutable): special-cased in decode_value
        elif name in _STRUCTS:
            dec = _fixed(name, e.width, _STRUCTS[name], Timestamp if name == "timestamp" else None)
        elif e.type in ("decimal32", "decimal64", "decimal128"):
            dec = _fixed(name, e.width, None, {"decimal32": Decimal32, "decimal64": Decimal64,
                                               "decimal128": Decimal128}[e.type])
        elif name == "uuid":
            dec = _fixed(name, 16, None, lambda raw: uuid.UUID(bytes=raw))
        elif name == "char":
            dec = _char
        elif e.type == "binary":
            dec = _variable(name, e.width, bytes)
        elif e.type == "string":
            dec = _variable(name, e.width, _utf8)
        elif e.type == "symbol":
            dec = _variable(name, e.width, _ascii)
        elif e.category == "compound":
            dec = _compound(name, e.width, e.type == "map")
        elif e.category == "array":
            dec = _array(name, e.width)
        else:  # pragma: no cover - every encoding of the table is handled above
            raise AssertionError(f"unhandled encoding {name}")
        DATA_DECODERS[code] = dec
    DATA_DECODERS[CODE["list0"]] = lambda buf, pos, end, depth, budget: ([], pos)


_build_decoders()


def decode_value(buf, pos: int = 0, end: int | None = None, depth: int = 0,
                 budget: list[int] | None = None) -> tuple[object, int]:
    """Decode one value (constructor and data) at ``pos``, reading no further than ``end``.

    Returns (value, position after it).  ``depth``: how deep inside lists, maps, arrays and described
    values this value sits; ``budget``: see :data:`DATA_DECODERS` (None: a fresh :func:`new_budget`,
    unlimited elements).  Raises only :class:`DecodeError`."""
    if end is None:
        end = len(buf)
    if budget is None:
        budget = new_budget()
    if pos >= end:
        raise DecodeError(f"a value was expected at {pos}, the data ends at {end}")
    code = buf[pos]
    if code == 0x00:
        _deeper(depth)
        descriptor, pos = decode_value(buf, pos + 1, end, depth + 1, budget)
        value, pos = decode_value(buf, pos, end, depth + 1, budget)
        return Described(descriptor, value), pos
    dec = DATA_DECODERS[code]
    if dec is None:
        raise DecodeError(f"unknown format code {code:#04x} at {pos}")
    return dec(buf, pos + 1, end, depth, budget)


def decode(buf, elements: int | None = None) -> object:
    """The one value that ``buf`` holds, all of it (trailing octets are a DecodeError); ``elements``:
    the element budget (:func:`new_budget`)."""
    value, pos = decode_value(buf, 0, len(buf), 0, new_budget(elements))
    if pos != len(buf):
        raise DecodeError(f"{len(buf) - pos} octets after the value")
    return value


# ------------------------------------------------------------------------------------------------ encoding
#: The ranges of the integer types (and timestamp), inclusive.
INT_RANGES = {
    "ubyte": (0, 0xFF), "ushort": (0, 0xFFFF), "uint": (0, 0xFFFFFFFF), "ulong": (0, (1 << 64) - 1),
    "byte": (-0x80, 0x7F), "short": (-0x8000, 0x7FFF), "int": (-(1 << 31), (1 << 31) - 1),
    "long": (-(1 << 63), (1 << 63) - 1), "timestamp": (-(1 << 63), (1 << 63) - 1),
}
_PACK = {name: Struct(fmt).pack for name, fmt in _STRUCTS.items()}


def _int(type_name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{type_name} needs an int, got {type(value).__name__}")
    lo, hi = INT_RANGES[type_name]
    if not lo <= value <= hi:
        raise ValueError(f"{value} is out of range for {type_name}")
    return value


def _sized(small: str, large: str, raw: bytes) -> bytes:
    n = len(raw)
    if n <= 0xFF:
        return bytes((CODE[small], n)) + raw
    if n > 0xFFFFFFFF:
        raise ValueError(f"value of {n} octets is too large for {large}")
    return bytes((CODE[large],)) + _U32.pack(n) + raw


def encode_compound(small: str, large: str, count: int, body: bytes) -> bytes:
    """A list or map of ``count`` encoded items ``body``: the 8-bit encoding when size and count fit."""
    if count <= 0xFF and len(body) < 0xFF:
        return bytes((CODE[small], len(body) + 1, count)) + body
    return bytes((CODE[large],)) + _U32.pack(len(body) + 4) + _U32.pack(count) + body


def encode_list(items) -> bytes:
    if not items:
        return b"\x45"
    return encode_compound("list8", "list32", len(items), b"".join(encode_value(i) for i in items))


def encode_map(mapping: dict, key_type: str = "*") -> bytes:
    parts = []
    for key, item in mapping.items():
        parts.append(encode_as(key_type, key))
        parts.append(encode_value(item))
    return encode_compound("map8", "map32", 2 * len(mapping), b"".join(parts))


def encode_uint(value: int) -> bytes:
    value = _int("uint", value)
    if value == 0:
        return b"\x43"
    if value <= 0xFF:
        return bytes((0x52, value))
    return b"\x70" + _PACK["uint"](value)


def encode_ulong(value: int) -> bytes:
    value = _int("ulong", value)
    if value == 0:
        return b"\x44"
    if value <= 0xFF:
        return bytes((0x53, value))
    return b"\x80" + _PACK["ulong"](value)


def _encode_int(value: int) -> bytes:
    value = _int("int", value)
    return bytes((0x54,)) + _PACK["smallint"](value) if -128 <= value <= 127 else b"\x71" + _PACK["int"](value)


def _encode_long(value: int) -> bytes:
    value = _int("long", value)
    if -128 <= value <= 127:
        return b"\x55" + _PACK["smalllong"](value)
    return b"\x81" + _PACK["long"](value)


def _encode_string(value) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"string needs a str, got {type(value).__name__}")
    return _sized("str8-utf8", "str32-utf8", value.encode("utf-8"))


def _encode_symbol(value) -> bytes:
    if isinstance(value, bytes):
        value = value.decode("ascii")
    if not isinstance(value, str):
        raise ValueError(f"symbol needs a str, got {type(value).__name__}")
    return _sized("sym8", "sym32", value.encode("ascii"))


def _encode_binary(value) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"binary needs bytes, got {type(value).__name__}")
    return _sized("vbin8", "vbin32", bytes(value))


def _encode_boolean(value) -> bytes:
    if not isinstance(value, bool):
        raise ValueError(f"boolean needs a bool, got {type(value).__name__}")
    return b"\x41" if value else b"\x42"


def _encode_char(value) -> bytes:
    if not isinstance(value, str) or len(value) != 1:
        raise ValueError("char needs a str of one character")
    return b"\x73" + _U32.pack(ord(value))


def _encode_uuid(value) -> bytes:
    if not isinstance(value, uuid.UUID):
        raise ValueError(f"uuid needs a uuid.UUID, got {type(value).__name__}")
    return b"\x98" + value.bytes


def _decimal(type_name: str, width: int):
    code = CODE[type_name]

    def enc(value) -> bytes:
        raw = bytes(value)
        if len(raw) != width:
            raise ValueError(f"{type_name} needs {width} octets, got {len(raw)}")
        return bytes((code,)) + raw
    return enc


def _fixed_encoder(type_name: str):
    pack = _PACK[type_name]
    code = bytes((CODE[type_name],))
    if type_name in ("float", "double"):
        def enc_float(value) -> bytes:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{type_name} needs a float, got {type(value).__name__}")
            return code + pack(float(value))
        return enc_float

    def enc(value) -> bytes:
        return code + pack(_int(type_name, value))
    return enc


def _encode_list_value(value) -> bytes:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"list needs a list, got {type(value).__name__}")
    return encode_list(value)


def _encode_map_value(value) -> bytes:
    if not isinstance(value, dict):
        raise ValueError(f"map needs a dict, got {type(value).__name__}")
    return encode_map(value)


def _encode_array_value(value) -> bytes:
    if not isinstance(value, Array):
        raise ValueError(f"array needs an Array, got {type(value).__name__}")
    return encode_array(value)


#: Encoder of each primitive type (the smallest encoding that holds the value); "*" infers the type.
ENCODERS: dict[str, Callable[[Any], bytes]] = {
    "null": lambda value: b"\x40",
    "boolean": _encode_boolean,
    "ubyte": _fixed_encoder("ubyte"),
    "ushort": _fixed_encoder("ushort"),
    "uint": encode_uint,
    "ulong": encode_ulong,
    "byte": _fixed_encoder("byte"),
    "short": _fixed_encoder("short"),
    "int": _encode_int,
    "long": _encode_long,
    "float": _fixed_encoder("float"),
    "double": _fixed_encoder("double"),
    "decimal32": _decimal("decimal32", 4),
    "decimal64": _decimal("decimal64", 8),
    "decimal128": _decimal("decimal128", 16),
    "char": _encode_char,
    "timestamp": _fixed_encoder("timestamp"),
    "uuid": _encode_uuid,
    "binary": _encode_binary,
    "string": _encode_string,
    "symbol": _encode_symbol,
    "list": _encode_list_value,
    "map": _encode_map_value,
    "array": _encode_array_value,
}


def encode_as(type_name: str, value) -> bytes:
    """``value`` encoded as primitive type ``type_name`` (``"*"``: inferred); None is always null."""
    if value is None:
        return b"\x40"
    if type_name == "*":
        return encode_value(value)
    return ENCODERS[type_name](value)


def type_of(value) -> str:
    """The primitive type a Python value encodes as (see the module docstring)."""
    if value is None:
        return "null"
    cls = value.__class__
    if cls is bool:
        return "boolean"
    if cls is str:
        return "string"
    if cls is int:
        return "long" if value < (1 << 63) else "ulong"
    if cls is float:
        return "double"
    if cls is bytes:
        return "binary"
    if cls is list or cls is tuple:
        return "list"
    if cls is dict:
        return "map"
    typed = getattr(cls, "TYPE", None)
    if typed is not None:
        return typed
    for base, name in _BY_CLASS:
        if isinstance(value, base):
            return name
    raise ValueError(f"no AMQP 1.0 type for {cls.__name__}")


_BY_CLASS: tuple[tuple[type, str], ...] = (
    (Symbol, "symbol"), (Char, "char"), (str, "string"), (Timestamp, "timestamp"), (bool, "boolean"),
    (int, "long"), (float, "double"), (Decimal32, "decimal32"), (Decimal64, "decimal64"),
    (Decimal128, "decimal128"), (bytes, "binary"), (bytearray, "binary"), (memoryview, "binary"),
    (uuid.UUID, "uuid"), (list, "list"), (tuple, "list"), (dict, "map"), (Array, "array"),
)


def encode_value(value) -> bytes:
    """Encode a Python value with its inferred type (:func:`type_of`); described values as 0x00 + ..."""
    if isinstance(value, DescribedType):
        return value.encode()
    if isinstance(value, Described):
        return encode_described(value.descriptor, encode_value(value.value))
    return ENCODERS[type_of(value)](value)


def encode_descriptor(descriptor) -> bytes:
    """A descriptor (1.5): an int is a ulong, a str a symbol."""
    if isinstance(descriptor, int) and not isinstance(descriptor, bool):
        return encode_ulong(descriptor)
    if isinstance(descriptor, str):
        return _encode_symbol(descriptor)
    return encode_value(descriptor)


def encode_described(descriptor, encoded_value: bytes) -> bytes:
    return b"\x00" + encode_descriptor(descriptor) + encoded_value


# Array element constructors: one for all elements.  Fixed-width types use their full-width encoding (an
# array of uint0 elements would be zero-width, see MAX_ZERO_WIDTH_ELEMENTS); binary, string and symbol the
# 8-bit size when every element fits it; lists, maps and arrays as elements always the 32-bit encoding.
_ARRAY_FIXED = ("null", "boolean", "ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "float",
                "double", "decimal32", "decimal64", "decimal128", "char", "timestamp", "uuid")
_ARRAY_SIZED = {"binary": ("vbin8", "vbin32", bytes),
                "string": ("str8-utf8", "str32-utf8", lambda v: v.encode("utf-8")),
                "symbol": ("sym8", "sym32", lambda v: v.encode("ascii"))}


def _fixed_element_encoder(type_name: str) -> Callable[[object], bytes]:
    if type_name == "null":
        return lambda v: b""
    if type_name == "boolean":
        return lambda v: b"\x01" if _encode_boolean(v) == b"\x41" else b"\x00"
    if type_name in _PACK:
        enc = _fixed_encoder(type_name)
    else:  # decimals, char, uuid: one encoding each
        enc = ENCODERS[type_name]
    return lambda v: enc(v)[1:]


_FIXED_ELEMENT = {name: _fixed_element_encoder(name) for name in _ARRAY_FIXED}


def _check(type_name: str, value, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"array of {type_name} holds a {type(value).__name__}")


def _array_body(array: Array) -> tuple[int, bytes]:
    """(count, element constructor + elements) of an array."""
    items = list(array.items)
    type_name = array.type
    constructor = b"\x00" + encode_descriptor(array.descriptor) if array.descriptor is not None else b""
    if type_name in _FIXED_ELEMENT:
        code = CODE[type_name]
        if type_name == "null" and len(items) > MAX_ZERO_WIDTH_ELEMENTS:
            raise ValueError(f"an array of more than {MAX_ZERO_WIDTH_ELEMENTS} nulls cannot be decoded")
        fixed = _FIXED_ELEMENT[type_name]
        elements = b"".join(fixed(v) for v in items)
    elif type_name in _ARRAY_SIZED:
        small, large, to_bytes = _ARRAY_SIZED[type_name]
        raws = [to_bytes(v) for v in items]
        if all(len(r) <= 0xFF for r in raws):
            code, elements = CODE[small], b"".join(bytes((len(r),)) + r for r in raws)
        else:
            code, elements = CODE[large], b"".join(_U32.pack(len(r)) + r for r in raws)
    elif type_name == "list":
        code = CODE["list32"]
        for v in items:
            _check(type_name, v, (list, tuple))
        elements = b"".join(_wide_compound(len(v), b"".join(encode_value(i) for i in v)) for v in items)
    elif type_name == "map":
        code = CODE["map32"]
        for v in items:
            _check(type_name, v, dict)
        elements = b"".join(_wide_compound(2 * len(v), b"".join(encode_value(k) + encode_value(i)
                                                                   for k, i in v.items())) for v in items)
    elif type_name == "array":
        code = CODE["array32"]
        for v in items:
            _check(type_name, v, Array)
        elements = b"".join(_wide_compound(*_array_body(v)) for v in items)
    else:
        raise ValueError(f"no array of {type_name}")
    return len(items), constructor + bytes((code,)) + elements


def _wide_compound(count: int, body: bytes) -> bytes:
    return _U32.pack(len(body) + 4) + _U32.pack(count) + body


def encode_array(array: Array) -> bytes:
    """An array: array8 when its size and count fit one octet, else array32 (1.6.24)."""
    count, body = _array_body(array)
    if count <= 0xFF and len(body) < 0xFF:
        return bytes((CODE["array8"], len(body) + 1, count)) + body
    return bytes((CODE["array32"],)) + _wide_compound(count, body)
