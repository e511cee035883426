"""The core's TxCommit as the AMQP 1.0 front end uses it (node/amqp10/transactions.py, spec 4.4).

A 1.0 connection has one core session per link, so a transaction's commit carries PUBLISH commands on
the coordinator's core session and MESSAGE_SETTLE commands on the core sessions of the links that
sent the deliveries.  Checked here: all of it is applied by one command (one log entry), it survives
the log's batch encoding with its nested settlements typed, and a settlement on a session that is gone
is skipped while the rest applies -- which is why the front end refuses to commit once a link that
did the transaction's work has detached.
"""

from __future__ import annotations

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    OUT_TRANSFER,
    MessageFlow,
    MessageSettle,
    MessageSubscribe,
    Publish,
    QueueDeclare,
    SessionAttach,
    SessionDetach,
    TxCommit,
    VhostAdd,
    decode_batch,
    encode_batch,
)
from raftmq.store.core.sessions import SETTLE_ACCEPT, UNLIMITED

NOW = 1_700_000_000_000_000
CONN = "n1.b.1"
COORDINATOR, LINK_A, LINK_C = 1, 2, 3  # core channels: one core session per 1.0 link


def _publish(channel: int, queue: str, body: bytes) -> Publish:
    return Publish(CONN, None, channel, "/", "", queue, False, b"", body, True, 0, None)


def _setup() -> tuple[StoredMachine, dict[int, int]]:
    """Queues A, B, C; a message in A and in C, each delivered (unsettled) to its own link."""
    m = StoredMachine()
    m.apply_batch(NOW, [VhostAdd(None, None, "/")])
    commands = [SessionAttach(CONN, None, ch, "/", "guest", f"amqp10:{CONN}:{ch}".encode(), False)
                for ch in (COORDINATOR, LINK_A, LINK_C)]
    commands += [QueueDeclare(CONN, None, COORDINATOR, "/", q, False, True, False, False, {}) for q in "ABC"]
    commands += [_publish(COORDINATOR, "A", b"a"), _publish(COORDINATOR, "C", b"c")]
    for ch, q in ((LINK_A, "A"), (LINK_C, "C")):
        commands += [MessageSubscribe(CONN, None, ch, "/", q, f"l{ch}", False, False, {}),
                     MessageFlow(CONN, None, ch, f"l{ch}", 0, 1), MessageFlow(CONN, None, ch, f"l{ch}", 1, UNLIMITED)]
    out = m.apply_batch(NOW, commands)
    transfers = {o[2]: o[4][0] for o in out if o[1] == OUT_TRANSFER}  # core channel -> transfer id
    assert set(transfers) == {LINK_A, LINK_C}
    return m, transfers


def _counts(m: StoredMachine) -> dict[str, tuple[int, int]]:
    """queue -> (ready, unacked) messages."""
    queues = m.vhosts["/"].queues
    unacked = {q: 0 for q in queues}
    for channels in m.channels.values():
        for ch in channels.values():
            for queue, _entry in ch.unacked.values():
                unacked[queue.name] += 1
    return {q: (len(queues[q].ready), unacked[q]) for q in sorted(queues)}


def _commit(transfers: dict[int, int]) -> TxCommit:
    return TxCommit(CONN, 7, COORDINATOR, [
        _publish(COORDINATOR, "B", b"moved"),
        MessageSettle(CONN, None, LINK_A, [[transfers[LINK_A]] * 2], SETTLE_ACCEPT),
        MessageSettle(CONN, None, LINK_C, [[transfers[LINK_C]] * 2], SETTLE_ACCEPT),
    ])


def test_publishes_and_settlements_of_several_links_in_one_command():
    """4.4: the publish to B and the accepts of two links' deliveries are one apply."""
    m, transfers = _setup()
    assert _counts(m) == {"A": (0, 1), "B": (0, 0), "C": (0, 1)}
    m.apply_batch(NOW, [_commit(transfers)])
    assert _counts(m) == {"A": (0, 0), "B": (1, 0), "C": (0, 0)}


def test_the_commit_survives_the_log_encoding():
    """The log holds the commit as one command with its nested settlements and publish typed again."""
    _m, transfers = _setup()
    (decoded,) = decode_batch(encode_batch([_commit(transfers)]))
    assert decoded == _commit(transfers)
    assert [op.__class__ for op in decoded.operations] == [Publish, MessageSettle, MessageSettle]


def test_a_settlement_on_a_detached_session_is_skipped():
    """Why the front end checks its links before it commits: a link whose core session detached has
    had its delivery returned to the queue, and the core skips that settlement (the rest applies)."""
    m, transfers = _setup()
    m.apply_batch(NOW, [SessionDetach(CONN, None, LINK_C)])
    assert _counts(m)["C"] == (1, 0)  # back in C
    m.apply_batch(NOW, [_commit(transfers)])
    assert _counts(m) == {"A": (0, 0), "B": (1, 0), "C": (1, 0)}
