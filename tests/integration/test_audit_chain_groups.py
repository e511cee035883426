"""The audit chain over every Raft group (issue 34 "Audit: each group's events keep their own
sequence"; issue 36's chain, docs/design.md "Tamper evidence: the event chain"): GET
/api/raftmq/audit/chain (ops/http/auditchain.py) and ``raftmq audit verify --peer/--against``
(ops/audit_verify.py) on a real node started with three groups (``groups_node``: the metadata group
and queue groups 1 and 2, each with its own history and chain, ``groups/g<N>/events``).

pika traffic (confirmed publishes, acknowledged gets: AMQP 0-9-1 sections 1.8.3.9-1.8.3.13) to a
queue of each queue group; the node's history is on (``audit_retention``) and its HTTP API serves
the chain of each group.
"""

from __future__ import annotations

import shutil

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from raftmq.store.core import events as E
from raftmq.store.disk import history as EV
from tests.integration.helpers import consume_acked
from tests.integration.test_audit_chain_node import rewrite_consistently
from tests.support.cli import raftmq
from tests.support.groups import wait_histories
from tests.support.http_api import call

CHAIN = "/api/raftmq/audit/chain"


@pytest.fixture
def http_port(monkeypatch) -> int:
    """The node's history and HTTP API switched on through its environment (RAFTMQ_*: ops/config.py);
    requested before ``groups_node`` so that the node starts with them."""
    port = free_port()
    monkeypatch.setenv("RAFTMQ_AUDIT_RETENTION", "metadata")
    monkeypatch.setenv("RAFTMQ_HTTP_PORT", str(port))
    return port


def traffic(node: RaftmqNode) -> None:
    """15 messages through a queue of queue group 1 and 10 through one of group 2."""
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for queue, group, count in (("chain-g1", 1, 15), ("chain-g2", 2, 10)):
        ch.queue_declare(queue, durable=True, arguments={"x-queue-group": group})
        for i in range(count):
            ch.basic_publish("", queue, b"chained-%d" % i, pika.BasicProperties(delivery_mode=2))
        assert len(consume_acked(ch, queue, count)) == count
    conn.close()


def test_the_chain_endpoint_serves_each_groups_chain(http_port, groups_node):
    """``?group=N`` answers queue group N's chain records, equal to what its worker wrote in
    ``groups/g<N>/events``; without it the metadata group's, with ``group`` 0; every answer lists
    the node's ``groups``; a group the node does not have is 404, a group that is no integer 400."""
    node = groups_node
    traffic(node)
    wait_histories(node, groups=3)
    base = f"http://127.0.0.1:{http_port}"
    for group in (0, 1, 2):
        status, page = call(base, "GET", f"{CHAIN}?group={group}" if group else CHAIN)
        assert status == 200, page
        assert page["group"] == group and page["groups"] == [0, 1, 2] and page["more"] is False
        history = node.data_dir / "events" if group == 0 else node.data_dir / "groups" / f"g{group}" / "events"
        written = [[r[0], r[1], r[2], bytes(r[3]).hex(), bytes(r[4]).hex()]
                   for r in EV.read_table(str(history), E.CHAIN_TABLE)]
        assert page["batches"] == written and written
    # The queue groups' chains hold their queues' message events (each its own sequence).
    status, page = call(base, "GET", f"{CHAIN}?group=2&events=1&from=0&limit=10000")
    assert status == 200
    kinds = {(EV.KIND_NAMES[e[2]], e[4]) for e in page["events"].values()}
    assert {("routed", "chain-g2"), ("delivered", "chain-g2"), ("acked", "chain-g2")} <= kinds
    # chain-g1 only as the topology every group applies (its declare), none of its messages' events.
    assert {k for k in kinds if k[1] == "chain-g1"} == {("queue_declared", "chain-g1")}
    assert call(base, "GET", f"{CHAIN}?group=7")[0] == 404
    assert call(base, "GET", f"{CHAIN}?group=one")[0] == 400


def test_verify_against_a_peer_and_a_snapshot_compares_each_group_with_the_same_group(
        http_port, groups_node, tmp_path):
    """``raftmq audit verify --snapshot S --peer`` compares every group's history of S with the
    running node's chain of that group (three lines, all identical); S with one of group 2's events
    rewritten consistently passes alone, and fails against the peer and ``--against`` another
    snapshot, naming group 2's history and the seq -- groups 0 and 1 still intact."""
    node = groups_node
    traffic(node)
    wait_histories(node, groups=3)
    snap, later = tmp_path / "snap", tmp_path / "later"
    for out in (snap, later):
        assert raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out)).returncode == 0
    peer = f"127.0.0.1:{http_port}"
    done = raftmq("audit", "verify", "--snapshot", str(snap), "--peer", peer, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all("batches identical on the peer" in line for line in lines), lines
    assert "(group 1)" in lines[1] and "(group 2)" in lines[2]

    g2 = snap / "groups" / "g2"
    seq = rewrite_consistently(g2, "not-what-happened")
    alone = raftmq("audit", "verify", "--snapshot", str(snap), timeout=120)
    assert alone.returncode == 0, alone.stdout  # each group's chain consistent on its own
    for other in (["--peer", peer], ["--against", str(later)], ["--against", str(node.data_dir)]):
        done = raftmq("audit", "verify", "--snapshot", str(snap), *other, timeout=120)
        assert done.returncode == 1, (other, done.stdout, done.stderr)
        heads = [line.split(":")[0] for line in done.stdout.splitlines() if not line.startswith(" ")]
        assert heads == ["intact", "intact", "NOT INTACT"], done.stdout
        assert f"NOT INTACT: {g2}: first bad event: seq {seq} (events): differs than " in done.stdout, done.stdout


def test_a_snapshot_with_a_group_the_other_lacks_is_not_intact(http_port, groups_node, tmp_path):
    """``--against`` a copy of the snapshot without its queue groups' histories (as a node started
    with one group): group 0 is compared and intact, each group the other lacks is named, exit 1."""
    node = groups_node
    traffic(node)
    wait_histories(node, groups=3)
    snap, other = tmp_path / "snap", tmp_path / "other"
    assert raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(snap)).returncode == 0
    shutil.copytree(snap, other, ignore=shutil.ignore_patterns("groups"))
    done = raftmq("audit", "verify", "--snapshot", str(snap), "--against", str(other), timeout=120)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"intact: {snap}: ") and f"batches identical in {other}" in lines[0], lines
    for group in (1, 2):
        assert f"NOT INTACT: {snap / 'groups' / f'g{group}'}: first bad event: group {group}'s history has no " \
               f"counterpart in {other}" in lines, lines


def test_one_group_keeps_the_answer_it_had(broker_kind, tmp_path):
    """A node with one group answers as before (batches, events, more), with ``group`` 0 and
    ``groups`` [0] beside them; ``group=1`` is 404 there."""
    if broker_kind != "raftmq":
        pytest.skip("raftmq's audit history")
    port = free_port()
    env = {"RAFTMQ_RAFT_GROUPS": "1", "RAFTMQ_AUDIT_RETENTION": "metadata", "RAFTMQ_HTTP_PORT": str(port)}
    with RaftmqNode(tmp_path / "one", env=env) as node:
        node.wait_history()
        base = f"http://127.0.0.1:{port}"
        status, page = call(base, "GET", CHAIN)
        assert status == 200 and set(page) == {"batches", "events", "more", "group", "groups"}
        assert (page["group"], page["groups"]) == (0, [0]) and page["batches"]
        assert call(base, "GET", f"{CHAIN}?group=1")[0] == 404
