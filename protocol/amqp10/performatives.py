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

import uuid
from collections.abc import Callable
from typing import Any

from . import types as t
from ._generate import attr_name as _attr
from .described import Composite as Composite
from .described import Section as Section
from .errors import DecodeError, InvalidField
from .performatives_gen import *  # noqa: F403 - the generated classes are this module's public names
from .performatives_gen import DESCRIBED_CLASSES
from .spec_table import Field

SPEC = t.SPEC
#: Choices of the restricted types: ``CHOICES["sender-settle-mode"]["settled"] == 1``.
CHOICES: dict[str, dict[str, object]] = {name: dict(r.choices) for name, r in SPEC.restricted.items() if r.choices}
#: The error conditions of 2.8.15-2.8.18 by short name: ``CONDITIONS["decode-error"] == "amqp:decode-error"``.
CONDITIONS: dict[str, t.Symbol] = {name: t.Symbol(sym) for name, sym in SPEC.conditions.items()}


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


def _keyed_map_encoder(key_kind: str) -> Callable[[Any], bytes]:
    def encode(mapping: Any) -> bytes:
        return _encode_keyed_map(mapping, key_kind)
    return encode


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
    encode_one: Callable[[Any], bytes]
    check_one: Callable[[Any], Any]

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
            self.encode_one, self.check_one = _composite_field(source)
        elif source == "map" and (key_kind := _key_kind(f.type)):
            self.encode_one = _keyed_map_encoder(key_kind)
            self.check_one = _checker("map")
        else:
            self.encode_one = t.ENCODERS[source]
            self.check_one = _checker(source)

    def encode(self, value: Any) -> bytes:
        if self.multiple and isinstance(value, t.Array):
            return t.encode_array(value)
        if self.multiple and isinstance(value, (list, tuple)):
            if self.source in SPEC.described or self.source == "*":
                raise ValueError(f"{self.name}: multiple values of {self.source} are not supported")
            return t.encode_array(t.Array(self.source, list(value)))
        return self.encode_one(value)

    def check(self, value: Any, owner: str) -> Any:
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


def _composite_field(name: str) -> tuple[Callable[[Any], bytes], Callable[[Any], Any]]:
    """The encoder and checker of a field whose type is the described type ``name`` (error, source...)."""
    def encode(value: Any) -> bytes:
        return _encode_composite_field(name, value)

    def check(value: Any) -> Any:
        return _expect(name, value)
    return encode, check


def _encode_composite_field(name: str, value: Any) -> bytes:
    cls = BY_NAME[name]
    if not isinstance(value, cls):
        raise ValueError(f"expected {cls.__name__}, got {type(value).__name__}")
    return value.encode()


def _expect(name: str, value: Any) -> Any:
    converted = _convert(value)
    if not isinstance(converted, BY_NAME[name]):
        raise ValueError(f"expected {name}")
    return converted


BY_NAME: dict[str, type[Composite] | type[Section]] = {}  # "attach" -> Attach
BY_CODE: dict[int, type[Composite] | type[Section]] = {}  # 0x12 -> Attach
BY_SYMBOL: dict[str, type[Composite] | type[Section]] = {}  # "amqp:attach:list" -> Attach


def _build() -> None:
    """Register the generated classes and attach their codecs (built from the same table)."""
    for cls in DESCRIBED_CLASSES:
        d = SPEC.described[cls.NAME]
        if issubclass(cls, Composite) and cls.__slots__ != tuple(_attr(f.name) for f in d.fields):
            raise ImportError(f"{cls.__name__} does not match the spec table: run python -m raftmq.protocol.codegen")
        BY_NAME[d.name] = cls
        BY_CODE[d.code] = cls
        BY_SYMBOL[d.symbol] = cls
    for cls in DESCRIBED_CLASSES:  # field codecs refer to classes by name: build them once all exist
        d = SPEC.described[cls.NAME]
        if issubclass(cls, Composite):
            cls.FIELDS = tuple(FieldCodec(f) for f in d.fields)
            continue
        source = SPEC.source_of(d.source)
        if source != "*":
            key_kind = _key_kind(d.source)
            cls._ENCODE = staticmethod(_keyed_map_encoder(key_kind) if key_kind else t.ENCODERS[source])
            cls._CHECK = staticmethod(_checker(source))


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
