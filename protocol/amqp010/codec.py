"""AMQP 0-10 controls, commands and structs, generated from :mod:`.spec_table`.

Every struct, control and command of the table becomes a small slotted class (``SessionAttach``,
``MessageTransfer``, ``DeliveryProperties``...) with snake_case attributes (``known_hosts``), class
attributes ``CLASS_CODE``, ``CODE``, ``NAME``, ``KIND``, ``FIELDS`` and an ``encode()``.

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

import keyword
from struct import error as StructError

from . import types as t
from .errors import FramingError
from .frames import SEG_BODY, SEG_COMMAND, SEG_CONTROL, SEG_HEADER, TRACK_COMMAND, TRACK_CONTROL, Assembly
from .spec_table import Field

SPEC = t.SPEC


def _attr(name: str) -> str:
    attr = name.replace("-", "_")
    return attr + "_" if keyword.iskeyword(attr) else attr


def _camel(*words: str) -> str:
    return "".join(part.capitalize() for word in words for part in word.split("-"))


class FieldCodec:
    """How one field is encoded: resolved once from the table."""

    __slots__ = ("name", "attr", "type", "required", "default", "is_bit", "encode", "decode")

    def __init__(self, f: Field, default) -> None:
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
            struct_key = base
            self.encode = lambda v, k=struct_key: STRUCTS[k].encode_struct(v)
            self.decode = lambda buf, pos, depth=0, k=struct_key: STRUCTS[k].decode_struct(buf, pos, depth)
        elif base == "array":
            element = self._element(f.type)
            self.encode = lambda v, e=element: t.encode_array(v, e)
            self.decode = lambda buf, pos, depth=0: t.decode("array", buf, pos, depth)
        else:
            self.encode = t.ENCODERS[base]
            if base in t.NESTED:
                self.decode = lambda buf, pos, depth=0, b=base: t.decode(b, buf, pos, depth)
            else:
                self.decode = lambda buf, pos, depth=0, b=base: t.decode_flat(b, buf, pos)

    @staticmethod
    def _element(type_name: str) -> str | None:
        domain = SPEC.domains.get(type_name)
        if domain is None or domain.element is None:
            return None
        base = SPEC.base_type(domain.element)
        return base if base in SPEC.types else None


class Composite:
    """Base of structs, controls and commands."""

    __slots__ = ()
    FIELDS: tuple[FieldCodec, ...] = ()
    NAME = ""
    PACK = 2

    def __init__(self, **kwargs) -> None:
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
    def decode_fields(cls, buf, pos: int, end: int | None = None, depth: int = 0):
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
    CODE: int | None = None  # class code << 8 | struct code
    SIZE = 0
    KEY = ""

    def encode_struct(self) -> bytes:
        body = self.encode_fields()
        if self.CODE is not None:
            body = self.CODE.to_bytes(2, "big") + body
        return len(body).to_bytes(self.SIZE, "big") + body if self.SIZE else body

    @classmethod
    def decode_struct(cls, buf, pos: int, depth: int = 0):
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
    KIND = ""
    CLASS_CODE = 0
    CODE = 0
    RESULT: type[StructBase] | None = None
    HAS_SEGMENTS = False

    def encode_segment(self) -> bytes:
        return bytes((self.CLASS_CODE, self.CODE)) + self.encode_fields()


class Command(Method):
    """A command: ``sync`` is the session header's flag; ``id`` the session command-id (not encoded)."""

    __slots__ = ("sync", "id", "headers", "body")
    KIND = "command"

    def __init__(self, **kwargs) -> None:
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


STRUCTS: dict[str, type[StructBase]] = {}  # "message.delivery-properties" -> class
STRUCTS_BY_CODE: dict[int, type[StructBase]] = {}
CONTROLS: dict[int, type[Control]] = {}  # class_code << 8 | code
COMMANDS: dict[int, type[Command]] = {}
BY_NAME: dict[str, type] = {}  # "session.attach" -> class


def _build() -> None:
    t.ENCODERS["struct32"] = encode_struct32
    t.DECODERS["struct32"] = decode_struct32
    names = [s.name for s in SPEC.structs.values()]
    for key, s in SPEC.structs.items():
        py_name = _camel(s.name) if names.count(s.name) == 1 else _camel(s.cls, s.name)
        if py_name == "Header":
            py_name = "SessionHeader"
        cls = type(py_name, (StructBase,), {"__slots__": tuple(_attr(f.name) for f in s.fields)})
        cls.CODE, cls.SIZE, cls.PACK, cls.NAME, cls.KEY = s.code, s.size, s.pack, key, key
        STRUCTS[key] = cls
        if s.code is not None:
            STRUCTS_BY_CODE[s.code] = cls
        globals()[py_name] = cls
    # Field codecs refer to STRUCTS lazily, so they can be built after every struct class exists.
    for key, s in SPEC.structs.items():
        STRUCTS[key].FIELDS = tuple(FieldCodec(f, s.defaults.get(f.name, None) and bool(s.defaults[f.name]))
                                    for f in s.fields)
    for m in SPEC.methods:
        base = Command if m.kind == "command" else Control
        py_name = _camel(m.cls, m.name)
        cls = type(py_name, (base,), {"__slots__": tuple(_attr(f.name) for f in m.fields)})
        cls.CLASS_CODE, cls.CODE, cls.NAME = m.class_code, m.code, f"{m.cls}.{m.name}"
        cls.FIELDS = tuple(FieldCodec(f, None) for f in m.fields)
        cls.RESULT = STRUCTS[m.result] if m.result else None
        cls.HAS_SEGMENTS = bool(m.segments)
        (COMMANDS if m.kind == "command" else CONTROLS)[m.class_code << 8 | m.code] = cls
        BY_NAME[cls.NAME] = cls
        globals()[py_name] = cls


def encode_struct32(value: StructBase) -> bytes:
    body = value.CODE.to_bytes(2, "big") + value.encode_fields()
    return len(body).to_bytes(4, "big") + body


def decode_struct32(buf, pos: int, depth: int = 0):
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
    try:
        if len(payload) < 2:
            raise FramingError("segment too short for its class and method codes")
        index = payload[0] << 8 | payload[1]
        if seg_type == SEG_CONTROL:
            if assembly.track != TRACK_CONTROL:
                raise FramingError("a control on the command track")
            cls = CONTROLS.get(index)
            if cls is None:
                raise FramingError(f"unknown control {payload[0]:#04x}.{payload[1]:#04x}")
            method, end = cls.decode_fields(payload, 2)
        elif seg_type == SEG_COMMAND:
            if assembly.track != TRACK_COMMAND:
                raise FramingError("a command on the control track")
            cls = COMMANDS.get(index)
            if cls is None:
                raise UnknownCommand(payload[0], payload[1])
            if len(payload) < 4 or payload[2] != 1:
                raise FramingError("malformed session header")
            method, end = cls.decode_fields(payload, 4)
            method.sync = bool(payload[3] & 1)
            method.id = None
            method.headers, method.body = _content(segments[1:], cls)
        else:
            raise FramingError(f"an assembly cannot start with a segment of type {seg_type}")
    except (StructError, IndexError) as exc:
        raise FramingError(f"truncated control or command: {exc}") from exc
    if end != len(payload):
        raise FramingError(f"{cls.NAME}: {len(payload) - end} trailing octets")
    return method


def _content(segments: list[tuple[int, bytes]], cls) -> tuple[list | None, bytes | None]:
    headers = body = None
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
