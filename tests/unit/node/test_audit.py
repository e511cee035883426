"""node/audit.py: the notes a node proposes for the audit history (issue 36), and their bound.

A client hammering refused logins must not flood the log: per source address at most
``per_source`` notes a window, the rest counted and proposed as one note when the window is over.
Opened/closed notes carry the principal; a refused operation carries its connection's principal.
"""

from __future__ import annotations

import re

from raftmq.node.audit import AuditNotes
from raftmq.node.auth import Principal
from raftmq.node.core.access import Access, AccessRefused
from raftmq.store.core import events as EV
from raftmq.store.core.commands import AuditNote, QueueDeclare


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def notes(per_source: int = 5, per_window: int = 100) -> tuple[AuditNotes, list[AuditNote], Clock]:
    proposed: list[AuditNote] = []
    clock = Clock()
    return AuditNotes(proposed.append, clock=clock, per_source=per_source, per_window=per_window), proposed, clock


def test_a_login_flood_from_one_address_is_bounded_and_its_count_proposed_after_the_window():
    """1,000 refused logins in one window from one address: 5 notes, then one note counting 995."""
    audit, proposed, clock = notes()
    for i in range(1000):
        audit.login_refused(f"user{i}", "PLAIN", "127.0.0.9", "Login was refused")
    assert len(proposed) == 5 and audit.suppressed == 995
    audit.flush()  # the window is not over yet: nothing more
    assert len(proposed) == 5
    clock.now += 1.0
    audit.flush()
    assert len(proposed) == 6
    summary = proposed[-1]
    assert summary.kind == EV.LOGIN_REFUSED and summary.detail == "995 more like this suppressed"
    assert summary.principal[2] == "127.0.0.9"
    first = proposed[0]
    assert first.principal == ["user0", "", "127.0.0.9", ""] and first.detail == "PLAIN: Login was refused"


def test_other_addresses_keep_their_own_allowance_within_the_node_wide_cap():
    """Per source: a second address is not silenced by the first; the node cap bounds them all."""
    audit, proposed, _clock = notes(per_source=2, per_window=5)
    for address in ("a", "b", "c", "d"):
        for _ in range(3):
            audit.login_refused("x", "PLAIN", address, "no")
    assert [n.principal[2] for n in proposed] == ["a", "a", "b", "b", "c"]  # then the node cap (5)


def test_opened_closed_and_refused_operations_carry_the_principal():
    """opened notes user/protocol/address/name; Access reports a refusal to the note taker, which
    names the operation and permission; closed repeats the principal; an unknown conn is not noted."""
    audit, proposed, _clock = notes()
    principal = Principal("alice", {"/": tuple(re.compile(p) for p in ("^mine$", ".*", ".*"))})
    access = Access(principal, "/")
    audit.opened("n1.b.3", "AMQP 0-9-1", access, "127.0.0.1:4000", "app")
    try:
        access.authorize(QueueDeclare("n1.b.3", None, 1, "/", "theirs", False, True, False, False, {}))
    except AccessRefused:
        pass
    else:
        raise AssertionError("the declare should have been refused")
    audit.closed("n1.b.3")
    audit.closed("n1.never.opened")
    kinds = [n.kind for n in proposed]
    assert kinds == [EV.CONNECTION_OPENED, EV.ACCESS_REFUSED, EV.CONNECTION_CLOSED]
    refused = proposed[1]
    assert refused.conn == "n1.b.3" and refused.queue == "theirs" and refused.vhost == "/"
    assert refused.detail == "queue_declare needs configure"
    assert refused.principal == ["alice", "AMQP 0-9-1", "127.0.0.1:4000", "app"] == proposed[2].principal


def test_admin_changes_are_never_suppressed():
    """Every administrative change counts for an auditor: no bound applies to them."""
    audit, proposed, _clock = notes(per_source=1, per_window=1)
    for i in range(20):
        audit.admin_change("admin", "http", "127.0.0.1", f"set_permissions user='u{i}'")
    assert len(proposed) == 20 and all(n.kind == EV.ADMIN_CHANGE for n in proposed)
