"""The command stream behind tests/unit/store/fixtures/snapshot-format-1.lmdb.

``python -m tests.unit.store.snapshot_fixture PATH`` writes a snapshot of the machine it builds; the
committed fixture was written so by the code of snapshot format 1.  test_versions.py loads it with
today's code and compares it with the same stream applied today: a change to the model that older
snapshots can no longer be read into fails there, and must come with a new SNAPSHOT_FORMAT and a
way to read the old one (store/versions.py).
"""

from __future__ import annotations

import sys

from raftmq.store.commands import (
    OK,
    OUT_REPLY,
    Ack,
    ChannelOpen,
    Consume,
    ExchangeDeclare,
    PermissionSet,
    Publish,
    Qos,
    QueueBind,
    QueueDeclare,
    SessionAttach,
    UserPut,
    VhostAdd,
)
from raftmq.store.machine import StateMachine
from raftmq.store.snapshot import write_snapshot

NOW = 1_700_000_000_000_000
C091, C010 = "n1.1a2b.1", "n1.1a2b.2"


def commands() -> list[list]:
    publish = [Publish(C091, 10 + i, 1, "/", "fx.topic", f"orders.{i % 3}", False, b"\x00\x00",
                f"body-{i}".encode() * (i + 1), i % 2 == 0, i % 4, 60_000 if i == 5 else None) for i in range(12)]
    return [
        VhostAdd(None, None, "/"),
        UserPut(None, 1, None, "fixture-user", "pbkdf2-sha256$1$c2FsdA==$aGFzaA==", ["management"], False),
        PermissionSet(None, 2, None, "fixture-user", "/", "^fx-", "^fx-", "^fx-"),
        ChannelOpen(C091, 3, 1),
        ExchangeDeclare(C091, 4, 1, "/", "fx.topic", "topic", False, True, False, False, {}),
        QueueDeclare(C091, 5, 1, "/", "fx-orders", False, True, False, False, {"x-max-priority": 5}),
        QueueDeclare(C091, 6, 1, "/", "fx-audit", False, False, False, False, {"x-message-ttl": 120_000}),
        QueueBind(C091, 7, 1, "/", "fx-orders", "fx.topic", "orders.*", {}),
        QueueBind(C091, 8, 1, "/", "fx-audit", "fx.topic", "#", {}),
        *publish,
        Qos(C091, 30, 1, 3, False),
        Consume(C091, 31, 1, "/", "fx-orders", "fx-consumer", False, False, {}),
        SessionAttach(C010, 40, 1, "/", "guest", b"fixture-session", False),
    ]


def build() -> StateMachine:
    machine = StateMachine(None)
    for command in commands():
        outputs = machine.apply_batch(NOW, [command])
        for out in outputs:
            if out[1] == OUT_REPLY:
                assert out[3][0] == OK, (command, out)
    first_unacked = sorted(machine.channels[C091][1].unacked)[0]  # (qid, seq) of the first delivery
    machine.apply_batch(NOW + 1000, [Ack(C091, None, 1, [list(first_unacked)])])
    return machine


if __name__ == "__main__":
    write_snapshot(sys.argv[1], build(), b"fixture-meta")
