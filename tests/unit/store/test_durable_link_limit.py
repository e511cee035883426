"""The bound on AMQP 1.0 durable links per user, applied in the state machine (store/core/sessions.py).

Durable links are sessions named ``amqp10-link\\0<container>\\0<link>`` (node/amqp10/recovery.py) that
outlive their connection; ``StoredMachine.durable_links_limit`` (config amqp10_durable_links_per_user)
bounds how many one user holds.  Checked at apply, so attaches racing on several nodes cannot pass it,
and deterministic: the same log gives the same refusals on every replica.
"""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import ERR, OUT_REPLY, Op, SessionTimeout, VhostAdd, make

NOW = 1_700_000_000_000_000


def attach(m: StoredMachine, conn: str, channel: int, user: str, name: bytes):
    out = m.apply_batch(NOW, [make(Op.SESSION_ATTACH, conn, 1, channel, "/", user, name, True)])
    return next(o[3] for o in out if o[1] == OUT_REPLY)


def durable(i: int) -> bytes:
    return b"amqp10-link\x00client\x00link-%d" % i


def machine(limit: int) -> StoredMachine:
    m = StoredMachine()
    m.durable_links_limit = limit
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    return m


def test_new_durable_links_beyond_the_limit_are_refused_per_user() -> None:
    """Two durable links fit, the third is refused (530, naming the setting); another user, and sessions
    that are no durable links (a 1.0 link's plain core session, a 0-10 session), are not counted."""
    m = machine(2)
    assert attach(m, "c1", 1, "alice", durable(1))[0] != ERR
    assert attach(m, "c1", 2, "alice", durable(2))[0] != ERR
    refused = attach(m, "c1", 3, "alice", durable(3))
    assert refused[0] == ERR and refused[1] == 530 and "amqp10_durable_links_per_user" in refused[2]
    assert attach(m, "c1", 4, "bob", durable(3))[0] != ERR
    assert attach(m, "c1", 5, "alice", b"amqp10:c1:5")[0] != ERR
    assert attach(m, "c1", 6, "alice", b"0-10 session")[0] != ERR
    assert len(m.sessions) == 5


def test_a_re_attach_is_not_a_new_link_and_a_destroyed_one_frees_its_place() -> None:
    """Re-attaching an existing durable link (after its connection went) is allowed at the limit; once
    one is destroyed (a closing detach sets its timeout to 0, then detaches), a new one fits."""
    m = machine(2)
    attach(m, "c1", 1, "alice", durable(1))
    attach(m, "c1", 2, "alice", durable(2))
    m.apply_batch(NOW, [SessionTimeout("c1", None, 1, 60), SessionTimeout("c1", None, 2, 60)])
    m.apply_batch(NOW, [make(Op.CONNECTION_CLOSE, "c1", None)])
    assert len(m.sessions) == 2  # they outlive the connection
    assert attach(m, "c2", 1, "alice", durable(1))[0] != ERR  # resumed
    assert attach(m, "c2", 2, "alice", durable(3))[0] == ERR
    m.apply_batch(NOW, [SessionTimeout("c2", None, 1, 0), make(Op.SESSION_DETACH, "c2", None, 1)])
    assert attach(m, "c2", 3, "alice", durable(3))[0] != ERR


def test_the_read_api_lists_durable_links_and_0_10_sessions_apart() -> None:
    """queries.sessions (the management UI's Sessions page, issue 35): a durable link is named by its
    container and link (the prefix left out), a 0-10 session by its name; both attached."""
    from raftmq.store.core import queries as Q

    m = machine(4)
    attach(m, "c1", 1, "alice", durable(1))
    attach(m, "c2", 1, "bob", b"plain-010")
    listed = sorted((s.kind, s.principal, s.name, s.detached_at) for s in Q.sessions(m))
    assert listed == [("0-10 session", "bob", "plain-010", None), ("1.0 durable link", "alice", "client / link-1", None)]
