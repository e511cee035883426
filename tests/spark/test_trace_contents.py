"""``audit trace`` and ``audit contents`` (issue 36) on a real node's history: pika publishes four
messages to a queue with a dead-letter exchange, takes one (acked), rejects one (dead-lettered to a
second queue: AMQP 0-9-1 basic.reject/nack with requeue=false, spec 0-9-1 section 1.8.3.14 --
RabbitMQ dead-letters it), and leaves one delivered but unacknowledged to a consumer tagged
``auditor`` (basic.consume with prefetch 1, 0-9-1 section 1.8.3.3); an x-delayed-message exchange
bound to the queue holds one message past the end and releases another into it; a second queue is
emptied by no-ack deliveries (basic.get and basic.consume with no-ack set, 0-9-1 sections 1.8.3.10
and 1.8.3.3: "the server does not expect acknowledgements").  The snapshot is taken while the
``auditor`` delivery is still held.

With queue groups (``RAFTMQ_RAFT_GROUPS=3``) the queues are placed in the metadata group (``x-queue-group``
0), beside the delayed exchange (a plugin exchange: its messages are the metadata group's): a
message released or dead-lettered into another group's queue becomes a new message there that
``trace`` and ``contents`` do not link yet (docs/design.md, the *Audit* bullet of "Sharded Raft
groups"); tests/spark/test_groups_audit.py covers the jobs across groups."""

from __future__ import annotations

import re
import time

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp091.properties import decode_properties
from raftmq.spark import audit
from raftmq.store.disk import history as EV
from tests.support.cli import raftmq
from tests.support.groups import GROUPS

HERE = {"x-queue-group": 0} if GROUPS > 1 else {}  # module docstring


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """(snapshot path, AMQP message-id -> raftmq message id, the moments worth asking about)."""
    base = tmp_path_factory.mktemp("trace")
    with RaftmqNode(base / "node", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("work.dead", arguments=HERE or None)
        ch.queue_bind("work.dead", "dlx")
        ch.queue_declare("work", arguments={"x-dead-letter-exchange": "dlx", **HERE})
        for i in range(4):
            ch.basic_publish("", "work", f"job {i}".encode(), pika.BasicProperties(message_id=f"w{i}"))
        method, props, _ = ch.basic_get("work")
        assert props.message_id == "w0"
        ch.basic_ack(method.delivery_tag)
        method, props, _ = ch.basic_get("work")
        assert props.message_id == "w1"
        ch.basic_nack(method.delivery_tag, requeue=False)
        holder = conn.channel()
        holder.basic_qos(prefetch_count=1)
        held = []
        holder.basic_consume("work", lambda c, m, p, b: held.append(p.message_id), consumer_tag="auditor")
        while not held:
            conn.process_data_events(time_limit=0.2)
        assert held == ["w2"]
        ch.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        ch.queue_bind("work", "later", "work")
        ch.basic_publish("later", "work", b"much later", pika.BasicProperties(message_id="w4",
                                                                          headers={"x-delay": 600_000}))
        ch.basic_publish("later", "work", b"soon", pika.BasicProperties(message_id="w5", headers={"x-delay": 200}))
        ch.queue_declare("quick", arguments=HERE or None)
        ch.basic_publish("", "quick", b"q", pika.BasicProperties(message_id="q0"))
        assert ch.basic_get("quick", auto_ack=True)[1].message_id == "q0"
        ch.basic_publish("", "quick", b"q", pika.BasicProperties(message_id="q1"))
        fast = []
        ch.basic_consume("quick", lambda c, m, p, b: fast.append(p.message_id), auto_ack=True, consumer_tag="fast")
        deadline = time.monotonic() + 10
        while not fast or ch.queue_declare("work", passive=True).method.message_count < 2:  # w3, and w5 released
            assert time.monotonic() < deadline
            conn.process_data_events(time_limit=0.1)
        node.wait_history()
        out = base / "snapshot"
        done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out))
        assert done.returncode == 0, done.stderr
        conn.close()
    records = list(EV.read_events(str(out)))
    ids = {decode_properties(m[7]).message_id: m[0] for m in EV.read_table(str(out), "messages")
           if not m[6].startswith("dead-letter:")}
    routed_work = [r for r in records if r[2] == EV.ROUTED and r[4] == "work"]
    first_delivery = next(r for r in records if r[2] == EV.DELIVERED)
    w5_held = next(r for r in records if r[2] == EV.DELAYED and r[5] == ids["w5"])
    moments = {"all routed": routed_work[3][1], "w5 held": w5_held[1], "end": records[-1][1]}
    assert first_delivery[1] > moments["all routed"]  # a later batch, a later leader-stamped time
    return str(out), ids, moments, records


def rows(df) -> list[dict]:
    return [r.asDict() for r in df.collect()]


def test_trace_follows_a_message_through_its_dead_letter_hop(spark, traffic):
    """Every event of w1 then of its dead-letter copy, in sequence order, with who did each."""
    path, ids, _moments, records = traffic
    found = rows(audit.trace(spark, path, ids["w1"]))
    copy = next(r[5] for r in records if r[2] == EV.PUBLISHED and r[9] == f"dead-letter:{ids['w1']}:work")
    assert [(r["kind"], r["message_id"], r["queue"], r["generation"]) for r in found] == [
        ("published", ids["w1"], "", 0), ("routed", ids["w1"], "work", 0), ("delivered", ids["w1"], "work", 0),
        ("rejected", ids["w1"], "work", 0), ("dead_lettered", ids["w1"], "work", 0),
        ("published", copy, "", 1), ("routed", copy, "work.dead", 1)]
    assert [r["seq"] for r in found] == sorted(r["seq"] for r in found)
    who = [r["who"] for r in found]
    assert who[0].startswith("connection n1.") and who[2] == "basic.get"
    assert who[4] == "broker: rejected->dlx" and who[5] == f"dead-letter of message {ids['w1']} from queue work"
    # The copy's id leads back to the same life.
    assert rows(audit.trace(spark, path, copy)) == found
    # message_id IN (...) is pushed down to the reader: Spark does not filter on it itself.
    plan = audit.trace(spark, path, copy)._jdf.queryExecution().executedPlan().toString()
    assert not [line for line in plan.splitlines() if re.search(r"\bFilter\b", line) and "message_id" in line], plan
    who = {r["message_id"]: r["who"] for r in rows(audit.trace(spark, path, ids["q0"])) if r["kind"] == "delivered"}
    assert who == {ids["q0"]: "basic.get (no-ack)"}
    who = [r["who"] for r in rows(audit.trace(spark, path, ids["q1"])) if r["kind"] == "delivered"]
    assert who == ["consumer fast (no-ack)"]


def test_contents_before_and_after_the_consume(spark, traffic):
    """At the last routing, before any delivery, all four are ready; at the end w0 is gone (acked),
    w1 gone (dead-lettered: its copy is ready in work.dead), w2 unacked by 'auditor', w3 ready."""
    path, ids, moments, _records = traffic
    before = rows(audit.contents(spark, path, "work", moments["all routed"]))
    assert [(r["amqp_message_id"], r["state"], r["consumer"]) for r in before] == [
        (f"w{i}", "ready", None) for i in range(4)]
    after = rows(audit.contents(spark, path, "work", moments["end"]))
    assert sorted((r["amqp_message_id"], r["state"], r["consumer"], r["deliveries"]) for r in after) == [
        ("w2", "unacked", "auditor", 1), ("w3", "ready", None, 0), ("w4", "delayed", None, 0), ("w5", "ready", None, 0)]
    assert {r["message_id"] for r in after} == {ids["w2"], ids["w3"], ids["w4"], ids["w5"]}
    # While the delayed exchange held w5 (released into the queue later) and w4 (never released).
    held = rows(audit.contents(spark, path, "work", moments["w5 held"]))
    assert sorted((r["amqp_message_id"], r["state"]) for r in held) == [
        ("w2", "unacked"), ("w3", "ready"), ("w4", "delayed"), ("w5", "delayed")]
    # No-ack deliveries end a message's life in the queue (no acked event follows them).
    assert rows(audit.contents(spark, path, "quick", moments["end"])) == []
    dead = rows(audit.contents(spark, path, "work.dead", moments["end"]))
    assert [(r["amqp_message_id"], r["state"]) for r in dead] == [("w1", "ready")]  # the copy keeps its properties
    # A moment in ISO text (UTC) before anything happened: an empty queue.
    assert rows(audit.contents(spark, path, "work", "2000-01-01 00:00:00")) == []


def test_trace_and_contents_commands(traffic):
    """The CLI jobs: trace by AMQP message-id, contents at a moment given as UTC text."""
    path, _ids, moments, _records = traffic
    done = raftmq("audit", "trace", "--snapshot", path, "--message-id", "w1", "--quiet", timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "(7 rows)" in done.stdout and "dead-letter of message" in done.stdout, done.stdout
    assert [k for k in ("published", "routed", "delivered", "rejected", "dead_lettered") if k in lines[2]] == ["published"]
    import datetime as dt

    at = dt.datetime.fromtimestamp(moments["end"] / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    done = raftmq("audit", "contents", "--snapshot", path, "--queue", "work", "--at", at, "--quiet", timeout=180)
    assert done.returncode == 0, done.stderr
    assert "(4 rows)" in done.stdout and "auditor" in done.stdout and "delayed" in done.stdout and "unacked" in done.stdout, done.stdout
