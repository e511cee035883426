"""Authorization for every protocol front end: which permission each core operation needs.

RabbitMQ's model -- per virtual host, three regular expressions a resource name must match to be
*configured* (declared, deleted), *written* (published to, bound to as a destination) or *read*
(consumed, fetched, purged, bound from as a source) -- applied to core commands instead of to one
protocol's methods.  A front end translates its wire method into a core command and asks ``Access``
before submitting it; so an operation is authorized by the same rule whichever protocol asked for
it, and a front end cannot skip a check for an operation it forgot (every command a client
connection may submit has an entry in ``_RULES``; any other operation is refused outright).

The rules follow RabbitMQ 3.x (rabbit_channel's check_*_permitted calls), verified against a real
RabbitMQ by tests/integration/test_permissions.py:

* declare: configure on the name; passive declares need only access to the vhost (RabbitMQ checks
  nothing more: clients probe queues they may only publish to);
* an alternate exchange (``alternate-exchange``) or dead-letter exchange (``x-dead-letter-exchange``)
  argument: additionally read on the declared resource and write on the named exchange, since it
  lets the declarer's messages flow into that exchange;
* delete: configure; purge: read (it consumes the messages);
* queue bind/unbind: write on the queue, read on the exchange; exchange bind/unbind: write on the
  destination, read on the source;
* publish: write on the exchange (``amq.default`` for the default exchange); consume/subscribe/get:
  read on the queue;
* AMQP 0-10's queue.query, exchange.query and exchange.bound (no 0-9-1 counterpart): read on what
  they inspect -- a query tells a queue's depth and consumers, which is the queue owner's business.

Operations on a connection's own channels, consumers and deliveries (qos, flow, cancel, ack,
nack, recover, settle, session control) need no permission: they only reach what an authorized
operation already gave this connection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftmq.store.core.commands import (
    Command,
    Consume,
    ExchangeBind,
    ExchangeBound,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeQuery,
    ExchangeUnbind,
    Get,
    MessageSubscribe,
    Op,
    Publish,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueQuery,
    QueueUnbind,
    TxCommit,
)

from ..auth import Principal

CONFIGURE, WRITE, READ = 0, 1, 2
PERMISSION_NAMES = ("configure", "write", "read")
DEFAULT_EXCHANGE = "amq.default"  # the name of the nameless exchange, for permissions (RabbitMQ's)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One permission an operation needs on one resource."""

    permission: int  # CONFIGURE, WRITE or READ
    kind: str  # "queue" or "exchange"
    name: str


class AccessRefused(Exception):
    """An operation needs a permission the principal lacks (403 in every AMQP version)."""

    code = 403

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


Rule = Callable[[Any], tuple[Requirement, ...]]
NOTHING: tuple[Requirement, ...] = ()


def _declare_exchange(cmd: ExchangeDeclare) -> tuple[Requirement, ...]:
    if cmd.passive:
        return NOTHING
    alternate = (cmd.arguments or {}).get("alternate-exchange")
    if isinstance(alternate, str):
        return (Requirement(CONFIGURE, "exchange", cmd.name), Requirement(READ, "exchange", cmd.name),
                Requirement(WRITE, "exchange", alternate))
    return (Requirement(CONFIGURE, "exchange", cmd.name),)


def _declare_queue(cmd: QueueDeclare) -> tuple[Requirement, ...]:
    if cmd.passive:
        return NOTHING
    dead_letter = (cmd.arguments or {}).get("x-dead-letter-exchange")
    if isinstance(dead_letter, str):
        return (Requirement(CONFIGURE, "queue", cmd.name), Requirement(READ, "queue", cmd.name),
                Requirement(WRITE, "exchange", dead_letter))
    return (Requirement(CONFIGURE, "queue", cmd.name),)


def _configure_exchange(cmd: ExchangeDelete) -> tuple[Requirement, ...]:
    return (Requirement(CONFIGURE, "exchange", cmd.name),)


def _configure_queue(cmd: QueueDelete) -> tuple[Requirement, ...]:
    return (Requirement(CONFIGURE, "queue", cmd.name),)


def _read_named_queue(cmd: QueuePurge | QueueQuery) -> tuple[Requirement, ...]:
    return (Requirement(READ, "queue", cmd.name),)


def _consume_queue(cmd: Consume | MessageSubscribe | Get) -> tuple[Requirement, ...]:
    return (Requirement(READ, "queue", cmd.queue),)


def _query_exchange(cmd: ExchangeQuery) -> tuple[Requirement, ...]:
    return (Requirement(READ, "exchange", cmd.name),)


def _exchange_bound(cmd: ExchangeBound) -> tuple[Requirement, ...]:
    return (Requirement(READ, "exchange", cmd.exchange),)


def _bind_queue(cmd: QueueBind | QueueUnbind) -> tuple[Requirement, ...]:
    return (Requirement(WRITE, "queue", cmd.queue), Requirement(READ, "exchange", cmd.exchange))


def _bind_exchange(cmd: ExchangeBind | ExchangeUnbind) -> tuple[Requirement, ...]:
    return (Requirement(WRITE, "exchange", cmd.destination), Requirement(READ, "exchange", cmd.source))


def _publish(cmd: Publish) -> tuple[Requirement, ...]:
    return (Requirement(WRITE, "exchange", cmd.exchange),)


def _none(cmd: Any) -> tuple[Requirement, ...]:
    return NOTHING


def _transaction(cmd: TxCommit) -> tuple[Requirement, ...]:
    """What the transaction would do, all of it."""
    return tuple(req for inner in cmd.operations for req in requirements(inner))


_RULES: dict[int, Rule] = {
    Op.EXCHANGE_DECLARE: _declare_exchange,
    Op.EXCHANGE_DELETE: _configure_exchange,
    Op.EXCHANGE_BIND: _bind_exchange,
    Op.EXCHANGE_UNBIND: _bind_exchange,
    Op.QUEUE_DECLARE: _declare_queue,
    Op.QUEUE_DELETE: _configure_queue,
    Op.QUEUE_PURGE: _read_named_queue,
    Op.QUEUE_BIND: _bind_queue,
    Op.QUEUE_UNBIND: _bind_queue,
    Op.PUBLISH: _publish,
    Op.CONSUME: _consume_queue,
    Op.MESSAGE_SUBSCRIBE: _consume_queue,
    Op.GET: _consume_queue,
    Op.QUEUE_QUERY: _read_named_queue,
    Op.EXCHANGE_QUERY: _query_exchange,
    Op.EXCHANGE_BOUND: _exchange_bound,
    Op.TX_COMMIT: _transaction,
    # A connection's own channels, consumers and deliveries: nothing beyond the vhost.
    Op.CHANNEL_OPEN: _none,
    Op.CHANNEL_CLOSE: _none,
    Op.CONNECTION_CLOSE: _none,
    Op.QOS: _none,
    Op.FLOW: _none,
    Op.CANCEL: _none,
    Op.ACK: _none,
    Op.NACK: _none,
    Op.RECOVER: _none,
    Op.SESSION_ATTACH: _none,
    Op.SESSION_DETACH: _none,
    Op.SESSION_TIMEOUT: _none,
    Op.SESSION_KNOWN_COMPLETED: _none,
    Op.SESSION_TX_SELECT: _none,
    Op.MESSAGE_FLOW: _none,
    Op.SESSION_WINDOW_CREDIT: _none,
    Op.MESSAGE_FLOW_MODE: _none,
    Op.MESSAGE_STOP: _none,
    Op.MESSAGE_FLUSH: _none,
    Op.MESSAGE_SETTLE: _none,
    Op.MESSAGE_MODIFY: _none,  # settles held deliveries, as MESSAGE_SETTLE (store/core/modify.py)
    Op.MESSAGE_ACQUIRE: _none,
    Op.MESSAGE_RESUME: _none,
}

# Operations a client connection may never submit: the node's own (TICK, NODE_RESET, MEMBER_*)
# and administration (VHOST_ADD, VHOST_DELETE, USER_*, PERMISSION_*, LIMITS_SET), which come from the admin API.
CLIENT_OPS = frozenset(_RULES)


def requirements(command: Command) -> tuple[Requirement, ...]:
    """What ``command`` needs; raises AccessRefused for an operation clients may not submit."""
    rule = _RULES.get(command.op)
    if rule is None:
        raise AccessRefused(f"operation {_op_name(command.op)} is not available to clients")
    return rule(command)


def _op_name(op: int) -> str:
    try:
        return Op(op).name
    except ValueError:
        return repr(op)


class Access:
    """A connection's principal inside the vhost it opened: the one place every front end asks.

    Created once the connection is open (``Access.open`` checks access to the vhost itself);
    ``authorize`` raises AccessRefused with RabbitMQ's wording, which a front end sends with its own
    protocol's 403.  Principals remember their answers, so the check per publish is two lookups.
    """

    __slots__ = ("principal", "vhost", "on_refused")

    def __init__(self, principal: Principal, vhost: str) -> None:
        self.principal = principal
        self.vhost = vhost
        # Told of every refusal, (operation, permission, kind, resource), before AccessRefused is
        # raised: the node's audit notes (node/audit.py, issue 36).  None: nobody listens.
        self.on_refused: Callable[[str, str, str, str], None] | None = None

    @classmethod
    def open(cls, principal: Principal, vhost: str) -> Access:
        if not principal.may_access_vhost(vhost):
            raise AccessRefused(f"access to vhost '{vhost}' refused for user '{principal.name}'")
        return cls(principal, vhost)

    def authorize(self, command: Command) -> None:
        for requirement in requirements(command):
            self.require(requirement.permission, requirement.kind, requirement.name, command.op)

    def require(self, permission: int, kind: str, name: str, op: int = Op.PUBLISH) -> None:
        """One permission on one resource (also the publish path's direct check: ``_publish``'s rule).

        The default exchange is ``amq.default`` to permissions, as in RabbitMQ: a write pattern of
        ``^amq\\.default$`` allows publishing straight to queues, and a refusal names it so."""
        if kind == "exchange" and not name:
            name = DEFAULT_EXCHANGE
        if not self.principal.allows(self.vhost, permission, name):
            if self.on_refused is not None:
                self.on_refused(_op_name(op).lower(), PERMISSION_NAMES[permission], kind, name)
            raise AccessRefused(f"access to {kind} '{name}' in vhost '{self.vhost}' refused for user "
                                f"'{self.principal.name}'")
