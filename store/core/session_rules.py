"""0-10 rules that need the state and that 0-9-1 lacks or words otherwise (issue 23).

The core's handlers are shared with 0-9-1, where these cases are fine (RabbitMQ answers delete-ok for
a missing queue, cancel-ok for an unknown consumer tag, ignores unknown x-arguments). A 0-10 session
command (``SESSION_COMMAND``) is checked here first, on the replicated state, so every replica
refuses alike. Line numbers are those of shared/specs/amqp-0-10.txt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .commands import (
    Cancel,
    Command,
    DeclaredQueue,
    ExchangeDeclare,
    ExchangeDelete,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueueUnbind,
)
from .errors import CommandError
from .queue_args import EQUIVALENCE_ARGS, LATER_ARGS, NO_LOCAL

if TYPE_CHECKING:
    from .machine import StateMachine
    from .model import ChannelState, Queue, VHost

NOT_FOUND, RESOURCE_LOCKED, NOT_ALLOWED, NOT_IMPLEMENTED, INVALID_ARGUMENT = 404, 405, 530, 540, 542
# x-queue-group: the queue's Raft group (store/core/groups.py PLACEMENT_ARGUMENT; ignored with one group).
QUEUE_ARGS = frozenset((*EQUIVALENCE_ARGS, *LATER_ARGS, "x-queue-type", "x-deduplication-header", NO_LOCAL,
                        "x-queue-group"))


def check(machine: StateMachine, conn: str, number: int, inner: Command) -> Command:
    """Raise the 0-10 refusal for ``inner`` (a core command of this session), if there is one; else
    ``inner`` as 0-10 means it (the sticky fields of a redeclare, a binding named by its key).

    Branches on the command's type, not on its ``op``: the type narrows ``inner`` for the checker
    (each command type has exactly one op, commands.COMMAND_TYPES), so the two say the same."""
    if isinstance(inner, Cancel):
        ch = machine.channels.get(conn, {}).get(number)
        if ch is None or inner.consumer_tag not in ch.consumers:
            # message.cancel exception subscription-not-found (L6082ff): not-found.
            raise CommandError(NOT_FOUND, f"subscription-not-found: no subscription '{inner.consumer_tag}'")
        return inner
    vhost_name = getattr(inner, "vhost", None)
    vhost = machine.vhosts.get(vhost_name) if isinstance(vhost_name, str) else None
    if vhost is None:
        return inner  # the handler refuses an unknown vhost itself
    if isinstance(inner, QueueDelete):
        queue = vhost.queues.get(inner.name)
        if queue is None:
            # queue.delete exception queue-exists (L7832ff): "The queue must exist" -- not-found.
            raise CommandError(NOT_FOUND, f"queue-exists: no queue '{inner.name}'")
        _orphans_to_alternate(machine, vhost, queue, conn, inner)
        return inner
    if isinstance(inner, QueueDeclare):
        return _queue_declare(machine, conn, number, vhost, inner)
    if isinstance(inner, ExchangeDeclare):
        return _exchange_declare(vhost, inner)
    if isinstance(inner, ExchangeDelete):
        _exchange_delete(vhost, inner)
    elif isinstance(inner, QueueUnbind):
        return _queue_unbind(vhost, inner)
    elif isinstance(inner, QueueBind):
        exchange = vhost.exchanges.get(inner.exchange)
        args = inner.arguments or {}
        if exchange is not None and exchange.type == "headers" and args.get("x-match") not in ("any", "all"):
            # Rule headers_exchange_requires_match_arg (L9218ff): invalid-argument.
            raise CommandError(INVALID_ARGUMENT, "a headers binding needs x-match 'any' or 'all'")
    return inner


def _queue_declare(machine: StateMachine, conn: str, number: int, vhost: VHost, inner: QueueDeclare) -> QueueDeclare:
    name, passive, args = inner.name, inner.passive, inner.arguments
    existing = vhost.queues.get(name)
    if passive and existing is not None and inner.exclusive and existing.exclusive_owner != machine._caller_owner:
        # queue.declare exception in-use (L7781ff): asking for exclusive use of a queue this
        # session does not hold exclusively is resource-locked, passive or not.
        raise CommandError(RESOURCE_LOCKED, f"in-use: queue '{name}' is not exclusive to this session")
    unknown = sorted(k for k in args if k not in QUEUE_ARGS)
    if unknown and not passive:
        # queue.declare exception unknown-argument (L7791ff): not-implemented.
        raise CommandError(NOT_IMPLEMENTED, f"unknown-argument: {', '.join(unknown)}")
    if existing is not None and not passive:
        inner = _sticky_queue(machine, conn, number, existing, inner)
    alternate = args.get("x-dead-letter-exchange")
    if existing is not None and alternate and existing.arguments.get("x-dead-letter-exchange") != alternate:
        # queue.declare exception pre-existing-exchange (L7756ff): not-allowed.
        raise CommandError(NOT_ALLOWED, f"pre-existing-exchange: queue '{name}' has another alternate")
    return inner


def _exchange_declare(vhost: VHost, inner: ExchangeDeclare) -> ExchangeDeclare:
    name, args = inner.name, inner.arguments
    existing = vhost.exchanges.get(name)
    if existing is not None:
        # exchange.declare rules sticky (L7193ff): durable and auto-delete are ignored if the
        # exchange exists (the core, as RabbitMQ, would refuse a difference with 406).
        inner = inner._replace(durable=existing.durable, auto_delete=existing.auto_delete)
    alternate = args.get("alternate-exchange")
    if existing is not None and alternate and existing.arguments.get("alternate-exchange") != alternate:
        # exchange.declare exception pre-existing-exchange (L7235ff): not-allowed.
        raise CommandError(NOT_ALLOWED, f"pre-existing-exchange: exchange '{name}' has another alternate")
    return inner


def _exchange_delete(vhost: VHost, inner: ExchangeDelete) -> None:
    name = inner.name
    users = [f"exchange '{x.name}'" for x in vhost.exchanges.values()
             if x.name != name and x.arguments.get("alternate-exchange") == name]
    users += [f"queue '{q.name}'" for q in vhost.queues.values() if q.arguments.get("x-dead-letter-exchange") == name]
    if users:
        # exchange.delete exception used-as-alternate (L7288ff): not-allowed.
        raise CommandError(NOT_ALLOWED, f"used-as-alternate: '{name}' is the alternate of {users[0]}")


def _queue_unbind(vhost: VHost, inner: QueueUnbind) -> QueueUnbind:
    # The core unbinds leniently for 0-9-1 (RabbitMQ answers unbind-ok when either end is gone);
    # exchange.unbind exceptions non-existent-queue (L7486ff) and non-existent-exchange (L7492ff):
    # not-found.
    if inner.queue not in vhost.queues:
        raise CommandError(NOT_FOUND, f"non-existent-queue: no queue '{inner.queue}'")
    exchange = vhost.exchanges.get(inner.exchange)
    if exchange is None:
        raise CommandError(NOT_FOUND, f"non-existent-exchange: no exchange '{inner.exchange}'")
    found = [b for b in exchange.bindings
             if b.dest_is_queue and b.destination == inner.queue and b.routing_key == inner.routing_key]
    if not found:
        # exchange.unbind exception non-existent-binding-key (L7504ff): not-found.
        raise CommandError(NOT_FOUND, f"non-existent-binding-key: no binding '{inner.routing_key}'")
    # 0-10 names a binding by queue, exchange and key (a headers binding's arguments too).
    return inner._replace(arguments=found[0].arguments)


def passive_declare(machine: StateMachine, inner: QueueDeclare) -> DeclaredQueue:
    """A 0-10 passive queue.declare: the queue's presence asserted, nothing used or changed.

    passive (L7663ff) "allows the client to assert the presence of a queue without modifying the
    server state": it neither declares nor uses the queue, so another session's exclusive queue
    may be asserted too (the in-use exception, L7781ff, is about declaring it -- its scenario a
    second declare -- binding or consuming from it; :func:`check` refuses a passive declare that
    asks for exclusivity).  Qpid's request/reply clients rely on it (qpid_tests queue.py,
    test_declare_passive_with_exclusive).  0-9-1 keeps RabbitMQ's 405 (store/core/topology.py)."""
    vhost = machine.vhost(inner.vhost)
    queue = vhost.queues.get(inner.name)
    if queue is None:
        # queue.declare exception passive (L7770ff): not-found.
        raise CommandError(NOT_FOUND, f"passive: no queue '{inner.name}' in vhost '{vhost.name}'")
    return DeclaredQueue(queue.name, len(queue.ready), len(queue.consumers))


def _sticky_queue(machine: StateMachine, conn: str, number: int, existing: Queue, inner: QueueDeclare) -> QueueDeclare:
    """A redeclare of an existing queue: queue.declare rule pre-existence (L7737ff) "The server MUST
    ignore the auto-delete field if the queue already exists" (durable alike, L7723ff), and 0-10 has
    no rule against redeclaring one's own exclusive queue without the flag (0-9-1 has: 405)."""
    inner = inner._replace(durable=existing.durable, auto_delete=existing.auto_delete)
    ch = machine.channels.get(conn, {}).get(number)
    session = ch.session if ch is not None else None
    if session is not None and existing.exclusive_owner == session.key:
        inner = inner._replace(exclusive=True)
    return inner


def _orphans_to_alternate(machine: StateMachine, vhost: VHost, queue: Queue, conn: str, inner: QueueDelete) -> None:
    """Before a queue.delete: the orphans go to the alternate (:func:`orphans_to_alternate`);
    nothing moves if the delete is going to be refused (lock, if-unused, if-empty)."""
    if queue.dead_letter_exchange is None:
        return
    machine.queue(vhost, queue.name, conn)  # the exclusive-lock refusal comes before any change
    if (inner.if_unused and queue.consumers) or (inner.if_empty and len(queue.ready)):
        return  # if-unused / if-empty: the core refuses it
    orphans_to_alternate(machine, queue)


def orphans_to_alternate(machine: StateMachine, queue: Queue, holder: ChannelState | None = None) -> None:
    """queue.declare alternate-exchange (L7656ff): messages "orphaned by queue deletion MUST be routed
    to the alternate-exchange" -- the ready ones and those acquired by subscribers (which the delete
    discards from their holders), in queue order.  Copies are routed before the core deletes the
    queue, which drops the originals.  For a 0-10 queue.delete and for a queue a 0-10 session's end
    or last cancel auto-deletes (auto-delete, L7682ff; Qpid's test_queue_autodelete); 0-9-1's
    auto-delete drops them, as RabbitMQ's does.  ``holder``: the channel of an ending session,
    already out of ``machine.channels``, whose acquired messages are orphans too."""
    if queue.dead_letter_exchange is None:
        return
    entries = queue.ready.take_all()
    for entry in entries:
        queue.ready.requeue(entry)
    if queue.unacked_count:
        holders = [ch for ch_map in machine.channels.values() for ch in ch_map.values()]
        if holder is not None and holder not in holders:
            holders.append(holder)
        entries += [item[1] for ch in holders for key, item in ch.unacked.items() if key[0] == queue.qid]
    entries.sort(key=lambda entry: entry.seq)
    for entry in entries:
        machine.expiry.dead_letter(queue, entry.message, "deleted")
