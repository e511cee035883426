"""The event chain on a real single node (issue 36; docs/design.md "Tamper evidence: the event chain").

A single node has no Raft snapshot to carry its chain head across a restart: it continues from its
history's last chain record (node/broker.py).  Real traffic (pika, confirms, acks) before and after
a restart; ``raftmq audit verify --data-dir`` on the *running* node (read in one LMDB read
transaction) finds the chain continuous across the restart, and after a stop an event edited and
sealed again is named.
"""

from __future__ import annotations

import lmdb
import msgpack
import pika
import pytest

from raftmq.ops.local.node import RaftmqNode
from raftmq.store.core import events as E
from raftmq.store.disk import history as EV
from raftmq.store.disk.sealed import seal, unseal
from tests.integration.helpers import consume_acked
from tests.support.cli import raftmq


def traffic(node: RaftmqNode, queue: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    for i in range(count):
        ch.basic_publish("", queue, b"chained-%d" % i, pika.BasicProperties(delivery_mode=2))
    assert len(consume_acked(ch, queue, count)) == count
    conn.close()


def test_a_single_node_continues_its_chain_across_a_restart(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's audit history")
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        traffic(node, "before", 30)
        node.wait_history()
        node.terminate()
        node.start()
        traffic(node, "after", 30)
        node.wait_history()
        done = raftmq("audit", "verify", "--data-dir", str(node.data_dir), timeout=120)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert done.stdout.startswith(f"intact: {node.data_dir / 'events'}: ") and " 0 snapshot gaps" in done.stdout
    events = node.data_dir / "events"
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
    assert done.stdout.startswith(f"NOT INTACT: {events}: first bad event: seq {seq} (events): the record is not "
                                  "the one written"), done.stdout
