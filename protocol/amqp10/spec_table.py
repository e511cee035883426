"""The tables of AMQP 1.0 as plain text: type encodings, restricted types, described types, conditions.

Transcribed from the OASIS specification (``amqp-1-0.txt`` in the shared specs; section numbers in
``#`` comments).  That text is a PDF-to-text conversion that lost most of the XML type definitions
(the encoding codes of part 1 and many field lists of parts 2, 3 and 5); those were filled in from the
specification's XML definitions, whose codes and field orders every implementation shares.  They are
checked against a real implementation in ``tests/unit/protocol/test_amqp10_proton.py``: Qpid Proton's
engine writes and reads open, begin, attach (with source and target), flow, transfer, disposition
(with outcomes), close (with an error), the SASL frames and the message sections with them.  :mod:`.types` and :mod:`.performatives` are generated
from these tables; :func:`parse` turns them into records and checks that they are consistent.  Blank
lines and ``#`` comments (also trailing ones) are ignored.

``ENCODINGS``, one line per encoding (1.6): ``name code category width type``.

* ``category`` is ``fixed``, ``variable``, ``compound`` or ``array`` (1.2); ``width`` the data width
  of a fixed encoding, or the width of the size (and count) prefix of the others.
* ``type`` is the primitive type the encoding represents: several encodings share one type (``uint``
  has ``uint``, ``smalluint`` and ``uint0``; ``boolean`` has ``true``, ``false`` and ``boolean``).

``RESTRICTED``, one line per restricted type (2.8, 3.2, 3.5, 5.3): ``name source [choice=value ...]``.
``source`` is a primitive type; choices are decimal integers, ``true``/``false``, or symbols.

``DESCRIBED``, one block per described type (1.3.2, 1.4).  The head line is
``name code symbol source [provides=a,b]`` at column 0:

* ``code`` is the numeric descriptor (domain 0: ``0x00000000:0x00000010`` is written ``0x10``),
  ``symbol`` the symbolic one, ``source`` ``composite`` for a composite type (1.4: a described list
  of its fields) or the source type of a restricted one (``data`` is a described ``binary``,
  ``amqp-sequence`` a described ``list``, ``amqp-value`` any value ``*``);
* ``provides`` lists the archetypes the type provides (``frame``, ``sasl-frame``, ``delivery-state``,
  ``outcome``, ``section``, ``source``, ``target``, ``lifetime-policy``).

Each following indented line is one field of a composite, in encoding order:
``name type [mandatory] [multiple] [default=value] [requires=archetype]``.  ``type`` is a primitive type,
a restricted type of ``RESTRICTED``, a composite of ``DESCRIBED`` (``error``) or ``*`` (any value;
``requires`` names the archetype the value should provide).  ``default`` is a value of the source type
or one of the restricted type's choice names (``default=mixed``).

``CONDITIONS``: the error conditions of 2.8.15-2.8.18, 4.5.8 (transaction errors) and 5.3.3.6 (SASL
codes), ``name symbol``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

ENCODINGS = """
null        0x40 fixed    0  null       # 1.6.1
true        0x41 fixed    0  boolean    # 1.6.2
false       0x42 fixed    0  boolean
boolean     0x56 fixed    1  boolean    # 0x00 false, 0x01 true
ubyte       0x50 fixed    1  ubyte      # 1.6.3
ushort      0x60 fixed    2  ushort     # 1.6.4
uint        0x70 fixed    4  uint       # 1.6.5
smalluint   0x52 fixed    1  uint
uint0       0x43 fixed    0  uint
ulong       0x80 fixed    8  ulong      # 1.6.6
smallulong  0x53 fixed    1  ulong
ulong0      0x44 fixed    0  ulong
byte        0x51 fixed    1  byte       # 1.6.7
short       0x61 fixed    2  short      # 1.6.8
int         0x71 fixed    4  int        # 1.6.9
smallint    0x54 fixed    1  int
long        0x81 fixed    8  long       # 1.6.10
smalllong   0x55 fixed    1  long
float       0x72 fixed    4  float      # 1.6.11
double      0x82 fixed    8  double     # 1.6.12
decimal32   0x74 fixed    4  decimal32  # 1.6.13
decimal64   0x84 fixed    8  decimal64  # 1.6.14
decimal128  0x94 fixed    16 decimal128 # 1.6.15
char        0x73 fixed    4  char       # 1.6.16 UTF-32BE
timestamp   0x83 fixed    8  timestamp  # 1.6.17 ms since the Unix epoch, signed
uuid        0x98 fixed    16 uuid       # 1.6.18
vbin8       0xa0 variable 1  binary     # 1.6.19
vbin32      0xb0 variable 4  binary
str8-utf8   0xa1 variable 1  string     # 1.6.20
str32-utf8  0xb1 variable 4  string
sym8        0xa3 variable 1  symbol     # 1.6.21 ASCII
sym32       0xb3 variable 4  symbol
list0       0x45 fixed    0  list       # 1.6.22
list8       0xc0 compound 1  list
list32      0xd0 compound 4  list
map8        0xc1 compound 1  map        # 1.6.23 count = keys + values
map32       0xd1 compound 4  map
array8      0xe0 array    1  array      # 1.6.24
array32     0xf0 array    4  array
"""

RESTRICTED = """
role                    boolean sender=false receiver=true                              # 2.8.1
sender-settle-mode      ubyte   unsettled=0 settled=1 mixed=2                           # 2.8.2
receiver-settle-mode    ubyte   first=0 second=1                                        # 2.8.3
handle                  uint                                                            # 2.8.4
seconds                 uint                                                            # 2.8.5
milliseconds            uint                                                            # 2.8.6
delivery-tag            binary                                                          # 2.8.7 at most 32 octets
delivery-number         uint                                                            # 2.8.8 a sequence-no
transfer-number         uint                                                            # 2.8.9 a sequence-no
sequence-no             uint                                                            # 2.8.10 RFC-1982
message-format          uint                                                            # 2.8.11
ietf-language-tag       symbol                                                          # 2.8.12
fields                  map                                                             # 2.8.13 symbol keys
amqp-error              symbol                                                          # 2.8.15
connection-error        symbol                                                          # 2.8.16
session-error           symbol                                                          # 2.8.17
link-error              symbol                                                          # 2.8.18
annotations             map                                                             # 3.2.10 symbol or ulong keys
message-id-ulong        ulong                                                           # 3.2.11
message-id-uuid         uuid                                                            # 3.2.12
message-id-binary       binary                                                          # 3.2.13
message-id-string       string                                                          # 3.2.14
address-string          string                                                          # 3.2.15
terminus-durability     uint    none=0 configuration=1 unsettled-state=2                # 3.5.5
terminus-expiry-policy  symbol  link-detach=link-detach session-end=session-end connection-close=connection-close never=never  # 3.5.6
std-dist-mode           symbol  move=move copy=copy                                     # 3.5.7
filter-set              map                                                             # 3.5.8
node-properties         fields                                                          # 3.5.9
txn-capability          symbol  local-transactions=amqp:local-transactions distributed-transactions=amqp:distributed-transactions promotable-transactions=amqp:promotable-transactions multi-txns-per-ssn=amqp:multi-txns-per-ssn multi-ssns-per-txn=amqp:multi-ssns-per-txn  # 4.5.7
sasl-code               ubyte   ok=0 auth=1 sys=2 sys-perm=3 sys-temp=4                 # 5.3.3.6
"""

DESCRIBED = """
# ---- part 2: transport performatives (2.7), provides=frame
open 0x10 amqp:open:list composite provides=frame                                            # 2.7.1
    container-id            string              mandatory
    hostname                string
    max-frame-size          uint                default=4294967295
    channel-max             ushort              default=65535
    idle-time-out           milliseconds
    outgoing-locales        ietf-language-tag   multiple
    incoming-locales        ietf-language-tag   multiple
    offered-capabilities    symbol              multiple
    desired-capabilities    symbol              multiple
    properties              fields
begin 0x11 amqp:begin:list composite provides=frame                                          # 2.7.2
    remote-channel          ushort
    next-outgoing-id        transfer-number     mandatory
    incoming-window         uint                mandatory
    outgoing-window         uint                mandatory
    handle-max              handle              default=4294967295
    offered-capabilities    symbol              multiple
    desired-capabilities    symbol              multiple
    properties              fields
attach 0x12 amqp:attach:list composite provides=frame                                        # 2.7.3
    name                    string              mandatory
    handle                  handle              mandatory
    role                    role                mandatory
    snd-settle-mode         sender-settle-mode  default=mixed
    rcv-settle-mode         receiver-settle-mode default=first
    source                  *                   requires=source
    target                  *                   requires=target
    unsettled               map
    incomplete-unsettled    boolean             default=false
    initial-delivery-count  sequence-no
    max-message-size        ulong
    offered-capabilities    symbol              multiple
    desired-capabilities    symbol              multiple
    properties              fields
flow 0x13 amqp:flow:list composite provides=frame                                            # 2.7.4
    next-incoming-id        transfer-number
    incoming-window         uint                mandatory
    next-outgoing-id        transfer-number     mandatory
    outgoing-window         uint                mandatory
    handle                  handle
    delivery-count          sequence-no
    link-credit             uint
    available               uint
    drain                   boolean             default=false
    echo                    boolean             default=false
    properties              fields
transfer 0x14 amqp:transfer:list composite provides=frame                                    # 2.7.5
    handle                  handle              mandatory
    delivery-id             delivery-number
    delivery-tag            delivery-tag
    message-format          message-format
    settled                 boolean             # no default: unset on a continuation means "as before"
    more                    boolean             default=false
    rcv-settle-mode         receiver-settle-mode
    state                   *                   requires=delivery-state
    resume                  boolean             default=false
    aborted                 boolean             default=false
    batchable               boolean             default=false
disposition 0x15 amqp:disposition:list composite provides=frame                              # 2.7.6
    role                    role                mandatory
    first                   delivery-number     mandatory
    last                    delivery-number
    settled                 boolean             default=false
    state                   *                   requires=delivery-state
    batchable               boolean             default=false
detach 0x16 amqp:detach:list composite provides=frame                                        # 2.7.7
    handle                  handle              mandatory
    closed                  boolean             default=false
    error                   error
end 0x17 amqp:end:list composite provides=frame                                              # 2.7.8
    error                   error
close 0x18 amqp:close:list composite provides=frame                                          # 2.7.9
    error                   error
error 0x1d amqp:error:list composite                                                        # 2.8.14
    condition               symbol              mandatory   requires=error-condition
    description             string
    info                    fields

# ---- part 3: messaging
header 0x70 amqp:header:list composite provides=section                                      # 3.2.1
    durable                 boolean             default=false
    priority                ubyte               default=4
    ttl                     milliseconds
    first-acquirer          boolean             default=false
    delivery-count          uint                default=0
delivery-annotations 0x71 amqp:delivery-annotations:map annotations provides=section     # 3.2.2
message-annotations 0x72 amqp:message-annotations:map annotations provides=section       # 3.2.3
properties 0x73 amqp:properties:list composite provides=section                              # 3.2.4
    message-id              *                   requires=message-id
    user-id                 binary
    to                      *                   requires=address
    subject                 string
    reply-to                *                   requires=address
    correlation-id          *                   requires=message-id
    content-type            symbol
    content-encoding        symbol
    absolute-expiry-time    timestamp
    creation-time           timestamp
    group-id                string
    group-sequence          sequence-no
    reply-to-group-id       string
application-properties 0x74 amqp:application-properties:map map provides=section         # 3.2.5 string keys
data 0x75 amqp:data:binary binary provides=section                                      # 3.2.6
amqp-sequence 0x76 amqp:amqp-sequence:list list provides=section                        # 3.2.7
amqp-value 0x77 amqp:amqp-value:* * provides=section                                    # 3.2.8
footer 0x78 amqp:footer:map annotations provides=section                                # 3.2.9
received 0x23 amqp:received:list composite provides=delivery-state                           # 3.4.1
    section-number          uint                mandatory
    section-offset          ulong               mandatory
accepted 0x24 amqp:accepted:list composite provides=delivery-state,outcome                   # 3.4.2
rejected 0x25 amqp:rejected:list composite provides=delivery-state,outcome                   # 3.4.3
    error                   error
released 0x26 amqp:released:list composite provides=delivery-state,outcome                   # 3.4.4
modified 0x27 amqp:modified:list composite provides=delivery-state,outcome                   # 3.4.5
    delivery-failed         boolean
    undeliverable-here      boolean
    message-annotations     fields
source 0x28 amqp:source:list composite provides=source                                       # 3.5.3
    address                 *                   requires=address
    durable                 terminus-durability default=none
    expiry-policy           terminus-expiry-policy default=session-end
    timeout                 seconds             default=0
    dynamic                 boolean             default=false
    dynamic-node-properties node-properties
    distribution-mode       symbol              requires=distribution-mode
    filter                  filter-set
    default-outcome         *                   requires=outcome
    outcomes                symbol              multiple
    capabilities            symbol              multiple
target 0x29 amqp:target:list composite provides=target                                       # 3.5.4
    address                 *                   requires=address
    durable                 terminus-durability default=none
    expiry-policy           terminus-expiry-policy default=session-end
    timeout                 seconds             default=0
    dynamic                 boolean             default=false
    dynamic-node-properties node-properties
    capabilities            symbol              multiple
delete-on-close 0x2b amqp:delete-on-close:list composite provides=lifetime-policy            # 3.5.10
delete-on-no-links 0x2c amqp:delete-on-no-links:list composite provides=lifetime-policy      # 3.5.11
delete-on-no-messages 0x2d amqp:delete-on-no-messages:list composite provides=lifetime-policy  # 3.5.12
delete-on-no-links-or-messages 0x2e amqp:delete-on-no-links-or-messages:list composite provides=lifetime-policy  # 3.5.13

# ---- part 4: transactions (4.5)
coordinator 0x30 amqp:coordinator:list composite provides=target                             # 4.5.1
    capabilities            symbol              multiple    requires=txn-capability
declare 0x31 amqp:declare:list composite                                                     # 4.5.2
    global-id               *                   requires=global-tx-id
discharge 0x32 amqp:discharge:list composite                                                 # 4.5.3
    txn-id                  *                   mandatory   requires=txn-id
    fail                    boolean
declared 0x33 amqp:declared:list composite provides=delivery-state,outcome                   # 4.5.5
    txn-id                  *                   mandatory   requires=txn-id
transactional-state 0x34 amqp:transactional-state:list composite provides=delivery-state     # 4.5.6
    txn-id                  *                   mandatory   requires=txn-id
    outcome                 *                   requires=outcome

# ---- part 5: SASL frames (5.3.3), provides=sasl-frame
sasl-mechanisms 0x40 amqp:sasl-mechanisms:list composite provides=sasl-frame                 # 5.3.3.1
    sasl-server-mechanisms  symbol              mandatory   multiple
sasl-init 0x41 amqp:sasl-init:list composite provides=sasl-frame                             # 5.3.3.2
    mechanism               symbol              mandatory
    initial-response        binary
    hostname                string
sasl-challenge 0x42 amqp:sasl-challenge:list composite provides=sasl-frame                   # 5.3.3.3
    challenge               binary              mandatory
sasl-response 0x43 amqp:sasl-response:list composite provides=sasl-frame                     # 5.3.3.4
    response                binary              mandatory
sasl-outcome 0x44 amqp:sasl-outcome:list composite provides=sasl-frame                       # 5.3.3.5
    code                    sasl-code           mandatory
    additional-data         binary
"""

CONDITIONS = """
internal-error              amqp:internal-error                     # 2.8.15
not-found                   amqp:not-found
unauthorized-access         amqp:unauthorized-access
decode-error                amqp:decode-error
resource-limit-exceeded     amqp:resource-limit-exceeded
not-allowed                 amqp:not-allowed
invalid-field               amqp:invalid-field
not-implemented             amqp:not-implemented
resource-locked             amqp:resource-locked
precondition-failed         amqp:precondition-failed
resource-deleted            amqp:resource-deleted
illegal-state               amqp:illegal-state
frame-size-too-small        amqp:frame-size-too-small
connection-forced           amqp:connection:forced                  # 2.8.16
framing-error               amqp:connection:framing-error
connection-redirect         amqp:connection:redirect
window-violation            amqp:session:window-violation           # 2.8.17
errant-link                 amqp:session:errant-link
handle-in-use               amqp:session:handle-in-use
unattached-handle           amqp:session:unattached-handle
detach-forced               amqp:link:detach-forced                 # 2.8.18
transfer-limit-exceeded     amqp:link:transfer-limit-exceeded
message-size-exceeded       amqp:link:message-size-exceeded
link-redirect               amqp:link:redirect
stolen                      amqp:link:stolen
unknown-id                  amqp:transaction:unknown-id             # 4.5.8
transaction-rollback        amqp:transaction:rollback
transaction-timeout         amqp:transaction:timeout
"""

#: The primitive types of 1.6, in the spec's order (the ``type`` column of ENCODINGS).
PRIMITIVES = ("null", "boolean", "ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long", "float",
              "double", "decimal32", "decimal64", "decimal128", "char", "timestamp", "uuid", "binary", "string",
              "symbol", "list", "map", "array")
CATEGORIES = ("fixed", "variable", "compound", "array")


class Encoding(NamedTuple):
    name: str
    code: int
    category: str
    width: int
    type: str


class Restricted(NamedTuple):
    name: str
    source: str
    choices: dict[str, object]  # choice name -> value of the source type


class Field(NamedTuple):
    name: str
    type: str  # a primitive, restricted or described type name, or "*"
    mandatory: bool = False
    multiple: bool = False
    default: object = None  # already converted to the source type
    requires: str | None = None


@dataclass(frozen=True)
class Described:
    name: str
    code: int  # the ulong descriptor (domain 0)
    symbol: str
    source: str  # "composite", else the source type of a restricted type ("binary", "*", ...)
    provides: tuple[str, ...]
    fields: tuple[Field, ...]

    @property
    def composite(self) -> bool:
        """A composite type (1.3.2: a described list of fields), else a restricted one (1.3.5)."""
        return self.source == "composite"


@dataclass(frozen=True)
class Spec:
    encodings: dict[int, Encoding]  # code -> encoding
    restricted: dict[str, Restricted]
    described: dict[str, Described]  # name -> definition, in table order
    conditions: dict[str, str]  # short name -> symbol

    def source_of(self, type_name: str) -> str:
        """The primitive type a field type is encoded as (restricted types resolve to their source);
        described types resolve to themselves and ``*`` stays ``*``."""
        seen = 0
        while type_name in self.restricted:
            type_name = self.restricted[type_name].source
            seen += 1
            if seen > 8:
                raise ValueError(f"restricted type cycle at {type_name}")
        return type_name


def _lines(text: str):
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.strip():
            yield raw, line


def _value(text: str, source: str) -> object:
    if source == "boolean":
        if text not in ("true", "false"):
            raise ValueError(f"boolean value {text!r}")
        return text == "true"
    if source in ("ubyte", "ushort", "uint", "ulong", "byte", "short", "int", "long"):
        return int(text, 0)
    if source == "symbol":
        return text
    raise ValueError(f"no literal syntax for {source} values ({text!r})")


def parse() -> Spec:
    """The tables as records, checked: unique codes, known types, defaults of the right type."""
    encodings: dict[int, Encoding] = {}
    for _raw, line in _lines(ENCODINGS):
        name, code, category, width, typ = line.split()
        enc = Encoding(name, int(code, 16), category, int(width), typ)
        if enc.code in encodings:
            raise ValueError(f"duplicate encoding code {code}")
        if category not in CATEGORIES or typ not in PRIMITIVES:
            raise ValueError(f"bad encoding line {line!r}")
        encodings[enc.code] = enc
    if {e.type for e in encodings.values()} != set(PRIMITIVES):
        raise ValueError("every primitive type needs an encoding")

    restricted: dict[str, Restricted] = {}
    for _raw, line in _lines(RESTRICTED):
        name, source, *choices = line.split()
        restricted[name] = Restricted(name, source, {})
    for r in list(restricted.values()):
        base = r.source
        while base in restricted:
            base = restricted[base].source
        if base not in PRIMITIVES:
            raise ValueError(f"restricted type {r.name}: unknown source {r.source}")
    for _raw, line in _lines(RESTRICTED):
        name, source, *choices = line.split()
        base = restricted[name].source
        while base in restricted:
            base = restricted[base].source
        for choice in choices:
            key, _, value = choice.partition("=")
            restricted[name].choices[key] = _value(value, base)

    described: dict[str, Described] = {}
    head: list | None = None
    fields: list[Field] = []

    def close() -> None:
        if head is not None:
            name, code, symbol, source, provides = head
            described[name] = Described(name, code, symbol, source, provides, tuple(fields))

    for _raw, line in _lines(DESCRIBED):
        if not line.startswith(" "):
            close()
            words = line.split()
            provides: tuple[str, ...] = ()
            if len(words) == 5:
                key, _, value = words[4].partition("=")
                if key != "provides":
                    raise ValueError(f"bad described head {line!r}")
                provides = tuple(value.split(","))
            elif len(words) != 4:
                raise ValueError(f"bad described head {line!r}")
            head = [words[0], int(words[1], 16), words[2], words[3], provides]
            fields = []
            continue
        if head is None:
            raise ValueError("a field line before any described type")
        name, typ, *flags = line.split()
        mandatory = multiple = False
        default = requires = None
        for flag in flags:
            if flag == "mandatory":
                mandatory = True
            elif flag == "multiple":
                multiple = True
            elif flag.startswith("default="):
                default = flag[len("default="):]
            elif flag.startswith("requires="):
                requires = flag[len("requires="):]
            else:
                raise ValueError(f"unknown field flag {flag!r} in {line!r}")
        fields.append(Field(name, typ, mandatory, multiple, default, requires))
    close()

    codes: dict[int, str] = {}
    symbols: set[str] = set()
    spec = Spec(encodings, restricted, described, {})
    for d in described.values():
        if d.code in codes or d.symbol in symbols:
            raise ValueError(f"duplicate descriptor for {d.name}")
        codes[d.code] = d.name
        symbols.add(d.symbol)
        if d.fields and not d.composite:
            raise ValueError(f"{d.name}: only composite types have fields")
        resolved = []
        for f in d.fields:
            source = spec.source_of(f.type)
            if source not in PRIMITIVES and source not in described and source != "*":
                raise ValueError(f"{d.name}.{f.name}: unknown type {f.type}")
            default = f.default
            if isinstance(default, str):  # as written in the table
                choices = restricted[f.type].choices if f.type in restricted else {}
                default = choices[default] if default in choices else _value(default, source)
            resolved.append(f._replace(default=default))
        described[d.name] = Described(d.name, d.code, d.symbol, d.source, d.provides, tuple(resolved))
    for d in described.values():
        source = spec.source_of(d.source)
        if source not in PRIMITIVES and source not in ("*", "composite"):
            raise ValueError(f"{d.name}: unknown source type {d.source}")

    conditions = {}
    for _raw, line in _lines(CONDITIONS):
        name, symbol = line.split()
        conditions[name] = symbol
    return Spec(encodings, restricted, described, conditions)
