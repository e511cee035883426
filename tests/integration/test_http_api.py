"""RabbitMQ's HTTP management API on a raftmq node: real node process, real HTTP requests.

What RabbitMQ documents for its management plugin (https://www.rabbitmq.com/docs/management and the
HTTP API reference served at /api/index.html) is the specification here: the paths, the JSON field
names, and the user tags (management, policymaker, monitoring, administrator) with vhost
permissions deciding what a user sees and changes.  Every mutating endpoint is refused to
anonymous and wrong-password requests (401) and to users without the tag or permission it needs
(403; RabbitMQ 3.10.8 answers those with 401 -- see ops/http/common.py).
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import quote

import grpc
import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.http_api import GUEST, call, path

pytestmark = pytest.mark.timeout(120)

ADMIN = ("boss", "boss-pw")  # administrator, created through the API
MGMT = ("mgr", "mgr-pw")  # management, permissions on "/" only
MONITOR = ("watcher", "watcher-pw")  # monitoring, no vhost permissions
PLAIN = ("app", "app-pw")  # no tag: AMQP only
OTHER_VHOST = "other"


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def __call__(self, method: str, url_path: str, auth=GUEST, body=None):
        return call(self.base, method, url_path, auth, body)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    http_port, admin_port = free_port(), free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("http-node"),
                      extra_args=["--http-port", str(http_port), "--admin-port", str(admin_port)])
    node.http_port, node.admin_port = http_port, admin_port
    with node:
        api = Api(f"http://127.0.0.1:{http_port}")
        deadline = time.monotonic() + 10
        while api("GET", "/api/overview")[0] != 200:
            assert time.monotonic() < deadline, node.log_tail(20)
            time.sleep(0.1)
        assert api("PUT", path("vhosts", OTHER_VHOST))[0] in (201, 204)
        for (name, password), tags in ((ADMIN, "administrator"), (MGMT, "management"), (MONITOR, "monitoring"),
                                       (PLAIN, "")):
            assert api("PUT", path("users", name), body={"password": password, "tags": tags})[0] in (201, 204)
        for user in (ADMIN[0], MGMT[0], PLAIN[0]):
            status, _ = api("PUT", path("permissions", "/", user), body={"configure": ".*", "write": ".*",
                                                                         "read": ".*"})
            assert status == 201
        assert api("PUT", path("permissions", OTHER_VHOST, ADMIN[0]),
                   body={"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
        yield node


@pytest.fixture
def api(node) -> Api:
    return Api(f"http://127.0.0.1:{node.http_port}")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------ refusals, table-driven

# (method, path, body, the least tag it needs: "management" means any management user with the
# vhost permission; "administrator" an administrator).
MUTATIONS = [
    ("PUT", path("queues", "/", "guarded-q"), {"durable": False}, "management"),
    ("DELETE", path("queues", "/", "guarded-existing"), None, "management"),
    ("DELETE", path("queues", "/", "guarded-existing", "contents"), None, "management"),
    ("POST", path("queues", "/", "guarded-existing", "get"), {"count": 1, "ackmode": "ack_requeue_true",
                                                              "encoding": "auto"}, "management"),
    ("PUT", path("exchanges", "/", "guarded-x"), {"type": "fanout"}, "management"),
    ("DELETE", path("exchanges", "/", "guarded-existing-x"), None, "management"),
    ("POST", path("exchanges", "/", "amq.default", "publish"),
     {"properties": {}, "routing_key": "guarded-existing", "payload": "x", "payload_encoding": "string"},
     "management"),
    ("POST", path("bindings", "/", "e", "guarded-existing-x", "q", "guarded-existing"), {"routing_key": "k"},
     "management"),
    ("DELETE", path("bindings", "/", "e", "guarded-existing-x", "q", "guarded-existing", "bound"), None,
     "management"),
    ("PUT", path("users", "intruder"), {"password": "x", "tags": "administrator"}, "administrator"),
    ("DELETE", path("users", PLAIN[0]), None, "administrator"),
    ("PUT", path("permissions", "/", PLAIN[0]), {"configure": ".*", "write": ".*", "read": ".*"},
     "administrator"),
    ("DELETE", path("permissions", "/", PLAIN[0]), None, "administrator"),
    ("PUT", path("vhosts", "intruders"), None, "administrator"),
    ("DELETE", path("vhosts", OTHER_VHOST), None, "administrator"),
    ("POST", "/api/definitions", {"queues": [{"name": "intruder", "vhost": "/", "durable": True}]},
     "administrator"),
    ("PUT", path("policies", "/", "intruder"), {"pattern": ".*", "definition": {"max-length": 1}}, "policymaker"),
]
READS_NEEDING_TAGS = [
    ("GET", "/api/users", "administrator"),
    ("GET", "/api/permissions", "administrator"),
    ("GET", "/api/definitions", "administrator"),
    ("GET", "/api/nodes", "monitoring"),
]


@pytest.fixture
def guarded(api):
    """The objects the refused requests aim at, so that a request let through would change them."""
    assert api("PUT", path("queues", "/", "guarded-existing"), body={"durable": True})[0] in (201, 204)
    assert api("PUT", path("exchanges", "/", "guarded-existing-x"), body={"type": "direct"})[0] in (201, 204)
    assert api("POST", path("bindings", "/", "e", "guarded-existing-x", "q", "guarded-existing"),
               body={"routing_key": "bound"})[0] == 201
    return api


def _state(api) -> tuple:
    _, queues = api("GET", "/api/queues")
    _, users = api("GET", "/api/users")
    _, definitions = api("GET", "/api/definitions")
    return (sorted((q["name"], q["messages"]) for q in queues), sorted(u["name"] for u in users),
            definitions["permissions"], definitions["vhosts"], definitions["bindings"], definitions["exchanges"])


@pytest.mark.parametrize(("method", "url_path", "body", "needs"), MUTATIONS,
                         ids=[f"{m} {p}" for m, p, _, _ in MUTATIONS])
def test_mutation_refused_without_credentials_or_rights(guarded, method, url_path, body, needs):
    api = guarded
    before = _state(api)
    status, error = api(method, url_path, auth=None, body=body)
    assert status == 401 and error["error"] == "not_authorized", (status, error)
    assert api(method, url_path, auth=("guest", "wrong"), body=body)[0] == 401
    assert api(method, url_path, auth=("nobody", "guest"), body=body)[0] == 401
    status, error = api(method, url_path, auth=PLAIN, body=body)  # no management tag at all
    assert status == 403 and error["reason"] == "Not management user", (status, error)
    # Monitoring users may look at everything but change only vhosts they have permissions in
    # (none here), and have no administrator rights.
    assert api(method, url_path, auth=MONITOR, body=body)[0] == 403
    if needs in ("administrator", "policymaker"):
        assert api(method, url_path, auth=MGMT, body=body)[0] == 403
    assert _state(api) == before  # nothing changed


def test_closing_a_connection_refused_without_rights(api, node):
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        name = next(c["name"] for c in api("GET", "/api/connections")[1]
                    if c["peer_port"] == conn._impl._transport._sock.getsockname()[1])
        url_path = path("connections", name)
        assert api("DELETE", url_path, auth=None)[0] == 401
        assert api("DELETE", url_path, auth=("guest", "wrong"))[0] == 401
        assert api("DELETE", url_path, auth=PLAIN)[0] == 403
        assert api("DELETE", url_path, auth=MONITOR)[0] == 403  # sees it (monitoring), may not close it
        assert api("DELETE", url_path, auth=MGMT)[0] == 404  # another user's: not even visible
        conn.process_data_events(time_limit=0.3)
        assert conn.is_open
    finally:
        conn.close()


@pytest.mark.parametrize(("method", "url_path", "needs"), READS_NEEDING_TAGS,
                         ids=[p for _, p, _ in READS_NEEDING_TAGS])
def test_reads_need_their_tag(api, method, url_path, needs):
    assert api(method, url_path, auth=None)[0] == 401
    assert api(method, url_path, auth=MGMT)[0] == 403
    assert api(method, url_path, auth=ADMIN)[0] == 200
    assert api(method, url_path, auth=MONITOR)[0] == (200 if needs == "monitoring" else 403)


def test_a_management_user_works_in_its_own_vhosts_only(api):
    name = unique("mine")
    assert api("PUT", path("queues", "/", name), auth=MGMT, body={"durable": False})[0] == 201
    assert api("PUT", path("queues", OTHER_VHOST, name), auth=MGMT, body={})[0] == 403
    assert api("PUT", path("queues", OTHER_VHOST, name), auth=ADMIN, body={})[0] == 201
    seen = {(q["vhost"], q["name"]) for q in api("GET", "/api/queues", auth=MGMT)[1]}
    assert ("/", name) in seen and (OTHER_VHOST, name) not in seen
    assert {v["name"] for v in api("GET", "/api/vhosts", auth=MGMT)[1]} == {"/"}
    assert api("GET", path("queues", OTHER_VHOST), auth=MGMT)[0] == 403
    # monitoring: every vhost visible, nothing changeable there
    seen = {(q["vhost"], q["name"]) for q in api("GET", "/api/queues", auth=MONITOR)[1]}
    assert {("/", name), (OTHER_VHOST, name)} <= seen
    assert api("DELETE", path("queues", OTHER_VHOST, name), auth=MONITOR)[0] == 403
    assert api("DELETE", path("queues", OTHER_VHOST, name), auth=ADMIN)[0] == 204


def test_grpc_admin_requires_an_administrator(node):
    from raftmq.ops.admin import admin_stub
    from raftmq.ops.proto import admin_pb2 as pb

    address = f"127.0.0.1:{node.admin_port}"
    calls = [("Status", pb.Empty()), ("ListQueues", pb.Empty()), ("ListUsers", pb.Empty()),
             ("DeclareQueue", pb.DeclareQueueRequest(vhost="/", name="grpc-intruder")),
             ("DeleteQueue", pb.QueueRef(vhost="/", name="grpc-intruder")),
             ("PurgeQueue", pb.QueueRef(vhost="/", name="grpc-intruder")),
             ("DeclareExchange", pb.DeclareExchangeRequest(vhost="/", name="grpc-intruder-x", type="fanout")),
             ("DeleteExchange", pb.ExchangeRef(vhost="/", name="grpc-intruder-x")),
             ("PutUser", pb.PutUserRequest(name="grpc-intruder", password="x", tags=["administrator"])),
             ("DeleteUser", pb.UserRef(name=PLAIN[0])),
             ("SetPermissions", pb.PermissionRequest(user=PLAIN[0], vhost="/", configure=".*", write=".*",
                                                     read=".*")),
             ("ClearPermissions", pb.PermissionRequest(user=PLAIN[0], vhost="/")),
             ("CloseConnection", pb.CloseConnectionRequest(id="x")),
             ("AddMember", pb.MemberRequest(raft_address="127.0.0.1:1")),
             ("RemoveMember", pb.MemberRequest(raft_address="127.0.0.1:1")),
             ("CompactLog", pb.Empty()),
             ("SetLimits", pb.LimitsRequest(scope="vhost", name="/", definition='{"max-queues": 0}')),
             ("ClearLimits", pb.LimitsRequest(scope="user", name="guest", limit="all")),
             ("ListLimits", pb.LimitsRequest(scope="user"))]
    refusals = [(None, "", grpc.StatusCode.UNAUTHENTICATED), ("guest", "wrong", grpc.StatusCode.UNAUTHENTICATED),
                (MGMT[0], MGMT[1], grpc.StatusCode.PERMISSION_DENIED),
                (MONITOR[0], MONITOR[1], grpc.StatusCode.PERMISSION_DENIED)]
    for user, password, code in refusals:
        stub = admin_stub(address, user=user, password=password)
        for method, request in calls:
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, method)(request, timeout=10)
            assert info.value.code() == code, (user, method, info.value.details())
    names = [u.name for u in admin_stub(address).ListUsers(pb.Empty(), timeout=10).users]  # guest: admin
    assert "grpc-intruder" not in names and PLAIN[0] in names
    assert admin_stub(address, user=ADMIN[0], password=ADMIN[1]).Status(pb.Empty(), timeout=10).node_id


# ------------------------------------------------------------------ what the endpoints do

def test_queue_declare_publish_get_purge_delete(api):
    name = unique("q")
    q = path("queues", "/", name)
    assert api("PUT", q, body={"durable": True, "arguments": {"x-max-length": 10}})[0] == 201
    assert api("PUT", q, body={"durable": True, "arguments": {"x-max-length": 10}})[0] == 204  # same again
    status, error = api("PUT", q, body={"durable": False})  # inequivalent: RabbitMQ's 400
    assert status == 400 and error["error"] == "bad_request"
    for i in range(3):
        status, routed = api("POST", path("exchanges", "/", "amq.default", "publish"),
                             body={"properties": {"delivery_mode": 2, "headers": {"n": i}}, "routing_key": name,
                                   "payload": f"m{i}", "payload_encoding": "string"})
        assert (status, routed) == (200, {"routed": True})
    status, routed = api("POST", path("exchanges", "/", "amq.default", "publish"),
                         body={"properties": {}, "routing_key": unique("nowhere"), "payload": "",
                               "payload_encoding": "string"})
    assert (status, routed) == (200, {"routed": False})
    status, view = api("GET", q)
    assert status == 200
    assert (view["messages"], view["messages_ready"], view["messages_unacknowledged"], view["consumers"]) == (3, 3, 0, 0)
    assert view["durable"] is True and view["arguments"] == {"x-max-length": 10} and view["name"] == name

    got = api("POST", q + "/get", body={"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"})[1]
    assert [m["payload"] for m in got] == ["m0", "m1"] and got[0]["properties"]["headers"] == {"n": 0}
    assert got[0]["properties"]["delivery_mode"] == 2 and got[1]["message_count"] == 1
    assert api("GET", q)[1]["messages"] == 3  # requeued
    got = api("POST", q + "/get", body={"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"})[1]
    assert got[0]["payload_encoding"] == "base64" and got[0]["redelivered"] is True
    assert api("GET", q)[1]["messages"] == 2
    assert api("DELETE", q + "/contents")[0] == 204
    assert api("GET", q)[1]["messages"] == 0
    assert api("DELETE", q)[0] == 204
    assert api("GET", q)[0] == 404


def test_names_with_reserved_characters(api):
    for name in ("50%off", "a/b", "sp ace", "q#?&"):
        assert api("PUT", path("queues", "/", name), body={"durable": False})[0] == 201, name
        assert api("GET", path("queues", "/", name))[1]["name"] == name
        assert api("DELETE", path("queues", "/", name))[0] == 204


def test_exchanges_and_bindings(api):
    x, q = unique("x"), unique("q")
    assert api("PUT", path("exchanges", "/", x), body={"type": "topic", "durable": True})[0] == 201
    assert api("PUT", path("exchanges", "/", x), body={"durable": True})[0] == 400  # type missing
    assert api("PUT", path("queues", "/", q), body={})[0] == 201
    binding = path("bindings", "/", "e", x, "q", q)
    status = api("POST", binding, body={"routing_key": "a.*", "arguments": {}})[0]
    assert status == 201
    rows = api("GET", binding)[1]
    assert [(b["source"], b["destination"], b["destination_type"], b["routing_key"]) for b in rows] == [
        (x, q, "queue", "a.*")]
    listed = [b for b in api("GET", "/api/bindings")[1] if b["destination"] == q]
    assert {b["source"] for b in listed} == {"", x}  # the default exchange's binding too
    status, routed = api("POST", path("exchanges", "/", x, "publish"),
                         body={"properties": {}, "routing_key": "a.b", "payload": "hi", "payload_encoding": "string"})
    assert routed == {"routed": True}
    assert api("GET", path("exchanges", "/", x))[1]["type"] == "topic"
    # (the key is quoted once more in the URL, as rabbitmqadmin does)
    assert api("DELETE", binding + "/" + quote(rows[0]["properties_key"], safe=""))[0] == 204
    assert api("GET", binding)[1] == []
    assert api("DELETE", path("exchanges", "/", x))[0] == 204
    assert api("GET", path("exchanges", "/", x))[0] == 404


def test_connections_channels_consumers_and_closing(api, node):
    q = unique("consumed")
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare(q)
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume(q, lambda *a: None, consumer_tag="ctag")
    conns = api("GET", "/api/connections")[1]
    mine = [c for c in conns if c["user"] == "guest" and c["protocol"] == "AMQP 0-9-1"]
    assert len(mine) == 1 and mine[0]["vhost"] == "/" and mine[0]["channels"] == 1
    channels = [c for c in api("GET", "/api/channels")[1] if c["connection_details"]["name"] == mine[0]["name"]]
    assert [(c["number"], c["consumer_count"], c["prefetch_count"]) for c in channels] == [(1, 1, 7)]
    consumers = [c for c in api("GET", "/api/consumers")[1] if c["queue"]["name"] == q]
    assert [(c["consumer_tag"], c["ack_required"], c["prefetch_count"]) for c in consumers] == [("ctag", True, 7)]
    assert api("GET", path("queues", "/", q))[1]["consumers"] == 1
    # a management user sees only its own connections
    assert [c for c in api("GET", "/api/connections", auth=MGMT)[1] if c["user"] == "guest"] == []
    assert api("DELETE", path("connections", mine[0]["name"]), auth=MGMT)[0] == 404
    assert api("DELETE", path("connections", mine[0]["name"]))[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        for _ in range(50):
            conn.process_data_events(time_limit=0.1)
    assert info.value.reply_code == 320


def test_overview_nodes_health(api):
    status, overview = api("GET", "/api/overview")
    assert status == 200
    for key in ("management_version", "rabbitmq_version", "node", "object_totals", "queue_totals", "message_stats",
                "listeners"):
        assert key in overview
    assert overview["object_totals"]["queues"] == len(api("GET", "/api/queues")[1])
    nodes = api("GET", "/api/nodes", auth=MONITOR)[1]
    assert len(nodes) == 1 and nodes[0]["running"] and nodes[0]["raft"]["role"] == "single"
    assert api("GET", path("aliveness-test", "/"))[1] == {"status": "ok"}
    assert api("GET", path("aliveness-test", OTHER_VHOST), auth=MGMT)[0] == 403
    assert api("GET", "/api/health/checks/alarms")[1] == {"status": "ok"}
    assert api("GET", "/api/health/checks/virtual-hosts")[1] == {"status": "ok"}
    assert api("GET", "/api/whoami", auth=MONITOR)[1] == {"name": MONITOR[0], "tags": ["monitoring"]}


def test_definitions_round_trip(api):
    q, x = unique("def-q"), unique("def-x")
    api("PUT", path("queues", "/", q), body={"durable": True, "arguments": {"x-message-ttl": 60000}})
    api("PUT", path("exchanges", "/", x), body={"type": "fanout", "durable": True})
    api("POST", path("bindings", "/", "e", x, "q", q), body={"routing_key": ""})
    exported = api("GET", "/api/definitions")[1]
    assert {"name": q, "vhost": "/", "durable": True, "auto_delete": False,
            "arguments": {"x-message-ttl": 60000}} in exported["queues"]
    assert any(e["name"] == x and e["type"] == "fanout" for e in exported["exchanges"])
    assert {"source": x, "vhost": "/", "destination": q, "destination_type": "queue", "routing_key": "",
            "arguments": {}} in exported["bindings"]
    assert any(u["name"] == ADMIN[0] and u["tags"] == ["administrator"] for u in exported["users"])
    api("DELETE", path("exchanges", "/", x))
    api("DELETE", path("queues", "/", q))
    assert api("POST", "/api/definitions", body=exported)[0] == 204
    again = api("GET", "/api/definitions")[1]
    for key in ("queues", "exchanges", "bindings", "users", "permissions", "vhosts"):
        assert sorted(map(repr, again[key])) == sorted(map(repr, exported[key])), key
    # a user imported with its hash still logs in with its password
    assert api("GET", "/api/whoami", auth=ADMIN)[0] == 200


def test_definitions_with_rabbitmq_password_hash(api):
    # RabbitMQ 3.10.8's export of guest/guest (rabbit_password_hashing_sha256)
    definitions = {"users": [{"name": "imported", "password_hash": "/VaB3CSD82NaBvB3YevsTjgrX0IXTdB2hrOJw5WHv1Q0j79m",
                              "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"],
                              "limits": {}}],
                   "permissions": [{"user": "imported", "vhost": "/", "configure": "", "write": "", "read": ".*"}],
                   "policies": [], "parameters": []}
    assert api("POST", "/api/definitions", body=definitions)[0] == 204
    assert api("GET", "/api/whoami", auth=("imported", "guest"))[1] == {"name": "imported", "tags": ["management"]}
    assert api("GET", "/api/whoami", auth=("imported", "other"))[0] == 401
    refused = api("POST", "/api/definitions", body={"policies": [{"name": "p", "vhost": "/", "pattern": ".*",
                                                                  "definition": {}}]})
    assert refused[0] == 400


def test_admin_cli_credentials(node):
    from tests.support.cli import raftmq

    address = f"127.0.0.1:{node.admin_port}"
    done = raftmq("admin", "--address", address, "--json", "users", timeout=30)  # guest/guest by default
    assert done.returncode == 0 and ADMIN[0] in done.stdout, done.stderr
    done = raftmq("admin", "--address", address, "--user", MGMT[0], "--password", MGMT[1], "queues", timeout=30)
    assert done.returncode == 1 and "PERMISSION_DENIED" in done.stderr
    done = raftmq("admin", "--address", address, "--password", "wrong", "queues", timeout=30)
    assert done.returncode == 1 and "UNAUTHENTICATED" in done.stderr
    done = raftmq("admin", "--address", address, "--user", ADMIN[0], "--password", ADMIN[1], "put-user",
                  "cli-made", "--password", "cli-pw", "--tag", "management", timeout=30)
    assert done.returncode == 0, done.stderr
    assert call(f"http://127.0.0.1:{node.http_port}", "GET", "/api/whoami", ("cli-made", "cli-pw"))[1] == {
        "name": "cli-made", "tags": ["management"]}


def test_https_with_http_tls_cert(tmp_path):
    """http_tls_cert / http_tls_key: the API over TLS only (a plaintext request gets no answer)."""
    import ssl
    import urllib.error
    import urllib.request

    from tests.integration.test_tls import self_signed
    from tests.support.http_api import basic_auth

    cert, key = self_signed(tmp_path)
    port = free_port()
    with RaftmqNode(tmp_path / "n", extra_args=["--http-port", str(port)],
                    env={"RAFTMQ_HTTP_TLS_CERT": str(cert), "RAFTMQ_HTTP_TLS_KEY": str(key)}):
        context = ssl.create_default_context(cafile=str(cert))
        request = urllib.request.Request(f"https://localhost:{port}/api/whoami", headers=basic_auth(GUEST))
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(request, context=context, timeout=5) as response:
                    assert response.status == 200 and b'"administrator"' in response.read()
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://localhost:{port}/api/whoami", timeout=5)


def test_the_page_is_a_login_form_and_the_api_needs_a_login(api):
    """The UI's page and script hold no data (issue 35: a login form, then the API with a session
    cookie, tests/integration/test_ui_session.py and test_ui_browser.py): served to anyone, with a
    CSP that allows scripts of this origin only; every /api path still needs a management login."""
    for auth in (None, GUEST, PLAIN):
        status, page = api("GET", "/", auth=auth)
        assert status == 200 and 'id="login-form"' in page, (auth, status)
    assert api("GET", "/static/app.js", auth=None)[0] == 200
    assert api("GET", "/static/other.js", auth=None)[0] == 404
    assert api("GET", "/api/overview", auth=None)[0] == 401
    assert api("GET", "/api/overview", auth=PLAIN)[0] == 403


def test_admin_channel_recovers_after_each_kind_of_error(node, api):
    """A refused command closes the admin's channel in the state machine (a channel exception) or
    not (530 unknown vhost, a connection-level code); either way the next command must work.  Before
    ops/control.py reopened the channel after every error, the gRPC command after a 406 failed with
    "CHANNEL_ERROR - channel 1 is not open" (seen on main's node, 1847d3e)."""
    from raftmq.ops.admin import admin_stub
    from raftmq.ops.proto import admin_pb2 as pb

    stub = admin_stub(f"127.0.0.1:{node.admin_port}")
    name = unique("recover")
    stub.DeclareQueue(pb.DeclareQueueRequest(vhost="/", name=name, durable=True), timeout=10)
    for bad in (pb.DeclareQueueRequest(vhost="/", name=name, durable=False),  # 406 inequivalent
                pb.DeclareQueueRequest(vhost="no-such-vhost", name=name)):  # 530
        with pytest.raises(grpc.RpcError):
            stub.DeclareQueue(bad, timeout=10)
        assert stub.PurgeQueue(pb.QueueRef(vhost="/", name=name), timeout=10).count == 0
    assert api("PUT", path("queues", "no-such-vhost", name), body={})[0] == 404
    assert api("PUT", path("queues", "/", name), body={"durable": False})[0] == 400
    assert api("DELETE", path("queues", "/", name))[0] == 204


def test_importing_guest_keeps_it_loopback_only(api, node):
    """RabbitMQ's exports list guest; importing one must not let guest in from elsewhere."""
    from raftmq.ops.admin import admin_stub
    from raftmq.ops.proto import admin_pb2 as pb

    definitions = {"users": [{"name": "guest", "password_hash": "/VaB3CSD82NaBvB3YevsTjgrX0IXTdB2hrOJw5WHv1Q0j79m",
                              "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"]}],
                   "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}
    assert api("POST", "/api/definitions", body=definitions)[0] == 204
    users = admin_stub(f"127.0.0.1:{node.admin_port}").ListUsers(pb.Empty(), timeout=10).users
    guest = next(u for u in users if u.name == "guest")
    assert guest.source == "cluster" and guest.loopback_only
    assert api("GET", "/api/whoami")[1] == {"name": "guest", "tags": ["administrator"]}


def test_list_parameters_paging_sorting_filtering(api):
    names = [unique("page") for _ in range(5)]
    for i, name in enumerate(names):
        api("PUT", path("queues", "/", name), body={"durable": False})
        for _ in range(i):
            api("POST", path("exchanges", "/", "amq.default", "publish"),
                body={"properties": {}, "routing_key": name, "payload": "x", "payload_encoding": "string"})
    status, page = api("GET", "/api/queues?page=2&page_size=2&name=page-&sort=messages&sort_reverse=true")
    assert status == 200, page
    assert (page["page"], page["page_size"], page["page_count"], page["filtered_count"]) == (2, 2, 3, 5)
    assert [q["messages"] for q in page["items"]] == [2, 1]
    rows = api("GET", "/api/queues?columns=name,messages&use_regex=true&name=^page-&sort=name")[1]
    assert [r["name"] for r in rows] == sorted(names) and all(set(r) == {"name", "messages"} for r in rows)
    assert api("GET", "/api/queues?page=9&page_size=2")[0] == 400


def test_more_read_endpoints(api):
    x, q = unique("ex"), unique("eq")
    api("PUT", path("exchanges", "/", x), body={"type": "direct"})
    api("PUT", path("queues", "/", q), body={})
    api("POST", path("bindings", "/", "e", x, "q", q), body={"routing_key": "k"})
    api("POST", path("bindings", "/", "e", "amq.direct", "e", x), body={"routing_key": "k2"})
    source = api("GET", path("exchanges", "/", x, "bindings", "source"))[1]
    assert [(b["destination"], b["routing_key"]) for b in source] == [(q, "k")]
    destination = api("GET", path("exchanges", "/", x, "bindings", "destination"))[1]
    assert [(b["source"], b["destination_type"], b["routing_key"]) for b in destination] == [
        ("amq.direct", "exchange", "k2")]
    assert {p["vhost"] for p in api("GET", path("users", ADMIN[0], "permissions"))[1]} == {"/", OTHER_VHOST}
    assert MGMT[0] in {p["user"] for p in api("GET", path("vhosts", "/", "permissions"))[1]}
    assert api("GET", path("users", MGMT[0], "permissions"), auth=MGMT)[0] == 403
    listener = api("GET", path("health", "checks", "port-listener", str(api.base.rsplit(":", 1)[1])))
    assert listener[1]["status"] == "ok", listener
    assert api("GET", path("health", "checks", "port-listener", "1"))[0] == 503
    assert api("GET", "/api/healthchecks/node")[1] == {"status": "ok"}
    assert api("GET", "/api/cluster-name")[1]["name"]


def test_trailing_slash_paths_answer_like_rabbitmq(api):
    """RabbitMQ 3.10.8 answers any /api path with a trailing slash as without it (measured: 200 for
    /api/queues/, /api/queues/%2F/, /api/overview/, /api/queues/%2F/NAME/) and 404 for an empty
    vhost segment (/api/queues//).  Celery Flower relies on it: for the default vhost it asks
    ``urljoin(broker_api, "queues//")`` = /api/queues/ (tests/integration/test_flower.py)."""
    q = unique("slash")
    assert api("PUT", path("queues", "/", q) + "/", body={"durable": True})[0] == 201
    assert api("GET", "/api/queues/", auth=None)[0] == 401  # the login is still required
    for url in ("/api/queues", path("queues", "/"), path("queues", "/", q)):
        status, body = api("GET", url + "/")
        assert status == 200, (url, body)
        if isinstance(body, list):
            assert q in {row["name"] for row in body}
        else:
            assert body["name"] == q
    assert api("GET", "/api/overview/")[1]["node"] == api("GET", "/api/overview")[1]["node"]
    assert api("GET", "/api/queues//")[0] == 404
    assert api("DELETE", path("queues", "/", q) + "/")[0] == 204
    assert api("GET", path("queues", "/", q))[0] == 404


def test_management_changes_are_authorized_by_the_amqp_rule_of_the_operation(api):
    """A management user's changes go through node/core/access.py, the rule AMQP clients meet: declaring
    a queue needs configure on it, and with a dead-letter exchange also read on the queue and write on
    that exchange (RabbitMQ's rule, tests/integration/test_permissions.py); a purge needs read.  The
    refusal is 403 with the AMQP refusal's text, and nothing changes."""
    user = (unique("scoped"), "scoped-pw")
    assert api("PUT", path("users", user[0]), body={"password": user[1], "tags": "management"})[0] in (201, 204)
    # configure and read on scoped-*, write on nothing but scoped-*: amq.direct is not writable.
    assert api("PUT", path("permissions", "/", user[0]),
               body={"configure": "^scoped-", "write": "^scoped-", "read": "^scoped-"})[0] == 201
    own, dead_lettered = unique("scoped-q"), unique("scoped-dlq")
    assert api("PUT", path("queues", "/", own), auth=user, body={"durable": False})[0] == 201
    status, error = api("PUT", path("queues", "/", dead_lettered), auth=user,
                        body={"durable": False, "arguments": {"x-dead-letter-exchange": "amq.direct"}})
    assert status == 403 and "exchange 'amq.direct'" in error["reason"], (status, error)
    assert api("GET", path("queues", "/", dead_lettered))[0] == 404  # not declared
    foreign = unique("foreign-q")
    assert api("PUT", path("queues", "/", foreign), body={"durable": False})[0] == 201
    status, error = api("DELETE", path("queues", "/", foreign, "contents"), auth=user)
    assert status == 403 and f"queue '{foreign}'" in error["reason"], (status, error)
    for name in (own, foreign):
        assert api("DELETE", path("queues", "/", name))[0] == 204
    assert api("DELETE", path("users", user[0]))[0] == 204


def test_queue_message_stats_count_and_rate_deliveries_and_acks(api, node):
    """A queue's message_stats as RabbitMQ's (issue 35): publish, deliver_get and ack totals with
    ``*_details.rate`` per second (ops/http/rates.py samples every 5 s, so the rates are waited
    for, not timed): 6 published, 1 got without ack, 5 delivered to a consumer (prefetch 4, one
    more once 4 are acked), 4 acked."""
    name = unique("rates")
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = conn.channel()
        ch.queue_declare(name)
        for i in range(6):
            ch.basic_publish("", name, f"m{i}".encode())
        assert ch.basic_get(name, auto_ack=True)[2] == b"m0"
        ch.basic_qos(prefetch_count=4)
        got: list = []
        ch.basic_consume(name, lambda c, m, p, b: got.append(m.delivery_tag))
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        assert len(got) >= 4
        for tag in got[:4]:
            ch.basic_ack(tag)
        conn.process_data_events(time_limit=0.2)

        def counted_and_rated():
            stats = api("GET", path("queues", "/", name))[1]["message_stats"]
            done = stats["deliver_get_details"]["rate"] > 0 and stats["ack_details"]["rate"] > 0
            return stats if done else None

        deadline = time.monotonic() + 15
        while (stats := counted_and_rated()) is None:
            assert time.monotonic() < deadline, api("GET", path("queues", "/", name))[1]["message_stats"]
            time.sleep(0.2)
        assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (6, 6, 4)
        assert stats["publish_details"]["rate"] >= 0
    finally:
        conn.close()
