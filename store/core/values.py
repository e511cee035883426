"""Plain values: what field-table values become inside commands and LMDB records.

Wire codecs decode field tables into Python values with a few wrapper types (exact AMQP types,
decimals, timestamps). Commands must pack with msgpack and compare equal on every node, so the front
ends hand the core *plain* values: None, bool, int, float, str, bytes, list, dict.
"""

from __future__ import annotations

import datetime
import decimal
from typing import overload


@overload
def to_plain(value: dict) -> dict[str, object]: ...


@overload
def to_plain(value: object) -> object: ...


def to_plain(value: object) -> object:
    """``value`` as a plain value (a dict stays a dict, with str keys: the overloads say so)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    inner = getattr(value, "value", None)
    if inner is not None:
        return to_plain(inner)
    return str(value)


def as_int(value: object) -> int | None:
    """An integer argument, or None if the value is not one (bools are not integers here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
