"""The event chain on a real single node (issue 36; docs/design.md "Tamper evidence: the event chain").

A single node has no Raft snapshot to carry its chain head across a restart: it continues from its
history's last chain record (node/broker.py).  Real traffic (pika, confirms, acks) before and after
a restart; ``raftmq audit verify --data-dir`` on the *running* node (read in one LMDB read
transaction) finds the chain continuous across the restart, and after a stop an event edited and
sealed again is named.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the queues are placed in queue group 1, whose
own history and chain (``groups/g1/events``) hold their events and are the ones edited; ``raftmq
audit verify --data-dir`` verifies every group's history, one line each.
"""

from __future__ import annotations

import lmdb
import msgpack
import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from raftmq.store.core import events as E
from raftmq.store.disk import history as EV
from raftmq.store.disk.sealed import seal, unseal
from tests.integration.helpers import consume_acked
from tests.support.cli import raftmq
from tests.support.groups import GROUPS, group_dir, queue_arguments, wait_histories


def traffic(node: RaftmqNode, queue: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True, arguments=queue_arguments())
    for i in range(count):
        ch.basic_publish("", queue, b"chained-%d" % i, pika.BasicProperties(delivery_mode=2))
    assert len(consume_acked(ch, queue, count)) == count
    conn.close()



def rewrite_consistently(history, detail: str) -> int:
    """The first event of ``history``'s last batch rewritten (its detail set to ``detail``), with
    the batch's seal hint and head recomputed: the history is consistent on its own; only another
    copy of the chain can tell (issue 36).  Returns the event's seq."""
    chain = list(EV.read_table(str(history), E.CHAIN_TABLE))[-1]
    first, end = chain[0], chain[1]
    seq = first
    env = lmdb.open(str(history), max_dbs=len(EV.TABLES) + 1, lock=False)
    try:
        events, chain_db = env.open_db(b"events"), env.open_db(E.CHAIN_TABLE.encode())
        with env.begin(write=True) as txn:
            key = EV.U64.pack(seq)
            record = msgpack.unpackb(unseal(key, txn.get(key, db=events)), raw=False)
            record[9] = detail
            txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)), db=events)
            raw = [txn.get(EV.U64.pack(s), db=events) for s in range(first, end + 1)]
            fields = [E.chained_fields(msgpack.unpackb(unseal(EV.U64.pack(s), v), raw=False))
                      for s, v in zip(range(first, end + 1), raw, strict=True)]
            chain[5] = b"".join(bytes(v[1:5]) for v in raw)
            chain[4] = E.chain_next(chain[3], b"".join(E.chain_packed(f) for f in fields))
            chain_key = EV.U64.pack(first)
            txn.put(chain_key, seal(chain_key, msgpack.packb(chain, use_bin_type=True)), db=chain_db)
    finally:
        env.close()
    return seq

def test_a_single_node_continues_its_chain_across_a_restart(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's audit history")
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        traffic(node, "before", 30)
        wait_histories(node)
        node.terminate()
        node.start()
        traffic(node, "after", 30)
        wait_histories(node)
        done = raftmq("audit", "verify", "--data-dir", str(node.data_dir), timeout=120)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.startswith(f"intact: {node.data_dir / 'events'}: ") and " 0 snapshot gaps" in done.stdout
        assert done.stdout.count("intact: ") == GROUPS and "NOT INTACT" not in done.stdout, done.stdout
    events = group_dir(node) / "events"  # the queue's group's history (the node's own with one group)
    chain = list(EV.read_table(str(events), E.CHAIN_TABLE))
    after = [r for r in EV.read_events(str(events)) if r[4] == "after"]
    assert after and chain[0][0] < after[0][0]  # batches on both sides of the restart, one chain
    assert all(b[3] == a[4] for a, b in zip(chain, chain[1:], strict=False))
    seq = after[5][0]
    env = lmdb.open(str(events), max_dbs=len(EV.TABLES) + 1)
    try:
        db = env.open_db(b"events")
        key = EV.U64.pack(seq)
        with env.begin(write=True, db=db) as txn:
            record = msgpack.unpackb(unseal(key, txn.get(key)), raw=False)
            record[9] = "someone-else"  # detail: the consumer tag / publisher
            txn.put(key, seal(key, msgpack.packb(record, use_bin_type=True)))
    finally:
        env.close()
    done = raftmq("audit", "verify", "--data-dir", str(node.data_dir), timeout=120)
    assert done.returncode == 1
    assert f"NOT INTACT: {events}: first bad event: seq {seq} (events): the record is not the one written" \
        in done.stdout, done.stdout
    assert done.stdout.count("NOT INTACT") == 1, done.stdout  # the other groups' histories are intact


def test_verify_against_a_running_peer_names_an_event_rewritten_with_its_chain(tmp_path, broker):
    """``--peer HOST:PORT`` reads the running node's chain through its HTTP API
    (GET /api/raftmq/audit/chain, ops/http/auditchain.py).  A snapshot of the node's history passes
    against it; the snapshot with one event of its last batch rewritten *and* that batch's seal hint
    and head recomputed passes alone (consistent) but not against the peer, which names the event
    and the field."""
    if broker.kind != "raftmq":
        pytest.skip("raftmq's audit history")
    http_port = free_port()
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"},
                    extra_args=["--http-port", str(http_port)]) as node:
        traffic(node, "watched", 20)
        wait_histories(node)
        snap = tmp_path / "snap"
        assert raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(snap)).returncode == 0
        peer = f"127.0.0.1:{http_port}"
        done = raftmq("audit", "verify", "--snapshot", str(snap), "--peer", peer, timeout=120)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "batches identical on the peer" in done.stdout

        first = rewrite_consistently(snap, "not-the-consumer")
        alone = raftmq("audit", "verify", "--snapshot", str(snap), timeout=120)
        assert alone.returncode == 0, alone.stdout  # consistent on its own
        done = raftmq("audit", "verify", "--snapshot", str(snap), "--peer", peer, timeout=120)
        assert done.returncode == 1, done.stdout
        assert done.stdout.startswith(f"NOT INTACT: {snap}: first bad event: seq {first} (events): differs than "
                                      f"on the peer {peer}: detail: 'not-the-consumer' here"), done.stdout
