"""AMQP 1.0's modified outcome with message-annotations (spec 3.4.5): the consumer changes the message
it gives back, as RabbitMQ 4's quorum queues allow (its docs' "Modified Outcome", rabbit_fifo's
``#modify{}``).

``MessageModify`` carries what ``MessageSettle`` carries plus ``annotations``, ``{"x-...": value}``
to add to or replace in the message's annotations:

- requeued (``released`` or ``modified`` without undeliverable-here): the queue's entry keeps its
  place (its sequence number: it goes back to the head, as every requeue does) and its delivery
  count, and now holds a *copy* of the message with the annotations merged -- a copy, because the
  same message may sit in other queues (fanout), and only this queue's copy is changed.  The copy
  has a new message id; its body is the original's (the node stores it again under the new id,
  as for a dead-letter copy: ``Delivery.keep_body``), the original loses this holder as when an
  entry is dropped.  A durable entry's LMDB record points to the copy.
- discarded (``modified`` with undeliverable-here): dead-lettered with the annotations merged, as
  RabbitMQ 4 does -- the dead-letter copy (store/core/expiry.py) starts from the annotated properties.

Annotations are merged through the message's own codec as headers (store/core/message.py): a 1.0
message gets them in its message-annotations section (an ``x-`` header goes there: protocol/amqp10/
neutral.py), a 0-9-1 or 0-10 message as ``x-`` headers, which is where RabbitMQ 4 puts them for an
AMQP 0-9-1 message.  Values are plain (store/core/values.py: str, int, float, bool, bytes, None, lists and
maps of them), so every replica encodes the same bytes; a 1.0 symbol comes back as a string.
Only keys starting with ``x-`` are taken ("all symbolic keys except those beginning with x- are
reserved", 3.2.10); the front end bounds their number and size (node/amqp10/modified.py).
Pure and deterministic like the rest of apply: no clock, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import events as EV
from . import message as fmt
from . import ranges as rs
from .commands import MessageModify
from .message import AMQP091
from .model import Entry, Message, Queue
from .sessions import SETTLE_REJECT, SETTLE_RELEASE

if TYPE_CHECKING:
    from .machine import StateMachine


def annotated(message: Message, annotations: dict) -> bytes:
    """``message``'s properties with ``annotations`` merged in, in its own format; its properties
    unchanged when they do not decode or encode (delivered as published rather than not at all)."""
    wanted = {key: value for key, value in annotations.items() if isinstance(key, str) and key.startswith("x-")}
    if not wanted:
        return message.properties
    try:
        codec = fmt.codec(message.format)
        props = codec.decode(message.properties)
        props.headers = {**(props.headers or {}), **wanted}
        return codec.encode(props)
    except (ValueError, LookupError, TypeError):
        return message.properties


def message_modify(m: StateMachine, cmd: MessageModify) -> None:
    """Settle like ``SessionCommands.message_settle`` (release or reject; an accept is a plain settle),
    each message annotated first."""
    ch = m.channel(cmd.conn, cmd.channel)
    session = ch.session
    if session is None:
        raise m.error(503, "message settlement on a channel without a session")
    refs = []
    for transfer_id in rs.ids(cmd.ranges):
        item = session.transfers.pop(transfer_id, None)
        if item is not None:
            refs.append((item[0], item[1]))
    annotations = cmd.annotations if isinstance(cmd.annotations, dict) else {}
    for queue, entry in m.delivery.take_unacked(ch, refs):
        message = entry.message
        if cmd.how == SETTLE_REJECT:
            props = annotated(message, annotations)
            view = message if props is message.properties else Message(
                message.id, message.exchange, message.routing_key, props, message.size, message.persistent,
                message.priority, message.published_at, format=message.format)
            m.expiry.dead_letter(queue, view, "rejected", cmd.conn)
            m.delivery.drop(queue, entry)
            continue
        if cmd.how == SETTLE_RELEASE and entry.delivery_count > 0:
            entry.delivery_count -= 1  # release without set-redelivered, as message_settle
        replace_message(m, queue, entry, annotated(message, annotations))
        m.delivery.return_to_ready(queue, entry)


def replace_message(m: StateMachine, queue: Queue, entry: Entry, properties: bytes) -> None:
    """``entry`` (held, about to be requeued) holds a copy of its message with ``properties``."""
    old = entry.message
    if properties == old.properties:
        return
    # live=2: the entry, and the routing hold that keep_body ends (as a dead-letter copy's).
    new = Message(m.next_msg_id, old.exchange, old.routing_key, properties, old.size, old.persistent,
                  old.priority, old.published_at, 0, old.format, 2)
    m.next_msg_id += 1
    m.event(EV.PUBLISHED, None, new, f"modified:{old.id}:{queue.name}", queue.vhost)
    m.delivery.keep_body(new, m.delivery.body_source(old))  # before the original may lose its body
    m.message_bytes += new.size
    if queue.dedup is not None:  # the deduplication key follows its message to the copy
        key = queue.dedup.owners.pop(old.id, None)
        if key is not None:
            queue.dedup.owners[new.id] = key
            item = queue.dedup.entries.get(key)
            if item is not None and item[1] == old.id:
                queue.dedup.entries[key] = (item[0], new.id)
    if entry.durable and m._persist is not None:
        record = [new.exchange, new.routing_key, new.properties, None, new.priority, new.published_at]
        if new.format != AMQP091:
            record.append(new.format)
        m._persist.put_message(new.id, record)  # the node fills the body in (index 3), as for a publish
        new.refs = 1
        m._persist.put_entry(queue.qid, entry.seq, [new.id, entry.expires_at, entry.priority,
                                                    entry.delivery_count])
    m.delivery.release_message(entry)  # the original loses this holder (its record, its body when last)
    entry.message = new
