"""The 1.0 stored sections (protocol/amqp10/stored.py) as the plain view filters read
(store/core/filters/view.py): header, properties, message-annotations, application-properties.

Registered with the core by node/core/formats.py.  Values become plain: symbols and chars str,
timestamps their milliseconds, uuids their string form, other described or compound values None
(a filter cannot compare them: JMS 3.8.1.1 selectors see only simple values).
"""

from __future__ import annotations

import uuid
from typing import Any

from raftmq.store.core.filters.view import MessageView, register

from . import performatives as p
from .stored import parse

_HEADER = tuple((f.attr, f.name) for f in p.Header.FIELDS)
_PROPERTIES = tuple((f.attr, f.name) for f in p.Properties.FIELDS)


def plain(value: Any) -> Any:
    """A 1.0 value as a plain one, or None if a filter cannot use it."""
    if value is None or value.__class__ in (bool, str, int, float, bytes):
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, bytes) and value.__class__ is bytes:
        return bytes(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return None


def decode_view(raw: bytes) -> MessageView:
    """The view of 1.0 stored sections; ValueError if they do not decode."""
    sections = parse(raw)
    view = MessageView()
    if sections.header is not None:
        for attr, name in _HEADER:
            value = getattr(sections.header, attr)
            if value is not None:
                view.header[name] = plain(value)
    if sections.properties is not None:
        for attr, name in _PROPERTIES:
            value = getattr(sections.properties, attr)
            if value is not None:
                view.properties[name] = plain(value)
    if sections.annotations:
        view.annotations = {str(k): plain(v) for k, (v, _raw) in sections.annotations.items()}
    if sections.application:
        view.application = {str(k): plain(v) for k, (v, _raw) in sections.application.items()}
    return view


register(decode_view)
