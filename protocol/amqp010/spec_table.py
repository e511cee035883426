"""The protocol table of AMQP 0-10: types, domains, structs, controls and commands, as plain text.

Transcribed from the specification text (``amqp-0-10.txt``, a PDF-to-text conversion; ``# Lnnnn``
comments give the line of the definition there) for the classes connection (0x01), session (0x02),
execution (0x03), message (0x04), tx (0x05), dtx (0x06), exchange (0x07) and queue (0x08); file and
stream are left out.  The codec is generated from these tables; :func:`parse` turns them into records
and checks that they are consistent.  Blank lines and ``#`` comments (also trailing ones) are ignored.

``TYPES``, one line per primitive type (spec chapter 7): ``name code width``.

* ``code`` is the one-octet type code, or ``-`` for the three types the spec gives none
  (``sequence-no``, ``byte-ranges``, ``sequence-set``: they never appear in maps, lists or arrays).
* ``width`` is the fixed size in octets (``0`` for ``void`` and ``bit``), or ``v1``/``v2``/``v4``
  for a variable-width type whose data is preceded by a 1/2/4-octet byte count.

``DOMAINS``, one line per domain: ``name base [of:element] [choice=value ...]``.

* A domain defined inside a class is named ``class.name`` (``message.accept-mode``): the spec reuses
  short names across classes (``session.name`` is a vbin16, ``exchange.name`` and ``queue.name`` are
  str8).  The three global domains (``segment-type``, ``track``, ``str16-array``) are unqualified.
* ``base`` is always a primitive type of ``TYPES``.
* ``of:element`` gives the element type of an array domain (resolved in the domain's class).
* ``choice=value`` lists the enum choices, values in decimal, in the spec's order.

``STRUCTS``, one line per struct: ``class name code size=N pack=M field ...``.

* ``code`` is the 16-bit struct code, class code in the high octet (``0x0401``), or ``-`` for an
  uncoded struct.  ``size`` is the width of the byte count before the struct (0, 1, 2 or 4) and
  ``pack`` the width of its packing flags (0, 1, 2 or 4).
* Inline result structs (``<result><struct ...>``) are listed with the other structs of their class.

``METHODS``, one line per control or command:
``class class-code kind name code field ... [result=struct] [segments=header,body] [header=entry,...]``.

* ``kind`` is ``control`` or ``command``; ``code`` the control/command code within the class.  All
  arguments are encoded as an unsized, uncoded struct with 2 octets of packing flags (spec 5.7, 5.8);
  commands also carry the ``session.header`` struct before them.
* ``result=`` names the (coded, size 4) struct a command's result is carried in by execution.result.
* ``segments=`` lists the segments that may follow the command segment; ``header=`` the structs a
  header segment may hold.  message.transfer is the only one: both segments are optional (L5713ff).

Fields, in STRUCTS and METHODS, are ``name:type`` in encoding order, with ``!`` appended when the spec
marks the field required and ``=value`` when it gives a default (``first:bit=1``).  Field names keep
the spec's hyphens.  ``type`` is spelled as the spec spells it: a primitive type, a domain or struct
of the same class by its short name (``accept-mode``), one of another class qualified
(``session.commands``), or a global domain.  :func:`parse` canonicalises it to the key of
``Spec.types``, ``Spec.domains`` or ``Spec.structs`` (``message.accept-mode``), and
:meth:`Spec.base_type` resolves any of them to a primitive type (structs resolve to themselves).

Struct codes: the text prints none.  They were taken from the task brief (message 0x0401-0x0405,
exchange 0x0701/0x0702, queue 0x0801) and, for dtx, from the spec's XML rendering
(``amqp.0-10.xml``: xa-result 0x1, get-timeout-result 0x2, recover-result 0x3 in class dtx), which
also agrees with every brief code.  The text also prints no names for inline result structs; the
names are the XML's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import NamedTuple

TYPES = """
# fixed width (L2589ff); the code ranges fix the width (L1944ff)
bin8        0x00 1    # L2596
int8        0x01 1
uint8       0x02 1
char        0x04 1
boolean     0x08 1
bin16       0x10 2    # L2606
int16       0x11 2
uint16      0x12 2
bin32       0x20 4    # L2612
int32       0x21 4
uint32      0x22 4
float       0x23 4
char-utf32  0x27 4
sequence-no -    4    # L2622, L2876ff: RFC-1982 serial number, no type code
bin64       0x30 8    # L2624
int64       0x31 8
uint64      0x32 8
double      0x33 8
datetime    0x38 8
bin128      0x40 16   # L2634
uuid        0x48 16
bin256      0x50 32
bin512      0x60 64
bin1024     0x70 128
bin40       0xc0 5    # L2644
dec32       0xc8 5    # uint8 exponent + int32 mantissa
bin72       0xd0 9    # the BNF at L3120 says "bin64 = 9 OCTET": a typo for bin72
dec64       0xd8 9    # uint8 exponent + int64 mantissa
void        0xf0 0    # L2652
bit         0xf1 0    # L2654: a packing flag with no data
# variable width (L3154ff)
vbin8       0x80 v1   # L3160
str8-latin  0x84 v1   # L3162; the diagram at L3219 labels the size uint16, the BNF (L3225) says uint8
str8        0x85 v1
str8-utf16  0x86 v1
vbin16      0x90 v2   # L3168
str16-latin 0x94 v2
str16       0x95 v2
str16-utf16 0x96 v2
byte-ranges -    v2   # L3176, L3357ff: (lower, upper) uint64 pairs, no type code
sequence-set -   v2   # L3178, L3395ff: (lower, upper) sequence-no pairs, no type code
vbin32      0xa0 v4   # L3180
map         0xa8 v4   # size, then uint32 count, then entries (L3471ff)
list        0xa9 v4   # size, then uint32 count, then items (L3525ff)
array       0xaa v4   # size, then type code octet, then uint32 count, then values (L3566ff)
struct32    0xab v4   # size, then class-code, struct-code, packing flags, fields (L3596ff)
"""

DOMAINS = """
segment-type uint8 control=0 command=1 header=2 body=3                             # L3646
track uint8 control=0 command=1                                                    # L3672
str16-array array of:str16                                                         # L3690
connection.close-code uint16 normal=200 connection-forced=320 invalid-path=402 framing-error=501  # L3777
connection.amqp-host-url str16                                                     # L3804
connection.amqp-host-array array of:amqp-host-url                                  # L3828
session.name vbin16                                                                # L4414
session.detach-code uint8 normal=0 session-busy=1 transport-busy=2 not-attached=3 unknown-ids=4  # L4421
session.commands sequence-set                                                      # L4449
session.command-fragments array of:command-fragment                                # L4457
execution.error-code uint16 unauthorized-access=403 not-found=404 resource-locked=405 precondition-failed=406 resource-deleted=408 illegal-state=409 command-invalid=503 resource-limit-exceeded=506 not-allowed=530 illegal-argument=531 not-implemented=540 internal-error=541 invalid-argument=542  # L4927
message.destination str8                                                           # L5502
message.accept-mode uint8 explicit=0 none=1                                        # L5509
message.acquire-mode uint8 pre-acquired=0 not-acquired=1                           # L5529
message.reject-code uint16 unspecified=0 unroutable=1 immediate=2                  # L5555
message.resume-id str16                                                            # L5575
message.delivery-mode uint8 non-persistent=1 persistent=2                          # L5583
message.delivery-priority uint8 lowest=0 lower=1 low=2 below-average=3 medium=4 above-average=5 high=6 higher=7 very-high=8 highest=9  # L5610
message.flow-mode uint8 credit=0 window=1                                          # L5650
message.credit-unit uint8 message=0 byte=1                                         # L5663
dtx.xa-status uint16 xa-ok=0 xa-rbrollback=1 xa-rbtimeout=2 xa-heurhaz=3 xa-heurcom=4 xa-heurrb=5 xa-heurmix=6 xa-rdonly=7  # L6461
exchange.name str8                                                                 # L7108
queue.name str8                                                                    # L7630
"""

STRUCTS = """
# the text heads every struct "Domain: class.name" and prints "Struct Type / Size Packing / N M"
session header - size=1 pack=1 sync:bit                                            # L4382
session command-fragment - size=0 pack=0 command-id:sequence-no! byte-ranges:byte-ranges!  # L4399
message delivery-properties 0x0401 size=4 pack=2 discard-unroutable:bit immediate:bit redelivered:bit priority:delivery-priority! delivery-mode:delivery-mode! ttl:uint64 timestamp:datetime expiration:datetime exchange:exchange.name routing-key:str8 resume-id:resume-id resume-ttl:uint64  # L5268
message fragment-properties 0x0402 size=4 pack=2 first:bit=1 last:bit=1 fragment-size:uint64  # L5384
message reply-to - size=2 pack=2 exchange:exchange.name routing-key:str8           # L5413
message message-properties 0x0403 size=4 pack=2 content-length:uint64 message-id:uuid correlation-id:vbin16 reply-to:reply-to content-type:str8 content-encoding:str8 user-id:vbin16 app-id:vbin16 application-headers:map  # L5431
message acquired 0x0404 size=4 pack=2 transfers:session.commands!                  # L5878 (result of message.acquire)
message message-resume-result 0x0405 size=4 pack=2 offset:uint64                   # L5933 (result of message.resume)
dtx xa-result 0x0601 size=4 pack=2 status:xa-status!                               # L6429
dtx xid - size=2 pack=2 format:uint32! global-id:vbin8! branch-id:vbin8!           # L6442
dtx get-timeout-result 0x0602 size=4 pack=2 timeout:uint32!                        # L6807 (result of dtx.get-timeout)
dtx recover-result 0x0603 size=4 pack=2 in-doubt:array!                            # L6902 (result of dtx.recover; an array of xid)
exchange exchange-query-result 0x0701 size=4 pack=2 type:str8 durable:bit not-found:bit arguments:map  # L7320 (result of exchange.query)
exchange exchange-bound-result 0x0702 size=4 pack=2 exchange-not-found:bit queue-not-found:bit queue-not-matched:bit key-not-matched:bit args-not-matched:bit  # L7542 (result of exchange.bound)
queue queue-query-result 0x0801 size=4 pack=2 queue:name! alternate-exchange:exchange.name durable:bit exclusive:bit auto-delete:bit arguments:map message-count:uint32! subscriber-count:uint32!  # L7928 (result of queue.query)
"""

METHODS = """
# connection (L3699): signatures L3709ff
connection 0x01 control start 0x1 server-properties:map mechanisms:str16-array! locales:str16-array!  # L3845
connection 0x01 control start-ok 0x2 client-properties:map mechanism:str8! response:vbin32! locale:str8!  # L3915
connection 0x01 control secure 0x3 challenge:vbin32!                                # L3968
connection 0x01 control secure-ok 0x4 response:vbin32!                              # L3988
connection 0x01 control tune 0x5 channel-max:uint16 max-frame-size:uint16 heartbeat-min:uint16 heartbeat-max:uint16  # L4006
connection 0x01 control tune-ok 0x6 channel-max:uint16! max-frame-size:uint16 heartbeat:uint16  # L4068
connection 0x01 control open 0x7 virtual-host:str8! capabilities:str16-array insist:bit  # L4135
connection 0x01 control open-ok 0x8 known-hosts:amqp-host-array                     # L4186
connection 0x01 control redirect 0x9 host:amqp-host-url! known-hosts:amqp-host-array  # L4209
connection 0x01 control heartbeat 0xa                                               # L4243
connection 0x01 control close 0xb reply-code:close-code! reply-text:str8            # L4251
connection 0x01 control close-ok 0xc                                                # L4278
# session (L4297): signatures L4311ff
session 0x02 control attach 0x1 name:name! force:bit                                # L4465
session 0x02 control attached 0x2 name:name!                                        # L4512
session 0x02 control detach 0x3 name:name!                                          # L4531
session 0x02 control detached 0x4 name:name! code:detach-code!                      # L4552
session 0x02 control request-timeout 0x5 timeout:uint32                             # L4575
session 0x02 control timeout 0x6 timeout:uint32                                     # L4605
session 0x02 control command-point 0x7 command-id:sequence-no! command-offset:uint64!  # L4625
session 0x02 control expected 0x8 commands:commands! fragments:command-fragments    # L4665
session 0x02 control confirmed 0x9 commands:commands fragments:command-fragments    # L4706
session 0x02 control completed 0xa commands:commands timely-reply:bit              # L4763
session 0x02 control known-completed 0xb commands:commands                          # L4810
session 0x02 control flush 0xc expected:bit confirmed:bit completed:bit             # L4841
session 0x02 control gap 0xd commands:commands                                      # L4861
# execution (L4897): signatures L4907ff
execution 0x03 command sync 0x1                                                     # L5005
execution 0x03 command result 0x2 command-id:sequence-no! value:struct32            # L5016
execution 0x03 command exception 0x3 error-code:error-code! command-id:sequence-no class-code:uint8 command-code:uint8 field-index:uint8 description:str16 error-info:map  # L5035
# message (L5090): signatures L5100ff
message 0x04 command transfer 0x1 destination:destination accept-mode:accept-mode! acquire-mode:acquire-mode! segments=header,body header=delivery-properties,fragment-properties,message-properties  # L5676
message 0x04 command accept 0x2 transfers:session.commands!                         # L5752
message 0x04 command reject 0x3 transfers:session.commands! code:reject-code! text:str8  # L5777
message 0x04 command release 0x4 transfers:session.commands! set-redelivered:bit    # L5819
message 0x04 command acquire 0x5 transfers:session.commands! result=acquired        # L5854
message 0x04 command resume 0x6 destination:destination resume-id:resume-id! result=message-resume-result  # L5893
message 0x04 command subscribe 0x7 queue:queue.name! destination:destination accept-mode:accept-mode! acquire-mode:acquire-mode! exclusive:bit resume-id:resume-id resume-ttl:uint64 arguments:map  # L5948
message 0x04 command cancel 0x8 destination:destination!                            # L6055
message 0x04 command set-flow-mode 0x9 destination:destination flow-mode:flow-mode!  # L6087
message 0x04 command flow 0xa destination:destination unit:credit-unit! value:uint32  # L6140
message 0x04 command flush 0xb destination:destination                              # L6169
message 0x04 command stop 0xc destination:destination                               # L6186
# tx (L6205): signatures L6213ff
tx 0x05 command select 0x1                                                          # L6247
tx 0x05 command commit 0x2                                                          # L6280
tx 0x05 command rollback 0x3                                                        # L6307
# dtx (L6336): signatures L6346ff
dtx 0x06 command select 0x1                                                         # L6492
dtx 0x06 command start 0x2 xid:xid! join:bit resume:bit result=xa-result            # L6502
dtx 0x06 command end 0x3 xid:xid! fail:bit suspend:bit result=xa-result             # L6580
dtx 0x06 command commit 0x4 xid:xid! one-phase:bit result=xa-result                 # L6664
dtx 0x06 command forget 0x5 xid:xid!                                                # L6737
dtx 0x06 command get-timeout 0x6 xid:xid! result=get-timeout-result                 # L6778
dtx 0x06 command prepare 0x7 xid:xid! result=xa-result                              # L6829
dtx 0x06 command recover 0x8 result=recover-result                                  # L6892
dtx 0x06 command rollback 0x9 xid:xid! result=xa-result                             # L6918
dtx 0x06 command set-timeout 0xa xid:xid! timeout:uint32!                           # L6976
# exchange (L7016): signatures L7026ff
exchange 0x07 command declare 0x1 exchange:name! type:str8! alternate-exchange:name passive:bit durable:bit auto-delete:bit arguments:map  # L7116
exchange 0x07 command delete 0x2 exchange:name! if-unused:bit                       # L7253
exchange 0x07 command query 0x3 name:str8 result=exchange-query-result              # L7301
exchange 0x07 command bind 0x4 queue:queue.name! exchange:name! binding-key:str8! arguments:map  # L7349
exchange 0x07 command unbind 0x5 queue:queue.name! exchange:name! binding-key:str8!  # L7458
exchange 0x07 command bound 0x6 exchange:str8 queue:str8! binding-key:str8 arguments:map result=exchange-bound-result  # L7509
# queue (L7574): signatures L7584ff
queue 0x08 command declare 0x1 queue:name! alternate-exchange:exchange.name passive:bit durable:bit exclusive:bit auto-delete:bit arguments:map  # L7639
queue 0x08 command delete 0x2 queue:name! if-unused:bit if-empty:bit                # L7796
queue 0x08 command purge 0x3 queue:name!                                            # L7857
queue 0x08 command query 0x4 queue:name! result=queue-query-result                  # L7912
"""


class SpecTableError(ValueError):
    """The table text is malformed or inconsistent."""


class Field(NamedTuple):
    """One field of a struct, control or command: ``type`` is canonical (see the module docstring)."""

    name: str
    type: str
    required: bool


@dataclass(frozen=True)
class Type:
    name: str
    code: int | None  # None: the spec assigns no type code
    width: int  # fixed size in octets, or the width of the size prefix when ``variable``
    variable: bool


@dataclass(frozen=True)
class Domain:
    name: str  # "class.name", or "name" for a global domain
    cls: str | None
    base: str  # a primitive type
    element: str | None = None  # canonical element type of an array domain
    choices: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Struct:
    cls: str
    name: str
    code: int | None  # class code << 8 | struct code; None when uncoded
    size: int
    pack: int
    fields: list[Field]
    defaults: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.cls}.{self.name}"


@dataclass(frozen=True)
class Method:
    cls: str
    class_code: int
    kind: str  # "control" or "command"
    name: str
    code: int
    fields: list[Field]
    result: str | None = None  # canonical struct key
    segments: tuple[str, ...] = ()
    header: tuple[str, ...] = ()  # canonical struct keys allowed in the header segment


@dataclass
class Spec:
    types: dict[str, Type]
    domains: dict[str, Domain]
    structs: dict[str, Struct]
    methods: list[Method]

    def method(self, cls: str, name: str) -> Method:
        for m in self.methods:
            if m.cls == cls and m.name == name:
                return m
        raise KeyError(f"{cls}.{name}")

    def by_code(self, kind: str, class_code: int, code: int) -> Method:
        for m in self.methods:
            if m.kind == kind and m.class_code == class_code and m.code == code:
                return m
        raise KeyError((kind, class_code, code))

    def struct_by_code(self, code: int) -> Struct:
        for s in self.structs.values():
            if s.code == code:
                return s
        raise KeyError(code)

    def base_type(self, name: str) -> str:
        """The primitive type a canonical type name encodes as (a struct key is returned unchanged)."""
        if name in self.types or name in self.structs:
            return name
        return self.domains[name].base


_NAME = r"[a-z][a-z0-9-]*"
_FIELD = re.compile(rf"^({_NAME}):({_NAME}(?:\.{_NAME})?)(!)?(?:=(\d+))?$")
_CHOICE = re.compile(rf"^({_NAME})=(\d+)$")
_WIDTH = re.compile(r"^(v)?(\d+)$")


def _lines(text: str):
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            yield line.split()


def _code(token: str, what: str) -> int | None:
    if token == "-":
        return None
    try:
        return int(token, 16) if token.startswith("0x") else int(token)
    except ValueError:
        raise SpecTableError(f"{what}: bad code {token!r}") from None


def parse(types: str = TYPES, domains: str = DOMAINS, structs: str = STRUCTS,
          methods: str = METHODS) -> Spec:
    """Parse the four tables into a :class:`Spec`, raising :class:`SpecTableError` on any inconsistency."""
    spec = Spec({}, {}, {}, [])

    for tok in _lines(types):
        if len(tok) != 3:
            raise SpecTableError(f"type line {' '.join(tok)!r}: expected 'name code width'")
        name, code, width = tok
        m = _WIDTH.match(width)
        if not m or (m.group(1) and width not in ("v1", "v2", "v4")):
            raise SpecTableError(f"type {name}: bad width {width!r}")
        if name in spec.types:
            raise SpecTableError(f"type {name} defined twice")
        spec.types[name] = Type(name, _code(code, f"type {name}"), int(m.group(2)), bool(m.group(1)))
    codes = [t.code for t in spec.types.values() if t.code is not None]
    if len(codes) != len(set(codes)):
        raise SpecTableError("duplicate type codes")

    # Domains and structs first, so that field types can refer to either in any order.
    pending_elements: list[tuple[str, str | None, str]] = []
    for tok in _lines(domains):
        name, base, rest = tok[0], tok[1] if len(tok) > 1 else "", tok[2:]
        cls = name.split(".", 1)[0] if "." in name else None
        if base not in spec.types:
            raise SpecTableError(f"domain {name}: base {base!r} is not a type")
        if name in spec.domains or name in spec.types:
            raise SpecTableError(f"domain {name} defined twice")
        element = None
        choices: dict[str, int] = {}
        for t in rest:
            if t.startswith("of:"):
                element = t[3:]
                pending_elements.append((name, cls, element))
            elif m := _CHOICE.match(t):
                if m.group(1) in choices:
                    raise SpecTableError(f"domain {name}: choice {m.group(1)} twice")
                choices[m.group(1)] = int(m.group(2))
            else:
                raise SpecTableError(f"domain {name}: bad token {t!r}")
        spec.domains[name] = Domain(name, cls, base, element, choices)

    struct_fields: list[tuple[Struct, list[str]]] = []
    for tok in _lines(structs):
        if len(tok) < 5 or not tok[3].startswith("size=") or not tok[4].startswith("pack="):
            raise SpecTableError(f"struct line {' '.join(tok)!r}: expected 'class name code size=N pack=M ...'")
        cls, name, code = tok[0], tok[1], _code(tok[2], f"struct {tok[0]}.{tok[1]}")
        size, pack = int(tok[3][5:]), int(tok[4][5:])
        if size not in (0, 1, 2, 4) or pack not in (0, 1, 2, 4):
            raise SpecTableError(f"struct {cls}.{name}: size and pack must be 0, 1, 2 or 4")
        s = Struct(cls, name, code, size, pack, [])
        if s.key in spec.structs or s.key in spec.domains:
            raise SpecTableError(f"struct {s.key} defined twice")
        spec.structs[s.key] = s
        struct_fields.append((s, tok[5:]))

    def canonical(typename: str, cls: str | None, where: str) -> str:
        if typename in spec.types:
            return typename
        candidates = [typename] if "." in typename else ([f"{cls}.{typename}"] if cls else []) + [typename]
        for c in candidates:
            if c in spec.domains or c in spec.structs:
                return c
        raise SpecTableError(f"{where}: unknown type {typename!r}")

    def parse_fields(tokens: list[str], cls: str, where: str) -> tuple[list[Field], dict[str, int]]:
        fields: list[Field] = []
        defaults: dict[str, int] = {}
        for t in tokens:
            m = _FIELD.match(t)
            if not m:
                raise SpecTableError(f"{where}: bad field {t!r}")
            fname = m.group(1)
            if any(f.name == fname for f in fields):
                raise SpecTableError(f"{where}: field {fname} twice")
            fields.append(Field(fname, canonical(m.group(2), cls, f"{where}.{fname}"), bool(m.group(3))))
            if m.group(4) is not None:
                defaults[fname] = int(m.group(4))
        return fields, defaults

    for name, cls, element in pending_elements:
        spec.domains[name] = replace(spec.domains[name], element=canonical(element, cls, f"domain {name}"))
    for s, tokens in struct_fields:
        fields, defaults = parse_fields(tokens, s.cls, f"struct {s.key}")
        s = spec.structs[s.key] = replace(s, fields=fields, defaults=defaults)
        if s.pack and len(fields) > 8 * s.pack:
            raise SpecTableError(f"struct {s.key}: {len(fields)} fields do not fit {s.pack} octets of flags")
        if not s.pack and any(not f.required for f in fields):
            raise SpecTableError(f"struct {s.key}: an unpacked struct cannot have optional fields")

    class_codes: dict[str, int] = {}
    seen: set[tuple[str, int, int]] = set()
    for tok in _lines(methods):
        if len(tok) < 5:
            raise SpecTableError(f"method line {' '.join(tok)!r}: expected 'class class-code kind name code ...'")
        cls, class_code, kind, name = tok[0], _code(tok[1], tok[0]), tok[2], tok[3]
        code = _code(tok[4], f"{cls}.{name}")
        where = f"{kind} {cls}.{name}"
        if kind not in ("control", "command"):
            raise SpecTableError(f"{where}: kind must be control or command")
        if class_code is None or code is None or not 0 < class_code < 256 or not 0 <= code < 256:
            raise SpecTableError(f"{where}: bad class code or code")
        if class_codes.setdefault(cls, class_code) != class_code:
            raise SpecTableError(f"{where}: class {cls} has code {class_codes[cls]:#04x} elsewhere")
        if (kind, class_code, code) in seen:
            raise SpecTableError(f"{where}: ({class_code:#04x}, {code:#04x}) is already a {kind}")
        seen.add((kind, class_code, code))
        if any(m.cls == cls and m.name == name for m in spec.methods):
            raise SpecTableError(f"{where}: defined twice")
        result = None
        segments: tuple[str, ...] = ()
        header: tuple[str, ...] = ()
        field_tokens = []
        for t in tok[5:]:
            if t.startswith("result="):
                result = canonical(t[7:], cls, f"{where} result")
                r = spec.structs.get(result)
                if kind != "command" or r is None or r.code is None or r.size != 4:
                    raise SpecTableError(f"{where}: a result must be a coded struct of size 4 on a command")
            elif t.startswith("segments="):
                segments = tuple(t[9:].split(","))
                if not set(segments) <= {"header", "body"}:
                    raise SpecTableError(f"{where}: segments are header and/or body")
            elif t.startswith("header="):
                header = tuple(canonical(e, cls, f"{where} header") for e in t[7:].split(","))
                for e in header:
                    entry = spec.structs.get(e)
                    if entry is None or entry.code is None or entry.size != 4:
                        raise SpecTableError(f"{where}: header entry {e} must be a coded struct of size 4")
            else:
                field_tokens.append(t)
        if header and "header" not in segments:
            raise SpecTableError(f"{where}: header entries without a header segment")
        fields, defaults = parse_fields(field_tokens, cls, where)
        if defaults:
            raise SpecTableError(f"{where}: defaults are only given for struct fields")
        if len(fields) > 16:
            raise SpecTableError(f"{where}: more than 16 fields do not fit 2 octets of packing flags")
        spec.methods.append(Method(cls, class_code, kind, name, code, fields, result, segments, header))

    for s in spec.structs.values():
        if s.code is not None and (s.cls not in class_codes or s.code >> 8 != class_codes[s.cls]):
            raise SpecTableError(f"struct {s.key}: code {s.code:#06x} is not in class {s.cls}")
    struct_codes = [s.code for s in spec.structs.values() if s.code is not None]
    if len(struct_codes) != len(set(struct_codes)):
        raise SpecTableError("duplicate struct codes")
    return spec
