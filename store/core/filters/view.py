"""What a filter sees of a message: its AMQP 1.0 header, properties, annotations and
application-properties as plain values.

Filters are written against the 1.0 message (AMQP 1.0 3.2; the filter registry and the filter
expressions specification name 1.0 fields), so every message is seen as a 1.0 consumer would get
it: a message published with 1.0 through its stored sections, one published with 0-9-1 or 0-10
through the same conversion a 1.0 delivery uses (store/message.properties_in, RabbitMQ 4's mapping,
docs/message-mapping.md) -- a selector selects what the consumer then receives.

store/ knows no wire format: the decoder of 1.0 stored sections registers here
(protocol/amqp10/filter_view.py, imported by node/core/formats.py with the property codecs), as the
codecs do in store/core/message.py.  Values are plain (None, bool, int, float, str, bytes): timestamps as
milliseconds, uuids as their string form, symbols as str.  A message whose properties do not decode
is seen as one without properties (it matches only filters that accept absent fields), on every node
alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..message import AMQP100, properties_in


@dataclass(slots=True)
class MessageView:
    """The sections a filter reads; field names as in AMQP 1.0 (``message-id``, ``creation-time``)."""

    header: dict[str, Any] = field(default_factory=dict)  # durable, priority, ttl, first-acquirer...
    properties: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)  # message-annotations, keys as str
    application: dict[str, Any] = field(default_factory=dict)  # application-properties


EMPTY_VIEW = MessageView()

_decoder: list[Callable[[bytes], MessageView]] = []

#: Views by (format, property bytes): a view is a pure function of them, and messages often share
#: their property bytes (the publish path interns small ones), so a filtered consumer scanning a
#: backlog, or several scanning the same one, decode each distinct block once.  Bounded; not state.
_cache: dict[tuple[int, bytes], MessageView] = {}
CACHE_SIZE = 4096


def register(decoder: Callable[[bytes], MessageView]) -> None:
    """Install the decoder of 1.0 stored sections (protocol/amqp10/filter_view.py)."""
    _decoder[:] = [decoder]


def view_of(message: Any) -> MessageView:
    """The 1.0 view of a stored message (``Message``: ``properties`` in ``format``).  Callers do not
    change the view (it may be shared)."""
    key = (message.format, message.properties)
    view = _cache.get(key)
    if view is None:
        view = _decode(message)
        if len(_cache) >= CACHE_SIZE:
            _cache.clear()
        _cache[key] = view
    return view


def _decode(message: Any) -> MessageView:
    if not _decoder:
        raise LookupError("no 1.0 filter view decoder registered (node/core/formats.py registers it)")
    raw = properties_in(message, AMQP100, b"")
    if not raw:
        return EMPTY_VIEW
    try:
        return _decoder[0](raw)
    except (ValueError, IndexError, KeyError, TypeError):
        return EMPTY_VIEW
