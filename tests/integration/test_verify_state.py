"""A single node's state on a damaged disk (issue 29, store/disk/durable.py, ops/verify.py), raftmq only.

A real node, persistent messages published with pika and confirmed, the node stopped; ``raftmq verify``
calls its files clean; one byte flipped inside one stored body; verify names the damaged message (exit
1); the node then refuses to start (exit 74, a CRITICAL log line naming the record) instead of serving a
state its disk does not have.  A damaged audit history stops the node too, until it is moved aside.
And a state written before checksums (format 2, by a real node of that
code: the unit fixture) still opens, is served whole and verifies clean once sealed.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the flipped body is in queue group 1's state
(``groups/g1/state``: ``raftmq verify`` checks every group's stores), and the node stops with the
worker's exit status 74 (at start, or a moment after it listens).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import pika
import pytest

from raftmq.ops.local.node import NodeStartError, RaftmqNode
from raftmq.store.disk.sealed import EXIT_STORE_DAMAGED
from tests.integration.helpers import connect, get_bodies, message_count, wait_until
from tests.support.cli import raftmq
from tests.support.groups import GROUPS, group_dir, queue_arguments

N = 120
FIXTURE_2 = Path(__file__).parents[1] / "unit" / "store" / "fixtures" / "state-format-2.lmdb"


def _body(i: int) -> bytes:
    return (b"persistent-%03d|" % i).ljust(256, b"#")


@pytest.fixture
def node_factory(broker_kind, tmp_path):
    if broker_kind != "raftmq":
        pytest.skip("drives raftmq node processes and their files")
    nodes: list[RaftmqNode] = []

    def make(data_dir: Path) -> RaftmqNode:
        node = RaftmqNode(data_dir, env={"RAFTMQ_AUDIT_RETENTION": "body"})
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.kill9()


def test_verify_finds_a_flipped_body_byte_and_the_node_refuses_to_start(node_factory, tmp_path):
    data = tmp_path / "node"
    node = node_factory(data).start()
    conn = connect(node.url)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("kept", durable=True, arguments=queue_arguments())  # issue 34: its group's state
    for i in range(N):
        ch.basic_publish("", "kept", _body(i), pika.BasicProperties(delivery_mode=2))  # each one confirmed
    assert message_count(ch, "kept") == N
    conn.close()

    running = raftmq("verify", "--data-dir", str(data))
    assert running.returncode == 2 and "seems to be running" in running.stderr, running

    assert node.terminate() == 0
    clean = raftmq("verify", "--data-dir", str(data))
    assert clean.returncode == 0, (clean.stdout, clean.stderr)
    assert "clean (checked: state, events" in clean.stdout

    # Flip one bit inside message 58's body in the state's data file (every copy of those bytes: LMDB
    # keeps stale copies of rewritten pages, and the live one must be among those damaged).
    state = group_dir(node) / "state"  # the queue's group's (the node's own with one group)
    data_file = state / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    pattern = _body(57)[:16]
    offsets = [i for i in range(len(raw)) if raw.startswith(pattern, i)]
    assert offsets
    for at in offsets:
        raw[at + 12] ^= 0x01
    data_file.write_bytes(bytes(raw))

    damaged = raftmq("verify", "--data-dir", str(data))
    assert damaged.returncode == 1, (damaged.stdout, damaged.stderr)
    lines = [line for line in damaged.stdout.splitlines() if line.startswith("state: ")]
    assert lines == [f"state: {state} at messages/message 58: checksum mismatch"], damaged.stdout
    assert damaged.stdout.splitlines()[-1].startswith("DAMAGED: 1 problem(s)")

    if GROUPS == 1:
        with pytest.raises(NodeStartError, match=f"exited with code {EXIT_STORE_DAMAGED}"):
            node.start()
    else:
        # A queue group's worker opens its state while the main process may already listen: the
        # node then stops itself with the worker's exit status (node/group_host.py exit_status).
        try:
            node.start()
        except NodeStartError as exc:
            assert f"exited with code {EXIT_STORE_DAMAGED}" in str(exc)
        else:
            wait_until(lambda: not node.is_alive(), timeout=30, what="the node to stop")
            assert node.proc.returncode == EXIT_STORE_DAMAGED, node.log_tail(20)
    log = node.log_path.read_text()
    critical = [line for line in log.splitlines() if " CRITICAL " in line
                and "messages/message 58: checksum mismatch" in line]
    assert critical, log[-3000:]
    assert "Not starting on it" in critical[-1]


def test_a_state_written_before_checksums_is_served_and_then_checked(node_factory, tmp_path):
    """The format-2 fixture as a node's state: the node starts, seals it, serves all 5 messages with
    their bodies; stopped, its files verify clean (no "written before checksums" note any more)."""
    data = tmp_path / "old-node"
    shutil.copytree(FIXTURE_2, data / "state")
    before = raftmq("verify", "--data-dir", str(data))
    assert before.returncode == 0 and "note: state: format 2" in before.stdout, before.stdout
    node = node_factory(data).start()
    conn = connect(node.url)
    ch = conn.channel()
    got = get_bodies(ch, "fq")
    assert got[:5] == [b"fixture-body-%d" % i for i in range(4)] + [bytes(range(256)) * 16]
    # The fixture also holds an x-delay message: once its due time (from when the fixture was
    # written) has passed, the node routes it to fq at start, after the five.
    assert got[5:] in ([], [b"delayed-body"]), got[5:]
    conn.close()
    assert node.terminate() == 0
    after = raftmq("verify", "--data-dir", str(data))
    assert after.returncode == 0, after.stdout
    assert "note: state" not in after.stdout and "clean (checked: state, events" in after.stdout


def test_a_damaged_history_stops_the_node_until_it_is_moved_aside(node_factory, tmp_path):
    """The audit history's last_seq damaged (one bit of the stored value): verify names it (exit 1),
    the node refuses to start (exit 74, CRITICAL, the way out in the line); with the history moved
    aside it starts a new one and serves every confirmed message (the state is intact)."""
    data = tmp_path / "node"
    node = node_factory(data).start()
    conn = connect(node.url)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("audited", durable=True)
    for i in range(10):
        ch.basic_publish("", "audited", _body(i), pika.BasicProperties(delivery_mode=2))
    conn.close()
    assert node.terminate() == 0
    assert raftmq("verify", "--data-dir", str(data)).returncode == 0

    env = lmdb.open(str(data / "events"), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True, db=meta) as txn:
        value = bytearray(txn.get(b"last_seq"))
        value[-1] ^= 0x02
        txn.put(b"last_seq", bytes(value))
    env.close()

    damaged = raftmq("verify", "--data-dir", str(data))
    assert damaged.returncode == 1
    assert f"events: {data / 'events'} at meta/'last_seq': checksum mismatch" in damaged.stdout.splitlines()
    with pytest.raises(NodeStartError, match=f"exited with code {EXIT_STORE_DAMAGED}"):
        node.start()
    critical = [line for line in node.log_path.read_text().splitlines() if " CRITICAL " in line]
    assert critical and "audit history" in critical[-1] and "meta/'last_seq'" in critical[-1]
    assert "aside" in critical[-1]

    (data / "events").rename(tmp_path / "events.damaged")
    node.start()
    conn = connect(node.url)
    assert get_bodies(conn.channel(), "audited") == [_body(i) for i in range(10)]
    conn.close()
    assert node.terminate() == 0
