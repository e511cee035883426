"""Walking over an AMQP 1.0 encoded value without decoding it (part 1, 1.2 and 1.6).

Every encoding says how many octets it takes from its constructor alone: a fixed width (1.2: "fixed"
category), a size prefix (variable, compound and array: 1.2 "the size of the encoded data"), so the end
of a value is found in O(1) steps however many elements a list, map or array holds.  :func:`skip_value`
returns that end and checks what the walk reads: the format code is known, every size fits the octets of
the enclosing value (the buffer, the end given), a compound's count is no more than its octets can hold
(one constructor octet per item), an array has an element constructor of a known code whose least width
times the count fits, and no more than :data:`.types.MAX_ZERO_WIDTH_ELEMENTS` zero-width elements.  What
lies inside a compound or array, and the UTF-8 of a string, is not looked at: this is the check of a
message body the node only stores and forwards (protocol/amqp10/stored.py), never interprets.  It builds
no Python object for any element, so a body of millions of empty lists costs what one list costs.
Raises only :class:`DecodeError`.
"""

from __future__ import annotations

from struct import Struct

from .errors import DecodeError
from .types import ENCODING, MAX_DEPTH, MAX_ZERO_WIDTH_ELEMENTS, MIN_WIDTH

_U32 = Struct(">I")
FIXED, VARIABLE, COMPOUND, ARRAY = range(4)
_KINDS = {"fixed": FIXED, "variable": VARIABLE, "compound": COMPOUND, "array": ARRAY}
#: (kind, width, name) of each format code: width is the fixed data width or the size-prefix width.
SHAPE: list[tuple[int, int, str] | None] = [None] * 256
for _code, _e in ENCODING.items():
    SHAPE[_code] = (_KINDS[_e.category], _e.width, _e.name)


def _end_of(what: str, pos: int, need: int, end: int) -> DecodeError:
    return DecodeError(f"{what} needs {need} octets at {pos}, only {max(end - pos, 0)} present")


def skip_value(buf, pos: int, end: int, depth: int = 0) -> int:
    """The position after the value (constructor and data) at ``pos``, reading no further than ``end``.

    ``depth``: how deep in described values this one sits (descriptors chain at most
    :data:`.types.MAX_DEPTH` deep)."""
    if pos >= end:
        raise DecodeError(f"a value was expected at {pos}, the data ends at {end}")
    code = buf[pos]
    if code == 0x00:
        if depth >= MAX_DEPTH:
            raise DecodeError(f"described values nested more than {MAX_DEPTH} deep")
        after = skip_value(buf, pos + 1, end, depth + 1)  # the descriptor
        return skip_value(buf, after, end, depth + 1)
    shape = SHAPE[code]
    if shape is None:
        raise DecodeError(f"unknown format code {code:#04x} at {pos}")
    return _skip_data(buf, pos + 1, end, shape)


def _skip_data(buf, pos: int, end: int, shape: tuple[int, int, str]) -> int:
    """The end of a value's data at ``pos``, after a constructor of ``shape``."""
    kind, width, name = shape
    if kind == FIXED:
        nxt = pos + width
        if nxt > end:
            raise _end_of(name, pos, width, end)
        return nxt
    head = pos + (width if kind == VARIABLE else 2 * width)
    if head > end:
        raise _end_of(name, pos, head - pos, end)
    size = buf[pos] if width == 1 else _U32.unpack_from(buf, pos)[0]
    stop = pos + width + size
    if stop > end:
        raise DecodeError(f"{name} of {size} octets overruns the {end - pos - width} present")
    if kind == VARIABLE:
        return stop
    count = buf[pos + 1] if width == 1 else _U32.unpack_from(buf, pos + width)[0]
    if size < width:
        raise DecodeError(f"{name} size {size} is smaller than its count")
    if kind == COMPOUND:
        if count > stop - head:
            raise DecodeError(f"{name} declares {count} items, more than its {stop - head} octets can hold")
        return stop
    return _skip_array_header(buf, head, stop, count, name)


def _skip_array_header(buf, pos: int, stop: int, count: int, name: str) -> int:
    """Check an array's element constructor and count against its octets; its end (``stop``)."""
    if pos >= stop:
        raise DecodeError(f"{name} has no element constructor")
    code = buf[pos]
    pos += 1
    if code == 0x00:  # described elements: one descriptor for all, then the element format code
        pos = skip_value(buf, pos, stop, 1)
        if pos >= stop:
            raise DecodeError(f"{name} of described elements has no element format code")
        code = buf[pos]
        pos += 1
    if SHAPE[code] is None:
        raise DecodeError(f"unknown array element format code {code:#04x}")
    least = MIN_WIDTH[code]
    if least == 0:
        if count > MAX_ZERO_WIDTH_ELEMENTS:
            raise DecodeError(f"{name} declares {count} zero-width elements (at most {MAX_ZERO_WIDTH_ELEMENTS})")
    elif count * least > stop - pos:
        raise DecodeError(f"{name} declares {count} elements, more than its {stop - pos} octets can hold")
    return stop

