"""The 0-10 spec's codes for refusals the shared core words the 0-9-1 way (issue 23).

The state machine answers with 0-9-1 reply codes (RabbitMQ's, for the 0-9-1 front end); 0-10 names
other codes for some of the same refusals, and a few rules need no state at all. Both live here so
that the session (``session.py``) stays a dispatcher: :func:`check` refuses a command on its
arguments alone before it is submitted, :func:`code_for` turns a core refusal into the code the
0-10 spec gives for that command. Line numbers are those of shared/specs/amqp-0-10.txt.
"""

from __future__ import annotations

from raftmq.protocol.amqp010 import codec as c

NOT_FOUND, RESOURCE_LOCKED, NOT_ALLOWED, INVALID_ARGUMENT = 404, 405, 530, 542
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")  # store/core/machine.py's, the ones we route


def check(command) -> tuple[int, str] | None:
    """A refusal (code, text) that depends on the command's arguments only, else None."""
    if isinstance(command, c.ExchangeDeclare):
        if not command.exchange:
            return INVALID_ARGUMENT, "exchange-name-required: the exchange name must not be empty"  # L7210
        if not command.passive and command.exchange.startswith("qpid."):
            # Qpid's convention beside the spec's "amq." (reserved-names, L7203ff): "qpid." names are
            # its brokers' own (qpid.management, ...); Qpid's clients and tests expect not-allowed.
            return NOT_ALLOWED, f"reserved-names: exchange names starting with 'qpid.' are reserved ('{command.exchange}')"
        if not command.passive and (command.type or "direct") not in EXCHANGE_TYPES:
            # exchange.declare exception exchange-type-not-found (L7229ff): not-found.
            return NOT_FOUND, f"exchange-type-not-found: unknown exchange type '{command.type}'"
    elif isinstance(command, (c.ExchangeDelete, c.ExchangeBind, c.ExchangeUnbind)) and not command.exchange:
        # exchange.delete/bind/unbind exception exchange-name-required (L7282, L7448, L7498): the
        # default exchange has no name, so it cannot be deleted, bound or unbound.
        return INVALID_ARGUMENT, "exchange-name-required: the exchange name must not be empty"
    return None


def code_for(command, code: int, text: str) -> int:
    """The 0-10 code for a refusal the core answered with ``code``."""
    if isinstance(command, c.ExchangeDeclare):
        if code == 403:  # reserved-names (L7203ff): "amq." names are not-allowed
            return NOT_ALLOWED
        if code == 406 and "'type'" in text:  # typed (L7216ff): a different type is not-allowed
            return NOT_ALLOWED
        if code == 503:  # an exchange type the core does not know: exchange-type-not-found
            return NOT_FOUND
    if isinstance(command, c.MessageSubscribe) and code == 403:
        # message.subscribe exception in-use (L6046ff): an exclusive subscription to a queue that
        # has subscribers, or a subscription to an exclusively subscribed one, is resource-locked.
        return RESOURCE_LOCKED
    return code
