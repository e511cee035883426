"""Spark over every Raft group of a node (issue 34 "Audit: each group's events keep their own
sequence; Spark reads all groups of a node ... as one table with `group` and a documented order";
spark/groups.py, spark/datasource.py).

One real node started with ``raft_groups = 3`` (the metadata group in the main process, queue
groups 1 and 2 in workers, each with its own history ``groups/g<N>/events``); pika places ``left``
in queue group 1 and ``right`` in queue group 2 (``x-queue-group``), publishes with confirms to
both, takes one message of ``left`` and rejects it (AMQP 0-9-1 basic.nack requeue=false, section
1.8.3.14: dead-lettered through the fanout ``dlx`` to ``right``, a hop from group 1 to group 2),
and acknowledges one of ``right``.  ``raftmq snapshot`` writes every group's history, read back
here with the node's own reader (store/disk/history.py) as the reference.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import lmdb
import msgpack
import pika
import pytest
from pyspark.sql import functions as F

from raftmq.ops.cli import build_parser
from raftmq.ops.local.node import RaftmqNode
from raftmq.spark import audit
from raftmq.spark.groups import ORDER
from raftmq.spark.report import run
from raftmq.spark.session import load
from raftmq.store.disk import history as EV
from raftmq.store.disk.sealed import seal, unseal
from tests.support.cli import raftmq
from tests.support.groups import wait_histories

LEFT, RIGHT = 5, 4  # messages published to queue group 1's queue and to queue group 2's


@pytest.fixture(scope="module")
def node_history(tmp_path_factory):
    """(data directory, snapshot): the node stopped, its snapshot taken while it ran."""
    base = tmp_path_factory.mktemp("groups-audit")
    env = {"RAFTMQ_AUDIT_RETENTION": "metadata", "RAFTMQ_RAFT_GROUPS": "3"}
    with RaftmqNode(base / "data", env=env) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("left", arguments={"x-queue-group": 1, "x-dead-letter-exchange": "dlx"})
        ch.queue_declare("right", arguments={"x-queue-group": 2})
        ch.queue_bind("right", "dlx")
        for i in range(LEFT):
            ch.basic_publish("", "left", b"l%d" % i, pika.BasicProperties(message_id=f"left-{i}"))
        for i in range(RIGHT):
            ch.basic_publish("", "right", b"r%d" % i, pika.BasicProperties(message_id=f"right-{i}"))
        method, props, _ = ch.basic_get("left")
        assert props.message_id == "left-0"
        ch.basic_nack(method.delivery_tag, requeue=False)
        method, props, _ = ch.basic_get("right")
        assert props.message_id == "right-0"
        ch.basic_ack(method.delivery_tag)
        # The dead-lettered copy reaches group 2 through group 1's outbox: wait for it.
        for _ in range(100):
            if ch.queue_declare("right", passive=True).method.message_count == RIGHT:
                break
            conn.process_data_events(time_limit=0.05)
        assert ch.queue_declare("right", passive=True).method.message_count == RIGHT
        conn.close()
        wait_histories(node, groups=3)
        snap = base / "snap"
        done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(snap))
        assert done.returncode == 0, done.stderr
    return Path(node.data_dir), snap


def histories(snap: Path) -> dict[int, Path]:
    return {0: snap, 1: snap / "groups" / "g1", 2: snap / "groups" / "g2"}


def reference(snap: Path) -> list[tuple[int, list]]:
    """Every group's events read by the node's reader, merged as the node-side merges do:
    by time, then group, then the group's own sequence."""
    merged = [(e[1], g, e[0], e) for g, h in histories(snap).items() for e in EV.read_events(str(h))]
    return [(g, e) for _t, g, _s, e in sorted(merged, key=lambda item: item[:3])]


def test_every_group_is_one_table_with_group_and_the_documented_order(spark, node_history):
    """Every event of every group appears once, with its group and its group's own sequence; in the
    documented order (time, group, seq) the table is the node-side merge, row for row; each group's
    sequence starts at 1 (its own numbering); the queues' message events are in their groups."""
    _data, snap = node_history
    expected = reference(snap)
    df = load(spark, str(snap), "events")
    found = [(r["group"], r["seq"], r["kind"], r["queue"], r["message_id"])
             for r in df.orderBy(*ORDER).collect()]
    assert found == [(g, e[0], EV.KIND_NAMES[e[2]], e[4], e[5]) for g, e in expected]
    by_group = {g: sorted(s for gg, s, *_ in found if gg == g) for g in (0, 1, 2)}
    for group, seqs in by_group.items():
        assert seqs == list(range(1, len(seqs) + 1)), group  # each group numbers its own events
    routed = {(r[0], r[3]) for r in found if r[2] == "routed"}
    assert routed == {(1, "left"), (2, "right")}
    assert {r[0] for r in found if r[2].startswith("connection_")} == {0}
    # A queue group's published events get the publisher's principal from group 0's connections.
    users = {r["user"] for r in df.where((F.col("group") == 1) & (F.col("kind") == "published")
                                         & F.col("detail").startswith("n1.")).collect()}
    assert users == {"guest"}


def test_group_filters_are_pushed_down_and_messages_carry_their_group(spark, node_history):
    """``group = 2`` reads group 2's history only (no Spark Filter left on it); the messages table
    keys a message by (group, message_id): ids restart in each group."""
    _data, snap = node_history
    only = load(spark, str(snap), "events").where(F.col("group") == 2)
    assert only.count() == len(list(EV.read_events(str(histories(snap)[2]))))
    plan = only._jdf.queryExecution().executedPlan().toString()
    assert not [line for line in plan.splitlines() if "Filter" in line and re.search(r"group#\d+ = 2", line)], plan
    messages = load(spark, str(snap), "messages").select("group", "message_id", "amqp_message_id").collect()
    keys = [(r["group"], r["message_id"]) for r in messages]
    assert len(keys) == len(set(keys)) == LEFT + RIGHT + 2  # the dead-letter copy: once in each group
    by_id = {r["amqp_message_id"]: r["group"] for r in messages if (r["amqp_message_id"] or "").startswith("right")}
    assert set(by_id.values()) == {2}
    assert {r["message_id"] for r in messages if r["group"] == 1} == set(range(1, LEFT + 2))
    assert {r["message_id"] for r in messages if r["group"] == 2} == set(range(1, RIGHT + 2))


def test_jobs_key_messages_by_group(spark, node_history):
    """unconsumed: the messages never delivered, per queue, with their group; trace of a message of
    group 1 stays in group 1 (the reject and its dead-letter copy); contents of ``right`` at the end
    holds its three ready messages and the dead-lettered copy that crossed from group 1."""
    _data, snap = node_history
    path = str(snap)
    unconsumed = {(r["group"], r["queue"]) for r in audit.unconsumed(spark, path).collect()}
    assert unconsumed == {(1, "left"), (2, "right")}
    # left-0, its dead-letter copy in group 1, and that copy as it arrived in group 2 (new id there)
    assert audit.message_keys(spark, path, "left-0") == [(1, 1), (1, LEFT + 1), (2, RIGHT + 1)]
    life = [(r["group"], r["kind"]) for r in audit.trace(spark, path, 1, group=1).collect()]
    assert life == [(1, "published"), (1, "routed"), (1, "delivered"), (1, "rejected"), (1, "dead_lettered"),
                    (1, "published")]
    end = max(e[1] for _g, e in reference(snap))
    held = {(r["group"], r["amqp_message_id"], r["state"]) for r in audit.contents(spark, path, "right", end).collect()}
    assert held == {(2, f"right-{i}", "ready") for i in range(1, RIGHT)} | {(2, "left-0", "ready")}


def test_the_audit_command_snapshots_every_group_of_a_data_directory(spark, node_history, capsys):
    """``raftmq audit unconsumed --data-dir`` (in this process, on the session already started)
    snapshots the metadata group's and each queue group's history and reads them as one."""
    data, _snap = node_history
    args = build_parser().parse_args(["audit", "unconsumed", "--data-dir", str(data), "--quiet"])
    assert run(args) == 0
    out = capsys.readouterr()
    assert "group 1: events" in out.err and "group 2: events" in out.err
    assert f"({LEFT - 1 + RIGHT - 1 + 1} rows)" in out.out  # left-1..4; right-1..3 and the copy


def _damaged(snap: Path, tmp: Path) -> tuple[Path, Path, list]:
    copy = tmp / "snap"
    shutil.copytree(snap, copy)
    g2 = copy / "groups" / "g2"
    events = list(EV.read_events(str(g2)))
    return copy, g2, events[len(events) // 2]


def test_a_damaged_record_in_one_group_fails_that_groups_read(spark, node_history, tmp_path):
    """A bit flipped in one of group 2's event records: the read of every group fails naming group
    2's history and the seq (issue 29: never a damaged row); a scan of groups 0 and 1 (group 2 not
    opened, pushed down) still reads, each group checked on its own."""
    _data, snap = node_history
    copy, g2, target = _damaged(snap, tmp_path)
    data = bytearray((g2 / "data.mdb").read_bytes())
    packed = seal(EV.U64.pack(target[0]), msgpack.packb(target, use_bin_type=True))
    at = data.find(packed)
    assert at >= 0 and data.find(packed, at + 1) < 0
    data[at + len(packed) - 3] ^= 0x10
    (g2 / "data.mdb").write_bytes(bytes(data))
    with pytest.raises(Exception, match=rf"HistoryDamaged.*groups/g2.*events/seq {target[0]}: checksum mismatch"):
        load(spark, str(copy), "events").collect()
    healthy = load(spark, str(copy), "events").where(F.col("group").isin(0, 1)).count()
    assert healthy == sum(1 for g, _e in reference(snap) if g in (0, 1))


def test_an_event_rewritten_in_one_group_breaks_only_that_groups_chain(node_history, tmp_path):
    """An event of group 2 rewritten and sealed again (its CRC valid, so only the chain shows it):
    ``raftmq audit verify --snapshot`` verifies each group's chain on its own -- groups 0 and 1
    intact, group 2 NOT INTACT naming the seq -- and exits 1."""
    _data, snap = node_history
    copy, g2, target = _damaged(snap, tmp_path)
    env = lmdb.open(str(g2), max_dbs=len(EV.TABLES) + 1, lock=False)
    try:
        db = env.open_db(b"events")
        key = EV.U64.pack(target[0])
        with env.begin(write=True, db=db) as txn:
            record = msgpack.unpackb(unseal(key, txn.get(key)), raw=False)
            record[9] = "someone-else"
            txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)))
    finally:
        env.close()
    done = raftmq("audit", "verify", "--snapshot", str(copy), timeout=120)
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if not line.startswith(" ")] == ["intact", "intact", "NOT INTACT"]
    assert f"NOT INTACT: {g2}: first bad event: seq {target[0]} (events)" in done.stdout, done.stdout


def test_several_snapshots_of_the_nodes_groups_read_as_one(spark, node_history, tmp_path):
    """spark/union.py per group: the snapshot and a copy of it (as another node's) read as one give
    each (group, seq) once; the copy with one of group 1's events rewritten (sealed again) fails the
    read of group 1 as two histories disagreeing -- group g is compared with group g only, so group
    2 still reads."""
    _data, snap = node_history
    other = tmp_path / "other"
    shutil.copytree(snap, other)
    both = load(spark, [str(snap), str(other)], "events")
    assert both.count() == len(reference(snap))
    assert both.select("group", "seq").distinct().count() == both.count()
    g1 = other / "groups" / "g1"
    seq = next(e[0] for e in EV.read_events(str(g1)) if e[2] == EV.ROUTED and e[4] == "left")
    env = lmdb.open(str(g1), max_dbs=len(EV.TABLES) + 1, lock=False)
    try:
        db = env.open_db(b"events")
        key = EV.U64.pack(seq)
        with env.begin(write=True, db=db) as txn:
            record = msgpack.unpackb(unseal(key, txn.get(key)), raw=False)
            record[8] = 999
            txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)))
    finally:
        env.close()
    with pytest.raises(Exception, match=r"HistoriesDisagree|hold different records"):
        load(spark, [str(snap), str(other)], "events").where(F.col("group") == 1).collect()
    assert load(spark, [str(snap), str(other)], "events").where(F.col("group") == 2).count() == \
        sum(1 for g, _e in reference(snap) if g == 2)
