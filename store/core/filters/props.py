"""Property filters: ``amqp:properties-filter`` and ``amqp:application-properties-filter``.

AMQP Filter Expressions 1.0 sections 4.2.4 and 4.2.5, as RabbitMQ 4.1 implements them: a map of
field -> value, and a message matches when every entry matches (an absent field does not).  A value
matches a field of the same type and value (numbers by value: 1 matches 1.0; a boolean only a
boolean); a string value may instead be a prefix match ``&p:<prefix>`` or a suffix match
``&s:<suffix>``, and ``&&`` starts a literal string beginning with ``&``.  Field names of the
properties filter are those of the 1.0 properties section (``subject``, ``message-id``...); the
application-properties filter names application properties.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .sql import _PROPERTY_NAMES
from .view import MessageView

MAX_ENTRIES = 64  # entries of one property filter


class PropertyFilterError(ValueError):
    """The filter's map is not one we can evaluate."""


_SCALARS = (bool, int, float, str, bytes)


@dataclass(frozen=True, slots=True)
class PropertyFilter:
    section: str  # "p" (properties) or "a" (application-properties)
    entries: tuple[tuple[str, str, Any], ...]  # (field, how: "=" "prefix" "suffix", value)

    def matches(self, view: MessageView) -> bool:
        fields = view.properties if self.section == "p" else view.application
        for name, how, wanted in self.entries:
            value = fields.get(name)
            if value is None:
                return False
            if how == "=":
                if not _equal(value, wanted):
                    return False
            elif value.__class__ is not str or not (
                    value.startswith(wanted) if how == "prefix" else value.endswith(wanted)):
                return False
        return True


def _equal(value: Any, wanted: Any) -> bool:
    numeric = (int, float)
    if value.__class__ in numeric and wanted.__class__ in numeric:
        return value == wanted
    return value.__class__ is wanted.__class__ and value == wanted


def compile_properties(mapping: Any, section: str) -> PropertyFilter:
    """A filter from its map (keys str, values plain scalars); PropertyFilterError otherwise."""
    if not isinstance(mapping, dict):
        raise PropertyFilterError("a property filter is a map")
    if len(mapping) > MAX_ENTRIES:
        raise PropertyFilterError(f"a property filter has at most {MAX_ENTRIES} entries")
    entries = []
    for name in sorted(mapping, key=str):  # sorted: the same tree whatever the map's order
        value = mapping[name]
        if not isinstance(name, str):
            raise PropertyFilterError("property filter keys are strings")
        if section == "p" and name not in _PROPERTY_NAMES:
            raise PropertyFilterError(f"'{name}' is not a field of the properties section")
        if value is None or value.__class__ not in _SCALARS:
            raise PropertyFilterError(f"the value for '{name}' is not a simple value")
        how = "="
        if value.__class__ is str and value.startswith("&"):
            if value.startswith("&p:"):
                how, value = "prefix", value[3:]
            elif value.startswith("&s:"):
                how, value = "suffix", value[3:]
            elif value.startswith("&&"):
                value = value[1:]
        entries.append((str(name), how, value))
    return PropertyFilter(section, tuple(entries))
