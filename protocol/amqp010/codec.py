"""AMQP 0-10 controls, commands and structs, generated from :mod:`.spec_table`.

Every struct, control and command of the table is a small slotted class (``SessionAttach``,
``MessageTransfer``, ``DeliveryProperties``...) with typed snake_case attributes (``known_hosts``),
class attributes ``CLASS_CODE``, ``CODE``, ``NAME``, ``KIND``, ``FIELDS`` and an ``encode()``.  The
classes are generated source checked in (:mod:`.codec_gen`, written by :mod:`._generate` with
``python -m raftmq.protocol.codegen``, pamqp's way) so that type checkers and editors see them; their
base classes and packing-flag codec are in :mod:`.composite`.  This module attaches to each class its
field codecs (``FIELDS``, built from the same table), registers the classes by code and name, and
re-exports them.

Encoding rules (spec 3.x structs, 5.7 controls, 5.8 commands):

* a control is ``class-code control-code`` + its arguments as an unsized, uncoded struct with two
  octets of packing flags; a command additionally carries the ``session.header`` struct (one size
  octet, one packing-flag octet: ``sync``) between its codes and its arguments;
* packing flags: bit *i* (least significant first, octet by octet) says field *i* is present; a
  ``bit`` field is the flag itself and has no data;
* a struct is ``[size] [class-code struct-code] [packing flags] fields`` with widths from its
  definition; ``struct32`` values and header segment entries are sized (4) and coded.

Decoding never fails on a missing required field: :meth:`Composite.missing` lists them so that the
front end can answer with the right execution exception (the spec's rules differ per command).
Truncated or malformed data is a :class:`FramingError`.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import error as StructError
from typing import Any

from . import types as t
from ._generate import attr_name as _attr
from ._generate import method_default, struct_default
from .codec_gen import *  # noqa: F403 - the generated classes are this module's public names
from .codec_gen import METHOD_CLASSES, STRUCT_CLASSES
from .composite import Command as Command
from .composite import Composite as Composite
from .composite import Control as Control
from .composite import Method as Method
from .composite import StructBase as StructBase
from .errors import FramingError
from .frames import SEG_BODY, SEG_COMMAND, SEG_CONTROL, SEG_HEADER, TRACK_COMMAND, TRACK_CONTROL, Assembly
from .spec_table import Field

SPEC = t.SPEC

Encode = Callable[[Any], bytes]
Decode = Callable[[bytes, int, int], tuple[Any, int]]


def _struct_codec(key: str) -> tuple[Encode, Decode]:
    def encode(value: Any) -> bytes:
        return STRUCTS[key].encode_struct(value)

    def decode(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
        return STRUCTS[key].decode_struct(buf, pos, depth)
    return encode, decode


def _array_codec(element: str | None) -> tuple[Encode, Decode]:
    def encode(value: Any) -> bytes:
        return t.encode_array(value, element)

    def decode(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
        return t.decode("array", buf, pos, depth)
    return encode, decode


def _primitive_decoder(base: str) -> Decode:
    if base in t.NESTED:
        def nested(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
            return t.decode(base, buf, pos, depth)
        return nested

    def flat(buf: bytes, pos: int, depth: int = 0) -> tuple[Any, int]:
        return t.decode_flat(base, buf, pos)
    return flat


class FieldCodec:
    """How one field is encoded: resolved once from the table."""

    __slots__ = ("name", "attr", "type", "required", "default", "is_bit", "encode", "decode")
    encode: Encode
    decode: Decode

    def __init__(self, f: Field, default: Any) -> None:
        self.name = f.name
        self.attr = _attr(f.name)
        self.type = f.type
        self.required = f.required
        self.default = default
        base = SPEC.base_type(f.type)
        self.is_bit = base == "bit"
        if self.is_bit and default is None:
            self.default = False  # a bit is a packing flag: always present, never None
        if base in SPEC.structs:
            self.encode, self.decode = _struct_codec(base)
        elif base == "array":
            self.encode, self.decode = _array_codec(self._element(f.type))
        else:
            self.encode = t.ENCODERS[base]
            self.decode = _primitive_decoder(base)

    @staticmethod
    def _element(type_name: str) -> str | None:
        domain = SPEC.domains.get(type_name)
        if domain is None or domain.element is None:
            return None
        base = SPEC.base_type(domain.element)
        return base if base in SPEC.types else None


STRUCTS: dict[str, type[StructBase]] = {}  # "message.delivery-properties" -> class
STRUCTS_BY_CODE: dict[int, type[StructBase]] = {}
CONTROLS: dict[int, type[Control]] = {}  # class_code << 8 | code
COMMANDS: dict[int, type[Command]] = {}
BY_NAME: dict[str, type] = {}  # "session.attach" -> class


def _build() -> None:
    """Register the generated classes and attach their field codecs (built from the same table)."""
    t.ENCODERS["struct32"] = encode_struct32
    t.DECODERS["struct32"] = decode_struct32
    for cls in STRUCT_CLASSES:
        s = SPEC.structs[cls.KEY]
        _check_generated(cls, s.fields)
        STRUCTS[cls.KEY] = cls
        if cls.CODE is not None:
            STRUCTS_BY_CODE[cls.CODE] = cls
    # Field codecs refer to STRUCTS lazily, so they can be built after every struct class exists.
    for cls in STRUCT_CLASSES:
        s = SPEC.structs[cls.KEY]
        cls.FIELDS = tuple(FieldCodec(f, struct_default(SPEC, cls.KEY, f)) for f in s.fields)
    methods = {f"{m.cls}.{m.name}": m for m in SPEC.methods}
    for mcls in METHOD_CLASSES:
        m = methods[mcls.NAME]
        _check_generated(mcls, m.fields)
        mcls.FIELDS = tuple(FieldCodec(f, method_default(SPEC, f)) for f in m.fields)
        if issubclass(mcls, Command):
            COMMANDS[m.class_code << 8 | m.code] = mcls
        else:
            CONTROLS[m.class_code << 8 | m.code] = mcls
        BY_NAME[mcls.NAME] = mcls


def _check_generated(cls: type[Composite], fields: list[Field]) -> None:
    """The checked-in generated class has the table's fields, in order (else: regenerate it)."""
    if cls.__slots__ != tuple(_attr(f.name) for f in fields):
        raise ImportError(f"{cls.__name__} does not match the spec table: run python -m raftmq.protocol.codegen")


def encode_struct32(value: StructBase) -> bytes:
    code = value.CODE
    if code is None:
        raise ValueError(f"{value.NAME} is an uncoded struct: it cannot be a struct32 value")
    body = code.to_bytes(2, "big") + value.encode_fields()
    return len(body).to_bytes(4, "big") + body


def decode_struct32(buf: bytes, pos: int, depth: int = 0) -> tuple[StructBase, int]:
    if depth > t.MAX_DEPTH:
        t.check_depth(depth)
    size = int.from_bytes(buf[pos:pos + 4], "big")
    end = pos + 4 + size
    if end > len(buf) or size < 2:
        raise FramingError("struct32 overruns its data")
    code = int.from_bytes(buf[pos + 4:pos + 6], "big")
    cls = STRUCTS_BY_CODE.get(code)
    if cls is None:
        raise FramingError(f"unknown struct code {code:#06x}")
    obj, _ = cls.decode_fields(buf, pos + 6, end, depth)
    return obj, end


_build()


# ---------------------------------------------------------------------------------------------- assemblies

def decode_assembly(assembly: Assembly) -> Method:
    """The control or command an assembly carries (with header structs and body for transfers)."""
    segments = assembly.segments
    seg_type, payload = segments[0]
    method: Method
    try:
        if len(payload) < 2:
            raise FramingError("segment too short for its class and method codes")
        index = payload[0] << 8 | payload[1]
        if seg_type == SEG_CONTROL:
            if assembly.track != TRACK_CONTROL:
                raise FramingError("a control on the command track")
            control_cls = CONTROLS.get(index)
            if control_cls is None:
                raise FramingError(f"unknown control {payload[0]:#04x}.{payload[1]:#04x}")
            method, end = control_cls.decode_fields(payload, 2)
        elif seg_type == SEG_COMMAND:
            if assembly.track != TRACK_COMMAND:
                raise FramingError("a command on the control track")
            command_cls = COMMANDS.get(index)
            if command_cls is None:
                raise UnknownCommand(payload[0], payload[1])
            if len(payload) < 4 or payload[2] != 1:
                raise FramingError("malformed session header")
            command, end = command_cls.decode_fields(payload, 4)
            command.sync = bool(payload[3] & 1)
            command.id = None
            command.headers, command.body = _content(segments[1:], command_cls)
            method = command
        else:
            raise FramingError(f"an assembly cannot start with a segment of type {seg_type}")
    except (StructError, IndexError) as exc:
        raise FramingError(f"truncated control or command: {exc}") from exc
    if end != len(payload):
        raise FramingError(f"{method.NAME}: {len(payload) - end} trailing octets")
    return method


def _content(segments: list[tuple[int, bytes]], cls: type[Command]) -> tuple[list[StructBase] | None, bytes | None]:
    headers: list[StructBase] | None = None
    body: bytes | None = None
    for seg_type, payload in segments:
        if not cls.HAS_SEGMENTS:
            raise FramingError(f"{cls.NAME} carries no segments")
        if seg_type == SEG_HEADER and headers is None and body is None:
            headers = []
            pos = 0
            while pos < len(payload):
                struct, pos = decode_struct32(payload, pos)
                headers.append(struct)
        elif seg_type == SEG_BODY and body is None:
            body = payload
        else:
            raise FramingError(f"unexpected segment of type {seg_type} in {cls.NAME}")
    return headers, body


def segments_of(method: Method) -> tuple[int, list[tuple[int, bytes]]]:
    """(track, segments) to frame ``method`` with :func:`.frames.encode_assembly`."""
    if isinstance(method, Command):
        segments = [(SEG_COMMAND, method.encode_segment())]
        if method.headers is not None:
            segments.append((SEG_HEADER, b"".join(encode_struct32(h) for h in method.headers)))
        if method.body is not None:
            segments.append((SEG_BODY, bytes(method.body)))
        return TRACK_COMMAND, segments
    return TRACK_CONTROL, [(SEG_CONTROL, method.encode_segment())]


class UnknownCommand(Exception):
    """A command code the table does not define: answered with execution.exception not-implemented."""

    def __init__(self, class_code: int, code: int) -> None:
        super().__init__(f"unknown command {class_code:#04x}.{code:#04x}")
        self.class_code = class_code
        self.code = code
