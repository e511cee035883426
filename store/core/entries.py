"""A queued message as the model holds it: the ``Message`` (shared by every queue it was routed to)
and its ``Entry`` in one queue.

Their own module, below model.py and frozen.py: the ready lists of model.py freeze entries into the
columns of frozen.py, which builds these objects again when it thaws them, so both need them and
neither may import the other for them.  model.py re-exports the names: the tree imports them from
there, and snapshots pickled before this module existed name ``raftmq.store.model.Entry``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .message import AMQP091


@dataclass(slots=True, eq=False)
class Message:
    """One published message; shared (by reference) by every queue it was routed to.

    The body is not here (issue 18): it is stored once per node, outside the model, under the
    message's id (store/disk/bodies.py); the model keeps its ``size`` for byte limits, credit and the
    memory alarm.  ``live`` counts what holds the message (queue entries, a delayed exchange's
    hold): the body goes when it reaches 0.
    """

    id: int
    exchange: str
    routing_key: str
    properties: bytes  # as the publisher sent them, in ``format`` (store/core/message.py)
    size: int  # body bytes
    persistent: bool
    priority: int
    published_at: int  # microseconds, stamped by the proposer
    refs: int = 0  # durable queue entries referring to it (LMDB record lifetime)
    format: int = AMQP091  # the protocol whose property encoding ``properties`` are in
    live: int = 0  # queue entries and holds referring to it (body lifetime)

    def __setstate__(self, state: tuple) -> None:
        """Unpickle (snapshots).  Format 1 has no ``format`` (it was 0-9-1); formats 1 and 2 carry
        the body itself and no ``live``: the body goes to ``LEGACY_BODIES`` for the loader to
        store, and ``live`` is recounted (store/disk/snapshot.py)."""
        _no_dict, slots = state
        self.format = AMQP091
        self.live = 0
        body = slots.pop("body", None)
        if body is not None:
            self.size = len(body)
            LEGACY_BODIES.append((slots["id"], body))
        for name, value in slots.items():
            setattr(self, name, value)


#: Bodies found in a snapshot written before bodies left the model (format 1 and 2): filled while
#: unpickling, emptied by ``store.snapshot.import_model``.
LEGACY_BODIES: list[tuple[int, bytes]] = []


@dataclass(slots=True, eq=False)
class Entry:
    """A message's place in one queue."""

    seq: int
    message: Message
    expires_at: int | None  # microseconds; None = never
    priority: int
    durable: bool  # mirrored in LMDB (durable queue and persistent message)
    delivery_count: int = 0
    holder: object | None = None  # the Consumer or ChannelState holding it unacked; None = ready
