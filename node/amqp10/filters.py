"""A receiver's source filter set (AMQP 1.0 3.5.3, 3.5.8) as the core's subscription filter.

Supported (the AMQP filter registry, http://www.amqp.org/specification/1.0/filters, and AMQP Filter
Expressions 1.0 as RabbitMQ 4.1/4.2 implement it), by descriptor symbol or code:

* ``apache.org:selector-filter:string`` (0x0000468C00000004): a JMS selector (Proton's ``Selector``,
  rhea's ``filter.selector``, Qpid JMS);
* ``amqp:sql-filter`` (0x120): an AMQP SQL filter expression (RabbitMQ 4.2);
* ``amqp:properties-filter`` (0x173) and ``amqp:application-properties-filter`` (0x174): maps of
  field -> value (RabbitMQ 4.1).

The core evaluates them (store/core/filters/).  3.5.3: the attach reply's source lists the filters
actually in use, so the reply echoes the entries we took, as the client sent them, and leaves out
every other (a client that needs one checks the reply: Proton's examples do not).  A selector or SQL
expression that does not parse refuses the attach with ``amqp:invalid-field`` and the parser's reason
(what Qpid Broker-J and Artemis answer); a property filter whose map holds values a filter cannot
compare is left out, as an unsupported filter is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.filter_view import plain
from raftmq.store.core.filters import FILTER_ARGUMENT, MAX_FILTERS, FilterError, compile_spec

SELECTOR = ("apache.org:selector-filter:string", 0x0000468C00000004)
SQL = ("amqp:sql-filter", 0x120)
PROPERTIES = ("amqp:properties-filter", 0x173)
APPLICATION_PROPERTIES = ("amqp:application-properties-filter", 0x174)

_KINDS = {}
for _kind, (_symbol, _code) in (("selector", SELECTOR), ("sql", SQL), ("properties", PROPERTIES),
                                ("application-properties", APPLICATION_PROPERTIES)):
    _KINDS[_symbol] = _KINDS[_code] = _kind


class FilterRefused(Exception):
    """A filter the client asked for is malformed: refuse the attach (amqp:invalid-field)."""


@dataclass(slots=True)
class SourceFilters:
    spec: list = field(default_factory=list)  # [kind, value] for the core (store/filters)
    echo: dict = field(default_factory=dict)  # the entries in use, for the attach reply's source

    def arguments(self) -> dict:
        """MessageSubscribe.arguments carrying the filter ({} for none)."""
        return {FILTER_ARGUMENT: self.spec} if self.spec else {}


def _descriptor(value: Any) -> Any:
    if isinstance(value, t.Described):
        descriptor = value.descriptor
        if isinstance(descriptor, str):
            return str(descriptor)
        if isinstance(descriptor, int) and not isinstance(descriptor, bool):
            return int(descriptor)
    return None


def _plain_map(value: Any) -> dict | None:
    """A property filter's map with plain keys and values, or None if a value is not simple."""
    if not isinstance(value, dict):
        return None
    out = {}
    for key, item in value.items():
        if not isinstance(key, str):
            return None
        simple = plain(item)
        if simple is None:
            return None
        out[str(key)] = simple
    return out


def from_source(filter_set: Any) -> SourceFilters:
    """The supported filters of a source's filter set; FilterRefused for a malformed expression."""
    result = SourceFilters()
    if not isinstance(filter_set, dict):
        return result
    for key, value in filter_set.items():
        kind = _KINDS.get(_descriptor(value))
        if kind is None or len(result.spec) >= MAX_FILTERS:
            continue  # not ours: left out of the reply (3.5.3)
        inner = value.value
        if kind in ("selector", "sql"):
            if not isinstance(inner, str):
                raise FilterRefused(f"filter '{key}': the {kind} is not a string")
            item = [kind, str(inner)]
            try:
                compile_spec([item])
            except FilterError as exc:
                raise FilterRefused(f"filter '{key}': {exc}") from None
        else:
            mapping = _plain_map(inner)
            if mapping is None:
                continue
            item = [kind, mapping]
            try:
                compile_spec([item])
            except FilterError:
                continue  # e.g. a properties-filter naming no field of the properties section
        result.spec.append(item)
        result.echo[key] = value
    return result
