"""The filter expression language (store/filters, issue 37): JMS selectors, AMQP SQL filter expressions,
LIKE, the property filters, and the bounds on their cost.

JMS 2.0 section 3.8.1 is the reference for the selector syntax and its three-valued logic (the
examples below are the specification's own: ``JMSType = 'car' AND color = 'blue' AND weight > 2500``,
``phone LIKE '12%3'``, ``word LIKE 'l_se'``, ``underscored LIKE '\\_%' ESCAPE '\\'``, ``age BETWEEN 15
AND 19``, ``Country IN ('UK', 'US', 'France')``, ``prop_name IS NULL``); AMQP Filter Expressions 1.0
sections 4.2.4-4.2.5 (property filters) and 6 (SQL) for RabbitMQ 4.1/4.2's filters.
"""

from __future__ import annotations

import pickle
import re
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.store.core.filters import FilterError, compile_spec
from raftmq.store.core.filters.like import MAX_PATTERN, PatternError, compile_like
from raftmq.store.core.filters.props import compile_properties
from raftmq.store.core.filters.sql import (
    EVAL_BUDGET,
    JMS,
    MAX_DEPTH,
    MAX_LENGTH,
    MAX_NODES,
    SQL,
    SelectorError,
    evaluate,
    parse,
)
from raftmq.store.core.filters.view import MessageView

TIME_BOUND = 1.0  # seconds for one parse or evaluation of a bounded input: microseconds in practice
ALLOC_BOUND = 8 << 20  # bytes of peak allocation while parsing or evaluating one expression

CAR = MessageView(header={"priority": 7, "durable": True},
                  properties={"subject": "car", "message-id": "m-1", "creation-time": 1000, "user-id": b"bob"},
                  application={"color": "blue", "weight": 3000, "phone": "12993", "word": "lose",
                               "underscored": "_x", "age": 15, "Country": "UK", "price": 2.5, "flag": True})


def sel(text: str, view: MessageView = CAR, dialect: str = JMS) -> bool | None:
    return evaluate(parse(text, dialect), view, 0, dialect)


# ------------------------------------------------------------------------------------- JMS examples
@pytest.mark.parametrize("text, expected", [
    ("JMSType = 'car' AND color = 'blue' AND weight > 2500", True),
    ("JMSType = 'car' AND color = 'blue' AND weight > 3000", False),
    ("phone LIKE '12%3'", True),
    ("phone NOT LIKE '12%3'", False),
    ("word LIKE 'l_se'", True),
    ("underscored LIKE '\\_%' ESCAPE '\\'", True),
    ("word LIKE '\\_%' ESCAPE '\\'", False),
    ("age BETWEEN 15 AND 19", True),
    ("age NOT BETWEEN 15 AND 19", False),
    ("age BETWEEN 16 AND 19", False),
    ("Country IN ('UK', 'US', 'France')", True),
    ("Country NOT IN ('UK', 'US', 'France')", False),
    ("prop_name IS NULL", True),
    ("prop_name IS NOT NULL", False),
    ("color IS NOT NULL", True),
    ("JMSPriority = 7 AND JMSDeliveryMode = 'PERSISTENT'", True),
    ("JMSMessageID = 'm-1' AND JMSTimestamp = 1000 AND JMSXUserID = 'bob'", True),
    ("weight / 1000 = 3 AND weight * 2 - 1 = 5999 AND -weight < 0 AND +age = 15", True),
    ("price * 2 = 5.0 AND price > 2 AND price < 2.6", True),
    ("flag", True),
    ("flag = TRUE AND NOT flag = FALSE", True),
    ("(color = 'red' OR color = 'blue') AND NOT (weight < 100)", True),
    ("weight > 1e3 AND weight < 3.1E3 AND weight = 0xBB8", True),
])
def test_jms_examples(text, expected):
    """JMS 3.8.1.1's examples and header identifiers mapped onto the 1.0 message."""
    assert sel(text) is expected


def test_priority_defaults_to_4_and_delivery_mode_to_non_persistent():
    """1.0 3.2.1: absent header priority is 4; absent durable is false (JMSDeliveryMode NON_PERSISTENT)."""
    empty = MessageView()
    assert sel("JMSPriority = 4", empty) is True
    assert sel("JMSDeliveryMode = 'NON_PERSISTENT'", empty) is True


# --------------------------------------------------------------------------------- three-valued logic
def test_three_valued_truth_tables():
    """JMS 3.8.1.2: a comparison with NULL is unknown; AND, OR and NOT follow SQL's tables."""
    T, F, U = "weight > 0", "weight < 0", "missing > 0"
    table = {
        (T, "AND", U): None, (F, "AND", U): False, (U, "AND", U): None, (T, "AND", T): True,
        (T, "OR", U): True, (F, "OR", U): None, (U, "OR", U): None, (F, "OR", F): False,
    }
    for (a, op, b), expected in table.items():
        assert sel(f"{a} {op} {b}") is expected, (a, op, b)
        assert sel(f"{b} {op} {a}") is expected, (b, op, a)
    assert sel(f"NOT {U}") is None
    assert sel(f"NOT {F}") is True
    for unknown in ("missing BETWEEN 1 AND 2", "missing IN ('a')", "missing LIKE 'a%'", "missing + 1 = 2",
                    "-missing = 1", "missing = missing"):
        assert sel(unknown) is None, unknown
        assert sel(f"NOT ({unknown})") is None, unknown


def test_comparing_unlike_types_is_false_not_unknown():
    """JMS 3.8.1.2: "If the comparison of non-like type values is attempted, the value of the operation
    is false" -- so its negation is true; strings and booleans compare with = and <> only."""
    assert sel("color = 5") is False
    assert sel("NOT (color = 5)") is True
    assert sel("flag = 1") is False
    assert sel("color > 'a'") is False
    assert sel("color > 'a'", dialect=SQL) is True  # SQL filter expressions order strings
    assert sel("weight LIKE '3%'") is False  # LIKE applies to strings


def test_arithmetic_is_java_long_arithmetic():
    """Integer division truncates toward zero, division by zero is unknown, longs wrap."""
    v = MessageView(application={"a": -7, "b": 2, "z": 0, "big": 9223372036854775807})
    assert sel("a / b = -3", v) is True
    assert sel("a / z = 1", v) is None
    assert sel("big + 1 < 0", v) is True
    assert sel("a % b = -1", v, SQL) is True


def test_binary_and_compound_values_are_not_comparable():
    v = MessageView(application={"bin": b"x"})
    assert sel("bin IS NULL", v) is True  # not a value a selector sees


# ------------------------------------------------------------------------------------------ SQL dialect
def test_sql_filter_field_references():
    """Filter Expressions section 6: section-qualified fields (long and short prefixes, _ or -), an
    unqualified name is an application property, ``!=``, ``UTC()`` is the apply time (deterministic)."""
    assert sel("properties.subject = 'car' AND p.message_id = 'm-1' AND p.message-id = 'm-1'",
               dialect=SQL) is True
    assert sel("header.priority = 7 AND h.durable AND a.weight = 3000 AND weight = 3000 "
               "AND application_properties.color != 'red'", dialect=SQL) is True
    assert sel('"a.color" IS NULL AND "color" = \'blue\'', dialect=SQL) is True
    tree = parse("UTC() > p.creation_time + 500", SQL)
    assert evaluate(tree, CAR, 2000, SQL) is True and evaluate(tree, CAR, 1000, SQL) is False
    with pytest.raises(SelectorError, match="unknown field"):
        parse("p.colour = 'x'", SQL)
    with pytest.raises(SelectorError):
        parse("a != 1", JMS)  # a selector writes <>


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("text, reason", [
    ("", "empty"),
    ("color =", "expected an operand"),
    ("color = 'blue", "unterminated"),
    ("color LIKE color", "string pattern"),
    ("color LIKE 'a' ESCAPE 'ab'", "single character"),
    ("color LIKE 'a\\' ESCAPE '\\'", "ends with its escape"),
    ("color IN ()", "literal"),
    ("color IN ('a' 'b')", "expected ')'"),
    ("age BETWEEN 1", "AND in BETWEEN"),
    ("color IS 5", "NULL"),
    ("color NOT 5", "BETWEEN, IN or LIKE"),
    ("(color = 'a'", "expected ')'"),
    ("color = 'a')", "unexpected token"),
    ("color # 1", "unexpected character"),
    ("9223372036854775808 = 1", "64-bit"),
    ("AND = 1", "operand"),
])
def test_syntax_errors_say_why(text, reason):
    with pytest.raises(SelectorError, match=re.escape(reason)):
        parse(text)


def test_limits_on_length_nesting_and_size():
    """The parser refuses what would cost too much before it costs it (no RecursionError)."""
    with pytest.raises(SelectorError, match="longer than"):
        parse("a = 1 OR " * (MAX_LENGTH // 8) + "a = 1")
    with pytest.raises(SelectorError, match="nested deeper"):
        parse("(" * (MAX_DEPTH + 1) + "a = 1" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(SelectorError, match="nested deeper"):
        parse("NOT " * (MAX_DEPTH + 1) + "a = 1")
    with pytest.raises(SelectorError, match="nested deeper"):
        parse("- " * (MAX_DEPTH + 1) + "a = 1")
    with pytest.raises(SelectorError, match="nodes"):
        parse(" OR ".join(["a=1"] * (MAX_NODES // 2)))
    assert parse("(" * MAX_DEPTH + "a = 1" + ")" * MAX_DEPTH)


def test_evaluation_budget_makes_a_long_like_unknown():
    """A LIKE over a text longer than the budget is not run: the message is not selected (None)."""
    tree = parse("t LIKE '%x%'")
    long = MessageView(application={"t": "a" * (EVAL_BUDGET + 1)})
    assert evaluate(tree, long) is None
    assert evaluate(tree, MessageView(application={"t": "axa"})) is True


# ------------------------------------------------------------------------------------------------ LIKE
def reference_like(pattern: str, escape: str | None, text: str) -> bool:
    """The meaning of LIKE through a regular expression (fine for the small inputs of a test)."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), text, re.DOTALL) is not None


@settings(max_examples=400, deadline=None)
@given(pattern=st.text(alphabet="ab%_\\", max_size=12), text=st.text(alphabet="ab%_\\\n", max_size=12),
       escaped=st.booleans())
def test_like_agrees_with_its_definition(pattern, text, escaped):
    escape = "\\" if escaped else None
    try:
        matcher = compile_like(pattern, escape)
    except PatternError:
        assert escaped and pattern.endswith("\\") and (len(pattern) - len(pattern.rstrip("\\"))) % 2 == 1
        return
    assert matcher.match(text) is reference_like(pattern, escape, text)


def bounded(fn, *args):
    """Run ``fn(*args)``; (result or exception, CPU seconds, peak bytes allocated)."""
    tracemalloc.start()
    started = time.process_time()  # CPU: another process on the machine must not fail a bound
    try:
        outcome = fn(*args)
    except Exception as exc:  # noqa: BLE001 - returned for the caller to judge
        outcome = exc
    elapsed = time.process_time() - started
    _size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return outcome, elapsed, peak


def test_like_has_no_catastrophic_backtracking():
    """The ReDoS shape (many % and a text that almost matches): linear, not exponential."""
    pattern = compile_like("%a" * 30 + "%c")
    outcome, elapsed, peak = bounded(pattern.match, "a" * 20_000 + "b")
    assert outcome is False
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)
    with pytest.raises(PatternError):
        compile_like("a" * (MAX_PATTERN + 1))


# ---------------------------------------------------------------------------------------------- fuzzing
TOKENS = ["a", "b", "JMSPriority", "p.subject", "h.priority", "'x'", "'a%'", "1", "2.5", "-", "+", "*", "/",
          "%", "(", ")", "=", "<>", "!=", "<", ">=", "AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE",
          "IS", "NULL", "TRUE", ",", "'\\'", "UTC()", "0x1F", "1e3", "'", '"', "#"]
VIEW = MessageView(header={"priority": 5}, properties={"subject": "xa"}, application={"a": 1, "b": "a%"})


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(TOKENS), max_size=40), dialect=st.sampled_from([JMS, SQL]))
def test_fuzz_token_soup_parses_or_says_why(words, dialect):
    """Any sequence of tokens: a tree or SelectorError, never another exception; bounded time and memory;
    a tree evaluates to True, False or None."""
    text = " ".join(words)
    outcome, elapsed, peak = bounded(parse, text, dialect)
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)
    if isinstance(outcome, Exception):
        assert isinstance(outcome, SelectorError), repr(outcome)
        return
    value, elapsed, peak = bounded(evaluate, outcome, VIEW, 0, dialect)
    assert value in (True, False, None)
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=300))
def test_fuzz_arbitrary_text(text):
    outcome, elapsed, peak = bounded(parse, text, SQL)
    assert isinstance(outcome, (tuple, SelectorError)), repr(outcome)
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.integers(min_value=0, max_value=5000), kind=st.sampled_from(["(", "NOT ", "- ", "+ "]))
def test_fuzz_deep_nesting_is_refused_cheaply(depth, kind):
    text = (kind * depth + "a = 1" + (")" * depth if kind == "(" else ""))[:MAX_LENGTH]
    outcome, elapsed, peak = bounded(parse, text, JMS)
    assert isinstance(outcome, (tuple, SelectorError)), repr(outcome)
    assert elapsed < TIME_BOUND and peak < ALLOC_BOUND, (elapsed, peak)


# ------------------------------------------------------------------------------------- property filters
def test_properties_filter_matching():
    """Filter Expressions 4.2.4/4.2.5: all entries match; &p: prefix, &s: suffix, && a literal &;
    numbers by value, booleans only as booleans; an absent field does not match."""
    f = compile_properties({"subject": "&p:ca", "message-id": "&s:-1"}, "p")
    assert f.matches(CAR)
    assert not compile_properties({"subject": "&s:x"}, "p").matches(CAR)
    assert not compile_properties({"to": "x"}, "p").matches(CAR)
    a = compile_properties({"weight": 3000.0, "flag": True, "color": "blue"}, "a")
    assert a.matches(CAR)
    assert not compile_properties({"flag": 1}, "a").matches(CAR)
    amp = MessageView(application={"k": "&p:x"})
    assert compile_properties({"k": "&&p:x"}, "a").matches(amp)
    with pytest.raises(ValueError):
        compile_properties({"colour": "x"}, "p")  # not a field of the properties section
    with pytest.raises(ValueError):
        compile_properties({"k": [1]}, "a")


def test_compiled_spec_pickles_as_its_spec():
    """A snapshot holds the spec and compiles it again when loaded: the same filter on every node."""
    spec = [["selector", "color = 'blue'"], ["properties", {"subject": "car"}],
            ["application-properties", {"weight": 3000}], ["sql", "a.age BETWEEN 10 AND 20"]]
    compiled = compile_spec(spec)
    again = pickle.loads(pickle.dumps(compiled))
    assert again == compiled and again.spec == spec
    assert again.matches_view(CAR) is True
    with pytest.raises(FilterError, match="expected an operand"):
        compile_spec([["selector", "a ="]])
    with pytest.raises(FilterError, match="unknown filter"):
        compile_spec([["xquery", "."]])


def test_the_deepest_tree_the_limits_allow_evaluates_without_recursion_error():
    """A left-deep chain (``a + a + ... > 0``) is as deep as MAX_NODES allows (about 500): it still
    evaluates with 300 frames already on the stack (apply runs a few dozen deep)."""
    k = 1
    while True:
        try:
            tree = parse("a" + " + a" * (k + 1) + " > 0")
        except SelectorError:
            break
        k += 1
    tree = parse("a" + " + a" * k + " > 0")
    view = MessageView(application={"a": 1})

    def nested(n: int):
        return nested(n - 1) if n else evaluate(tree, view)

    assert k > MAX_NODES // 2 - 5
    assert nested(300) is True
