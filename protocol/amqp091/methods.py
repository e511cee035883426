"""AMQP 0-9-1 method classes, generated from :data:`.spec_table.METHOD_TABLE`.

Each method is a small slotted class (``BasicPublish``, ``ConnectionStartOk``...) with its fields as
attributes, class attributes ``CLASS_ID``, ``METHOD_ID``, ``NAME``, ``SYNCHRONOUS``, ``HAS_CONTENT``,
an ``encode()`` that returns the method frame payload and a ``decode(buf, offset)`` static method.

The encoder and decoder of each method are compiled once at import time from the field list (the way
``collections.namedtuple`` builds its classes): consecutive fixed-size fields become one
``struct`` call and consecutive bits one octet, so the per-frame cost on the hot path (publish,
deliver, ack) is a handful of C calls instead of an interpreter loop over field descriptors.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError

from .errors import AMQPSyntaxError, FrameError, NotImplementedMethod
from .fieldtable import decode_table, encode_table
from .spec_table import FIELD_DEFAULTS, TYPE_DEFAULTS, parse_table

_FIXED = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}
_IDS = Struct(">HH")
_U32 = Struct(">I")


class Method:
    """Base of every generated method class."""

    __slots__ = ()
    CLASS_ID = 0
    METHOD_ID = 0
    NAME = ""
    SYNCHRONOUS = False
    HAS_CONTENT = False
    FIELDS: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    def __hash__(self) -> int:  # methods are mutable records; hash by identity like a dataclass
        return id(self)

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"{type(self).__name__}({args})"

    def encode(self) -> bytes:  # pragma: no cover - replaced in every generated class
        raise NotImplementedError

    @property
    def index(self) -> int:
        return (self.CLASS_ID << 16) | self.METHOD_ID


def _shortstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if value.__class__ is str else bytes(value)
    if len(raw) > 255:
        raise ValueError(f"short string longer than 255 bytes: {raw[:40]!r}...")
    return bytes((len(raw),)) + raw


def _longstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if value.__class__ is str else bytes(value)
    return _U32.pack(len(raw)) + raw


def _camel(*words: str) -> str:
    return "".join(part.capitalize() for word in words for part in word.split("-"))


def _runs(fields: list[tuple[str, str]]):
    """Group fields into runs: ('fixed', [(name, type)...]), ('bits', [...]) or (type, [(name, type)])."""
    runs: list[tuple[str, list[tuple[str, str]]]] = []
    for name, typ in fields:
        kind = "fixed" if typ in _FIXED else "bits" if typ == "bit" else typ
        if runs and runs[-1][0] == kind and kind in ("fixed", "bits") and (
                kind != "bits" or len(runs[-1][1]) < 8):
            runs[-1][1].append((name, typ))
        else:
            runs.append((kind, [(name, typ)]))
    return runs


def _build(cls_name: str, class_id: int, meth_name: str, method_id: int, flags: str,
           fields: list[tuple[str, str]]) -> type[Method]:
    names = [n for n, _ in fields]
    defaults = [FIELD_DEFAULTS.get((cls_name, meth_name, n), TYPE_DEFAULTS[t]) for n, t in fields]
    ns: dict = {"Method": Method, "_shortstr": _shortstr, "_longstr": _longstr, "encode_table": encode_table,
                "decode_table": decode_table, "FrameError": FrameError, "_HDR": _IDS.pack(class_id, method_id),
                "_defaults": defaults}
    src: list[str] = []
    py_name = _camel(cls_name, meth_name)

    # __init__
    params = "".join(f", {n}=_defaults[{i}]" for i, n in enumerate(names))
    src.append(f"class {py_name}(Method):")
    src.append(f"    __slots__ = {tuple(names)!r}")
    src.append(f"    def __init__(self{params}):")
    for n in names:
        src.append(f"        self.{n} = {n}")
    if not names:
        src.append("        pass")

    # encode
    enc_parts = ["_HDR"]
    dec: list[str] = []
    for r, (kind, group) in enumerate(_runs(fields)):
        if kind == "fixed":
            st = Struct(">" + "".join(_FIXED[t] for _, t in group))
            ns[f"_S{r}"] = st
            enc_parts.append(f"_S{r}.pack({', '.join('self.' + n for n, _ in group)})")
            targets = "".join(f"{n}, " for n, _ in group)
            dec.append(f"    {targets}= _S{r}.unpack_from(buf, off)")
            dec.append(f"    off += {st.size}")
        elif kind == "bits":
            expr = " | ".join(f"({1 << i} if self.{n} else 0)" for i, (n, _) in enumerate(group))
            enc_parts.append(f"bytes(({expr},))")
            dec.append("    bits = buf[off]")
            dec.append("    off += 1")
            for i, (n, _) in enumerate(group):
                dec.append(f"    {n} = bits & {1 << i} != 0")
        elif kind == "shortstr":
            (n, _), = group
            enc_parts.append(f"_shortstr(self.{n})")
            dec.append("    size = buf[off]")
            dec.append(f"    {n} = str(buf[off + 1:off + 1 + size], 'utf-8')")
            dec.append("    off += 1 + size")
        elif kind == "longstr":
            (n, _), = group
            enc_parts.append(f"_longstr(self.{n})")
            dec.append("    size = buf[off] << 24 | buf[off + 1] << 16 | buf[off + 2] << 8 | buf[off + 3]")
            dec.append(f"    {n} = bytes(buf[off + 4:off + 4 + size])")
            dec.append("    off += 4 + size")
        elif kind == "table":
            (n, _), = group
            enc_parts.append(f"encode_table(self.{n})")
            dec.append(f"    {n}, off = decode_table(buf, off)")
        else:  # pragma: no cover - parse_table validates types
            raise ValueError(kind)
    src.append("    def encode(self):")
    src.append(f"        return b''.join(({', '.join(enc_parts)},))")
    src.append("def decode(buf, off):")
    src.extend(dec)
    src.append("    if off > len(buf):")
    src.append(f"        raise FrameError('truncated {cls_name}.{meth_name}', {class_id}, {method_id})")
    src.append(f"    return {py_name}({', '.join(names)})")
    exec("\n".join(src), ns)  # noqa: S102 - source generated above from the method table only
    cls = ns[py_name]
    cls.decode = staticmethod(ns["decode"])
    cls.CLASS_ID = class_id
    cls.METHOD_ID = method_id
    cls.NAME = f"{cls_name}.{meth_name}"
    cls.SYNCHRONOUS = "S" in flags
    cls.HAS_CONTENT = "C" in flags
    cls.FIELDS = tuple(names)
    cls.__module__ = __name__
    cls.__doc__ = f"AMQP 0-9-1 {cls_name}.{meth_name} ({class_id}.{method_id})."
    return cls


#: (class_id << 16 | method_id) -> method class.
METHODS_BY_INDEX: dict[int, type[Method]] = {}
#: "basic.publish" -> method class.
METHODS_BY_NAME: dict[str, type[Method]] = {}

for _row in parse_table():
    _cls = _build(*_row)
    METHODS_BY_INDEX[_cls.CLASS_ID << 16 | _cls.METHOD_ID] = _cls
    METHODS_BY_NAME[_cls.NAME] = _cls
    globals()[_cls.__name__] = _cls
del _row, _cls


def decode_method(payload: bytes) -> Method:
    """Decode a method frame payload (class id, method id, arguments).

    Unknown class/method -> 540 NOT_IMPLEMENTED; a payload too short for its fields -> 501 FRAME_ERROR;
    a short string that is not UTF-8 -> 502 SYNTAX_ERROR.
    """
    try:
        class_id, method_id = _IDS.unpack_from(payload, 0)
    except StructError as exc:
        raise FrameError("method frame shorter than its class and method ids") from exc
    cls = METHODS_BY_INDEX.get(class_id << 16 | method_id)
    if cls is None:
        raise NotImplementedMethod(f"unknown method {class_id}.{method_id}", class_id, method_id)
    try:
        return cls.decode(payload, 4)
    except (StructError, IndexError) as exc:
        raise FrameError(f"truncated '{cls.NAME}'", class_id, method_id) from exc
    except UnicodeDecodeError as exc:
        raise AMQPSyntaxError(f"'{cls.NAME}' has a short string that is not UTF-8", class_id, method_id) from exc

