"""node/core/access.py: the permission rule of every core operation, the same for every front end."""

from __future__ import annotations

import pytest

from raftmq.node.auth import Principal, _compile
from raftmq.node.core.access import (
    CLIENT_OPS,
    CONFIGURE,
    READ,
    WRITE,
    Access,
    AccessRefused,
    Requirement,
    requirements,
)
from raftmq.store.core.commands import (
    COMMAND_TYPES,
    Ack,
    ExchangeDeclare,
    ExchangeUnbind,
    Get,
    Op,
    Publish,
    QueueBind,
    QueueDeclare,
    TxCommit,
    make,
)

HEAD = [None, None, 1]  # conn, token, channel


def principal(configure: str = ".*", write: str = ".*", read: str = ".*") -> Principal:
    return Principal("u", _compile({"/": (configure, write, read)}))


def test_declares_need_configure_unless_passive():
    declare_q = QueueDeclare(*HEAD, "/", "q", False, True, False, False, {})
    assert requirements(declare_q) == (Requirement(CONFIGURE, "queue", "q"),)
    passive_q = QueueDeclare(*HEAD, "/", "q", True, False, False, False, {})
    assert requirements(passive_q) == ()
    declare_x = ExchangeDeclare(*HEAD, "/", "x", "direct", False, True, False, False, {})
    assert requirements(declare_x) == (Requirement(CONFIGURE, "exchange", "x"),)
    passive_x = ExchangeDeclare(*HEAD, "/", "x", "direct", True, False, False, False, {})
    assert requirements(passive_x) == ()


def test_dead_letter_and_alternate_exchanges_need_read_here_and_write_there():
    q = QueueDeclare(*HEAD, "/", "q", False, True, False, False, {"x-dead-letter-exchange": "dlx"})
    assert set(requirements(q)) == {Requirement(CONFIGURE, "queue", "q"), Requirement(READ, "queue", "q"),
                                    Requirement(WRITE, "exchange", "dlx")}
    x = ExchangeDeclare(*HEAD, "/", "x", "fanout", False, True, False, False, {"alternate-exchange": "ae"})
    assert set(requirements(x)) == {Requirement(CONFIGURE, "exchange", "x"), Requirement(READ, "exchange", "x"),
                                    Requirement(WRITE, "exchange", "ae")}


def test_bindings_write_the_destination_and_read_the_source():
    assert requirements(QueueBind(*HEAD, "/", "q", "x", "k", {})) == (
        Requirement(WRITE, "queue", "q"), Requirement(READ, "exchange", "x"))
    assert requirements(ExchangeUnbind(*HEAD, "/", "dst", "src", "k", {})) == (
        Requirement(WRITE, "exchange", "dst"), Requirement(READ, "exchange", "src"))


def test_a_transaction_needs_what_its_operations_need():
    publish = Publish(*HEAD, "/", "x", "k", False, b"", b"body", False, None, None)
    ack = Ack(*HEAD, [[1, 1]])
    assert requirements(TxCommit(*HEAD, [publish, ack, publish])) == (
        Requirement(WRITE, "exchange", "x"), Requirement(WRITE, "exchange", "x"))


@pytest.mark.parametrize("op", [Op.TICK, Op.NODE_RESET, Op.MEMBER_SET, Op.MEMBER_REMOVE, Op.VHOST_ADD, Op.VHOST_DELETE,
                                Op.USER_PUT, Op.USER_DELETE, Op.PERMISSION_SET, Op.PERMISSION_CLEAR])
def test_node_and_admin_operations_are_never_a_clients(op):
    assert op not in CLIENT_OPS
    with pytest.raises(AccessRefused):
        fields = COMMAND_TYPES[op]._fields
        Access(principal(), "/").authorize(make(op, *HEAD[:2], *[None] * (len(fields) - 3)))


def test_every_operation_has_a_rule_or_is_refused():
    """A new Op must be given a rule (or left out on purpose): nothing falls through unchecked."""
    admin_and_node = {Op.TICK, Op.NODE_RESET, Op.MEMBER_SET, Op.MEMBER_REMOVE, Op.VHOST_ADD, Op.VHOST_DELETE, Op.USER_PUT,
                      Op.USER_DELETE, Op.PERMISSION_SET, Op.PERMISSION_CLEAR, Op.SESSION_COMMAND,
                      Op.LIMITS_SET, Op.AUDIT_NOTE, Op.AUDIT_CHAIN_ON,
                      # queue groups' own (issue 34): proposed by the node's forwarder, never by a client
                      Op.GROUPS_SET, Op.META_APPLY, Op.META_TRIM, Op.QUEUE_GONE, Op.GONE_TRIM, Op.QUEUE_FORGET,
                      Op.MESSAGE_IN, Op.MESSAGE_DONE,
                      # the two-phase commit's (issue 34): TxBegin is made by the router from a TxCommit
                      # authorized as one, the others by the forwarder
                      Op.TX_BEGIN, Op.TX_PREPARE, Op.TX_VOTE, Op.TX_FINISH, Op.TX_ENDED, Op.TX_FORGET}
    assert set(Op) - CLIENT_OPS == admin_and_node


def test_patterns_are_searched_the_empty_one_grants_nothing_and_the_default_exchange_is_amq_default():
    """RabbitMQ's reading (rabbit_auth_backend_internal: re:run, "" as "^$"); checked against a real
    RabbitMQ in tests/integration/test_permissions.py."""
    access = Access(principal(configure="perm", write="^amq\\.default$", read=""), "/")
    access.authorize(QueueDeclare(*HEAD, "/", "xpermx", False, True, False, False, {}))
    access.authorize(Publish(*HEAD, "/", "", "q", False, b"", b"", False, None, None))
    with pytest.raises(AccessRefused, match="exchange 'amq.direct'"):
        access.authorize(Publish(*HEAD, "/", "amq.direct", "q", False, b"", b"", False, None, None))
    with pytest.raises(AccessRefused, match="queue 'q'"):
        access.authorize(Get(*HEAD, "/", "q", False))
    with pytest.raises(AccessRefused, match="exchange 'amq.default'"):
        Access(principal(write=""), "/").authorize(Publish(*HEAD, "/", "", "q", False, b"", b"", False,
                                                    None, None))


def test_access_refuses_with_rabbitmq_wording_and_opens_only_granted_vhosts():
    access = Access.open(principal(read="^mine-"), "/")
    access.authorize(Get(*HEAD, "/", "mine-1", False))
    with pytest.raises(AccessRefused) as info:
        access.authorize(Get(*HEAD, "/", "yours", False))
    assert info.value.text == "access to queue 'yours' in vhost '/' refused for user 'u'"
    assert info.value.code == 403
    with pytest.raises(AccessRefused):
        Access.open(principal(), "/other")
