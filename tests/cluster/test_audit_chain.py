"""Tamper evidence of the audit history in a real 3-node cluster (issue 36; docs/design.md "Tamper
evidence: the event chain"; ops/audit_verify.py).

One cluster, real clients (pika, publisher confirms and acks): a follower is killed, the others
go on and compact their logs, the follower comes back and installs a state snapshot (a gap in its
history), and traffic goes on.  Then, with the nodes stopped:

- every node's history passes ``raftmq audit verify`` alone and against every other node's: the
  batches applied after the install carry the same heads as on the nodes that never stopped (the
  chain continued from the head the snapshot carried), and the last head is the same everywhere;
- an event edited in one node's LMDB file (sealed again, so the CRC check of ``raftmq verify`` sees
  nothing) and an event deleted from another's are each named by seq and table, exit status 1.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) each group keeps its own history and chain
(``groups/g<N>/events``, its worker's): the queues are placed in queue group 1 (``x-queue-group``),
whose history holds their events and is the one checked above; every other group's history is
verified too (each node's against the next node's).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import lmdb
import msgpack
import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.store.core import events as E
from raftmq.store.disk import history as EV
from raftmq.store.disk.sealed import seal, unseal
from tests.integration.helpers import consume_acked

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CONFIG = 'audit_retention = "metadata"\nsnapshot_entries = 50\nsnapshot_seconds = 1.0'


def traffic(cluster: Cluster, node, queue: str, count: int) -> None:
    """``count`` confirmed publishes (one Raft entry each) and as many acked deliveries."""
    conn = cluster.connection(node)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=cluster.queue_arguments())
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, b"audited-%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)
    assert len(consume_acked(ch, queue, count)) == count
    conn.close()


def audit_verify(events_dir: Path, against: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "raftmq", "audit", "verify", "--snapshot", str(events_dir)]
    if against is not None:
        command += ["--against", str(against)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def reseal(events_dir: Path, seq: int, field: int, value: object) -> None:
    """An administrator's edit: one event's field rewritten, the record sealed again (valid CRC)."""
    env = lmdb.open(str(events_dir), max_dbs=len(EV.TABLES) + 1)
    try:
        db = env.open_db(b"events")
        key = EV.U64.pack(seq)
        with env.begin(write=True, db=db) as txn:
            record = msgpack.unpackb(unseal(key, txn.get(key)), raw=False)
            record[field] = value
            txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)))
    finally:
        env.close()


def delete(events_dir: Path, seq: int) -> None:
    env = lmdb.open(str(events_dir), max_dbs=len(EV.TABLES) + 1)
    try:
        db = env.open_db(b"events")
        with env.begin(write=True, db=db) as txn:
            assert txn.delete(EV.U64.pack(seq))
    finally:
        env.close()


def wait_history(cluster: Cluster, node, group: int, timeout: float = 15.0) -> None:
    """``RaftmqNode.wait_history`` for any group: until the group's audit writer on ``node`` wrote
    every event the group applied there, twice in a row."""
    if group == 0:
        node.wait_history(timeout)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = cluster.fresh_status(node, group=group, timeout=2.0) or {}
        if st.get("audit_last_seq") is not None and st.get("audit_last_seq") == st.get("event_seq"):
            time.sleep(0.6)
            again = cluster.fresh_status(node, group=group, timeout=2.0) or {}
            if again.get("audit_last_seq") == again.get("event_seq") == st["event_seq"]:
                return
        time.sleep(0.1)
    raise TimeoutError(f"group {group}'s audit history on {node.node_id} did not catch up: "
                       f"{cluster.status(node, group)}")


def test_chain_survives_a_snapshot_install_and_names_an_edited_and_a_deleted_event(tmp_path):
    with Cluster(3, tmp_path, extra_config=CONFIG) as cluster:
        group = cluster.queue_group
        leader = cluster.leader()
        lagging = next(n for n in cluster.nodes if n is not leader)
        traffic(cluster, leader, "before", 20)
        cluster.wait_applied_equal(group=group)
        lagging.kill9()
        traffic(cluster, leader, "while-down", 120)  # > snapshot_entries: the others compact
        lagging.start()
        cluster.wait_caught_up(lagging)
        cluster.wait_caught_up(lagging, group=group)
        traffic(cluster, leader, "after", 40)
        for g in range(cluster.groups):
            cluster.wait_applied_equal(group=g)
        for node in cluster.nodes:
            for g in range(cluster.groups):
                wait_history(cluster, node, g)
        cluster.stop()

    for other_group in range(cluster.groups):
        if other_group == group:
            continue
        paths = [cluster.group_dir(n, other_group) / "events" for n in cluster.nodes]
        for path, next_path in zip(paths, paths[1:] + paths[:1], strict=True):
            done = audit_verify(path, next_path)
            assert done.returncode == 0, (other_group, path, done.stdout, done.stderr)
    histories = {n.node_id: cluster.group_dir(n, group) / "events" for n in cluster.nodes}
    assert EV.history_info(str(histories[lagging.node_id])).gaps, "the follower did not install a snapshot"
    heads = {node: list(EV.read_table(str(path), E.CHAIN_TABLE))[-1][4] for node, path in histories.items()}
    assert len(set(heads.values())) == 1, heads  # one head everywhere, the installed node's too
    for node, path in histories.items():
        for other, other_path in histories.items():
            if other != node:
                done = audit_verify(path, other_path)
                assert done.returncode == 0, (node, other, done.stdout, done.stderr)
                assert done.stdout.startswith(f"intact: {path}: ") and "batches identical" in done.stdout
    lagging_out = audit_verify(histories[lagging.node_id]).stdout
    assert " 1 snapshot gaps" in lagging_out, lagging_out

    edited_node, deleted_node, witness = [n.node_id for n in cluster.nodes if n is not lagging] + [lagging.node_id]
    routed = [r for r in EV.read_events(str(histories[edited_node])) if r[2] == E.ROUTED and r[4] == "after"]
    edited_seq, deleted_seq = routed[3][0], routed[7][0]
    reseal(histories[edited_node], edited_seq, 4, "innocent-queue")
    delete(histories[deleted_node], deleted_seq)
    assert EV.verify_history(str(histories[edited_node])) == []  # invisible to the CRC check

    done = audit_verify(histories[edited_node], histories[witness])
    assert done.returncode == 1, done.stdout
    assert done.stdout.startswith(f"NOT INTACT: {histories[edited_node]}: first bad event: seq {edited_seq} "
                                  "(events): the record is not the one written (edited and sealed again)"), done.stdout
    assert f"; in {histories[witness]}: queue: 'innocent-queue' here, " \
           "'after' there" in done.stdout
    done = audit_verify(histories[deleted_node])
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == (f"NOT INTACT: {histories[deleted_node]}: first bad event: seq {deleted_seq} "
                                           "(events): missing: the chain says this node kept it (deleted)")
    assert audit_verify(histories[witness], histories[deleted_node]).returncode == 0  # the witness is intact
