"""RabbitMQ's management tags (https://www.rabbitmq.com/docs/management#permissions) as
ops/operator.py reads them, and HTTP basic credentials (RFC 7617)."""

from __future__ import annotations

import base64

from raftmq.node.auth import Principal
from raftmq.ops.config import Config, _tags
from raftmq.ops.operator import (
    ADMINISTRATOR,
    MANAGEMENT,
    MONITORING,
    POLICYMAKER,
    Operator,
    basic_header,
    parse_basic,
)


def _operator(*tags: str, vhosts=("/",)) -> Operator:
    return Operator("u", frozenset(tags), Principal("u", {vh: () for vh in vhosts}))


def test_each_tag_grants_what_it_includes():
    grants = {
        ADMINISTRATOR: {ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT},
        MONITORING: {MONITORING, MANAGEMENT},
        POLICYMAKER: {POLICYMAKER, MANAGEMENT},
        MANAGEMENT: {MANAGEMENT},
        "impersonator": set(),  # a tag the management API does not know grants nothing
    }
    for tag, granted in grants.items():
        op = _operator(tag)
        assert {t for t in (ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT) if op.has(t)} == granted, tag
    assert not _operator().has(MANAGEMENT)


def test_vhost_visibility():
    assert _operator(MANAGEMENT).may_see_vhost("/") and not _operator(MANAGEMENT).may_see_vhost("other")
    assert _operator(MONITORING, vhosts=()).may_see_vhost("other")  # monitoring sees every vhost...
    assert not _operator(MONITORING, vhosts=()).may_use_vhost("other")  # ...but changes none without permissions
    assert not _operator(ADMINISTRATOR, vhosts=()).may_use_vhost("/")


def test_basic_credentials():
    assert parse_basic(basic_header("guest", "pa:ss")) == ("guest", "pa:ss")  # the first colon separates
    assert parse_basic("basic " + base64.b64encode(b"a:b").decode()) == ("a", "b")  # scheme is case-insensitive
    for bad in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        assert parse_basic(bad) is None, bad


def test_configured_tags():
    assert Config().users["guest"].tags == [ADMINISTRATOR]  # the default guest administers, as in RabbitMQ
    assert _tags("administrator, monitoring") == ["administrator", "monitoring"]
    assert _tags(["management"]) == ["management"]
