"""node/amqp10/limits.py: the negotiated caps, the durable-link count and rate-limited refusals.

Spec: /work/shared/specs/amqp-1-0.txt 2.7.1 (channel-max plus one is the number of sessions), 2.7.2
(handle-max is the highest handle); RabbitMQ 4's session_max_per_connection / link_max_per_session.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from raftmq.node.amqp10 import limits
from raftmq.node.config import Config
from raftmq.store.core import queries


def test_channel_max_is_sessions_minus_one_and_never_above_either_side() -> None:
    """Default 64 sessions -> channel-max 63; a lower channel_max or a lower client value wins."""
    assert limits.channel_max(Config(), None) == 63
    assert limits.channel_max(Config(), 10) == 10
    assert limits.channel_max(Config(channel_max=5), None) == 5
    assert limits.channel_max(Config(amqp10_session_max=1), 100) == 0


def test_handle_max_is_links_minus_one_and_never_above_the_client() -> None:
    """Default 256 links per session -> handle-max 255; a client's smaller handle-max wins."""
    assert limits.handle_max(Config(), None) == 255
    assert limits.handle_max(Config(), 10) == 10
    assert limits.handle_max(Config(amqp10_link_max_per_session=1), None) == 0


def test_durable_links_are_counted_per_user_by_their_core_session_name() -> None:
    """Only sessions named as durable links (recovery.py) of that user count, attached or not (the
    count durable_refusal reads through store/core/queries.py)."""
    def session(principal: str, name: bytes):
        return SimpleNamespace(principal=principal, name=name)
    sessions = {
        1: session("alice", b"amqp10-link\x00c1\x00a"), 2: session("alice", b"amqp10-link\x00c2\x00b"),
        3: session("alice", b"amqp10:conn-1:7"), 4: session("bob", b"amqp10-link\x00c1\x00a")}
    machine = SimpleNamespace(sessions=sessions)
    assert queries.durable_link_count(machine, "alice") == 2
    assert queries.durable_link_count(machine, "bob") == 1
    assert queries.durable_link_count(machine, "carol") == 0


def test_refusals_are_all_counted_and_logged_once_per_interval(caplog, monkeypatch) -> None:
    """A flood of refusals: every one counted, one log line per kind per LOG_INTERVAL, and the next
    line says how many were not logged."""
    now = [100.0]
    monkeypatch.setattr(limits.time, "monotonic", lambda: now[0])
    refusals = limits.Refusals()
    with caplog.at_level(logging.WARNING, logger=limits.log.name):
        for _ in range(1000):
            refusals.refused("link", "peer", "too many")
        refusals.refused("durable link", "peer", "too many")
        now[0] += limits.LOG_INTERVAL
        refusals.refused("link", "peer", "too many")
    assert refusals.counts == {"link": 1001, "durable link": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "999 more refused" in lines[2]
