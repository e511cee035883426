"""The same management operations against raftmq and RabbitMQ, compared field by field.

RabbitMQ 3.10.8 (Debian's rabbitmq-server, management plugin enabled offline through its
enabled_plugins file: tests/support/rabbitmq.py) is the reference: what tools read -- a queue's
messages, messages_ready, messages_unacknowledged, consumers, durable, auto_delete, arguments; an
exchange's type and flags; bindings; /get's message fields; publish's ``routed``; the status codes
of create, re-create, inequivalent re-create, missing objects and missing credentials -- must be
equal.  Then rabbitmqadmin, as RabbitMQ serves it at /cli/rabbitmqadmin, runs unmodified against
raftmq, and definitions exported from RabbitMQ are imported into raftmq and back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support import rabbitmq as rabbitmq_support
from tests.support.http_api import call, path

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not rabbitmq_support.available(), reason="rabbitmq-server is not installed")]

QUEUE_FIELDS = ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "messages", "messages_ready",
                "messages_unacknowledged", "consumers")
EXCHANGE_FIELDS = ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")
BINDING_FIELDS = ("source", "vhost", "destination", "destination_type", "routing_key", "arguments", "properties_key")
GET_FIELDS = ("payload", "payload_bytes", "payload_encoding", "redelivered", "exchange", "routing_key",
              "message_count", "properties")


class Target:
    def __init__(self, kind: str, base: str, amqp_url: str) -> None:
        self.kind, self.base, self.amqp_url = kind, base, amqp_url

    def __call__(self, method: str, url_path: str, body=None, auth=("guest", "guest")):
        return call(self.base, method, url_path, auth, body)


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    # Statistics every 200 ms instead of 5 s: RabbitMQ's queue counters are collected, not live.
    rmq = rabbitmq_support.RabbitMQ(plugins=("rabbitmq_management",),
                                    extra_config="collect_statistics_interval = 200\n")
    http_port = free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("compat-node"), extra_args=["--http-port", str(http_port)])
    with rmq, node:
        both = [Target("raftmq", f"http://127.0.0.1:{http_port}", node.url),
                Target("rabbitmq", rmq.management_url, rmq.url)]
        for target in both:
            deadline = time.monotonic() + 60
            while call(target.base, "GET", "/api/overview")[0] != 200:
                assert time.monotonic() < deadline, f"{target.kind} management API did not start"
                time.sleep(0.3)
        yield both


def _settled(target: Target, url_path: str, expect: dict, timeout: float = 15.0) -> dict:
    """RabbitMQ's counters lag behind (collected statistics): poll until ``expect`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        status, view = target("GET", url_path)
        if status == 200 and all(view.get(k) == v for k, v in expect.items()):
            return view
        if time.monotonic() > deadline:
            return view
        time.sleep(0.2)


def _pick(view: dict, fields) -> dict:
    return {f: view.get(f, "<missing>") for f in fields}


def test_same_operations_same_answers(targets):
    q, x = f"cmp-q-{uuid.uuid4().hex[:6]}", f"cmp-x-{uuid.uuid4().hex[:6]}"
    seen: dict[str, dict] = {}
    for t in targets:
        out: dict = {}
        out["anonymous"] = t("GET", "/api/queues", auth=None)[0]
        out["wrong password"] = t("GET", "/api/queues", auth=("guest", "nope"))[0]
        arguments = {"x-max-length": 10, "x-message-ttl": 60000}
        out["declare"] = t("PUT", path("queues", "/", q), {"durable": True, "arguments": arguments})[0]
        out["redeclare"] = t("PUT", path("queues", "/", q), {"durable": True, "arguments": arguments})[0]
        out["inequivalent"] = t("PUT", path("queues", "/", q), {"durable": False})[0]
        out["missing queue"] = t("GET", path("queues", "/", q + "-missing"))[0]
        out["exchange"] = t("PUT", path("exchanges", "/", x), {"type": "fanout", "durable": True})[0]
        out["bind"] = t("POST", path("bindings", "/", "e", x, "q", q), {"routing_key": "rk", "arguments": {}})[0]
        out["publish"] = [t("POST", path("exchanges", "/", x, "publish"),
                            {"properties": {"delivery_mode": 2, "content_type": "text/plain", "headers": {"i": i}},
                             "routing_key": "rk", "payload": f"m{i}", "payload_encoding": "string"})
                          for i in range(4)]
        out["unroutable"] = t("POST", path("exchanges", "/", "amq.direct", "publish"),
                              {"properties": {}, "routing_key": "nowhere", "payload": "x",
                               "payload_encoding": "string"})
        out["get"] = [_pick(m, GET_FIELDS) for m in t("POST", path("queues", "/", q, "get"),
                                                    {"count": 1, "ackmode": "ack_requeue_false",
                                                     "encoding": "auto"})[1]]
        # one message held unacked by a client, one consumer
        conn = pika.BlockingConnection(pika.URLParameters(t.amqp_url))
        try:
            ch = conn.channel()
            method, _props, body = ch.basic_get(q, auto_ack=False)
            assert body == b"m1"
            consumer_ch = conn.channel()
            consumer_ch.queue_declare(q + "-c", exclusive=True)
            consumer_ch.basic_consume(q + "-c", lambda *a: None)
            view = _settled(t, path("queues", "/", q), {"messages": 3, "messages_unacknowledged": 1})
            out["queue"] = _pick(view, QUEUE_FIELDS)
            out["consumed queue"] = _pick(_settled(t, path("queues", "/", q + "-c"), {"consumers": 1}),
                                          ("consumers", "exclusive"))
            ch.basic_nack(method.delivery_tag, requeue=True)
            view = _settled(t, path("queues", "/", q), {"messages_ready": 3, "messages_unacknowledged": 0})
            out["after nack"] = _pick(view, ("messages", "messages_ready", "messages_unacknowledged"))
        finally:
            conn.close()
        deadline = time.monotonic() + 15  # RabbitMQ's message_stats are collected too
        while (t("GET", path("queues", "/", q))[1].get("message_stats") or {}).get("publish") != 4:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        stats = t("GET", path("queues", "/", q))[1].get("message_stats") or {}
        out["queue publish count"] = (stats.get("publish"), "rate" in stats.get("publish_details", {}))
        out["exchange view"] = _pick(t("GET", path("exchanges", "/", x))[1], EXCHANGE_FIELDS)
        out["bindings"] = sorted((_pick(b, BINDING_FIELDS) for b in t("GET", path("queues", "/", q, "bindings"))[1]),
                                 key=repr)
        exported = t("GET", "/api/definitions")[1]
        out["defined queue"] = [d for d in exported["queues"] if d["name"] == q]
        out["defined exchange"] = [d for d in exported["exchanges"] if d["name"] == x]
        out["defined binding"] = [d for d in exported["bindings"] if d["source"] == x]
        out["purge"] = t("DELETE", path("queues", "/", q, "contents"))[0]
        out["purged"] = _pick(_settled(t, path("queues", "/", q), {"messages": 0}), ("messages",))
        out["delete"] = t("DELETE", path("queues", "/", q))[0]
        out["deleted"] = t("GET", path("queues", "/", q))[0]
        out["delete exchange"] = t("DELETE", path("exchanges", "/", x))[0]
        seen[t.kind] = out
    raftmq, rabbitmq = seen["raftmq"], seen["rabbitmq"]
    for key in rabbitmq:
        assert raftmq[key] == rabbitmq[key], f"{key}: raftmq {raftmq[key]!r} != RabbitMQ {rabbitmq[key]!r}"


def test_the_fields_tools_read_exist_on_both(targets):
    """Top-level keys of the list endpoints that rabbitmqadmin, Flower and KEDA read."""
    wanted = {
        "/api/overview": {"management_version", "rabbitmq_version", "cluster_name", "node", "object_totals",
                          "queue_totals", "message_stats", "listeners"},
        "/api/queues": {"name", "vhost", "messages", "messages_ready", "messages_unacknowledged", "consumers",
                        "durable", "auto_delete", "exclusive", "arguments", "node", "state"},
        "/api/exchanges": {"name", "vhost", "type", "durable", "auto_delete", "internal", "arguments"},
        "/api/nodes": {"name", "type", "running", "mem_used", "mem_limit", "disk_free", "disk_free_limit",
                       "partitions"},
        "/api/vhosts": {"name", "messages", "messages_ready", "messages_unacknowledged", "tracing"},
        "/api/users": {"name", "tags", "password_hash", "hashing_algorithm"},
        "/api/permissions": {"user", "vhost", "configure", "write", "read"},
    }
    for t in targets:
        t("PUT", path("queues", "/", "fields-probe"), {"durable": False})
        for url_path, keys in wanted.items():
            deadline = time.monotonic() + 15  # RabbitMQ adds the counters once it collected them
            while True:
                status, data = t("GET", url_path)
                assert status == 200, (t.kind, url_path)
                rows = data if isinstance(data, list) else [data]
                missing = keys - set(rows[0]) if rows else keys
                if not missing or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert not missing, f"{t.kind} {url_path} lacks {missing}"
        t("DELETE", path("queues", "/", "fields-probe"))


def _rabbitmqadmin(tmp_path, rmq_base: str) -> str:
    status, script = call(rmq_base, "GET", "/cli/rabbitmqadmin", auth=None)
    assert status == 200 and isinstance(script, str) and script.startswith("#!")
    target = tmp_path / "rabbitmqadmin"
    target.write_text(script)
    return str(target)


def test_rabbitmqadmin_unmodified_against_raftmq(targets, tmp_path):
    raftmq, rabbitmq = targets
    script = _rabbitmqadmin(tmp_path, rabbitmq.base)
    port = raftmq.base.rsplit(":", 1)[1]

    def admin(*args: str, base_port: str = port) -> str:
        done = subprocess.run([sys.executable, script, "-H", "127.0.0.1", "-P", base_port, "-u", "guest",
                               "-p", "guest", *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    q = f"tool-q-{uuid.uuid4().hex[:6]}"
    assert "queue declared" in admin("declare", "queue", f"name={q}", "durable=true")
    assert "Message published" in admin("publish", f"routing_key={q}", "payload=hello")
    listed = json.loads(admin("-f", "raw_json", "list", "queues"))
    assert [(r["name"], r["messages"]) for r in listed if r["name"] == q] == [(q, 1)]
    got = json.loads(admin("-f", "raw_json", "get", f"queue={q}", "ackmode=ack_requeue_false"))
    assert [(m["payload"], m["message_count"]) for m in got] == [("hello", 0)]
    for kind in ("exchanges", "bindings", "connections", "channels", "consumers", "users", "vhosts", "nodes"):
        json.loads(admin("-f", "raw_json", "list", kind))
    assert "queue deleted" in admin("delete", "queue", f"name={q}")
    assert q not in admin("list", "queues")

    # definitions: RabbitMQ -> raftmq -> RabbitMQ
    x = f"tool-x-{uuid.uuid4().hex[:6]}"
    rmq_port = rabbitmq.base.rsplit(":", 1)[1]
    admin("declare", "exchange", f"name={x}", "type=topic", base_port=rmq_port)
    admin("declare", "queue", f"name={q}", "durable=true", 'arguments={"x-max-length": 5}', base_port=rmq_port)
    admin("declare", "binding", f"source={x}", f"destination={q}", "routing_key=a.#", base_port=rmq_port)
    admin("declare", "user", "name=tool-user", "password=tool-pw", "tags=monitoring", base_port=rmq_port)
    admin("declare", "permission", "vhost=/", "user=tool-user", "configure=", "write=", "read=.*",
          base_port=rmq_port)
    from_rmq = tmp_path / "from-rabbitmq.json"
    admin("export", str(from_rmq), base_port=rmq_port)
    exported = json.loads(from_rmq.read_text())
    exported["global_parameters"] = []  # RabbitMQ's cluster id: not a definition raftmq keeps
    from_rmq.write_text(json.dumps(exported))
    admin("import", str(from_rmq))
    queues = {r["name"]: r for r in json.loads(admin("-f", "raw_json", "list", "queues"))}
    assert queues[q]["arguments"] == {"x-max-length": 5} and queues[q]["durable"] is True
    bindings = json.loads(admin("-f", "raw_json", "list", "bindings"))
    assert any(b["source"] == x and b["destination"] == q and b["routing_key"] == "a.#" for b in bindings)
    # the imported user logs in to raftmq with the password it had on RabbitMQ
    assert call(raftmq.base, "GET", "/api/whoami", ("tool-user", "tool-pw"))[1] == {
        "name": "tool-user", "tags": ["monitoring"]}

    back = tmp_path / "from-raftmq.json"
    admin("export", str(back))
    admin("delete", "queue", f"name={q}", base_port=rmq_port)
    admin("delete", "exchange", f"name={x}", base_port=rmq_port)
    admin("delete", "user", "name=tool-user", base_port=rmq_port)
    definitions = json.loads(back.read_text())
    # raftmq's own users carry raftmq's hash, which RabbitMQ cannot check: send RabbitMQ the others
    definitions["users"] = [u for u in definitions["users"] if u["hashing_algorithm"].startswith("rabbit_")]
    definitions["permissions"] = [p for p in definitions["permissions"]
                                  if p["user"] in {u["name"] for u in definitions["users"]}]
    back.write_text(json.dumps(definitions))
    admin("import", str(back), base_port=rmq_port)
    rmq_queues = {r["name"]: r for r in json.loads(admin("-f", "raw_json", "list", "queues", base_port=rmq_port))}
    assert rmq_queues[q]["arguments"] == {"x-max-length": 5}
    status, _ = call(rabbitmq.base, "GET", "/api/whoami", ("tool-user", "tool-pw"))
    assert status == 200
