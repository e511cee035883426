"""Deleting a vhost and permissions of configuration-file users, through RabbitMQ's HTTP API, with
real clients (pika; RabbitMQ 4's rabbitmq-amqp-python-client) against one real node.

RabbitMQ's behaviour is the specification: DELETE /api/vhosts/:name (administrators; 204, 404 for an
unknown vhost) deletes the vhost with its queues, exchanges, bindings and permissions and closes its
connections with 320 CONNECTION_FORCED "vhost '...' is deleted" (rabbit_vhost:delete); PUT
/api/vhosts gives its creator full permissions whoever the creator is, and PUT/DELETE
/api/permissions/:vhost/:user work for every user -- here the configuration file's ``guest`` too.
"""

from __future__ import annotations

import threading
import time
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.helpers import http_node
from tests.integration.test_amqp10_rabbitmq4 import _cached_client, client_path, run, uri  # noqa: F401
from tests.support.http_api import call, path

pytestmark = pytest.mark.timeout(180)

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with http_node(tmp_path_factory.mktemp("vhost-delete"), rabbitmq_compat=True) as node:
        yield node


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def params(node, vhost: str, user: str = "guest", password: str = "guest") -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", node.port, vhost, pika.PlainCredentials(user, password),
                                     connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10)


def test_delete_closes_connections_with_320_and_removes_everything(node) -> None:
    """A configuration-file administrator creates a vhost (and so may use it), declares a queue bound
    to an exchange there, publishes and consumes on a pika connection; DELETE /api/vhosts answers 204,
    the connection is closed by the broker with 320 CONNECTION_FORCED, the vhost, its queue, exchange,
    bindings and permissions are gone from the API, a new connection to it is refused, a connection on
    another vhost stays open, and a second DELETE is 404."""
    vhost = unique("doomed")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    status, perm = call(node.http, "GET", path("permissions", vhost, "guest"))
    assert status == 200 and (perm["configure"], perm["write"], perm["read"]) == (".*", ".*", ".*")

    conn = pika.BlockingConnection(params(node, vhost))
    ch = conn.channel()
    ch.exchange_declare("dx", "direct", durable=True)
    ch.queue_declare("dq", durable=True)
    ch.queue_bind("dq", "dx", "k")
    for i in range(3):
        ch.basic_publish("dx", "k", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    got = []
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume("dq", lambda c, m, p, b: got.append(b))
    deadline = 50
    while not got and deadline:
        conn.process_data_events(time_limit=0.1)
        deadline -= 1
    assert got == [b"m0"]  # one held unacked, two ready
    bystander = pika.BlockingConnection(params(node, "/"))

    status, _ = call(node.http, "DELETE", path("vhosts", vhost))
    assert status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(100):
            conn.process_data_events(time_limit=0.1)
    assert closed.value.reply_code == 320
    assert closed.value.reply_text == f"CONNECTION_FORCED - vhost '{vhost}' is deleted"

    assert call(node.http, "GET", path("vhosts", vhost))[0] == 404
    assert vhost not in {v["name"] for v in call(node.http, "GET", "/api/vhosts")[1]}
    assert not [q for q in call(node.http, "GET", "/api/queues")[1] if q["vhost"] == vhost]
    assert not [e for e in call(node.http, "GET", "/api/exchanges")[1] if e["vhost"] == vhost]
    assert not [b for b in call(node.http, "GET", "/api/bindings")[1] if b["vhost"] == vhost]
    assert not [p for p in call(node.http, "GET", "/api/permissions")[1] if p["vhost"] == vhost]
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params(node, vhost))
    bystander.process_data_events(time_limit=0.2)
    assert bystander.is_open
    bystander.close()
    assert call(node.http, "DELETE", path("vhosts", vhost))[0] == 404
    # Created again, it starts empty.
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    again = pika.BlockingConnection(params(node, vhost))
    assert again.channel().queue_declare("dq", passive=False, durable=True).method.message_count == 0
    again.close()
    assert call(node.http, "DELETE", path("vhosts", vhost))[0] == 204


def test_only_administrators_delete_vhosts(node) -> None:
    """RabbitMQ: deleting a vhost needs the administrator tag; a management user with full
    permissions on the vhost is refused (403) and the vhost stays."""
    vhost, user = unique("kept"), unique("mgr")
    assert call(node.http, "PUT", path("users", user), body={"password": "pw", "tags": "management"})[0] == 201
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    assert call(node.http, "PUT", path("permissions", vhost, user), body=FULL)[0] == 201
    assert call(node.http, "DELETE", path("vhosts", vhost), auth=(user, "pw"))[0] == 403
    assert call(node.http, "DELETE", path("vhosts", vhost), auth=None)[0] == 401
    assert call(node.http, "GET", path("vhosts", vhost))[0] == 200
    assert call(node.http, "DELETE", path("vhosts", vhost))[0] == 204


def test_configuration_file_user_gets_permissions_through_the_api(node) -> None:
    """A vhost created by another (managed) administrator: guest, a user of the configuration file,
    cannot log in there; PUT /api/permissions/:vhost/guest (201) lets it in with pika, listed by the
    API; DELETE /api/permissions (204) takes it away again; guest's password is still the file's."""
    admin, vhost = unique("admin"), unique("granted")
    assert call(node.http, "PUT", path("users", admin), body={"password": "pw", "tags": "administrator"})[0] == 201
    assert call(node.http, "PUT", path("vhosts", vhost), auth=(admin, "pw"))[0] == 201
    assert call(node.http, "GET", path("permissions", vhost, "guest"))[0] == 404
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params(node, vhost))

    body = {"configure": "^mine-", "write": ".*", "read": ".*"}
    assert call(node.http, "PUT", path("permissions", vhost, "guest"), body=body)[0] == 201
    status, perms = call(node.http, "GET", path("users", "guest", "permissions"))
    assert status == 200 and {p["vhost"]: p["configure"] for p in perms}[vhost] == "^mine-"
    conn = pika.BlockingConnection(params(node, vhost))
    ch = conn.channel()
    ch.queue_declare("mine-q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_declare("theirs-q")  # the configure pattern applies
    assert refused.value.reply_code == 403
    conn.close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params(node, vhost, password="wrong"))

    assert call(node.http, "DELETE", path("permissions", vhost, "guest"))[0] == 204
    assert call(node.http, "DELETE", path("permissions", vhost, "guest"))[0] == 404
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params(node, vhost))
    assert call(node.http, "DELETE", path("vhosts", vhost))[0] == 204


def test_delete_closes_an_amqp10_connection_of_rabbitmq_client(node, client_path) -> None:  # noqa: F811
    """RabbitMQ 4's client, as its test_connection_vhost does: guest (configuration file) creates a
    vhost, dials it (it may, as its creator), and the vhost is deleted (204)."""
    vhost = unique("tmpVhost")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    assert run("dial", uri(node, vhost=vhost), client_path)["dialed"] is True
    assert call(node.http, "DELETE", path("vhosts", vhost) + "/")[0] == 204  # the client's trailing slash
    seen = run("dial", uri(node, vhost=vhost), client_path)
    assert seen["dialed"] is False and seen["raised"] == "ConnectionException", seen


def test_a_consumer_thread_sees_the_close(node) -> None:
    """A pika consumer blocked in start_consuming on the deleted vhost's queue ends with 320 (its
    connection is closed by the broker), not a hang."""
    vhost = unique("consumed")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    conn = pika.BlockingConnection(params(node, vhost))
    ch = conn.channel()
    ch.queue_declare("cq")
    ch.basic_consume("cq", lambda *a: None, auto_ack=True)
    outcome: list = []

    def consume() -> None:
        try:
            ch.start_consuming()
            outcome.append("returned")
        except pika.exceptions.ConnectionClosedByBroker as exc:
            outcome.append(exc.reply_code)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert call(node.http, "DELETE", path("vhosts", vhost))[0] == 204
    thread.join(20)
    assert outcome == [320]


def test_delete_closes_an_amqp10_connection(node) -> None:
    """An AMQP 1.0 client (Qpid Proton's BlockingConnection, hostname ``vhost:<name>`` as RabbitMQ 4
    reads it) receiving from a queue of the vhost: the delete closes its connection with
    amqp:connection:forced (AMQP 1.0 2.8.15, the forced close RabbitMQ sends), and the receive raises
    instead of waiting for ever."""
    from proton import ConnectionException
    from proton.utils import BlockingConnection, LinkDetached

    vhost = unique("one-oh")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    pika_conn = pika.BlockingConnection(params(node, vhost))
    pika_conn.channel().queue_declare("q10")
    pika_conn.close()
    conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=10,
                              virtual_host=f"vhost:{vhost}")
    receiver = conn.create_receiver("/queues/q10")
    assert call(node.http, "DELETE", path("vhosts", vhost))[0] == 204
    with pytest.raises((ConnectionException, LinkDetached)) as closed:
        receiver.receive(timeout=10)
    assert "forced" in str(closed.value) or "deleted" in str(closed.value), closed.value


def test_a_single_node_restart_keeps_the_delete_and_the_overlay(tmp_path) -> None:
    """Single node, LMDB: after a restart the deleted vhost and its durable queue are still gone, and
    the permissions set through the API for the configuration file's guest (a vhost another
    administrator created) still let guest log in with pika."""
    with http_node(tmp_path) as node:
        admin = ("boss", "pw")
        assert call(node.http, "PUT", path("users", "boss"), body={"password": "pw", "tags": "administrator"})[0] == 201
        for vhost in ("kept", "gone"):
            assert call(node.http, "PUT", path("vhosts", vhost), auth=admin)[0] == 201
            # guest did not create it: no permissions there yet, not even as an administrator
            assert call(node.http, "PUT", path("queues", vhost, "dq"), body={"durable": True})[0] == 403
        assert call(node.http, "PUT", path("permissions", "kept", "guest"), body=FULL)[0] == 201
        assert call(node.http, "PUT", path("permissions", "gone", "guest"), body=FULL)[0] == 201
        assert call(node.http, "PUT", path("queues", "gone", "dq"), body={"durable": True})[0] == 201
        assert call(node.http, "DELETE", path("vhosts", "gone"))[0] == 204
        node.restart()
        for _ in range(100):
            if call(node.http, "GET", "/api/overview")[0] == 200:
                break
            time.sleep(0.1)
        assert call(node.http, "GET", path("vhosts", "gone"))[0] == 404
        assert not [q for q in call(node.http, "GET", "/api/queues")[1] if q["vhost"] == "gone"]
        status, perm = call(node.http, "GET", path("permissions", "kept", "guest"))
        assert status == 200 and perm["configure"] == ".*"
        conn = pika.BlockingConnection(params(node, "kept"))
        conn.close()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params(node, "gone"))
