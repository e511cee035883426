"""The base classes of the AMQP 0-10 structs, controls and commands, and their packing-flag codec.

The classes themselves are generated source (:mod:`.codec_gen`, written by :mod:`._generate` from
:mod:`.spec_table`); :mod:`.codec` attaches each class's field codecs (``FIELDS``) and re-exports them.
This module is what the generated source imports, kept apart from :mod:`.codec` so that the two do not
import each other.

Encoding rules (spec 3.x structs, 5.7 controls, 5.8 commands): packing flags, bit *i* (least
significant first, octet by octet) says field *i* is present; a ``bit`` field is the flag itself and has
no data.  Decoding never fails on a missing required field: :meth:`Composite.missing` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

from .errors import FramingError

_C = TypeVar("_C", bound="Composite")
_S = TypeVar("_S", bound="StructBase")


class FieldSpec(Protocol):
    """What the base classes need of one field's codec (:class:`.codec.FieldCodec`)."""

    @property
    def name(self) -> str: ...
    @property
    def attr(self) -> str: ...
    @property
    def required(self) -> bool: ...
    @property
    def is_bit(self) -> bool: ...
    @property
    def default(self) -> Any: ...
    @property
    def encode(self) -> Callable[[Any], bytes]: ...
    @property
    def decode(self) -> Callable[[bytes, int, int], tuple[Any, int]]: ...


class Composite:
    """Base of structs, controls and commands."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = ()
    NAME: ClassVar[str] = ""
    PACK: ClassVar[int] = 2

    def __init__(self, **kwargs: Any) -> None:
        for f in self.FIELDS:
            setattr(self, f.attr, kwargs.pop(f.attr, f.default))
        if kwargs:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(kwargs)}")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f.attr) == getattr(other, f.attr) for f in self.FIELDS)

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.attr}={getattr(self, f.attr)!r}" for f in self.FIELDS
                          if getattr(self, f.attr) is not None and getattr(self, f.attr) is not False)
        return f"{type(self).__name__}({shown})"

    def missing(self) -> list[str]:
        """Required fields that are absent (None)."""
        return [f.name for f in self.FIELDS if f.required and not f.is_bit and getattr(self, f.attr) is None]

    def encode_fields(self) -> bytes:
        flags = 0
        parts = []
        for i, f in enumerate(self.FIELDS):
            value = getattr(self, f.attr)
            if f.is_bit:
                if value:
                    flags |= 1 << i
            elif value is not None:
                flags |= 1 << i
                parts.append(f.encode(value))
        return flags.to_bytes(self.PACK, "little") + b"".join(parts) if self.PACK else b"".join(parts)

    @classmethod
    def decode_fields(cls: type[_C], buf: bytes, pos: int, end: int | None = None,
                      depth: int = 0) -> tuple[_C, int]:
        """Decode the fields at ``pos``; ``depth``: how deep inside maps, lists, arrays and struct32
        values this struct sits (its map, array and struct32 fields count one level deeper)."""
        pack = cls.PACK
        flags = int.from_bytes(buf[pos:pos + pack], "little")
        if pos + pack > len(buf):
            raise FramingError(f"{cls.NAME}: truncated packing flags")
        pos += pack
        obj = cls.__new__(cls)
        for i, f in enumerate(cls.FIELDS):
            present = flags >> i & 1
            if f.is_bit:
                setattr(obj, f.attr, bool(present))
            elif present:
                value, pos = f.decode(buf, pos, depth)
                setattr(obj, f.attr, value)
            else:
                setattr(obj, f.attr, None)
        if flags >> len(cls.FIELDS) if pack else 0:
            raise FramingError(f"{cls.NAME}: reserved packing flags set")
        if pos > (len(buf) if end is None else end):
            raise FramingError(f"{cls.NAME}: fields overrun the data")
        return obj, pos


class StructBase(Composite):
    __slots__ = ()
    CODE: ClassVar[int | None] = None  # class code << 8 | struct code
    SIZE: ClassVar[int] = 0
    KEY: ClassVar[str] = ""

    def encode_struct(self) -> bytes:
        body = self.encode_fields()
        if self.CODE is not None:
            body = self.CODE.to_bytes(2, "big") + body
        return len(body).to_bytes(self.SIZE, "big") + body if self.SIZE else body

    @classmethod
    def decode_struct(cls: type[_S], buf: bytes, pos: int, depth: int = 0) -> tuple[_S, int]:
        end = None
        if cls.SIZE:
            size = int.from_bytes(buf[pos:pos + cls.SIZE], "big")
            pos += cls.SIZE
            end = pos + size
            if end > len(buf):
                raise FramingError(f"{cls.NAME}: struct overruns its data")
        if cls.CODE is not None:
            code = int.from_bytes(buf[pos:pos + 2], "big")
            if code != cls.CODE:
                raise FramingError(f"{cls.NAME}: struct code {code:#06x}, expected {cls.CODE:#06x}")
            pos += 2
        obj, pos = cls.decode_fields(buf, pos, end, depth)
        return obj, (end if end is not None else pos)


class Method(Composite):
    """A control or command."""

    __slots__ = ()
    KIND: ClassVar[str] = ""
    CLASS_CODE: ClassVar[int] = 0
    CODE: ClassVar[int] = 0
    RESULT: ClassVar[type[StructBase] | None] = None
    HAS_SEGMENTS: ClassVar[bool] = False

    def encode_segment(self) -> bytes:
        return bytes((self.CLASS_CODE, self.CODE)) + self.encode_fields()


class Command(Method):
    """A command: ``sync`` is the session header's flag; ``id`` the session command-id (not encoded);
    ``headers`` the structs of its header segment and ``body`` its body segment (message.transfer)."""

    __slots__ = ("sync", "id", "headers", "body")
    KIND = "command"
    sync: bool
    id: int | None
    headers: list[StructBase] | None
    body: bytes | None

    def __init__(self, **kwargs: Any) -> None:
        self.sync = kwargs.pop("sync", False)
        self.id = kwargs.pop("id", None)
        self.headers = kwargs.pop("headers", None)  # header segment structs (message.transfer)
        self.body = kwargs.pop("body", None)  # body segment (message.transfer)
        super().__init__(**kwargs)

    def encode_segment(self) -> bytes:
        return bytes((self.CLASS_CODE, self.CODE, 1, 1 if self.sync else 0)) + self.encode_fields()


class Control(Method):
    __slots__ = ()
    KIND = "control"
