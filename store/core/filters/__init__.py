"""Filters on a consumer: which messages of a queue it is given (issue 37).

A subscription's filters travel in its command as plain data -- ``MessageSubscribe.arguments``
under :data:`FILTER_ARGUMENT`, a list of ``[kind, value]``:

* ``["selector", text]`` -- a JMS message selector (``apache.org:selector-filter:string``);
* ``["sql", text]`` -- an AMQP SQL filter expression (RabbitMQ 4.2's ``amqp:sql-filter``);
* ``["properties", {field: value}]`` -- ``amqp:properties-filter`` (RabbitMQ 4.1);
* ``["application-properties", {name: value}]`` -- ``amqp:application-properties-filter``.

The state machine compiles them when it applies the subscription (:func:`compile_spec`), so every
replica holds the same compiled filter; a snapshot pickles the spec, not the compiled tree
(``SubscriptionFilter.__reduce__``), and compiles it again when loaded.  A message is given to the
consumer when every filter accepts it (the filters of one set are conjunctive, as RabbitMQ applies
them).  Parsing and evaluation have bounded cost (store/core/filters/sql.py, store/core/filters/like.py).

The dispatch side (a filtered consumer takes the first matching ready message in queue order; a
bounded scan per dispatch) is in store/core/delivery.py and described in docs/design.md.
"""

from __future__ import annotations

from typing import Any

from .props import PropertyFilter, PropertyFilterError, compile_properties
from .sql import JMS, SQL, SelectorError, evaluate, parse
from .view import MessageView, view_of

FILTER_ARGUMENT = "x-raftmq-filters"  # MessageSubscribe.arguments key (module docstring)
KINDS = ("selector", "sql", "properties", "application-properties")
MAX_FILTERS = 8


class FilterError(ValueError):
    """A filter that does not compile: the reason, for the client."""


class _Expression:
    __slots__ = ("tree", "dialect")

    def __init__(self, tree: tuple, dialect: str) -> None:
        self.tree, self.dialect = tree, dialect

    def matches(self, view: MessageView, now_ms: int) -> bool:
        return evaluate(self.tree, view, now_ms, self.dialect) is True


class SubscriptionFilter:
    """The compiled filters of one consumer."""

    __slots__ = ("spec", "parts")

    def __init__(self, spec: list, parts: list) -> None:
        self.spec = spec
        self.parts = parts

    def __reduce__(self) -> tuple:
        return (compile_spec, (self.spec,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubscriptionFilter) and other.spec == self.spec

    __hash__ = None  # type: ignore[assignment]

    def matches_view(self, view: MessageView, now_ms: int = 0) -> bool:
        return all(part.matches(view, now_ms) for part in self.parts)

    def matches(self, message: Any, now_us: int = 0) -> bool:
        """Does ``message`` (a stored ``Message``) pass every filter, as of apply time ``now_us``?"""
        return self.matches_view(view_of(message), now_us // 1000)


class _Properties:
    __slots__ = ("filter",)

    def __init__(self, compiled: PropertyFilter) -> None:
        self.filter = compiled

    def matches(self, view: MessageView, now_ms: int) -> bool:
        return self.filter.matches(view)


def compile_spec(spec: Any) -> SubscriptionFilter:
    """The compiled filter of a spec (module docstring); FilterError with the reason otherwise."""
    if not isinstance(spec, (list, tuple)) or not spec:
        raise FilterError("a filter spec is a non-empty list of [kind, value]")
    if len(spec) > MAX_FILTERS:
        raise FilterError(f"at most {MAX_FILTERS} filters on one consumer")
    parts: list = []
    plain_spec = []
    for item in spec:
        if not isinstance(item, (list, tuple)) or len(item) != 2 or item[0] not in KINDS:
            raise FilterError(f"unknown filter {item!r:.80}")
        kind, value = item
        try:
            if kind == "selector":
                parts.append(_Expression(parse(value, JMS), JMS))
            elif kind == "sql":
                parts.append(_Expression(parse(value, SQL), SQL))
            else:
                parts.append(_Properties(compile_properties(value, "p" if kind == "properties" else "a")))
        except (SelectorError, PropertyFilterError) as exc:
            raise FilterError(str(exc)) from None
        plain_spec.append([kind, value])
    return SubscriptionFilter(plain_spec, parts)


__all__ = ["FILTER_ARGUMENT", "FilterError", "MessageView", "SubscriptionFilter", "compile_spec", "view_of"]
