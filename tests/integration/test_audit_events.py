"""The audit history (store/disk/history.py): real traffic through a node, a snapshot of the running node,
event counts checked against what the test's clients did.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) each group keeps its own history (its own
sequence): the snapshot holds the queue groups' in ``<out>/groups/g<N>``, and the counts are over
every group's events (a queue's events are in its group's; the catalog, the metadata group's).  A
dead-lettered copy into another group's queue is published in its source group and arrives in the
target group as published by ``group:<source>:<seq>`` (store/core/groups.py MessageIn): counted once,
as its source's publish."""

from __future__ import annotations

import json
import time
from collections import Counter

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from raftmq.store.disk import history as ev
from tests.support.cli import raftmq
from tests.support.groups import GROUPS, wait_histories


@pytest.fixture
def node(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's audit history")
    admin_port = free_port()
    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"},
                    extra_args=["--admin-port", str(admin_port)]) as n:
        n.admin_address = f"127.0.0.1:{admin_port}"
        yield n


def test_history_of_publish_deliver_ack_reject_dlx_ttl_and_purge(node, tmp_path):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("dead")
    ch.queue_declare("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"})
    ch.queue_declare("short", arguments={"x-message-ttl": 50})
    for i in range(10):
        ch.basic_publish("", "work", f"w{i}".encode())
    ch.basic_publish("", "short", b"expires")
    ch.basic_publish("", "nowhere", b"unroutable")
    acked = rejected = requeued = 0
    for _ in range(10):
        method, _p, body = ch.basic_get("work")
        if body in (b"w0", b"w1"):
            ch.basic_nack(method.delivery_tag, requeue=False)  # -> dead-lettered to "dead"
            rejected += 1
        elif body == b"w2" and not method.redelivered:
            ch.basic_nack(method.delivery_tag, requeue=True)
            requeued += 1
        else:
            ch.basic_ack(method.delivery_tag)
            acked += 1
    method, _p, _b = ch.basic_get("work")  # the requeued w2 again
    ch.basic_ack(method.delivery_tag)
    acked += 1
    time.sleep(0.3)
    ch.basic_get("short")  # the expired message is gone (expiry at the head)
    purged = ch.queue_purge("dead").method.message_count
    conn.close()
    wait_histories(node)

    out = tmp_path / "snap"
    done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out))
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    histories = [(info, out)] + [(info["groups"][str(g)], out / "groups" / f"g{g}") for g in range(1, GROUPS)]
    records = []
    for group_info, history in histories:
        mine = list(ev.read_events(str(history)))
        assert group_info["events"] == len(mine) and (not mine or group_info["last_seq"] == mine[-1][0])
        assert [r[0] for r in mine] == sorted({r[0] for r in mine})  # increasing, no gaps in order
        records += mine
    # A copy arriving from another group (issue 34) is the source group's publish, counted there.
    arrivals = {r[0] for r in records if r[2] == ev.PUBLISHED and str(r[9]).startswith("group:")}
    assert len(arrivals) <= 2  # at most the two dead-lettered copies cross groups
    records = [r for r in records if not (r[2] == ev.PUBLISHED and str(r[9]).startswith("group:"))]
    kinds = Counter(ev.KIND_NAMES[r[2]] for r in records)
    assert kinds["published"] == 12 + 2  # client publishes, and the two dead-lettered copies
    assert kinds["routed"] == 11 + 2  # all but the unroutable one; the copies into "dead"
    assert kinds["unroutable"] == 1
    assert kinds["acked"] == acked == 8  # ten messages, two rejected
    assert kinds["rejected"] == rejected == 2
    assert kinds["dead_lettered"] == 2
    assert kinds["requeued"] == requeued == 1
    assert kinds["expired"] == 1
    assert kinds["purged"] == purged == 2
    assert kinds["delivered"] == 11  # ten gets plus the requeued one
    unroutable = [r for r in records if ev.KIND_NAMES[r[2]] == "unroutable"]
    assert unroutable[0][7] == "nowhere" and unroutable[0][9] == "dropped"  # not mandatory
    copies = [r for r in records if ev.KIND_NAMES[r[2]] == "published" and r[9].startswith("dead-letter:")]
    assert {r[9].rsplit(":", 1)[1] for r in copies} == {"work"}
    messages = [m for _info, history in histories for m in ev.read_table(str(history), "messages")
                if not str(m[6]).startswith("group:")]
    assert len(messages) == 14
    assert all(m[8] is None for m in messages)  # retention "metadata": no bodies
    publishers = {m[6] for m in messages if not m[6].startswith("dead-letter:")}
    assert len(publishers) == 1 and publishers.pop().startswith("n1.")  # the one client connection
    catalog = {name: list(ev.read_table(str(out), name)) for name in ("queues", "exchanges", "bindings")}
    assert sorted(q[1] for q in catalog["queues"]) == ["dead", "short", "work"]
    assert {"amq.direct", "amq.topic", ""} <= {e[1] for e in catalog["exchanges"]}


def test_admin_api_snapshots_the_history_of_the_running_node(node, tmp_path):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("q")
    for i in range(20):
        ch.basic_publish("", "q", f"m{i}".encode())
    conn.close()
    wait_histories(node)
    done = raftmq("admin", "--address", node.admin_address, "--json", "snapshot", str(tmp_path / "via-grpc"))
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    on_disk = list(ev.read_events(str(tmp_path / "via-grpc")))
    assert int(reply["events"]) == len(on_disk) and int(reply["last_seq"]) == on_disk[-1][0]
    # (The reply is the metadata group's; each queue group's history is in groups/g<N> beside it.)
    on_disk += [r for g in range(1, GROUPS) for r in ev.read_events(str(tmp_path / "via-grpc" / "groups" / f"g{g}"))]
    assert sum(1 for r in on_disk if r[2] == ev.PUBLISHED) == 20
    # Not empty any more: refused with the reason, nothing overwritten.
    again = raftmq("admin", "--address", node.admin_address, "snapshot", str(tmp_path / "via-grpc"))
    assert again.returncode == 1 and "FAILED_PRECONDITION" in again.stderr and "must be empty" in again.stderr


def test_snapshot_of_a_node_without_history_is_refused(fresh_node, tmp_path):
    done = raftmq("snapshot", "--data-dir", str(fresh_node.data_dir), "--out", str(tmp_path / "s"))
    assert done.returncode == 2 and "holds no history" in done.stderr
