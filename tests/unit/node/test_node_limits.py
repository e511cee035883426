"""node/limits.py: this node's connection and channel counts against vhost and user limits.

What is checked: a connection is refused past its vhost's max-connections (vhost first, RabbitMQ's
text) or its user's, and is then not counted; a negative limit or none admits everything, 0 admits
nothing; channels count over every connection of the user and a refused one is not counted; closing
a connection frees it and its channels; limits are read at each check (a change applies at once);
refusals are counted per limit and logged at most once per interval, the next line saying how many
were not logged.
"""

from __future__ import annotations

import logging

from raftmq.node import limits as node_limits
from raftmq.node.limits import Usage


def usage(vhost_limits: dict | None = None, user_limits: dict | None = None) -> Usage:
    vl, ul = vhost_limits if vhost_limits is not None else {}, user_limits if user_limits is not None else {}
    return Usage(lambda: vl, lambda: ul)


def test_vhost_and_user_connection_limits() -> None:
    u = usage({"v": {"max-connections": 2}}, {"alice": {"max-connections": 1}})
    assert u.open("c1", "bob", "v") is None
    assert u.open("c2", "alice", "v") is None
    assert u.open("c3", "bob", "v") == "access to vhost 'v' refused for user 'bob': connection limit (2) is reached"
    assert u.open("c4", "alice", "/") == "connection refused for user 'alice': user connection limit (1) is reached"
    assert u.by_vhost == {"v": 2} and u.by_user == {"bob": 1, "alice": 1}  # the refused are not counted
    u.close("c2")
    assert u.open("c5", "bob", "v") is None
    u.close("c3")  # refused, never counted: nothing to forget
    assert u.by_vhost == {"v": 2} and u.refused == {"vhost max-connections": 1, "user max-connections": 1}


def test_zero_admits_nothing_and_negative_everything() -> None:
    vhost_limits: dict = {"v": {"max-connections": 0}}
    u = usage(vhost_limits)
    assert u.open("c1", "bob", "v") is not None
    vhost_limits["v"]["max-connections"] = -1  # read at each check
    assert all(u.open(f"c{i}", "bob", "v") is None for i in range(2, 50))


def test_channels_count_over_the_users_connections() -> None:
    user_limits: dict = {"alice": {"max-channels": 3}}
    u = usage(user_limits=user_limits)
    u.open("a", "alice", "/")
    u.open("b", "alice", "/")
    assert u.channel_opened("a") is None and u.channel_opened("a") is None and u.channel_opened("b") is None
    assert u.channel_opened("b") == ("number of channels opened for user 'alice' has reached the maximum "
                                     "allowed user limit of 3")
    assert u.channels_by_user == {"alice": 3}
    u.channel_closed("a")
    assert u.channel_opened("b") is None
    u.close("b")  # its two channels go with it
    assert u.channels_by_user == {"alice": 1}
    u.close("a")
    assert u.channels_by_user == {} and u.by_user == {} and u.held == {}
    assert u.channel_opened("never-opened") is None  # not open yet: not limited here


def test_refusals_are_logged_at_most_once_per_interval(caplog, monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(node_limits.time, "monotonic", lambda: clock[0])
    u = usage({"v": {"max-connections": 0}})
    with caplog.at_level(logging.WARNING, logger="raftmq.node.limits"):
        for i in range(50):
            assert u.open(f"c{i}", "bob", "v") is not None
        clock[0] += node_limits.LOG_INTERVAL
        u.open("last", "bob", "v")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "(and 49 more not logged)" in lines[1]
    assert u.refused["vhost max-connections"] == 51
