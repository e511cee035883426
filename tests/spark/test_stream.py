"""The streaming source (issue 36, spark/stream.py): ``spark.readStream.format("raftmq")`` on a real
node's live history sees every event exactly once, across a restart of the node while the query
runs and across a restart of the query from its checkpoint (Spark keeps the sequence offsets)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pika

from raftmq.ops.local.node import RaftmqNode
from raftmq.store.disk import history as EV
from tests.support.groups import GROUPS

BATCH = 40  # messages published per round: each adds published + routed events


def publish(node: RaftmqNode, first: int, count: int = BATCH) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.confirm_delivery()
    # With queue groups (RAFTMQ_RAFT_GROUPS) the queue stays in the metadata group, whose history
    # <data>/events is the one this stream follows (every group's: the test below).
    ch.queue_declare("streamed", durable=True, arguments={"x-queue-group": 0} if GROUPS > 1 else None)
    for i in range(first, first + count):
        ch.basic_publish("", "streamed", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()


class Sink:
    """A foreachBatch sink keeping every sequence number each micro-batch delivered (duplicates too)."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.batches = 0
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        got = [r[0] for r in df.select("seq").collect()]
        with self.lock:
            self.seqs.extend(got)
            self.batches += 1

    def wait_for(self, last_seq: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.seqs and max(self.seqs) >= last_seq:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the stream did not reach seq {last_seq}: {max(self.seqs, default=None)}")


def start(spark, path: str, checkpoint: str, sink: Sink):
    return (spark.readStream.format("raftmq").option("path", path).option("maxEventsPerTrigger", 50).load()
            .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(processingTime="300 milliseconds").start())


def test_a_stream_sees_every_event_once_across_node_and_query_restarts(spark, tmp_path):
    sink = Sink()
    checkpoint = str(tmp_path / "checkpoint")
    with RaftmqNode(tmp_path / "node", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        history = str(node.data_dir / "events")
        publish(node, 0)
        first = node.wait_history()["event_seq"]
        query = start(spark, history, checkpoint, sink)
        try:
            sink.wait_for(first)
            node.restart()  # the query keeps running while the node is down and back
            publish(node, BATCH)
            second = node.wait_history()["event_seq"]
            assert second > first
            sink.wait_for(second)
        finally:
            query.stop()
        publish(node, 2 * BATCH)  # while no query runs
        third = node.wait_history()["event_seq"]
        query = start(spark, history, checkpoint, sink)  # resumes from the checkpointed offset
        try:
            sink.wait_for(third)
            time.sleep(1.0)  # a few more (empty) triggers: nothing is delivered twice
        finally:
            query.stop()
    expected = [r[0] for r in EV.read_events(history)]
    assert len(expected) >= 3 * 2 * BATCH  # published + routed per message, at least
    duplicated = {seq: n for seq, n in Counter(sink.seqs).items() if n > 1}
    assert not duplicated, duplicated
    assert sorted(sink.seqs) == expected
    assert sink.batches >= 3  # several micro-batches (maxEventsPerTrigger = 50)


class GroupSink:
    """A foreachBatch sink keeping every (group, seq) delivered (duplicates too)."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        got = [(r[0], r[1]) for r in df.select("group", "seq").collect()]
        with self.lock:
            self.keys.extend(got)

    def wait_for(self, expected: set[tuple[int, int]], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if expected <= set(self.keys):
                    return
            time.sleep(0.2)
        raise TimeoutError(f"the stream lacks {sorted(expected - set(self.keys))[:10]}")


def test_a_stream_of_a_data_directory_follows_every_group(spark, tmp_path):
    """Issue 34: the stream of a node's data directory started with three Raft groups follows the
    metadata group's history and each queue group's (``groups/g<N>/events``), each by its own
    sequence offset (``seq``, ``g1``, ``g2``): every (group, seq) exactly once, queue groups'
    message events included, while traffic goes on in queues of groups 1 and 2."""
    from tests.support.groups import wait_histories

    sink = GroupSink()
    env = {"RAFTMQ_AUDIT_RETENTION": "metadata", "RAFTMQ_RAFT_GROUPS": "3"}
    with RaftmqNode(tmp_path / "node", env=env) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        for group in (1, 2):
            ch.queue_declare(f"streamed-g{group}", arguments={"x-queue-group": group})
        query = (spark.readStream.format("raftmq").option("path", str(node.data_dir))
                 .option("maxEventsPerTrigger", 50).load()
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(processingTime="300 milliseconds").start())
        try:
            for i in range(BATCH):
                ch.basic_publish("", f"streamed-g{1 + i % 2}", b"m%d" % i)
            conn.close()
            wait_histories(node, groups=3)
            histories = {0: node.data_dir / "events", 1: node.data_dir / "groups" / "g1" / "events",
                         2: node.data_dir / "groups" / "g2" / "events"}
            expected = {(g, r[0]) for g, h in histories.items() for r in EV.read_events(str(h))}
            sink.wait_for(expected)
            time.sleep(1.0)  # a few more (empty) triggers: nothing is delivered twice
        finally:
            query.stop()
        routed = {(g, r[4]) for g, h in histories.items() for r in EV.read_events(str(h)) if r[2] == EV.ROUTED}
    assert routed == {(1, "streamed-g1"), (2, "streamed-g2")}
    duplicated = {key: n for key, n in Counter(sink.keys).items() if n > 1}
    assert not duplicated, duplicated
    assert set(sink.keys) == expected
