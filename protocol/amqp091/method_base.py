"""The base class of the AMQP 0-9-1 method classes and the string encoders their generated code calls.

The method classes themselves are generated source (:mod:`.methods_gen`, written by :mod:`._generate`
from :data:`.spec_table.METHOD_TABLE`); this module is what that source imports, kept apart from
:mod:`.methods` so that the generated module and the module that re-exports it do not import each other.
"""

from __future__ import annotations

from struct import Struct
from typing import ClassVar

_U32 = Struct(">I")


class Method:
    """Base of every generated method class."""

    __slots__ = ()
    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    SYNCHRONOUS: ClassVar[bool] = False
    HAS_CONTENT: ClassVar[bool] = False
    FIELDS: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    def __hash__(self) -> int:  # methods are mutable records; hash by identity like a dataclass
        return id(self)

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"{type(self).__name__}({args})"

    def encode(self) -> bytes:  # pragma: no cover - overridden in every generated class
        raise NotImplementedError

    @staticmethod
    def decode(buf: bytes, off: int) -> Method:  # pragma: no cover - overridden in every generated class
        """The method whose arguments start at ``off`` (after the class and method ids)."""
        raise NotImplementedError

    @property
    def index(self) -> int:
        return (self.CLASS_ID << 16) | self.METHOD_ID


def _shortstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def _longstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return _U32.pack(len(raw)) + raw
