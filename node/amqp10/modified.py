"""The modified outcome's message-annotations (AMQP 1.0 3.4.5) on the way to the core.

A disposition ``modified`` with ``message-annotations`` becomes one ``MessageModify`` (store/core/modify.py:
the core merges the annotations into the message it requeues or dead-letters, as RabbitMQ 4's quorum
queues do).  A modified outcome without annotations, and every other outcome, stays on the ordinary
settle path (batched ``MessageSettle``, links.py): this module is only reached when there are some.

What is accepted, and what is refused at once (the link is detached with ``amqp:invalid-field``, its
unsettled deliveries go back to the queue):

- keys must be symbols or strings starting with ``x-`` ("all symbolic keys except those beginning
  with x- are reserved", 3.2.10; RabbitMQ 4 takes only those too, and applications use ``x-opt-``);
- at most :data:`MAX_ANNOTATIONS` keys and :data:`MAX_BYTES` octets (msgpack-encoded) per
  disposition: each one is a log entry and, for a requeue, stays with the message;
- values are kept as plain values (store/core/values.py): strings, numbers, booleans, binaries, lists and
  maps of them; a 1.0 symbol or timestamp comes back as a string or an integer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack

from raftmq.protocol.amqp10 import performatives as p
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import MessageModify
from raftmq.store.core.values import to_plain

from .session import error

if TYPE_CHECKING:
    from .links import OutgoingLink

MAX_ANNOTATIONS = 64
MAX_BYTES = 16 * 1024
MAX_DEPTH = 8


class BadAnnotations(ValueError):
    pass


def plain(value: Any, depth: int = 0) -> Any:
    """``value`` in exact builtin types (a str subclass such as a Symbol becomes a str), so that the
    command is the same object on the proposer as decoded from the log on every other node."""
    if depth > MAX_DEPTH:
        raise BadAnnotations("annotation values nested too deep")
    if value is None or value.__class__ is bool:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    converted = to_plain(value)
    if converted is value or converted.__class__ is value.__class__:
        return str(value)
    return plain(converted, depth + 1)


def annotations_of(state) -> dict:
    """The annotations of a modified outcome as the core takes them; BadAnnotations if refused."""
    raw = state.message_annotations or {}
    if not isinstance(raw, dict):
        raise BadAnnotations("message-annotations is not a map")
    if len(raw) > MAX_ANNOTATIONS:
        raise BadAnnotations(f"more than {MAX_ANNOTATIONS} message-annotations")
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.startswith("x-"):
            raise BadAnnotations(f"message-annotation key {key!r} is reserved: keys start with x- (3.2.10)")
        out[str(key)] = plain(value)
    if len(msgpack.packb(out, use_bin_type=True)) > MAX_BYTES:
        raise BadAnnotations(f"message-annotations larger than {MAX_BYTES} octets")
    return out


def settle_modified(link: OutgoingLink, transfer_ids: list[int], state, how: int, settled: bool,
                    first: int, last: int) -> None:
    """One disposition ``modified`` with annotations, for ``link``'s ``transfer_ids``."""
    try:
        annotations = annotations_of(state)
    except BadAnnotations as exc:
        link.session.detach_link(link, error("amqp:invalid-field", str(exc)))
        return
    link.flush_settles()  # settlements read before this one reach the core first
    ranges = [list(r) for r in rs.from_ids(sorted(transfer_ids))]
    conn = link.conn
    command = MessageModify(conn.conn_id, None, link.core, ranges, how, annotations)
    if settled:
        conn.broker.submit(command)
        return
    session = link.session  # receiver-settle-mode second (2.6.12): settled once applied, as links.py
    for delivery_id in list(session.unsettled):
        if session.unsettled[delivery_id][0] is link and session.unsettled[delivery_id][1] in transfer_ids:
            del session.unsettled[delivery_id]

    def done(result: tuple) -> None:
        session.conn.send(session.channel, p.Disposition(role=False, first=first, last=None if last == first else last,
                                                         settled=True, state=state))
    conn.request(command, done)
