"""AMQP 1.0 performatives, SASL frames, definitions and message sections, generated from
:data:`.spec_table.DESCRIBED`.

Every described type of the table becomes a small slotted class: composites (1.3.2) such as
:class:`Open`, :class:`Attach`, :class:`Transfer`, :class:`Source`, :class:`Error`, :class:`Header`,
:class:`Properties`, :class:`Accepted` have one snake_case attribute per field (``max_frame_size``);
restricted described types (1.3.5), the message sections :class:`Data`, :class:`AmqpValue`,
:class:`AmqpSequence`, :class:`ApplicationProperties`, :class:`MessageAnnotations`,
:class:`DeliveryAnnotations`, :class:`Footer`, have one attribute, ``value``.  Class attributes:
``NAME`` (``"attach"``), ``CODE`` (the ulong descriptor), ``SYMBOL`` (``"amqp:attach:list"``),
``PROVIDES`` and, for composites, ``FIELDS``.

Encoding (1.4): a composite is a described list, its descriptor the ulong code as smallulong
(``00 53 12`` for attach); fields equal to their default are sent as null (1.3.4: "A default value for the
field if no value is encoded") and trailing nulls are omitted.  A ``multiple`` field is a Python list,
sent as an array of the field's type (1.4).  Keys of ``fields`` maps (2.8.13) are sent as symbols even
when given as plain str; keys of ``annotations`` maps (3.2.10) as symbols (str) or ulongs (int).

Decoding: missing and null fields take their defaults; a ``multiple`` field decodes to a list whether it
came as one value or as an array (null stays None).  A mandatory field left null, a value of the wrong
type (a handle that is not a uint, a role that is not a boolean), a multiple-and-mandatory field with no
value (1.4), or a composite with more list items than fields is an :class:`InvalidField`
(amqp:invalid-field) or :class:`DecodeError`.  Fields typed ``*`` (attach's source and target, transfer's
state, properties' message-id...) hold whatever was sent; described values with a descriptor of this
table become instances of its class (``Source``, ``Accepted``), others stay :class:`.types.Described`.
"""

from __future__ import annotations

import keyword
import uuid
from collections.abc import Callable

from . import types as t
from .errors import DecodeError, InvalidField
from .spec_table import Described as DescribedDef
from .spec_table import Field

SPEC = t.SPEC
#: Choices of the restricted types: ``CHOICES["sender-settle-mode"]["settled"] == 1``.
CHOICES: dict[str, dict[str, object]] = {name: dict(r.choices) for name, r in SPEC.restricted.items() if r.choices}
#: The error conditions of 2.8.15-2.8.18 by short name: ``CONDITIONS["decode-error"] == "amqp:decode-error"``.
CONDITIONS: dict[str, t.Symbol] = {name: t.Symbol(sym) for name, sym in SPEC.conditions.items()}


def _attr(name: str) -> str:
    attr = name.replace("-", "_")
    return attr + "_" if keyword.iskeyword(attr) else attr


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def _key_kind(type_name: str) -> str | None:
    """How the keys of a map-typed field are encoded: "symbol" (fields, filter-set), "annotation"."""
    while type_name in SPEC.restricted:
        if type_name in ("fields", "filter-set"):
            return "symbol"
        if type_name == "annotations":
            return "annotation"
        type_name = SPEC.restricted[type_name].source
    return None


def _annotation_key(key) -> bytes:
    if isinstance(key, int) and not isinstance(key, bool):
        return t.encode_ulong(key)
    return t.ENCODERS["symbol"](key)


def _encode_keyed_map(mapping, key_kind: str) -> bytes:
    if not isinstance(mapping, dict):
        raise ValueError(f"a map needs a dict, got {type(mapping).__name__}")
    key_encoder = t.ENCODERS["symbol"] if key_kind == "symbol" else _annotation_key
    parts = []
    for key, item in mapping.items():
        parts.append(key_encoder(key))
        parts.append(t.encode_value(item))
    return t.encode_compound("map8", "map32", 2 * len(mapping), b"".join(parts))


# ---------------------------------------------------------------------------------------- field checks
_INT_TYPES = {"ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long"}


def _checker(source: str) -> Callable[[object], object]:
    """A function that returns a decoded value as the field's Python type, or raises ValueError."""
    if source in _INT_TYPES:
        lo, hi = t.INT_RANGES[source]

        def check_int(v):
            if v.__class__ is not int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"expected {source}")
            if not lo <= v <= hi:
                raise ValueError(f"{v} is out of range for {source}")
            return v
        return check_int
    simple: dict[str, tuple[type, ...]] = {
        "boolean": (bool,), "string": (str,), "binary": (bytes,), "map": (dict,), "list": (list,),
        "uuid": (uuid.UUID,), "float": (float,), "double": (float,), "char": (t.Char,),
        "array": (t.Array,), "decimal32": (t.Decimal32,), "decimal64": (t.Decimal64,),
        "decimal128": (t.Decimal128,),
    }
    if source in simple:
        kinds = simple[source]

        def check(v):
            if not isinstance(v, kinds):
                raise ValueError(f"expected {source}")
            return v
        return check
    if source == "symbol":
        def check_symbol(v):
            if v.__class__ is t.Symbol:
                return v
            if isinstance(v, str) and v.isascii():  # sent as a string: lenient, it is still a name
                return t.Symbol(v)
            raise ValueError("expected symbol")
        return check_symbol
    if source == "timestamp":
        def check_timestamp(v):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError("expected timestamp")
            return t.Timestamp(v)
        return check_timestamp
    if source == "null":
        def check_null(v):
            raise ValueError("expected null")
        return check_null
    raise AssertionError(f"no checker for {source}")  # pragma: no cover


class FieldCodec:
    """How one field of a composite is encoded and checked: resolved once from the table."""

    __slots__ = ("name", "attr", "type", "source", "mandatory", "multiple", "default", "requires",
                 "encode_one", "check_one")

    def __init__(self, f: Field) -> None:
        self.name = f.name
        self.attr = _attr(f.name)
        self.type = f.type
        self.source = SPEC.source_of(f.type)
        self.mandatory = f.mandatory
        self.multiple = f.multiple
        self.requires = f.requires
        source = self.source
        self.default = t.Symbol(f.default) if source == "symbol" and f.default is not None else f.default
        if source == "*":
            self.encode_one = t.encode_value
            self.check_one = _convert
        elif source in SPEC.described:
            self.encode_one = lambda v, n=source: _encode_composite_field(n, v)
            self.check_one = lambda v, n=source: _expect(n, v)
        elif source == "map" and _key_kind(f.type):
            key_kind = _key_kind(f.type)
            self.encode_one = lambda v: _encode_keyed_map(v, key_kind)
            self.check_one = _checker("map")
        else:
            self.encode_one = t.ENCODERS[source]
            self.check_one = _checker(source)

    def encode(self, value) -> bytes:
        if self.multiple and isinstance(value, t.Array):
            return t.encode_array(value)
        if self.multiple and isinstance(value, (list, tuple)):
            if self.source in SPEC.described or self.source == "*":
                raise ValueError(f"{self.name}: multiple values of {self.source} are not supported")
            return t.encode_array(t.Array(self.source, list(value)))
        return self.encode_one(value)

    def check(self, value, owner: str):
        """The decoded ``value`` as this field's attribute value, or InvalidField."""
        if value is None:
            if self.mandatory:
                raise InvalidField(f"{owner}.{self.name} is mandatory but null")
            return self.default
        try:
            if self.multiple:
                if isinstance(value, t.Array):
                    items = [self.check_one(v) for v in value.items]
                    if self.mandatory and not items:
                        raise InvalidField(f"{owner}.{self.name} is mandatory but an empty array (1.4)")
                    return items
                return [self.check_one(value)]
            return self.check_one(value)
        except ValueError as exc:
            raise InvalidField(f"{owner}.{self.name}: {exc}, got {type(value).__name__}") from None


def _encode_composite_field(name: str, value) -> bytes:
    cls = BY_NAME[name]
    if not isinstance(value, cls):
        raise ValueError(f"expected {cls.__name__}, got {type(value).__name__}")
    return value.encode()


def _expect(name: str, value):
    converted = _convert(value)
    if not isinstance(converted, BY_NAME[name]):
        raise ValueError(f"expected {name}")
    return converted


# --------------------------------------------------------------------------------------------- classes
class Composite(t.DescribedType):
    """Base of the composite types (1.3.2)."""

    __slots__ = ()
    NAME = ""
    CODE = 0
    SYMBOL = ""
    PROVIDES: tuple[str, ...] = ()
    FIELDS: tuple[FieldCodec, ...] = ()
    _PREFIX = b""

    def __init__(self, **kwargs) -> None:
        for f in self.FIELDS:
            setattr(self, f.attr, kwargs.pop(f.attr, f.default))
        if kwargs:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(kwargs)}")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, f.attr) == getattr(other, f.attr) for f in self.FIELDS)

    __hash__ = None  # mutable records

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
    def from_value(cls, value):
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
    NAME = ""
    CODE = 0
    SYMBOL = ""
    PROVIDES: tuple[str, ...] = ()
    SOURCE = "*"
    _PREFIX = b""
    _ENCODE: Callable[[object], bytes] = staticmethod(t.encode_value)
    _CHECK: Callable[[object], object] | None = None

    def __init__(self, value=None) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.value == other.value

    __hash__ = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"

    def encode(self) -> bytes:
        return self._PREFIX + type(self)._ENCODE(self.value)

    @classmethod
    def from_value(cls, value):
        if cls._CHECK is not None:
            if value is None:
                raise InvalidField(f"{cls.NAME} holds null, not a {cls.SOURCE}")
            try:
                value = cls._CHECK(value)
            except ValueError as exc:
                raise InvalidField(f"{cls.NAME}: {exc}, got {type(value).__name__}") from None
        return cls(value)


BY_NAME: dict[str, type] = {}  # "attach" -> Attach
BY_CODE: dict[int, type] = {}  # 0x12 -> Attach
BY_SYMBOL: dict[str, type] = {}  # "amqp:attach:list" -> Attach


def _build() -> None:
    for d in SPEC.described.values():
        _make(d)
    for d in SPEC.described.values():  # field codecs refer to classes by name: build them once all exist
        if d.composite:
            BY_NAME[d.name].FIELDS = tuple(FieldCodec(f) for f in d.fields)


def _make(d: DescribedDef) -> None:
    py_name = _camel(d.name)
    if d.composite:
        cls = type(py_name, (Composite,), {"__slots__": tuple(_attr(f.name) for f in d.fields),
                                           "__doc__": f"The {d.name} composite ({d.symbol})."})
    else:
        source = SPEC.source_of(d.source)
        body: dict = {"__slots__": (), "__doc__": f"The {d.name} section ({d.symbol}): one {d.source}."}
        body["SOURCE"] = d.source
        if source != "*":
            key_kind = _key_kind(d.source)
            encoder = (lambda v, k=key_kind: _encode_keyed_map(v, k)) if key_kind else t.ENCODERS[source]
            body["_ENCODE"] = staticmethod(encoder)
            body["_CHECK"] = staticmethod(_checker(source))
        cls = type(py_name, (Section,), body)
    cls.__module__ = __name__
    cls.NAME, cls.CODE, cls.SYMBOL, cls.PROVIDES = d.name, d.code, d.symbol, d.provides
    cls._PREFIX = b"\x00" + t.encode_ulong(d.code)
    BY_NAME[d.name] = cls
    BY_CODE[d.code] = cls
    BY_SYMBOL[d.symbol] = cls
    globals()[py_name] = cls


def _convert(value):
    """A decoded value with every known described type turned into its class (recursively inside)."""
    if value.__class__ is t.Described:
        descriptor = value.descriptor
        if isinstance(descriptor, str):
            cls = BY_SYMBOL.get(descriptor)
        elif isinstance(descriptor, int) and not isinstance(descriptor, bool):
            cls = BY_CODE.get(descriptor)
        else:
            cls = None
        if cls is not None:
            return cls.from_value(value.value)
    return value


_build()


def from_described(value):
    """:func:`_convert` for callers: a :class:`.types.Described` of this table as its class."""
    return _convert(value)


def decode_described(buf, pos: int = 0, end: int | None = None, provides: str | None = None,
                     budget: list[int] | None = None):
    """Decode the described value at ``pos`` as its class; (object, position after it).

    ``provides``: the archetype it must provide (``"frame"``, ``"sasl-frame"``, ``"section"``), else a
    DecodeError.  ``budget``: zero-width array elements left (:func:`.types.decode_value`), shared by
    callers that decode many values from one input.  Raises only DecodeError (and its InvalidField)."""
    value, pos = t.decode_value(buf, pos, end, 0, budget)
    obj = _convert(value)
    if provides is not None and provides not in getattr(obj, "PROVIDES", ()):
        what = getattr(obj, "NAME", None) or type(obj).__name__
        raise DecodeError(f"expected a {provides}, got {what}")
    return obj, pos


def decode_sections(payload, elements: int | None = None) -> list:
    """The sections of a message (3.2): each described value of ``payload`` as its class, in order.

    Sections this table does not know (a descriptor of another domain) are a DecodeError: a message is
    made only of the sections of 3.2.  ``elements``: the element budget of the whole message
    (:func:`.types.new_budget`; None: unlimited, for messages the node encoded itself)."""
    out = []
    pos, end = 0, len(payload)
    budget = t.new_budget(elements)  # one for the whole message, not one per section
    while pos < end:
        section, pos = decode_described(payload, pos, end, "section", budget)
        out.append(section)
    return out


def encode_sections(sections) -> bytes:
    return b"".join(s.encode() for s in sections)
