"""JMS message selectors and AMQP SQL filter expressions: a bounded parser and a three-valued evaluator.

Two dialects of one SQL-92 subset (JMS 2.0 section 3.8.1, "Message selector"):

* ``JMS`` -- ``apache.org:selector-filter:string`` (the AMQP filter registry): identifiers are JMS
  header names mapped onto the 1.0 message as Qpid JMS and Artemis map them (:data:`JMS_FIELDS`:
  ``JMSMessageID`` -> properties.message-id, ``JMSPriority`` -> header.priority (4 when absent),
  ``JMSDeliveryMode`` -> ``'PERSISTENT'``/``'NON_PERSISTENT'`` from header.durable, ``JMSType`` ->
  properties.subject, ``JMSTimestamp`` -> properties.creation-time...); any other identifier names an
  application property.
* ``SQL`` -- RabbitMQ 4.2's ``amqp:sql-filter`` (AMQP Filter Expressions 1.0, section 6): the same
  grammar, identifiers qualified by section (``header.``/``h.``, ``properties.``/``p.``,
  ``application_properties.``/``a.``, ``message_annotations.``/``m.``; field names with ``_`` or
  ``-``), unqualified ones naming application properties; ``!=`` for ``<>``, ``%`` (remainder),
  string ordering, and ``UTC()`` (the time of the log entry being applied: deterministic).

Grammar (lowest precedence first)::

    or        := and (OR and)*
    and       := not (AND not)*
    not       := NOT not | predicate
    predicate := sum [cmp sum | [NOT] BETWEEN sum AND sum | [NOT] IN '(' literal, ... ')'
                      | [NOT] LIKE string [ESCAPE string] | IS [NOT] NULL]
    sum       := product (('+' | '-') product)*
    product   := unary (('*' | '/' | '%') unary)*
    unary     := ('+' | '-') unary | primary
    primary   := literal | identifier | '(' or ')' | UTC '(' ')'

Bounded cost, whatever the input: the text is at most :data:`MAX_LENGTH` characters, the parser is
hand-written recursive descent that refuses nesting deeper than :data:`MAX_DEPTH` (parentheses, NOT
and sign chains: no RecursionError) and trees of more than :data:`MAX_NODES` nodes; LIKE patterns are
compiled to a linear-time matcher (store/core/filters/like.py); evaluation of one message stops at
:data:`EVAL_BUDGET` units (a node visited is one, a LIKE costs one per text character) and the
selector then does not select the message -- counted, not timed, so every replica decides alike.

Three-valued logic as JMS 3.8.1.2 defines it: a NULL (absent) value makes comparisons, arithmetic,
BETWEEN, IN and LIKE unknown (None); AND/OR/NOT follow SQL's truth tables; comparing values of
different types (a string with a number) is false, not unknown; a message is selected only when the
expression is TRUE.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from .like import PatternError, compile_like
from .view import MessageView

JMS, SQL = "jms", "sql"

MAX_LENGTH = 4096  # characters of an expression
MAX_DEPTH = 64  # nesting of parentheses, NOT and signs
MAX_NODES = 1000  # nodes of the parsed tree
EVAL_BUDGET = 100_000  # units per message (module docstring)

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


class SelectorError(ValueError):
    """The expression does not parse (or is over a limit): the reason, for the client."""


# ------------------------------------------------------------------------------------------- tokens
_KEYWORDS = frozenset(("NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"))
_OPERATORS = ("<>", "<=", ">=", "!=", "=", "<", ">", "+", "-", "*", "/", "%", "(", ")", ",")

# Token kinds: "kw" (value the upper-case keyword), "id", "qid" (a "quoted" name, SQL), "str", "num", "op",
# "end".
Token = tuple[str, Any, int]


def _ident_start(ch: str) -> bool:
    return ch.isalpha() or ch in "_$"


def _ident_part(ch: str, dialect: str) -> bool:
    return ch.isalnum() or ch in "_$" or (dialect == SQL and ch in ".-")


def tokenize(text: str, dialect: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in " \t\r\n\f":
            i += 1
            continue
        start = i
        if ch == "'":
            i += 1
            parts = []
            while True:
                j = text.find("'", i)
                if j < 0:
                    raise SelectorError(f"unterminated string literal at position {start}")
                parts.append(text[i:j])
                if j + 1 < n and text[j + 1] == "'":
                    parts.append("'")
                    i = j + 2
                    continue
                i = j + 1
                break
            tokens.append(("str", "".join(parts), start))
            continue
        if ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            i = _number_end(text, i)
            tokens.append(("num", _number(text[start:i], start), start))
            continue
        if ch == '"' and dialect == SQL:  # a delimited identifier (SQL-92), e.g. "a.my key"
            j = text.find('"', i + 1)
            if j < 0:
                raise SelectorError(f"unterminated quoted identifier at position {start}")
            tokens.append(("qid", text[i + 1:j], start))  # names an application property as written
            i = j + 1
            continue
        if _ident_start(ch):
            i += 1
            while i < n and _ident_part(text[i], dialect):
                i += 1
            word = text[start:i]
            upper = word.upper()
            if upper in _KEYWORDS:
                tokens.append(("kw", upper, start))
            else:
                tokens.append(("id", word, start))
            continue
        for op in _OPERATORS:
            if text.startswith(op, i):
                if op == "!=" and dialect != SQL:
                    raise SelectorError(f"unexpected '!=' at position {start} (a selector writes <>)")
                if op == "%" and dialect != SQL:
                    break
                tokens.append(("op", "<>" if op == "!=" else op, start))
                i += len(op)
                break
        else:
            raise SelectorError(f"unexpected character {ch!r} at position {start}")
        if i == start:
            raise SelectorError(f"unexpected character {ch!r} at position {start}")
    tokens.append(("end", None, n))
    return tokens


def _number_end(text: str, i: int) -> int:
    n = len(text)
    if text.startswith(("0x", "0X"), i):
        i += 2
        while i < n and text[i] in "0123456789abcdefABCDEF":
            i += 1
        return i + (1 if i < n and text[i] in "lL" else 0)
    while i < n and text[i].isdigit():
        i += 1
    if i < n and text[i] == ".":
        i += 1
        while i < n and text[i].isdigit():
            i += 1
    if i < n and text[i] in "eE":
        j = i + 1
        if j < n and text[j] in "+-":
            j += 1
        if j < n and text[j].isdigit():
            i = j
            while i < n and text[i].isdigit():
                i += 1
    if i < n and text[i] in "lLfFdD":
        i += 1
    return i


def _number(word: str, position: int) -> int | float:
    try:
        if word[:2] in ("0x", "0X"):
            value: int | float = int(word[2:].rstrip("lL"), 16)
        elif any(c in word for c in ".eEfFdD"):
            value = float(word.rstrip("fFdD"))
        else:
            value = int(word.rstrip("lL"))
    except ValueError:
        raise SelectorError(f"bad numeric literal {word!r} at position {position}") from None
    if isinstance(value, int) and value > _LONG_MAX + 1:  # + 1: the magnitude of -9223372036854775808
        raise SelectorError(f"numeric literal {word!r} is out of the range of a 64-bit integer")
    return value


# --------------------------------------------------------------------------------- identifier mapping
#: JMS header identifiers as 1.0 fields: (section, field).  Qpid JMS's and Artemis's mapping.
JMS_FIELDS = {
    "JMSMessageID": ("p", "message-id"),
    "JMSCorrelationID": ("p", "correlation-id"),
    "JMSPriority": ("prio", "priority"),
    "JMSType": ("p", "subject"),
    "JMSDeliveryMode": ("mode", "durable"),
    "JMSTimestamp": ("p", "creation-time"),
    "JMSExpiration": ("p", "absolute-expiry-time"),
    "JMSReplyTo": ("p", "reply-to"),
    "JMSDestination": ("p", "to"),
    "JMSXUserID": ("user", "user-id"),
    "JMSXGroupID": ("p", "group-id"),
    "JMSXGroupSeq": ("p", "group-sequence"),
    "JMSXDeliveryCount": ("count", "delivery-count"),
}

_SECTIONS = {"header": "h", "h": "h", "properties": "p", "p": "p", "application_properties": "a", "a": "a",
             "message_annotations": "m", "m": "m"}
_HEADER_NAMES = frozenset(("durable", "priority", "ttl", "first-acquirer", "delivery-count"))
_PROPERTY_NAMES = frozenset(("message-id", "user-id", "to", "subject", "reply-to", "correlation-id",
                             "content-type", "content-encoding", "absolute-expiry-time", "creation-time",
                             "group-id", "group-sequence", "reply-to-group-id"))


def resolve(name: str, dialect: str) -> tuple[str, str]:
    """The (section, field) an identifier names; SelectorError for an unknown qualified field."""
    if dialect == JMS:
        return JMS_FIELDS.get(name, ("a", name))
    prefix, dot, rest = name.partition(".")
    if dot and prefix.lower() in _SECTIONS:
        section = _SECTIONS[prefix.lower()]
        if section in "hp":
            field = rest.lower().replace("_", "-")
            if field not in (_HEADER_NAMES if section == "h" else _PROPERTY_NAMES):
                raise SelectorError(f"unknown field '{name}'")
            return section, field
        return section, rest
    return "a", name


# ------------------------------------------------------------------------------------------- parser
class _Parser:
    def __init__(self, text: str, dialect: str) -> None:
        self.dialect = dialect
        self.tokens = tokenize(text, dialect)
        self.pos = 0
        self.depth = 0
        self.nodes = 0

    def peek(self) -> Token:
        return self.tokens[self.pos]

    def take(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def is_kw(self, word: str) -> bool:
        kind, value, _ = self.tokens[self.pos]
        return kind == "kw" and value == word

    def is_op(self, op: str) -> bool:
        kind, value, _ = self.tokens[self.pos]
        return kind == "op" and value == op

    def expect_op(self, op: str) -> None:
        if not self.is_op(op):
            self.fail(f"expected '{op}'")
        self.pos += 1

    def fail(self, what: str) -> NoReturn:
        kind, value, position = self.peek()
        shown = "the end" if kind == "end" else repr(value if kind != "str" else f"'{value}'")
        raise SelectorError(f"{what} at position {position}, found {shown}")

    def node(self, *parts: Any) -> tuple:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SelectorError(f"expression has more than {MAX_NODES} nodes")
        return parts

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"expression nested deeper than {MAX_DEPTH}")

    def parse(self) -> tuple:
        if self.peek()[0] == "end":
            raise SelectorError("empty expression")
        tree = self.parse_or()
        if self.peek()[0] != "end":
            self.fail("unexpected token")
        return tree

    def parse_or(self) -> tuple:
        left = self.parse_and()
        while self.is_kw("OR"):
            self.pos += 1
            left = self.node("or", left, self.parse_and())
        return left

    def parse_and(self) -> tuple:
        left = self.parse_not()
        while self.is_kw("AND"):
            self.pos += 1
            left = self.node("and", left, self.parse_not())
        return left

    def parse_not(self) -> tuple:
        if self.is_kw("NOT"):
            self.pos += 1
            self.enter()
            inner = self.parse_not()
            self.depth -= 1
            return self.node("not", inner)
        return self.parse_predicate()

    def parse_predicate(self) -> tuple:
        left = self.parse_sum()
        kind, value, _ = self.peek()
        if kind == "op" and value in ("=", "<>", "<", "<=", ">", ">="):
            self.pos += 1
            return self.node("cmp", value, left, self.parse_sum())
        if kind == "kw" and value == "IS":
            self.pos += 1
            negated = self.is_kw("NOT")
            if negated:
                self.pos += 1
            if not self.is_kw("NULL"):
                self.fail("expected NULL")
            self.pos += 1
            return self.node("null", negated, left)
        negated = False
        if kind == "kw" and value == "NOT":
            negated = True
            self.pos += 1
            kind, value, _ = self.peek()
            if not (kind == "kw" and value in ("BETWEEN", "IN", "LIKE")):
                self.fail("expected BETWEEN, IN or LIKE after NOT")
        if kind == "kw" and value == "BETWEEN":
            self.pos += 1
            low = self.parse_sum()
            if not self.is_kw("AND"):
                self.fail("expected AND in BETWEEN")
            self.pos += 1
            return self.node("between", negated, left, low, self.parse_sum())
        if kind == "kw" and value == "IN":
            self.pos += 1
            self.expect_op("(")
            values = [self.literal()]
            while self.is_op(","):
                self.pos += 1
                values.append(self.literal())
            self.expect_op(")")
            return self.node("in", negated, left, tuple(values))
        if kind == "kw" and value == "LIKE":
            self.pos += 1
            pattern = self.string("a string pattern after LIKE")
            escape = None
            if self.is_kw("ESCAPE"):
                self.pos += 1
                escape = self.string("a string after ESCAPE")
            try:
                matcher = compile_like(pattern, escape)
            except PatternError as exc:
                raise SelectorError(str(exc)) from None
            return self.node("like", negated, left, matcher)
        return left

    def string(self, what: str) -> str:
        kind, value, _ = self.peek()
        if kind != "str":
            self.fail(f"expected {what}")
        self.pos += 1
        return value

    def literal(self) -> Any:
        kind, value, _ = self.peek()
        sign = 1
        if kind == "op" and value in ("+", "-"):
            sign = -1 if value == "-" else 1
            self.pos += 1
            kind, value, _ = self.peek()
            if kind != "num":
                self.fail("expected a number")
        if kind == "str":
            self.pos += 1
            return value
        if kind == "num":
            self.pos += 1
            value = sign * value
            if isinstance(value, int) and not _LONG_MIN <= value <= _LONG_MAX:
                raise SelectorError(f"numeric literal {value} is out of the range of a 64-bit integer")
            return value
        if kind == "kw" and value in ("TRUE", "FALSE"):
            self.pos += 1
            return value == "TRUE"
        self.fail("expected a literal")

    def parse_sum(self) -> tuple:
        left = self.parse_product()
        while self.peek()[0] == "op" and self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            left = self.node("arith", op, left, self.parse_product())
        return left

    def parse_product(self) -> tuple:
        left = self.parse_unary()
        while self.peek()[0] == "op" and self.peek()[1] in ("*", "/", "%"):
            op = self.take()[1]
            left = self.node("arith", op, left, self.parse_unary())
        return left

    def parse_unary(self) -> tuple:
        kind, value, _ = self.peek()
        if kind == "op" and value in ("+", "-"):
            self.pos += 1
            if self.peek()[0] == "num":  # a signed literal: -9223372036854775808 is in range
                number = self.take()[1]
                number = -number if value == "-" else number
                if isinstance(number, int) and not _LONG_MIN <= number <= _LONG_MAX:
                    raise SelectorError(f"numeric literal {number} is out of the range of a 64-bit integer")
                return self.node("lit", number)
            self.enter()
            inner = self.parse_unary()
            self.depth -= 1
            return self.node("neg", inner) if value == "-" else inner
        return self.parse_primary()

    def parse_primary(self) -> tuple:
        kind, value, _ = self.peek()
        if kind == "op" and value == "(":
            self.pos += 1
            self.enter()
            inner = self.parse_or()
            self.depth -= 1
            self.expect_op(")")
            return inner
        if kind == "str":
            self.pos += 1
            return self.node("lit", value)
        if kind == "num":
            self.pos += 1
            if isinstance(value, int) and value > _LONG_MAX:
                raise SelectorError(f"numeric literal {value} is out of the range of a 64-bit integer")
            return self.node("lit", value)
        if kind == "kw" and value in ("TRUE", "FALSE"):
            self.pos += 1
            return self.node("lit", value == "TRUE")
        if kind == "kw" and value == "NULL":
            self.pos += 1
            return self.node("lit", None)
        if kind == "qid":
            self.pos += 1
            return self.node("id", "a", value)
        if kind == "id":
            self.pos += 1
            if self.dialect == SQL and value.upper() == "UTC" and self.is_op("("):
                self.pos += 1
                self.expect_op(")")
                return self.node("utc")
            section, field = resolve(value, self.dialect)
            return self.node("id", section, field)
        self.fail("expected an operand")


def parse(text: str, dialect: str = JMS) -> tuple:
    """The tree of ``text``; SelectorError with the reason if it does not parse."""
    if not isinstance(text, str):
        raise SelectorError("the expression is not a string")
    if len(text) > MAX_LENGTH:
        raise SelectorError(f"expression longer than {MAX_LENGTH} characters")
    return _Parser(text, dialect).parse()


# ---------------------------------------------------------------------------------------- evaluator
def _wrap(value: int) -> int:
    """A Java long's arithmetic: wrap to 64 bits two's complement."""
    if _LONG_MIN <= value <= _LONG_MAX:
        return value
    return ((value - _LONG_MIN) % (1 << 64)) + _LONG_MIN


def _numeric(value: Any) -> bool:
    return value.__class__ is int or value.__class__ is float


class _OverBudget(Exception):
    pass


class Evaluation:
    """One message's evaluation: the view, the apply time, the budget left."""

    __slots__ = ("view", "now_ms", "budget", "dialect")

    def __init__(self, view: MessageView, now_ms: int, dialect: str, budget: int = EVAL_BUDGET) -> None:
        self.view, self.now_ms, self.dialect, self.budget = view, now_ms, dialect, budget

    def field(self, section: str, name: str) -> Any:
        view = self.view
        if section == "a":
            value = view.application.get(name)
        elif section == "p":
            value = view.properties.get(name)
        elif section == "h":
            value = view.header.get(name)
        elif section == "m":
            value = view.annotations.get(name)
        elif section == "prio":
            value = view.header.get("priority")
            return 4 if value is None else value  # 1.0 3.2.1: priority defaults to 4
        elif section == "mode":
            return "PERSISTENT" if view.header.get("durable") else "NON_PERSISTENT"
        elif section == "count":
            value = view.header.get("delivery-count")
            return (value or 0) + 1  # JMSXDeliveryCount counts this delivery
        elif section == "user":
            value = view.properties.get("user-id")
            if isinstance(value, bytes):
                return value.decode("utf-8", "replace")
            return value if isinstance(value, str) else None
        else:
            return None
        if value is None or value.__class__ in (bool, int, float, str):
            return value
        return None  # binary and the rest: nothing a selector compares

    def run(self, node: tuple) -> Any:
        self.budget -= 1
        if self.budget < 0:
            raise _OverBudget
        kind = node[0]
        if kind == "id":
            return self.field(node[1], node[2])
        if kind == "lit":
            return node[1]
        if kind == "and":
            left = _truth(self.run(node[1]))
            if left is False:
                return False
            right = _truth(self.run(node[2]))
            if right is False:
                return False
            return True if left and right else None
        if kind == "or":
            left = _truth(self.run(node[1]))
            if left is True:
                return True
            right = _truth(self.run(node[2]))
            if right is True:
                return True
            return False if left is False and right is False else None
        if kind == "not":
            value = _truth(self.run(node[1]))
            return None if value is None else not value
        if kind == "cmp":
            return self.compare(node[1], self.run(node[2]), self.run(node[3]))
        if kind == "null":
            is_null = self.run(node[2]) is None
            return not is_null if node[1] else is_null
        if kind == "between":
            value = self.run(node[2])
            low, high = self.run(node[3]), self.run(node[4])
            inside = _and(self.compare(">=", value, low), self.compare("<=", value, high))
            return _negate(inside) if node[1] else inside
        if kind == "in":
            value = self.run(node[2])
            if value is None:
                return None
            found = any(self.compare("=", value, v) is True for v in node[3])
            return not found if node[1] else found
        if kind == "like":
            value = self.run(node[2])
            if value is None:
                return None
            if value.__class__ is not str:
                return False  # not a string: "non-like types", false (JMS 3.8.1.2)
            self.budget -= len(value)
            if self.budget < 0:
                raise _OverBudget
            matched = node[3].match(value)
            return not matched if node[1] else matched
        if kind == "arith":
            return _arith(node[1], self.run(node[2]), self.run(node[3]))
        if kind == "neg":
            value = self.run(node[1])
            if not _numeric(value):
                return None
            return _wrap(-value) if value.__class__ is int else -value
        if kind == "utc":
            return self.now_ms
        raise ValueError(f"unknown node {kind!r}")

    def compare(self, op: str, left: Any, right: Any) -> bool | None:
        if left is None or right is None:
            return None
        if _numeric(left) and _numeric(right):
            pass
        elif left.__class__ is not right.__class__:
            return False  # "non-like type values": false (JMS 3.8.1.2)
        elif (left.__class__ is bool or (left.__class__ is str and self.dialect == JMS)) \
                and op not in ("=", "<>"):
            return False  # JMS: strings and booleans compare with = and <> only
        if op == "=":
            return left == right
        if op == "<>":
            return left != right
        if isinstance(left, float) and math.isnan(left) or isinstance(right, float) and math.isnan(right):
            return False
        if op == "<":
            return left < right
        if op == "<=":
            return left <= right
        if op == ">":
            return left > right
        return left >= right


def _truth(value: Any) -> bool | None:
    return value if value is True or value is False else None


def _and(left: bool | None, right: bool | None) -> bool | None:
    if left is False or right is False:
        return False
    return True if left and right else None


def _negate(value: bool | None) -> bool | None:
    return None if value is None else not value


def _arith(op: str, left: Any, right: Any) -> Any:
    if not (_numeric(left) and _numeric(right)):
        return None
    both_int = left.__class__ is int and right.__class__ is int
    if op == "+":
        result = left + right
    elif op == "-":
        result = left - right
    elif op == "*":
        result = left * right
    else:
        if right == 0:
            return None
        if both_int:
            quotient = abs(left) // abs(right)  # Java truncates toward zero
            if (left < 0) != (right < 0):
                quotient = -quotient
            result = quotient if op == "/" else left - right * quotient
        else:
            result = left / right if op == "/" else math.fmod(left, right)
    if both_int:
        return _wrap(result)
    try:
        return float(result)
    except OverflowError:
        return None


def evaluate(tree: tuple, view: MessageView, now_ms: int = 0, dialect: str = JMS,
             budget: int = EVAL_BUDGET) -> bool | None:
    """The expression's truth for one message: True, False, or None (unknown, or over budget)."""
    try:
        return _truth(Evaluation(view, now_ms, dialect, budget).run(tree))
    except _OverBudget:
        return None

