"""Issue 31 leftovers, on one private node with real clients: all-or-nothing definitions against
``max-queues``, the limits through ``raftmq admin`` (gRPC), and quieter refusals.

* Definitions (ops/http/limits.py ``check_queue_limits``): as RabbitMQ's rabbit_definitions
  ``validate_limits`` ("Import aborted!"), a file whose queues would pass a vhost's ``max-queues`` --
  the file's own limits included, queues that exist already not counted again -- is refused with 400
  and the reason before anything of it is imported.
* ``raftmq admin set-vhost-limits / clear-vhost-limits / list-vhost-limits / set-user-limits /
  clear-user-limits / list-user-limits``: rabbitmqctl's commands and argument forms (a JSON object);
  set_vhost_limits replaces the vhost's limits (rabbit_vhost_limit:set), set_user_limits adds to the
  user's (internal_user:update_limits add); administrators only, like every admin call.
* Refused logins are logged at most once per ``login_refusal_log_interval`` (1 s) per node, the next
  line counting the ones not logged (node/auth.py), and counted (status ``logins_refused``, metric
  ``raftmq_logins_refused_total``); the audit history records them, bounded per address
  (node/audit.py, issue 36: tests/integration/test_audit_who.py).  1.0 deliveries rejected past the element budget and frames that do not
  decode are counted in ``raftmq_amqp10_limit_refusals_total`` (kinds "undecodable delivery",
  "undecodable frame").
"""

from __future__ import annotations

import json
import re
import struct
import time
import urllib.request
import uuid

import pika
import pika.exceptions as pex
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from raftmq.protocol.amqp10 import performatives as p
from tests.integration.test_amqp10_body_bounds import attached_sender, outcome, send_message
from tests.integration.test_amqp10_raw import Raw
from tests.integration.test_login_hardening import sasl_login
from tests.support.cli import raftmq
from tests.support.http_api import call, path

pytestmark = pytest.mark.timeout(180)

MONITOR = ("lim-monitor", "monitor-pw")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("limits-cli")
    http_port, admin_port, metrics_port = free_port(), free_port(), free_port()
    config = directory / "node.toml"
    config.write_text(f"http_port = {http_port}\nadmin_port = {admin_port}\nmetrics_port = {metrics_port}\n"
                      '[users.guest]\npassword = "guest"\ntags = ["administrator"]\n')
    n = RaftmqNode(directory / "data", config=config)
    n.http = f"http://127.0.0.1:{http_port}"
    n.admin = f"127.0.0.1:{admin_port}"
    n.metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    with n:
        deadline = time.monotonic() + 15
        while call(n.http, "GET", "/api/overview")[0] != 200:
            assert time.monotonic() < deadline, n.log_tail(20)
            time.sleep(0.1)
        assert call(n.http, "PUT", path("users", MONITOR[0]), body={"password": MONITOR[1],
                                                                     "tags": "monitoring"})[0] == 201
        yield n


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def queues_of(node, vhost: str) -> set[str]:
    status, rows = call(node.http, "GET", path("queues", vhost))
    assert status == 200, rows
    return {q["name"] for q in rows}


def admin(node, *args: str, user: tuple[str, str] = ("guest", "guest")):
    return raftmq("admin", "--address", node.admin, "--user", user[0], "--password", user[1], *args, timeout=30)


def admin_ok(node, *args: str) -> str:
    done = admin(node, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _json_call(node, *args: str) -> str:
    done = raftmq("admin", "--address", node.admin, "--json", *args, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def metric(node, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(node.metrics, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line[len(name):line.index("}")]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} {labels} in the metrics")


# ------------------------------------------------------------------------- 1. definitions

def test_definitions_past_max_queues_import_nothing(node) -> None:
    """A file whose queues pass a vhost's max-queues is 400 with the reason and imports nothing --
    not its vhosts, users, exchanges nor the queues before the one that would pass the limit
    (RabbitMQ's rabbit_definitions validate_limits).  Queues that exist already are not counted
    again, a name listed twice counts once, the file's own limits (vhosts[].limits, a new vhost's
    too) are the ones checked, and a file that fits is imported."""
    vhost = unique("defs")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    assert call(node.http, "PUT", path("vhost-limits", vhost, "max-queues"), body={"value": 3})[0] == 204
    assert call(node.http, "PUT", path("queues", vhost, "old"), body={"durable": True})[0] in (201, 204)
    new_vhost, new_user, new_exchange = unique("defs-new"), unique("defs-user"), unique("defs-x")

    def queue(vhost_name: str, name: str) -> dict:
        return {"vhost": vhost_name, "name": name, "durable": True, "auto_delete": False, "arguments": {}}

    # 1 existing + 3 new > 3: refused whole.
    over = {"vhosts": [{"name": new_vhost}], "users": [{"name": new_user, "password": "pw", "tags": ""}],
            "exchanges": [{"vhost": vhost, "name": new_exchange, "type": "fanout", "durable": True}],
            "queues": [queue(vhost, "old"), queue(vhost, "a"), queue(vhost, "b"), queue(vhost, "c")]}
    status, answer = call(node.http, "POST", "/api/definitions", body=over)
    assert status == 400, answer
    assert f"vhost '{vhost}'" in answer["reason"] and "limit of 3" in answer["reason"], answer
    assert queues_of(node, vhost) == {"old"}
    assert call(node.http, "GET", path("vhosts", new_vhost))[0] == 404
    assert call(node.http, "GET", path("users", new_user))[0] == 404
    assert call(node.http, "GET", path("exchanges", vhost, new_exchange))[0] == 404

    # The file's own limit of a new vhost: 3 queues past its max-queues 2.
    own = {"vhosts": [{"name": new_vhost, "limits": {"max-queues": 2}}],
           "queues": [queue(new_vhost, "x"), queue(new_vhost, "y"), queue(new_vhost, "z")]}
    status, answer = call(node.http, "POST", "/api/definitions", body=own)
    assert status == 400 and f"vhost '{new_vhost}'" in answer["reason"], answer
    assert call(node.http, "GET", path("vhosts", new_vhost))[0] == 404

    # Fits: "old" exists, "a" twice counts once -> 1 + 2 = 3.
    fits = {"queues": [queue(vhost, "old"), queue(vhost, "a"), queue(vhost, "a"), queue(vhost, "b")]}
    assert call(node.http, "POST", "/api/definitions", body=fits)[0] in (201, 204)
    assert queues_of(node, vhost) == {"old", "a", "b"}

    # The file raises the limit it needs: imported, limit and queues.
    raised = {"vhosts": [{"name": vhost, "limits": {"max-queues": 5}}],
              "queues": [queue(vhost, "c"), queue(vhost, "d")]}
    assert call(node.http, "POST", "/api/definitions", body=raised)[0] in (201, 204)
    assert queues_of(node, vhost) == {"old", "a", "b", "c", "d"}
    assert call(node.http, "GET", path("vhost-limits", vhost))[1] == [{"vhost": vhost, "value": {"max-queues": 5}}]


# ------------------------------------------------------------------------------- 2. the CLI

def test_cli_vhost_limits(node) -> None:
    """set-vhost-limits replaces the vhost's limits with the JSON object (rabbitmqctl
    set_vhost_limits), list-vhost-limits shows them as JSON, the HTTP API sees the same replicated
    limits, a 0-9-1 declare past max-queues is refused with 406 (the limit is in force), and
    clear-vhost-limits clears them all."""
    vhost = unique("cli")
    assert call(node.http, "PUT", path("vhosts", vhost))[0] == 201
    admin_ok(node, "set-vhost-limits", "--vhost", vhost, '{"max-queues": 1, "max-connections": 5}')
    assert call(node.http, "GET", path("vhost-limits", vhost))[1] == [
        {"vhost": vhost, "value": {"max-connections": 5, "max-queues": 1}}]
    admin_ok(node, "set-vhost-limits", "-p", vhost, '{"max-queues": 1}')  # replaces: max-connections goes
    listed = json.loads(_json_call(node, "list-vhost-limits", "--vhost", vhost))["limits"]
    assert listed == [{"scope": "vhost", "name": vhost, "value": '{"max-queues": 1}'}]
    assert vhost in admin_ok(node, "list-vhost-limits")  # every vhost with limits

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port, vhost,
                                                             pika.PlainCredentials("guest", "guest")))
    try:
        ch = conn.channel()
        ch.queue_declare("first")
        with pytest.raises(pex.ChannelClosedByBroker) as refused:
            ch.queue_declare("second")
        assert refused.value.reply_code == 406 and "queue limit in vhost" in refused.value.reply_text
    finally:
        conn.close()

    admin_ok(node, "clear-vhost-limits", "--vhost", vhost)
    assert call(node.http, "GET", path("vhost-limits", vhost))[1] == []


def test_cli_user_limits(node) -> None:
    """set-user-limits adds the JSON object's limits to the user's others (rabbitmqctl
    set_user_limits), clear-user-limits clears one limit or ``all``, list-user-limits shows them; the
    HTTP API sees the same; a user of the configuration file (guest) may have limits too."""
    user = unique("cli-user")
    assert call(node.http, "PUT", path("users", user), body={"password": "pw", "tags": ""})[0] == 201
    admin_ok(node, "set-user-limits", user, '{"max-connections": 4}')
    admin_ok(node, "set-user-limits", user, '{"max-channels": 8}')
    assert call(node.http, "GET", path("user-limits", user))[1] == [
        {"user": user, "value": {"max-channels": 8, "max-connections": 4}}]
    admin_ok(node, "clear-user-limits", user, "max-channels")
    listed = json.loads(_json_call(node, "list-user-limits", "--user", user))["limits"]
    assert listed == [{"scope": "user", "name": user, "value": '{"max-connections": 4}'}]
    admin_ok(node, "clear-user-limits", user, "all")
    assert call(node.http, "GET", path("user-limits", user))[1] == []

    admin_ok(node, "set-user-limits", "guest", '{"max-channels": 100}')
    assert '{"max-channels": 100}' in admin_ok(node, "list-user-limits")
    admin_ok(node, "clear-user-limits", "guest", "all")


def test_cli_limits_refusals(node) -> None:
    """Not JSON, not an object, an unknown limit name or a value that is not an integer is
    INVALID_ARGUMENT; an unknown vhost or user NOT_FOUND; a user without the administrator tag
    PERMISSION_DENIED (the HTTP API's rules, rabbit_mgmt_wm_limit); nothing changes."""
    cases = [(("set-vhost-limits", "{max-queues: 1}"), "INVALID_ARGUMENT"),
             (("set-vhost-limits", "[1]"), "INVALID_ARGUMENT"),
             (("set-vhost-limits", '{"max-channels": 1}'), "INVALID_ARGUMENT"),
             (("set-vhost-limits", '{"max-queues": "ten"}'), "INVALID_ARGUMENT"),
             (("set-vhost-limits", "--vhost", unique("nope"), '{"max-queues": 1}'), "NOT_FOUND"),
             (("set-user-limits", unique("nobody"), '{"max-channels": 1}'), "NOT_FOUND"),
             (("clear-user-limits", "guest", "max-queues"), "INVALID_ARGUMENT")]
    for args, code in cases:
        done = admin(node, *args)
        assert done.returncode == 1 and code in done.stderr, (args, done.stdout, done.stderr)
    done = admin(node, "set-vhost-limits", '{"max-queues": 0}', user=MONITOR)
    assert done.returncode == 1 and "PERMISSION_DENIED" in done.stderr, done.stderr
    assert call(node.http, "GET", path("vhost-limits", "/"))[1] == []


# --------------------------------------------------------------------- 3. quieter refusals

LOGIN_LINE = "login refused for"


def test_login_flood_is_logged_once_a_second_and_counted(node) -> None:
    """A flood of wrong passwords (0-9-1 and 1.0 SASL PLAIN) writes at most one log line per second
    (login_refusal_log_interval), not one per attempt; the line after a quiet second counts the
    ones not logged, so the lines and their counts add up to the attempts; status.json
    ``logins_refused`` and ``raftmq_logins_refused_total`` count every one."""
    before = node.status()["logins_refused"]
    offset = node.log_path.stat().st_size
    attempts, start = 0, time.monotonic()
    wrong = pika.ConnectionParameters("127.0.0.1", node.port, "/", pika.PlainCredentials("guest", "wrong"),
                                      connection_attempts=1, socket_timeout=5)
    for _ in range(60):
        with pytest.raises(pex.ProbableAuthenticationError):
            pika.BlockingConnection(wrong)
        attempts += 1
    for _ in range(60):
        code, _rest = sasl_login("127.0.0.1", node.port, "PLAIN", b"\0nobody\0wrong")
        assert code == 1  # 5.3.3.6 auth
        attempts += 1
    elapsed = time.monotonic() - start
    time.sleep(1.2)  # past the interval: the next refusal writes the line with the count
    code, _rest = sasl_login("127.0.0.1", node.port, "PLAIN", b"\0guest\0wrong")
    assert code == 1
    attempts += 1
    deadline = time.monotonic() + 5
    while node.status()["logins_refused"] - before < attempts:
        assert time.monotonic() < deadline, node.status()
        time.sleep(0.1)
    assert node.status()["logins_refused"] - before == attempts
    assert metric(node, "raftmq_logins_refused_total") >= attempts

    lines = [line for line in node.log_path.read_bytes()[offset:].decode(errors="replace").splitlines()
             if LOGIN_LINE in line]
    print(f"{attempts} refused logins in {elapsed:.1f} s: {len(lines)} log lines")
    assert 2 <= len(lines) <= elapsed / 1.0 + 2, lines
    suppressed = sum(int(m.group(1)) for line in lines if (m := re.search(r"\((\d+) more since", line)))
    assert len(lines) + suppressed == attempts, lines
    assert "guest" in lines[-1] and "more since the last report" in lines[-1], lines[-1]


def test_amqp10_undecodable_deliveries_and_frames_are_counted(node) -> None:
    """A 1.0 delivery whose application-properties pass amqp10_max_message_elements is rejected
    (3.2.5, amqp:decode-error) and counted as "undecodable delivery"; a frame whose performative does
    not decode closes the connection with amqp:decode-error (2.8.15) and is counted as "undecodable
    frame" (raftmq_amqp10_limit_refusals_total)."""
    kind = "raftmq_amqp10_limit_refusals_total"
    deliveries = metric(node, kind, kind="undecodable delivery")
    frames = metric(node, kind, kind="undecodable frame")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.port))
    conn.channel().queue_declare("decode-count", durable=True)
    conn.close()
    raw = attached_sender(node, "/queues/decode-count")
    try:
        big = p.ApplicationProperties({f"k{i}": i for i in range(40_000)}).encode() + p.Data(b"x").encode()
        for delivery_id in (0, 1):
            send_message(raw, delivery_id, big)
            state = outcome(raw)
            assert isinstance(state, p.Rejected) and state.error.condition == "amqp:decode-error", state
    finally:
        raw.close()

    raw = Raw(node.port)
    try:
        raw.login("bad-frame")
        body = b"\x00\x53\x11\xff"  # a begin whose fields start with an unknown format code
        raw.send(struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body)
        while not isinstance(closed := raw.performative(), p.Close):
            pass
        assert closed.error.condition == "amqp:decode-error", closed
    finally:
        raw.close()
    assert metric(node, kind, kind="undecodable delivery") == deliveries + 2
    assert metric(node, kind, kind="undecodable frame") == frames + 1
