"""Issue 36's "who" scenario against one real node, shared by the history-reader test
(tests/integration/test_audit_who.py) and the Spark test (tests/spark/test_audit_who.py).

A user with narrow permissions (``alice``: configure and read only ``^alice-``) connects with pika
under a connection name, publishes and consumes her own queue, is refused a queue declare and a
consume (AMQP 0-9-1 403 access-refused: a channel exception, reference 1.2 "access-refused"), a
client fails to log in (403 at connection.start-ok, RabbitMQ's authentication_failure_close), and
the administrator changes alice's permissions through the HTTP API (PUT /api/permissions/{vhost}/{user})
and her limits through the CLI (``raftmq admin set-user-limits``, the gRPC admin API); a management
user of the HTTP API is refused a queue declare (403).
Returns the snapshot of the node's history and what the clients saw (their local addresses).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions as pex

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.cli import raftmq
from tests.support.groups import wait_histories
from tests.support.http_api import call, path

ALICE, PASSWORD = "alice", "alice-pw"
OTHER_VHOST = "audit-other"  # alice has no permissions there
CAROL = "carol"  # a management user of the HTTP API who may configure only ^carol-
CONNECTION_NAME = "alice-billing"


@dataclass(frozen=True)
class WhoScenario:
    snapshot: str
    alice_address: str  # "127.0.0.1:port" as the node saw alice's connection
    intruder_user: str  # the user name the failed login tried


def _address(conn: pika.BlockingConnection) -> str:
    host, port = conn._impl._transport._sock.getsockname()[:2]  # pika keeps its socket there
    return f"{host}:{port}"


def run(base: Path) -> WhoScenario:
    http_port, admin_port = free_port(), free_port()
    config = base / "node.toml"
    config.write_text(f'http_port = {http_port}\nadmin_port = {admin_port}\nvhosts = ["/", "{OTHER_VHOST}"]\n'
                      '[users.guest]\npassword = "guest"\ntags = ["administrator"]\n'
                      f'[users.{ALICE}]\npassword = "{PASSWORD}"\n'
                      'permissions = {"/" = ["^alice-", ".*", "^alice-"]}\n'
                      f'[users.{CAROL}]\npassword = "{PASSWORD}"\ntags = ["management"]\n'
                      'permissions = {"/" = ["^carol-", ".*", ".*"]}\n')
    with RaftmqNode(base / "data", config=config, env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        http = f"http://127.0.0.1:{http_port}"
        admin = pika.BlockingConnection(pika.URLParameters(node.url))
        admin.channel().queue_declare("payroll")  # a queue alice may not read
        admin.close()

        params = pika.URLParameters(f"amqp://{ALICE}:{PASSWORD}@127.0.0.1:{node.port}/%2F")
        params.client_properties = {"connection_name": CONNECTION_NAME}
        alice = pika.BlockingConnection(params)
        address = _address(alice)
        ch = alice.channel()
        ch.confirm_delivery()
        ch.queue_declare("alice-inbox")
        ch.basic_publish("", "alice-inbox", b"hello")
        method, _props, _body = ch.basic_get("alice-inbox")
        ch.basic_ack(method.delivery_tag)
        try:
            alice.channel().queue_declare("payroll-copy")  # configure: refused
            raise AssertionError("the declare should have been refused")
        except pex.ChannelClosedByBroker as exc:
            assert exc.reply_code == 403, exc
        try:
            alice.channel().basic_consume("payroll", lambda *a: None)  # read: refused
            raise AssertionError("the consume should have been refused")
        except pex.ChannelClosedByBroker as exc:
            assert exc.reply_code == 403, exc
        alice.close()
        try:  # a vhost alice may not use: 530 at connection.open (access to the vhost refused)
            pika.BlockingConnection(pika.URLParameters(
                f"amqp://{ALICE}:{PASSWORD}@127.0.0.1:{node.port}/{OTHER_VHOST}"))
            raise AssertionError("the vhost should have been refused")
        except pex.ProbableAccessDeniedError as exc:
            assert "530" in str(exc), exc

        intruder = "mallory"
        try:
            pika.BlockingConnection(pika.URLParameters(f"amqp://{intruder}:guess@127.0.0.1:{node.port}/%2F"))
            raise AssertionError("the login should have been refused")
        except pex.ProbableAuthenticationError:
            pass

        status, _ = call(http, "GET", path("overview"), auth=(CAROL, "not-her-password"))
        assert status == 401, status  # a management login refused
        status, body = call(http, "PUT", path("queues", "/", "payroll-archive"), auth=(CAROL, PASSWORD),
                            body={"durable": True})
        assert status == 403, (status, body)  # configure refused: node/core/access.py's rule over HTTP
        status, body = call(http, "PUT", path("permissions", "/", ALICE),
                            body={"configure": "^alice-", "write": "^alice-", "read": "^alice-"})
        assert status in (201, 204), (status, body)
        done = raftmq("admin", "--address", f"127.0.0.1:{admin_port}", "--user", "guest", "--password", "guest",
                      "set-user-limits", ALICE, '{"max-channels": 7}')
        assert done.returncode == 0, done.stderr

        wait_histories(node)  # every group's (issue 34: a queue's events are in its group's)
        out = base / "snapshot"
        done = raftmq("snapshot", "--data-dir", str(node.data_dir), "--out", str(out))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["events"] > 0
    return WhoScenario(str(out), address, intruder)
