"""The command streams behind tests/unit/store/fixtures/snapshot-format-N.lmdb.

``python -m tests.unit.store.snapshot_fixture PATH [FORMAT]`` writes a snapshot of the machine it
builds for FORMAT (default: the current one); each committed fixture was written so by the code of
its snapshot format.  Format 2 adds a message stored in 0-10 property format (Message.format);
format 3 has the same stream, written without bodies (Message.size and live instead).  test_versions.py loads it with
today's code and compares it with the same stream applied today: a change to the model that older
snapshots can no longer be read into fails there, and must come with a new SNAPSHOT_FORMAT and a
way to read the old one (raftmq/versions.py).
"""

from __future__ import annotations

import sys

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
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
from raftmq.store.core.message import AMQP010
from raftmq.store.disk.snapshot import write_snapshot

NOW = 1_700_000_000_000_000
C091, C010 = "n1.1a2b.1", "n1.1a2b.2"


def commands(format: int = 3) -> list:
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
        *([Publish(C091, 41, 1, "/", "fx.topic", "orders.010", False, AMQP010_HEADER, b"body-010", True, 2, None,
                   AMQP010)] if format >= 2 else []),
    ]


# A 0-10 transfer's stored header: delivery-properties (priority 2, persistent) and
# message-properties (content-type, application-headers {"k": "v"}), as protocol/amqp010/neutral.py
# stores them; spelled out so that the fixture does not depend on the codec it is meant to check.
AMQP010_HEADER = bytes.fromhex("000000060401180002020000001d040310010a746578742f706c61696e"
                               "0000000a00000001016b95000176")


def build(format: int = 3) -> StoredMachine:
    machine = StoredMachine()
    for command in commands(format):
        outputs = machine.apply_batch(NOW, [command])
        for out in outputs:
            if out[1] == OUT_REPLY:
                assert out[3][0] == OK, (command, out)
    first_unacked = sorted(machine.channels[C091][1].unacked)[0]  # (qid, seq) of the first delivery
    machine.apply_batch(NOW + 1000, [Ack(C091, None, 1, [list(first_unacked)])])
    return machine


if __name__ == "__main__":
    write_snapshot(sys.argv[1], build(int(sys.argv[2]) if len(sys.argv) > 2 else 3), b"fixture-meta")
