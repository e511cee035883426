"""Spark audits of a real node's history: pika traffic with rejects, dead-lettering, TTL expiry
and redeliveries; the results checked against what the test's own clients counted.

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the queues are placed as the node places
them (the fewest queues first), so a dead-lettered copy may cross to another group, where it is
published once more (docs/design.md, the *Audit* bullet of "Sharded Raft groups"); the snapshot is
every group's history, read as one table."""

from __future__ import annotations

import time
from collections import Counter

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode
from raftmq.spark import audit
from raftmq.spark.session import load
from raftmq.store.disk import history as EV
from tests.support.cli import raftmq
from tests.support.groups import wait_histories

ORDERS = 120


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Run the traffic once; yield (snapshot path, what the clients saw)."""
    base = tmp_path_factory.mktemp("audit")
    seen: dict = {"acked": set(), "rejected": set(), "requeued": set(), "delivered": Counter()}
    with RaftmqNode(base / "node", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        conn = pika.BlockingConnection(pika.URLParameters(node.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.exchange_declare("dlx", "fanout")
        ch.queue_declare("orders.dead")
        ch.queue_bind("orders.dead", "dlx")
        ch.queue_declare("orders", arguments={"x-dead-letter-exchange": "dlx"})
        ch.queue_declare("receipts", arguments={"x-audit-retention": "body"})
        ch.queue_declare("short", arguments={"x-message-ttl": 30})
        for i in range(ORDERS):
            ch.basic_publish("", "orders", f"order {i}".encode(), pika.BasicProperties(
                message_id=f"o{i}", headers={"tenant": "acme" if i % 2 else "globex"}, delivery_mode=2))
        for i in range(5):
            ch.basic_publish("", "receipts", f"receipt {i}".encode(), pika.BasicProperties(message_id=f"r{i}"))
        for i in range(3):
            ch.basic_publish("", "short", b"soon gone", pika.BasicProperties(message_id=f"s{i}"))
        # Consume "orders": reject every 10th (dead-lettered), requeue every 7th once, ack the rest.
        while len(seen["acked"]) + len(seen["rejected"]) < ORDERS:
            method, props, _body = ch.basic_get("orders")
            assert method is not None
            n = int(props.message_id[1:])
            seen["delivered"][props.message_id] += 1
            if n % 10 == 0:
                ch.basic_nack(method.delivery_tag, requeue=False)
                seen["rejected"].add(props.message_id)
            elif n % 7 == 0 and not method.redelivered:
                ch.basic_nack(method.delivery_tag, requeue=True)
                seen["requeued"].add(props.message_id)
            else:
                ch.basic_ack(method.delivery_tag)
                seen["acked"].add(props.message_id)
        time.sleep(0.2)
        assert ch.basic_get("short")[0] is None  # expired at the head
        conn.close()
        wait_histories(node)
        out = base / "snapshot"
        done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out))
        assert done.returncode == 0, done.stderr
    return str(out), seen


def rows(df) -> list[dict]:
    return [r.asDict() for r in df.collect()]


def group_of(spark, path: str, queue: str) -> int:
    """The group whose history holds the queue's message events (0 with one group)."""
    (group,) = {r["group"] for r in load(spark, path, "events").where(f"kind = 'routed' and queue = '{queue}'")
                .select("group").collect()}
    return group


def crossings(spark, path: str) -> int:
    """1 if the dead-lettered copies crossed to another group (each then published there too), else 0."""
    return int(group_of(spark, path, "orders") != group_of(spark, path, "orders.dead"))


def test_summary_counts_match_the_clients(spark, history):
    path, seen = history
    counts = {r["kind"]: r["events"] for r in rows(audit.summary(spark, path))}
    published = ORDERS + 5 + 3
    copies = len(seen["rejected"])  # the dead-lettered copies (published again where they cross groups)
    assert counts["published"] == published + copies * (1 + crossings(spark, path))
    assert counts["routed"] == published + copies
    assert counts["acked"] == len(seen["acked"])
    assert counts["rejected"] == counts["dead_lettered"] == len(seen["rejected"])
    assert counts["requeued"] == len(seen["requeued"])
    assert counts["delivered"] == sum(seen["delivered"].values())
    assert counts["expired"] == 3


def test_redelivered_lists_exactly_the_requeued_messages(spark, history):
    path, seen = history
    ids = {m["message_id"]: m["amqp_message_id"] for m in rows(load(spark, path, "messages"))}
    found = rows(audit.redelivered(spark, path))
    assert {ids[r["message_id"]] for r in found} == seen["requeued"]
    assert all(r["deliveries"] == 2 and r["queue"] == "orders" for r in found)


def test_unconsumed_and_their_fates(spark, history):
    path, seen = history
    fates = Counter((r["queue"], r["fate"]) for r in rows(audit.unconsumed(spark, path)))
    assert fates == {("receipts", "queued"): 5, ("short", "expired"): 3,
                     ("orders.dead", "queued"): len(seen["rejected"])}


def test_dead_letter_reasons(spark, history):
    path, seen = history
    assert rows(audit.dead_letters(spark, path)) == [
        {"vhost": "/", "queue": "orders", "reason": "rejected", "dead_letter_exchange": "dlx",
         "messages": len(seen["rejected"])}]


def test_latency_per_queue_covers_the_acknowledged_messages(spark, history):
    path, seen = history
    by_queue = {r["queue"]: r for r in rows(audit.latency(spark, path))}
    assert set(by_queue) == {"orders"}
    orders = by_queue["orders"]
    assert orders["messages"] == len(seen["acked"])
    assert 0 <= orders["to_deliver_p50_ms"] <= orders["to_ack_p50_ms"] <= orders["to_ack_max_ms"]


def test_throughput_buckets_add_up(spark, history):
    path, seen = history
    found = rows(audit.throughput(spark, path))
    assert sum(r["acked"] for r in found) == len(seen["acked"])
    assert sum(r["published"] for r in found) == ORDERS + 8 + len(seen["rejected"]) * (1 + crossings(spark, path))


def test_messages_table_decodes_properties_and_keeps_bodies_only_where_asked(spark, history):
    path, _seen = history
    messages = {r["amqp_message_id"]: r for r in rows(load(spark, path, "messages"))
                if r["amqp_message_id"]}
    assert messages["o1"]["headers"] == {"tenant": "acme"} and messages["o1"]["delivery_mode"] == 2
    assert messages["o1"]["body"] is None  # the vhost keeps metadata
    assert messages["r3"]["body"] == b"receipt 3"  # the queue's x-audit-retention keeps bodies
    publishers = {m["publisher"].split(":")[0] if m["publisher"].startswith("dead-letter:") else m["publisher"]
                  for m in messages.values()}
    assert len(publishers) == 2 and "dead-letter" in publishers  # the client's connection, the copies
    assert next(p for p in publishers if p != "dead-letter").startswith("n1.")


def test_catalog_tables(spark, history):
    path, _seen = history
    queues = {r["name"]: r for r in rows(load(spark, path, "queues"))}
    assert set(queues) == {"orders", "orders.dead", "receipts", "short"}
    assert queues["receipts"]["retention"] == "body" and queues["orders"]["retention"] == "metadata"
    bindings = rows(load(spark, path, "bindings"))
    assert [(b["source"], b["destination"], b["destination_type"]) for b in bindings] == [
        ("dlx", "orders.dead", "queue")]
    assert {"dlx", "amq.topic"} <= {r["name"] for r in rows(load(spark, path, "exchanges"))}


def test_pushdown_of_sequence_time_and_kind_matches_a_plain_scan(spark, history):
    """Within the group holding ``orders`` (group 0 with one group; sequences are per group), pushed
    seq, time and kind/queue filters give what a plain scan of that group's history gives."""
    path, _seen = history
    group = group_of(spark, path, "orders")
    plain = list(EV.read_events(path if group == 0 else f"{path}/groups/g{group}"))

    def scan(**options):
        return load(spark, path, "events", **options).where(f"`group` = {group}")

    middle = plain[len(plain) // 3][0], plain[2 * len(plain) // 3][0]
    in_range = scan(partitions=3).filter(f"seq >= {middle[0]} and seq < {middle[1]}")
    assert [r.seq for r in in_range.orderBy("seq").collect()] == [r[0] for r in plain if middle[0] <= r[0] < middle[1]]
    t0 = plain[len(plain) // 2][1]
    late = scan().where(f"time >= timestamp_micros({t0})")
    assert late.count() == sum(1 for r in plain if r[1] >= t0)
    acked = scan().where("kind = 'acked' and queue = 'orders'")
    assert acked.count() == sum(1 for r in plain if r[2] == EV.ACKED and r[4] == "orders")
    # Pushed down: Spark does not filter on the key itself any more.
    plan = scan().where(f"seq > {middle[0]}")._jdf.queryExecution().executedPlan().toString()
    assert not [line for line in plan.splitlines() if "Filter" in line and f"> {middle[0]}" in line], plan


def test_audit_cli_prints_and_writes_csv_and_png(history, tmp_path):
    path, seen = history
    done = raftmq("audit", "dead-letters", "--snapshot", path, "--quiet", "--out", str(tmp_path / "dl.csv"),
                  "--plot", str(tmp_path / "dl.png"), timeout=180)
    assert done.returncode == 0, done.stderr
    assert "rejected" in done.stdout and "(1 rows)" in done.stdout
    lines = (tmp_path / "dl.csv").read_text().splitlines()
    assert lines[0] == "vhost,queue,reason,dead_letter_exchange,messages"
    assert lines[1] == f"/,orders,rejected,dlx,{len(seen['rejected'])}"
    assert (tmp_path / "dl.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
