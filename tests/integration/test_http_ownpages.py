"""raftmq's own management API pages (issue 35; ops/http/ownpages.py), on one real node with its
audit history on (``RAFTMQ_AUDIT_RETENTION=metadata``), real clients (pika, the 0-10 client):

1. /api/raftmq/sessions: an AMQP 0-10 session (AMQP 0-10 spec, section 3.4 "Sessions": a detached
   session's state outlives the connection for its timeout and may be resumed) is listed attached,
   then detached with the time it stays resumable; a management user sees none of guest's.
2. /api/raftmq/held: a message held by an x-delayed-message exchange (x-delay) and one dropped by
   a queue's deduplication cache (x-message-deduplication, x-deduplication-header) are counted, with
   the exchange's held messages and the queue's cache entries.
3. /api/raftmq/queues/{vhost}/{name}/events: a queue's declared, routed and delivered events from
   the node's audit history (store/disk/history.py), newest first, and not another queue's; a bad
   limit is 400, an unknown vhost 404.
"""

from __future__ import annotations

import asyncio
import time

import pika
import pytest

from raftmq.client.amqp010 import Connection
from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.http_api import call, path
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    http_port = free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("ownpages"), env={"RAFTMQ_AUDIT_RETENTION": "metadata"},
                      extra_args=["--http-port", str(http_port)])
    node.http_base = f"http://127.0.0.1:{http_port}"
    with node:
        deadline = time.monotonic() + 10
        while call(node.http_base, "GET", "/api/overview")[0] != 200:
            assert time.monotonic() < deadline, node.log_tail(20)
            time.sleep(0.1)
        assert call(node.http_base, "PUT", path("users", "viewer"), body={"password": "v", "tags": "management"})[0] \
            in (201, 204)
        assert call(node.http_base, "PUT", path("permissions", "/", "viewer"),
                    body={"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
        yield node


def test_a_0_10_session_listed_attached_then_detached(node):
    base = node.http_base

    async def scenario() -> tuple[list, list]:
        conn = await Connection.connect([f"127.0.0.1:{node.port}"])
        session = await conn.session(name=b"ui-resumable", timeout=90)
        await session.queue_declare("ui-session-q", auto_delete=False)
        attached = call(base, "GET", "/api/raftmq/sessions")[1]
        await conn.close()  # session.detach: the state stays for its timeout
        return attached, wait_for(lambda: [s for s in call(base, "GET", "/api/raftmq/sessions")[1]
                                           if s["name"] == "ui-resumable" and s["state"] == "detached"],
                                  what="the session detached")

    attached, detached = asyncio.run(asyncio.wait_for(scenario(), 60))
    row = next(s for s in attached if s["name"] == "ui-resumable")
    assert (row["kind"], row["vhost"], row["user"], row["state"], row["timeout"]) == \
        ("0-10 session", "/", "guest", "attached", 90)
    assert row["detached_at"] is None and row["expires_at"] is None
    (gone,) = detached
    assert gone["expires_at"] - gone["detached_at"] == 90_000  # resumable for its timeout (ms)
    assert call(base, "GET", "/api/raftmq/sessions", auth=("viewer", "v"))[1] == []  # not its own
    status, page = call(base, "GET", "/api/raftmq/sessions?page=1&page_size=10&name=ui-resum")
    assert status == 200 and [s["name"] for s in page["items"]] == ["ui-resumable"]


def test_delayed_and_deduplicated_counts(node):
    base = node.http_base
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        ch.exchange_declare("ui-delayed", "x-delayed-message", arguments={"x-delayed-type": "direct"})
        ch.queue_declare("ui-delayed-q")
        ch.queue_bind("ui-delayed-q", "ui-delayed", "k")
        ch.basic_publish("ui-delayed", "k", b"later", pika.BasicProperties(headers={"x-delay": 600_000}))
        ch.queue_declare("ui-dedup-q", arguments={"x-message-deduplication": True})
        for _ in range(2):
            ch.basic_publish("", "ui-dedup-q", b"once", pika.BasicProperties(headers={"x-deduplication-header": "id-1"}))
        conn.process_data_events(time_limit=0.2)
    finally:
        conn.close()

    def counted():
        held = call(base, "GET", "/api/raftmq/held")[1]
        return held if held["messages_delayed"] >= 1 and held["deduplicated"] >= 1 else None

    held = wait_for(counted, what="the delayed and the deduplicated message counted")
    assert held["delayed"] >= 1
    exchange = next(e for e in held["exchanges"] if e["name"] == "ui-delayed")
    assert exchange["type"] == "x-delayed-message" and exchange["messages_delayed"] == 1
    queue = next(q for q in held["queues"] if q["name"] == "ui-dedup-q")
    assert queue == {"vhost": "/", "name": "ui-dedup-q", "cache_entries": 1}
    assert call(base, "GET", path("queues", "/", "ui-dedup-q"))[1]["messages"] == 1


def test_a_queues_audit_events(node):
    base = node.http_base
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        for queue in ("ui-audit-q", "ui-audit-other"):
            ch.queue_declare(queue)
            ch.basic_publish("", queue, b"audited")
        assert ch.basic_get("ui-audit-q", auto_ack=True)[2] == b"audited"
    finally:
        conn.close()
    url = path("raftmq", "queues", "/", "ui-audit-q", "events")

    def routed_and_delivered():
        answer = call(base, "GET", url)[1]
        kinds = [e["kind"] for e in answer["events"]]
        return answer if {"queue_declared", "routed", "delivered"} <= set(kinds) else None

    answer = wait_for(routed_and_delivered, what="the queue's events in the history")
    kinds = [e["kind"] for e in answer["events"]]
    assert kinds.index("delivered") < kinds.index("routed") < kinds.index("queue_declared")
    assert {(e["vhost"], e["queue"]) for e in answer["events"]} == {("/", "ui-audit-q")}
    seqs = [e["seq"] for e in answer["events"]]
    assert seqs == sorted(seqs, reverse=True)  # newest first
    assert answer["scanned_to"] <= min(seqs) and answer["last_seq"] >= max(seqs)
    assert call(base, "GET", url + "?limit=0")[0] == 400
    assert call(base, "GET", path("raftmq", "queues", "nope", "ui-audit-q", "events"))[0] == 404
