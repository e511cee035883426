"""Format versions (raftmq/versions.py): commands, snapshots and the LMDB store say which format they
are in; the current code reads its own and the unnumbered version-1 ones, and refuses newer ones."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import lmdb
import msgpack
import pytest

from raftmq.raft.replica import ENTRY
from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import (
    Ack,
    Nack,
    Op,
    Publish,
    QueueDeclare,
    SessionCommand,
    TxCommit,
    decode_batch,
    encode_batch,
)
from raftmq.store.core.message import AMQP010, AMQP091, headers_of
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import digest, import_model, live_bodies, read_snapshot, write_snapshot
from raftmq.versions import (
    COMMAND_FORMAT,
    EXIT_FORMAT_TOO_NEW,
    SNAPSHOT_FORMAT,
    STORE_FORMAT,
    FormatTooNew,
)
from tests.unit.raft.test_cluster_log import make_log
from tests.unit.store import snapshot_fixture

FIXTURE = Path(__file__).parent / "fixtures" / "snapshot-format-1.lmdb"
FIXTURE_2 = Path(__file__).parent / "fixtures" / "snapshot-format-2.lmdb"
FIXTURE_3 = Path(__file__).parent / "fixtures" / "snapshot-format-3.lmdb"
BATCH = [Publish("c", None, 1, "/", "", "q", False, b"\x00\x00", b"body", False, 0, None),
         Ack("c", None, 1, [[1, 2]])]


def test_a_batch_carries_its_format_and_reads_back():
    blob = encode_batch(BATCH)
    assert blob[0] == COMMAND_FORMAT
    assert decode_batch(blob) == BATCH
    assert decode_batch(memoryview(blob)) == BATCH


def _format_1(commands: list) -> list:
    """Commands as format 1 wrote them: ``[op, conn, token, *fields]``."""
    return [[command.op, *command[:-1]] for command in commands]


def test_a_batch_written_before_formats_were_numbered_is_read_as_version_1():
    assert decode_batch(msgpack.packb(_format_1(BATCH), use_bin_type=True)) == BATCH
    big = [BATCH[0]] * 20  # msgpack's array16 header (0xdc), not a fixarray
    assert decode_batch(msgpack.packb(_format_1(big), use_bin_type=True)) == big


def test_a_format_1_batch_reads_back_typed_with_its_optional_fields_defaulted():
    """Format 1 left optional trailing fields out (a queue.declare without server_named, a nack
    without unsent) and nested commands inside a 0-10 session command and a transaction."""
    declare = [Op.QUEUE_DECLARE, "c", 7, 1, "/", "q", False, True, False, False, {}]
    nack = [Op.NACK, "c", None, 1, [[1, 2]], True]
    wrapped = [Op.SESSION_COMMAND, "c", None, 1, 5, [Op.ACK, None, None, None, [[3, 3]]]]
    tx = [Op.TX_COMMIT, "c", 8, 1, [nack]]
    blob = bytes((1,)) + msgpack.packb([declare, nack, wrapped, tx], use_bin_type=True)
    assert decode_batch(blob) == [
        QueueDeclare("c", 7, 1, "/", "q", False, True, False, False, {}, server_named=False),
        Nack("c", None, 1, [[1, 2]], True, unsent=False),
        SessionCommand("c", None, 1, 5, Ack(None, None, None, [[3, 3]])),
        TxCommit("c", 8, 1, [Nack("c", None, 1, [[1, 2]], True)]),
    ]
    assert [c.__class__ for c in decode_batch(blob)] == [QueueDeclare, Nack, SessionCommand, TxCommit]


def test_format_2_nests_typed_commands_too():
    batch = [SessionCommand("c", None, 1, 5, Ack(None, None, None, [[3, 3]])),
             TxCommit("c", 8, 1, [BATCH[0], Nack("c", None, 1, [[1, 2]], True)])]
    decoded = decode_batch(encode_batch(batch))
    assert decoded == batch
    assert decoded[0].inner.__class__ is Ack and decoded[1].operations[1].__class__ is Nack


def test_a_batch_from_a_newer_raftmq_is_refused():
    newer = bytes((COMMAND_FORMAT + 1,)) + msgpack.packb(BATCH, use_bin_type=True)
    with pytest.raises(FormatTooNew, match="newer than"):
        decode_batch(newer)


def test_a_cluster_node_stops_at_an_entry_from_a_newer_raftmq(tmp_path):
    """Applying past it would make the node diverge: ClusterLog stops the process (exit 78)."""
    loop = asyncio.new_event_loop()
    try:
        log, _recorder = make_log(tmp_path, loop)
        newer = bytes((COMMAND_FORMAT + 1,)) + msgpack.packb(BATCH, use_bin_type=True)
        log._inbox.append((ENTRY, 7, 1, "n2.boot", 1, memoryview(newer)))
        with pytest.raises(SystemExit) as info:
            log._drain()
        assert info.value.code == EXIT_FORMAT_TOO_NEW
        assert log.machine.applied_index == 0  # nothing of it applied
    finally:
        loop.close()


def test_the_format_1_snapshot_fixture_loads_into_todays_model():
    """The committed fixture (written by snapshot_fixture.py under format 1) reads into the same state
    as its command stream applied by today's code; its messages, from before Message.format, are
    0-9-1."""
    meta, model = read_snapshot(str(FIXTURE))
    assert meta == b"fixture-meta"
    machine = StoredMachine()
    bodies = dict(import_model(machine, model))
    expected = snapshot_fixture.build(format=1)
    assert digest(machine) == digest(expected)  # the digest covers Message.live, recounted on import
    # Its bodies come back for the node's body store (the model keeps none since format 3).
    assert bodies == {i: expected.own_bodies.get(i) for i in live_bodies(expected)}
    assert {e.message.format for level in machine.vhosts["/"].queues["fx-audit"].ready._levels for e in level} == {AMQP091}
    queues = machine.vhosts["/"].queues
    assert (len(queues["fx-orders"].ready), queues["fx-orders"].unacked_count) == (8, 3)
    assert len(queues["fx-audit"].ready) == 12
    assert machine.users["fixture-user"].permissions == {"/": ("^fx-", "^fx-", "^fx-")}
    assert len(machine.sessions) == 1


def test_the_format_2_snapshot_fixture_loads_with_its_0_10_message_and_bodies():
    """snapshot-format-2.lmdb: a 0-10 message keeps its format, the core reads its headers through
    the 0-10 codec, and the bodies the format still carried come back for the body store."""
    meta, model = read_snapshot(str(FIXTURE_2))
    machine = StoredMachine()
    bodies = dict(import_model(machine, model))
    expected = snapshot_fixture.build(format=2)
    assert digest(machine) == digest(expected)
    (message,) = [e.message for level in machine.vhosts["/"].queues["fx-audit"].ready._levels for e in level
                  if e.message.format == AMQP010]
    assert bodies[message.id] == b"body-010" and message.size == len(b"body-010")
    assert headers_of(message.properties, message.format) == {"k": "v"}
    assert bodies == {i: expected.own_bodies.get(i) for i in live_bodies(expected)}


def test_the_current_format_snapshot_fixture_holds_no_bodies():
    """snapshot-format-3.lmdb, written by this format's code: the model without bodies (issue 18);
    a node that installs it fetches them (store/disk/body_fetch.py)."""
    meta, model = read_snapshot(str(FIXTURE_3))
    assert b"body-010" not in model and b"body-1body-1" not in model
    machine = StoredMachine()
    assert import_model(machine, model) == []
    expected = snapshot_fixture.build(format=3)
    assert digest(machine) == digest(expected)
    assert live_bodies(machine) == live_bodies(expected)


def test_a_snapshot_records_its_format_and_a_newer_one_is_refused(tmp_path):
    path = str(tmp_path / "snap.lmdb")
    write_snapshot(path, snapshot_fixture.build(), b"m")
    env = lmdb.open(path, subdir=False, lock=False)
    with env.begin(write=True) as txn:
        assert int(bytes(txn.get(b"format"))) == SNAPSHOT_FORMAT
        txn.put(b"format", str(SNAPSHOT_FORMAT + 1).encode())
    env.close()
    with pytest.raises(FormatTooNew, match="snapshot"):
        read_snapshot(path)


def test_a_snapshot_without_a_format_is_version_1(tmp_path):
    path = str(tmp_path / "old.lmdb")
    shutil.copy(FIXTURE, path)
    env = lmdb.open(path, subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.delete(b"format")
    env.close()
    assert read_snapshot(path)[0] == b"fixture-meta"


def test_the_lmdb_store_is_stamped_and_a_newer_one_is_refused(tmp_path):
    store = DurableStore(str(tmp_path / "state"))
    with store.env.begin() as txn:
        assert msgpack.unpackb(txn.get(b"format", db=store.db["meta"])) == STORE_FORMAT
    with store.env.begin(write=True) as txn:
        txn.put(b"format", msgpack.packb(STORE_FORMAT + 1), db=store.db["meta"])
    store.close()
    with pytest.raises(FormatTooNew, match="LMDB store"):
        DurableStore(str(tmp_path / "state"))
