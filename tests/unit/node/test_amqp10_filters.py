"""A 1.0 source filter set as the core's subscription filter (node/amqp10/filters.py; AMQP 1.0 3.5.3,
3.5.8, the filter registry and AMQP Filter Expressions): which entries are taken, by symbol or by code,
what the reply echoes, and which are refused."""

from __future__ import annotations

import pytest

from raftmq.node.amqp10.filters import FilterRefused, from_source
from raftmq.protocol.amqp10 import types as t
from raftmq.store.core.filters import FILTER_ARGUMENT


def described(descriptor, value) -> t.Described:
    return t.Described(descriptor, value)


def test_supported_filters_by_symbol_and_code_are_taken_and_echoed():
    selector = described(t.Symbol("apache.org:selector-filter:string"), "a = 1")
    by_code = described(0x0000468C00000004, "b = 2")
    props = described(t.Symbol("amqp:properties-filter"), {t.Symbol("subject"): "&p:x"})
    app = described(0x174, {"k": 5})
    sql = described(0x120, "p.subject = 'x'")
    legacy = described(t.Symbol("apache.org:legacy-amqp-direct-binding:string"), "key")
    filters = from_source({t.Symbol("s"): selector, t.Symbol("c"): by_code, t.Symbol("p"): props,
                           t.Symbol("a"): app, t.Symbol("q"): sql, t.Symbol("l"): legacy})
    assert filters.spec == [["selector", "a = 1"], ["selector", "b = 2"], ["properties", {"subject": "&p:x"}],
                            ["application-properties", {"k": 5}], ["sql", "p.subject = 'x'"]]
    assert list(filters.echo) == ["s", "c", "p", "a", "q"]  # 3.5.3: the legacy binding filter is not in use
    assert filters.echo["s"] is selector
    assert filters.arguments() == {FILTER_ARGUMENT: filters.spec}


def test_no_filter_set_means_no_arguments():
    assert from_source(None).arguments() == {} and from_source({}).echo == {}


@pytest.mark.parametrize("descriptor, value", [
    ("apache.org:selector-filter:string", "colour ="),
    ("apache.org:selector-filter:string", 5),
    ("amqp:sql-filter", "p.nosuchfield = 1"),
])
def test_malformed_expressions_are_refused(descriptor, value):
    with pytest.raises(FilterRefused):
        from_source({t.Symbol("f"): described(t.Symbol(descriptor), value)})


def test_property_filters_with_values_we_cannot_compare_are_left_out():
    filters = from_source({t.Symbol("p"): described(t.Symbol("amqp:properties-filter"), {t.Symbol("nope"): "x"}),
                           t.Symbol("a"): described(0x174, {"k": [1, 2]})})
    assert filters.spec == [] and filters.echo == {}
