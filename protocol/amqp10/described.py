"""The base classes of the AMQP 1.0 composites (1.3.2) and message sections (restricted described
types, 1.3.5).

The classes themselves are generated source (:mod:`.performatives_gen`, written by :mod:`._generate` from
:data:`.spec_table.DESCRIBED`); :mod:`.performatives` attaches their field codecs (``FIELDS``) and section
codecs (``_ENCODE``, ``_CHECK``) and re-exports them.  This module is what the generated source imports,
kept apart from :mod:`.performatives` so that the two do not import each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

from . import types as t
from .errors import DecodeError, InvalidField

_C = TypeVar("_C", bound="Composite")
_S = TypeVar("_S", bound="Section")


class FieldSpec(Protocol):
    """What :class:`Composite` needs of one field's codec (:class:`.performatives.FieldCodec`)."""

    @property
    def name(self) -> str: ...
    @property
    def attr(self) -> str: ...
    @property
    def default(self) -> Any: ...

    def encode(self, value: Any) -> bytes: ...

    def check(self, value: Any, owner: str) -> Any: ...


class Composite(t.DescribedType):
    """Base of the composite types (1.3.2)."""

    __slots__ = ()
    NAME: ClassVar[str] = ""
    CODE: ClassVar[int] = 0
    SYMBOL: ClassVar[str] = ""
    PROVIDES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = ()
    _PREFIX: ClassVar[bytes] = b""

    def __init__(self, **kwargs: Any) -> None:
        for f in self.FIELDS:
            setattr(self, f.attr, kwargs.pop(f.attr, f.default))
        if kwargs:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(kwargs)}")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f.attr) == getattr(other, f.attr) for f in self.FIELDS)

    # Mutable records: unhashable (a class that defines __eq__ and no __hash__ gets __hash__ = None).
    __hash__: ClassVar[None]  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.attr}={getattr(self, f.attr)!r}" for f in self.FIELDS
                          if getattr(self, f.attr) is not None and getattr(self, f.attr) != f.default)
        return f"{type(self).__name__}({shown})"

    def encode(self) -> bytes:
        parts = []
        used = 0
        for i, f in enumerate(self.FIELDS):
            value = getattr(self, f.attr)
            if value is None or (f.default is not None and value == f.default and type(value) is type(f.default)):
                parts.append(b"\x40")
                continue
            try:
                parts.append(f.encode(value))
            except (ValueError, TypeError, UnicodeError, OverflowError) as exc:
                raise ValueError(f"{self.NAME}.{f.name}: {exc}") from exc
            used = i + 1
        if not used:
            return self._PREFIX + b"\x45"
        return self._PREFIX + t.encode_compound("list8", "list32", used, b"".join(parts[:used]))

    @classmethod
    def from_value(cls: type[_C], value: object) -> _C:
        """An instance from the described value's value (a decoded list of fields)."""
        if not isinstance(value, list):
            raise DecodeError(f"{cls.NAME} is a described list, got {type(value).__name__}")
        fields = cls.FIELDS
        if len(value) > len(fields):
            raise DecodeError(f"{cls.NAME} has {len(fields)} fields, {len(value)} were sent")
        obj = cls.__new__(cls)
        n = len(value)
        for i, f in enumerate(fields):
            setattr(obj, f.attr, f.check(value[i] if i < n else None, cls.NAME))
        return obj


class Section(t.DescribedType):
    """Base of the restricted described types (message sections 3.2.2-3.2.9): one ``value``."""

    __slots__ = ("value",)
    NAME: ClassVar[str] = ""
    CODE: ClassVar[int] = 0
    SYMBOL: ClassVar[str] = ""
    PROVIDES: ClassVar[tuple[str, ...]] = ()
    SOURCE: ClassVar[str] = "*"
    _PREFIX: ClassVar[bytes] = b""
    _ENCODE: ClassVar[Callable[[Any], bytes]] = staticmethod(t.encode_value)
    _CHECK: ClassVar[Callable[[Any], Any] | None] = None
    value: Any

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Section) and type(self) is type(other) and self.value == other.value

    # Mutable records: unhashable (a class that defines __eq__ and no __hash__ gets __hash__ = None).
    __hash__: ClassVar[None]  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def encode(self) -> bytes:
        return self._PREFIX + type(self)._ENCODE(self.value)

    @classmethod
    def from_value(cls: type[_S], value: object) -> _S:
        check = cls._CHECK
        if check is not None:
            if value is None:
                raise InvalidField(f"{cls.NAME} holds null, not a {cls.SOURCE}")
            try:
                value = check(value)
            except ValueError as exc:
                raise InvalidField(f"{cls.NAME}: {exc}, got {type(value).__name__}") from None
        return cls(value)


#: A class of the table: a composite (performatives, Header, Properties...) or a section.
DescribedClass = type[Composite] | type[Section]
