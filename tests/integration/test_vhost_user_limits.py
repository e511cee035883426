"""Vhost and user limits (issue 31 item 7), end to end on one private node, with real clients.

RabbitMQ's behaviour is the specification (rabbit_vhost_limit, rabbit_auth_backend_internal user
limits, rabbit_mgmt_wm_limit(s), rabbit_mgmt_wm_user_limit(s), rabbit_reader, rabbit_queue_type,
rabbit_amqp_reader): limits set over RabbitMQ's HTTP API (``PUT /api/vhost-limits/{vhost}/{name}`` and
``/api/user-limits/{user}/{name}`` with ``{"value": N}``; negative: no limit, 0: none allowed) and
definitions, refused with each protocol's code:

* 0-9-1 (reference 1.2 constants): a queue.declare past ``max-queues`` is a channel close 406
  PRECONDITION_FAILED "cannot declare queue 'q': queue limit in vhost 'v' (N) is reached"; a connection
  past vhost or user ``max-connections`` is connection close 530 NOT_ALLOWED at connection.open; a
  channel.open past the user's ``max-channels`` is connection close 530 too (rabbit_reader: not_allowed);
* AMQP 1.0 (spec 2.8.15/2.8.16 error conditions; 2.4.4 open then close; 2.5.5 end with an error): a
  connection past a limit is open then close ``amqp:resource-limit-exceeded`` (as rabbit_amqp_reader);
  a begin past ``max-channels`` is begin then end with ``amqp:resource-limit-exceeded``;
* 0-10 (spec connection.close codes, L3777ff): a connection past a limit is closed with 320
  connection-forced, as the node-wide connection limits; a queue.declare past max-queues is an
  execution exception (precondition-failed).

Counts of connections and channels are each node's own (node/limits.py); the cluster test is in
tests/cluster/test_limits_cluster.py.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import pika
import pika.exceptions as pex
import pytest

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.frames import encode_frame
from tests.integration.helpers import http_node, round_trip
from tests.integration.test_amqp10_raw import Raw
from tests.support.http_api import call, path

pytestmark = pytest.mark.timeout(180)

FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with http_node(tmp_path_factory.mktemp("limits")) as node:
        yield node


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def vhost_with(node, **limits) -> str:
    """A new vhost (guest may use it: its creator) with these limits set over HTTP."""
    vhost = unique("lim")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    for name, value in limits.items():
        assert call(node.http, "PUT", path("vhost-limits", vhost, name.replace("_", "-")), body={"value": value})[0] == 204
    return vhost


def user_with(node, vhosts: list[str], tags: str = "", **limits) -> str:
    """A new user (password "pw", ``tags``) with full permissions on ``vhosts`` and these limits."""
    user = unique("u")
    assert call(node.http, "PUT", path("users", user), body={"password": "pw", "tags": tags})[0] == 201
    for vhost in vhosts:
        assert call(node.http, "PUT", path("permissions", vhost, user), body=FULL)[0] in (201, 204)
    for name, value in limits.items():
        assert call(node.http, "PUT", path("user-limits", user, name.replace("_", "-")), body={"value": value})[0] == 204
    return user


def params(node, vhost: str = "/", user: str = "guest", password: str = "guest") -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", node.port, vhost, pika.PlainCredentials(user, password),
                                     connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10)


def connect_soon(parameters: pika.ConnectionParameters) -> pika.BlockingConnection:
    """A connection once the node has seen a closed one go (its socket's end is asynchronous): tries
    for up to 5 s."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return pika.BlockingConnection(parameters)
        except pex.AMQPConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def refused_open(parameters: pika.ConnectionParameters) -> tuple[int, str]:
    """(reply code, reply text) of a connection the broker closes at connection.open (pika reports
    it as ProbableAccessDeniedError carrying the broker's close)."""
    with pytest.raises(pex.AMQPConnectionError) as refused:
        pika.BlockingConnection(parameters)
    found = re.search(r'\((\d+)\) "(.*)"', str(refused.value))
    assert found, refused.value
    return int(found.group(1)), found.group(2)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ------------------------------------------------------------------------------------------ HTTP API

def test_http_api_round_trip(node) -> None:
    """PUT/GET/DELETE of vhost and user limits with RabbitMQ's paths and bodies: 204 on change, the
    GET lists ``[{"vhost"|"user": name, "value": {...}}]``, GET /api/users shows a user's limits, a
    DELETE clears one limit and keeps the other; an unknown vhost or user is 404, an unknown limit
    name or a non-integer value 400, a non-administrator 403 for changes (and for another user's
    limits), but may read its own user limits."""
    vhost = vhost_with(node, max_queues=10, max_connections=-1)
    status, rows = call(node.http, "GET", path("vhost-limits", vhost))
    assert status == 200 and rows == [{"vhost": vhost, "value": {"max-queues": 10, "max-connections": -1}}]
    assert {"vhost": vhost, "value": {"max-queues": 10, "max-connections": -1}} in call(node.http, "GET", "/api/vhost-limits")[1]
    assert call(node.http, "PUT", path("vhost-limits", vhost, "max-queues"), body={"value": "12"})[0] == 204
    assert call(node.http, "DELETE", path("vhost-limits", vhost, "max-connections"))[0] == 204
    assert call(node.http, "GET", path("vhost-limits", vhost))[1] == [{"vhost": vhost, "value": {"max-queues": 12}}]

    user = user_with(node, [vhost], tags="management", max_connections=5, max_channels=20)
    assert call(node.http, "GET", path("user-limits", user))[1] == [
        {"user": user, "value": {"max-channels": 20, "max-connections": 5}}]
    assert call(node.http, "GET", path("users", user))[1]["limits"] == {"max-channels": 20, "max-connections": 5}
    assert call(node.http, "GET", path("user-limits", user), auth=(user, "pw"))[0] == 200  # its own
    assert call(node.http, "GET", "/api/user-limits", auth=(user, "pw"))[0] in (401, 403)
    assert call(node.http, "PUT", path("user-limits", user, "max-channels"), auth=(user, "pw"),
                body={"value": 99})[0] in (401, 403)
    assert call(node.http, "DELETE", path("user-limits", user, "max-channels"))[0] == 204
    assert call(node.http, "GET", path("users", user))[1]["limits"] == {"max-connections": 5}

    for url, value in ((path("vhost-limits", "no-such-vhost", "max-queues"), 1),
                       (path("user-limits", "no-such-user", "max-channels"), 1)):
        assert call(node.http, "PUT", url, body={"value": value})[0] == 404
    for url, value in ((path("vhost-limits", vhost, "max-channels"), 1),  # a user limit
                       (path("vhost-limits", vhost, "max-queues"), "many"),
                       (path("user-limits", user, "max-queues"), 1),
                       (path("user-limits", user, "max-channels"), 1.5)):
        status, answer = call(node.http, "PUT", url, body={"value": value})
        assert status == 400, (url, value, answer)
    assert call(node.http, "PUT", path("vhost-limits", vhost, "max-queues"), body={})[0] == 400


def test_definitions_export_and_import(node) -> None:
    """GET /api/definitions carries vhosts' and users' ``limits`` (RabbitMQ's export); POST imports
    them back, and also the ``parameters`` of component ``vhost-limits`` of RabbitMQ 3.x exports; a
    bad limit in definitions is 400 with the reason."""
    vhost = vhost_with(node, max_queues=7)
    user = user_with(node, [vhost], max_channels=3)
    status, definitions = call(node.http, "GET", "/api/definitions")
    assert status == 200
    assert {"name": vhost, "limits": {"max-queues": 7}} in definitions["vhosts"]
    assert next(u for u in definitions["users"] if u["name"] == user)["limits"] == {"max-channels": 3}

    other_vhost, other_vhost2, other_user = unique("imp"), unique("imp"), unique("imp")
    imported = {
        "vhosts": [{"name": other_vhost, "limits": {"max-connections": 2}}, {"name": other_vhost2}],
        "users": [{"name": other_user, "password": "pw", "tags": "", "limits": {"max-connections": 1}}],
        "parameters": [{"vhost": other_vhost2, "component": "vhost-limits", "name": "limits",
                        "value": {"max-queues": 4}}],
    }
    assert call(node.http, "POST", "/api/definitions", body=imported)[0] in (201, 204)
    assert call(node.http, "GET", path("vhost-limits", other_vhost))[1] == [
        {"vhost": other_vhost, "value": {"max-connections": 2}}]
    assert call(node.http, "GET", path("vhost-limits", other_vhost2))[1] == [
        {"vhost": other_vhost2, "value": {"max-queues": 4}}]
    assert call(node.http, "GET", path("user-limits", other_user))[1] == [
        {"user": other_user, "value": {"max-connections": 1}}]
    status, answer = call(node.http, "POST", "/api/definitions",
                          body={"vhosts": [{"name": unique("bad"), "limits": {"max-queues": "x"}}]})
    assert status == 400 and "max-queues" in answer["reason"]


# ------------------------------------------------------------------------------------------- 0-9-1

def test_max_queues_flood_is_refused_fast_and_the_node_stays_healthy(node) -> None:
    """The issue's flood, scaled: with max-queues 100 a client declares 100 queues, then 1,000 more
    declares (each on a fresh channel: a refusal closes its channel) are all refused with 406 and
    RabbitMQ's text; the vhost holds exactly 100 queues, RSS grows by less than 50 MB, another
    client's round trip works during and after, the node logs the refusals at most once a second, and
    a deleted queue frees a place."""
    vhost = vhost_with(node, max_queues=100)
    before, started = rss(node.pid), time.monotonic()
    conn = pika.BlockingConnection(params(node, vhost))
    ch = conn.channel()
    for i in range(100):
        ch.queue_declare(f"q{i}")
    ch.queue_declare("q5")  # an existing queue: still fine
    refused = 0
    for i in range(1000):
        try:
            ch.queue_declare(f"over{i}")
        except pex.ChannelClosedByBroker as exc:
            assert exc.reply_code == 406
            assert exc.reply_text == (f"PRECONDITION_FAILED - cannot declare queue 'over{i}': queue limit in vhost "
                                      f"'{vhost}' (100) is reached")
            refused += 1
        ch = conn.channel()
        if i == 500:
            round_trip(node.url)
    assert refused == 1000
    logged = [line for line in (node.data_dir / "node.log").read_text().splitlines()
              if "refused (vhost max-queues)" in line and f"vhost '{vhost}'" in line]
    assert 1 <= len(logged) <= 2 + int(time.monotonic() - started)  # at most one a second
    status, queues = call(node.http, "GET", path("queues", vhost))
    assert status == 200 and len(queues) == 100
    assert rss(node.pid) - before < 50 * 1024 * 1024
    round_trip(node.url)
    ch.queue_delete("q0")
    ch.queue_declare("again")
    conn.close()


def test_connection_limits_per_vhost_and_user(node) -> None:
    """Vhost max-connections 2: a third connection to the vhost is refused at connection.open with
    530 and RabbitMQ's text, whoever the user; closing one admits the next.  User max-connections 1:
    its second connection is refused (530) on any vhost while other users connect.  0 admits none."""
    vhost = vhost_with(node, max_connections=2)
    user = user_with(node, [vhost, "/"], max_connections=1)
    first, second = (pika.BlockingConnection(params(node, vhost)) for _ in range(2))
    assert refused_open(params(node, vhost, user, "pw")) == (
        530, f"NOT_ALLOWED - access to vhost '{vhost}' refused for user '{user}': connection limit (2) is reached")
    second.close()
    third = connect_soon(params(node, vhost, user, "pw"))  # a place is free again
    assert refused_open(params(node, "/", user, "pw")) == (
        530, f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) is reached")
    round_trip(node.url)  # guest, on "/": not limited
    for c in (first, third):
        c.close()
    closed = vhost_with(node, max_connections=0)
    assert refused_open(params(node, closed))[0] == 530


def test_max_channels_counts_every_connection_of_the_user(node) -> None:
    """User max-channels 3 over two connections: 2 + 1 channels open, the fourth channel.open is
    refused by closing that connection with 530 (rabbit_reader: not_allowed); closing a channel frees
    its place."""
    user = user_with(node, ["/"], max_channels=3)
    a = pika.BlockingConnection(params(node, "/", user, "pw"))
    b = pika.BlockingConnection(params(node, "/", user, "pw"))
    a1, _a2 = a.channel(), a.channel()
    b.channel()
    with pytest.raises(pex.ConnectionClosedByBroker) as refused:
        b.channel()
    assert refused.value.reply_code == 530
    assert refused.value.reply_text == (f"NOT_ALLOWED - number of channels opened for user '{user}' has reached "
                                        "the maximum allowed user limit of 3")
    a1.close()  # a's 2 channels, b's 1 went with b: 1 left
    a.channel()
    a.channel()
    with pytest.raises(pex.ConnectionClosedByBroker):
        a.channel()


# -------------------------------------------------------------------------------------------- 1.0

def _raw_login(node, vhost: str, user: str = "guest", password: str = "guest") -> tuple[Raw, object]:
    """SASL PLAIN and open on ``vhost``; the first performative after the server's open, or None."""
    from raftmq.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL

    raw = Raw(node.port)
    raw.send(SASL_HEADER)
    assert raw.header() == SASL_HEADER
    assert isinstance(raw.performative(), p.SaslMechanisms)
    raw.send(encode_frame(p.SaslInit(mechanism=t.Symbol("PLAIN"),
                                     initial_response=b"\0" + user.encode() + b"\0" + password.encode()),
                          0, frame_type=TYPE_SASL))
    assert raw.performative().code == 0
    raw.send(AMQP_HEADER)
    assert raw.header() == AMQP_HEADER
    raw.send(encode_frame(p.Open(container_id=unique("c"), hostname=f"vhost:{vhost}")))
    assert isinstance(raw.performative(), p.Open)
    return raw


def _expect_close(raw: Raw, condition: str) -> str:
    while True:
        body = raw.performative()
        if isinstance(body, p.Close):
            assert body.error is not None and body.error.condition == condition, body
            return body.error.description


def test_amqp10_connection_and_session_limits(node) -> None:
    """1.0: past vhost max-connections the open is answered with open then close
    amqp:resource-limit-exceeded (2.4.4, rabbit_amqp_reader's condition); past the user's
    max-channels (0-9-1 channels and 1.0 sessions together) a begin is answered with begin then end
    amqp:resource-limit-exceeded (2.5.5) and the connection's first session goes on."""
    vhost = vhost_with(node, max_connections=1)
    held = _raw_login(node, vhost)
    over = _raw_login(node, vhost)
    text = _expect_close(over, "amqp:resource-limit-exceeded")
    assert "connection limit (1) is reached" in text
    over.close()
    held.close()

    user = user_with(node, ["/"], max_channels=2)
    pika_conn = pika.BlockingConnection(params(node, "/", user, "pw"))
    pika_conn.channel()  # one of the two
    raw = _raw_login(node, "/", user, "pw")
    begin = p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10)
    raw.send(encode_frame(begin, 0))
    assert isinstance(raw.performative(), p.Begin)  # the second
    raw.send(encode_frame(begin, 1))
    assert isinstance(raw.performative(), p.Begin)
    end = raw.performative()
    assert isinstance(end, p.End) and end.error.condition == "amqp:resource-limit-exceeded", end
    assert "maximum allowed user limit of 2" in end.error.description
    raw.send(encode_frame(p.End(), 1))
    # Session 0 is alive: an attach on it is answered.
    raw.send(encode_frame(p.Attach(name="x", handle=0, role=False, target=p.Target(address=None),
                                   initial_delivery_count=0), 0))
    assert isinstance(raw.performative(), p.Attach)
    raw.close()
    pika_conn.close()


def test_amqp10_dynamic_queue_counts_against_max_queues(node) -> None:
    """A 1.0 dynamic receiver (3.5.3) declares a queue through the same core command: with
    max-queues 0 it is refused (the attach answered with a null source and a detach with an error),
    with max-queues 1 it works."""
    vhost = vhost_with(node, max_queues=0)
    raw = _raw_login(node, vhost)
    raw.send(encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10), 0))
    assert isinstance(raw.performative(), p.Begin)
    raw.send(encode_frame(p.Attach(name="dyn", handle=0, role=True, source=p.Source(dynamic=True),
                                   target=p.Target()), 0))
    attach = raw.performative()
    assert isinstance(attach, p.Attach) and attach.source is None
    detach = raw.performative()
    assert isinstance(detach, p.Detach) and detach.error.condition == "amqp:precondition-failed"
    assert f"queue limit in vhost '{vhost}' (0) is reached" in detach.error.description
    raw.send(encode_frame(p.Detach(handle=0, closed=True), 0))
    assert call(node.http, "PUT", path("vhost-limits", vhost, "max-queues"), body={"value": 1})[0] == 204
    raw.send(encode_frame(p.Attach(name="dyn2", handle=1, role=True, source=p.Source(dynamic=True),
                                   target=p.Target()), 0))
    attach = raw.performative()
    assert isinstance(attach, p.Attach) and attach.source is not None and attach.source.address
    raw.close()


# -------------------------------------------------------------------------------------------- 0-10

def test_amqp010_connection_and_queue_limits(node) -> None:
    """0-10: past vhost max-connections connection.open is answered with connection.close 320
    connection-forced and the limit's text; past max-queues a queue.declare is an execution
    exception (session ends with the error), and the vhost holds no more queues than the limit."""
    from raftmq.client.amqp010 import ClientError, Connection

    vhost = vhost_with(node, max_connections=1, max_queues=1)

    async def scenario() -> None:
        conn = await Connection.connect([f"127.0.0.1:{node.port}"], vhost=vhost, reconnect_timeout=1.0)
        try:
            with pytest.raises(ClientError) as refused:
                await Connection.connect([f"127.0.0.1:{node.port}"], vhost=vhost, reconnect_timeout=1.0)
            assert "320" in str(refused.value) and "connection limit (1) is reached" in str(refused.value)
            session = await conn.session()
            await session.queue_declare(unique("q"))
            with pytest.raises(ClientError) as over:
                await session.queue_declare(unique("q"))
            assert "queue limit" in str(over.value)
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(call(node.http, "GET", path("queues", vhost))[1]) != 1:
        time.sleep(0.1)
    assert len(call(node.http, "GET", path("queues", vhost))[1]) == 1


def test_amqp010_session_counts_against_max_channels(node) -> None:
    """0-10: with the user's max-channels 1, a second session.attach closes the connection with 320
    connection-forced and the limit's text (as a 0-9-1 channel.open past the limit closes the
    connection); the client's session call fails instead of hanging, and the node logs why."""
    from raftmq.client.amqp010 import ClientError, Connection
    from raftmq.node.limits import LOG_INTERVAL

    user = user_with(node, ["/"], max_channels=1)
    time.sleep(LOG_INTERVAL)  # an earlier test's max-channels refusal must not hold this one's log line back

    async def scenario() -> None:
        conn = await Connection.connect([f"127.0.0.1:{node.port}"], user=user, password="pw",
                                        reconnect_timeout=0.5, stall_timeout=0)
        try:
            await conn.session()
            with pytest.raises(ClientError):  # the client reports the close as ConnectionLost
                await asyncio.wait_for(conn.session(), 10)
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    # Why, from the node's log (the refusal is logged, node/limits.py).
    wanted = f"refused (user max-channels): number of channels opened for user '{user}'"
    deadline = time.monotonic() + 5
    while wanted not in (node.data_dir / "node.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert wanted in (node.data_dir / "node.log").read_text()
