"""RabbitMQ 4 compatibility (issue 37) with RabbitMQ 4's own Python client, rabbitmq-amqp-python-client
1.0.1, unchanged, against one node with ``amqp10_rabbitmq_compat`` and the HTTP API on: each test runs
a scenario of amqp10_rabbitmq4_compat.py in a subprocess and checks what the client saw.

The client comes from the test venv when installed there (pyproject's ``test`` extra), else from the
pip cache of test_amqp10_management.py (the test skips when neither can be had).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.helpers import http_node
from tests.integration.test_amqp10_management import rabbitmq_client_dir as _cached_client  # noqa: F401
from tests.support.http_api import call

SCRIPT = Path(__file__).with_name("amqp10_rabbitmq4_compat.py")


@pytest.fixture(scope="module")
def compat_node(tmp_path_factory):
    with http_node(tmp_path_factory.mktemp("amqp10-rmq4"), rabbitmq_compat=True) as node:
        yield node


@pytest.fixture(scope="module")
def client_path(request) -> str:
    """PYTHONPATH for the subprocess: empty when the venv has the client, else the pip cache."""
    if importlib.util.find_spec("rabbitmq_amqp_python_client") is not None:
        return ""
    return str(request.getfixturevalue("_cached_client"))


def run(scenario: str, uri: str, client_path: str, timeout: float = 90) -> dict:
    env = {**os.environ}
    if client_path:
        env["PYTHONPATH"] = client_path
    result = subprocess.run([sys.executable, str(SCRIPT), scenario, uri], capture_output=True, text=True,
                            timeout=timeout, env=env, cwd=client_path or None)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def uri(node, user: str = "guest", password: str = "guest", vhost: str = "") -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{node.port}/{vhost}"


def test_unbind_of_a_binding_whose_queue_or_exchange_is_gone_is_204(compat_node, client_path) -> None:
    """RabbitMQ 4's rabbit_amqp_management: DELETE /bindings/... answers 204 when no binding matches
    (its queue or exchange deleted); the client's unbind raises on anything else."""
    assert run("unbind-gone", uri(compat_node), client_path) == {"queue": "ok", "exchange": "ok"}


def test_an_unknown_vhost_makes_dial_raise(compat_node, client_path) -> None:
    """The vhost is refused before open, the socket closed (RabbitMQ 4's reader does the same): the
    client's dial() raises ConnectionException instead of reconnecting for ever (its recovery is on)."""
    seen = run("dial", uri(compat_node, vhost=f"nope-{uuid.uuid4().hex[:8]}"), client_path)
    assert seen["dialed"] is False and seen["raised"] == "ConnectionException", seen


def test_a_forbidden_vhost_makes_dial_raise(compat_node, client_path) -> None:
    """A vhost that exists but the user has no permissions on is refused alike (guest created it, so
    it had full permissions there, RabbitMQ's creator rule: they are taken away first)."""
    vhost = f"other-{uuid.uuid4().hex[:8]}"
    assert call(compat_node.http, "PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert call(compat_node.http, "DELETE", f"/api/permissions/{vhost}/guest")[0] == 204
    seen = run("dial", uri(compat_node, vhost=vhost), client_path)
    assert seen["dialed"] is False and seen["raised"] == "ConnectionException", seen


def test_a_new_vhost_is_usable_by_the_managed_user_who_created_it(compat_node, client_path) -> None:
    """PUT /api/vhosts gives its creator full permissions there (RabbitMQ's rabbit_vhost:add), so the
    creator can connect at once; another user still cannot."""
    admin, other = f"admin-{uuid.uuid4().hex[:6]}", f"user-{uuid.uuid4().hex[:6]}"
    for name, tags in ((admin, "administrator"), (other, "")):
        assert call(compat_node.http, "PUT", f"/api/users/{name}", body={"password": "pw", "tags": tags})[0] in (201, 204)
    vhost = f"mine-{uuid.uuid4().hex[:8]}"
    assert call(compat_node.http, "PUT", f"/api/vhosts/{vhost}", auth=(admin, "pw"))[0] == 201
    status, perms = call(compat_node.http, "GET", f"/api/vhosts/{vhost}/permissions")
    assert status == 200 and [(p["user"], p["configure"], p["write"], p["read"]) for p in perms] == \
        [(admin, ".*", ".*", ".*")]
    assert run("dial", uri(compat_node, admin, "pw", vhost), client_path)["dialed"] is True
    seen = run("dial", uri(compat_node, other, "pw", vhost), client_path)
    assert seen["dialed"] is False and seen["raised"] == "ConnectionException", seen


def test_modified_outcome_annotations_on_requeue_and_discard(compat_node, client_path) -> None:
    """3.4.5 modified, message-annotations merged into the message: requeue_with_annotations (released
    with annotations) gives the message back with its own annotation and the new one; the client's
    discard_with_annotations (undeliverable-here) dead-letters it with them."""
    seen = run("annotations", uri(compat_node), client_path)
    assert seen["requeued"]["x-opt-reason"] == "retry-later" and seen["requeued"]["x-opt-kept"] == "yes"
    assert seen["requeued_body"] == "first"
    assert seen["dead"]["x-opt-why"] == "poison" and seen["dead"]["x-opt-reason"] == "retry-later"
    assert seen["left"] == [0, 0]  # the queue emptied by the discard, the dead-letter queue by the read


def test_x_local_random_routes_each_message_to_one_queue(compat_node, client_path) -> None:
    """RabbitMQ 4's x-local-random: declared through /management, queues bound with an empty key, each
    of 30 messages accepted and in exactly one queue; every queue gets some (hash of the message id)."""
    seen = run("local-random", uri(compat_node), client_path)
    assert seen["outcomes"] == ["36"]  # Delivery.ACCEPTED (0x24)
    assert sum(seen["counts"]) == 30 and all(n > 0 for n in seen["counts"]), seen


def test_direct_reply_to(compat_node, client_path) -> None:
    """RabbitMQ 4.2's direct reply-to (the client requires the server to announce 4.2): a dynamic source
    with capability rabbitmq:volatile-queue gets /queues/amq.rabbitmq.reply-to.<id>; a publisher on
    another connection sends to it, the consumer receives in order."""
    seen = run("direct-reply", uri(compat_node), client_path)
    assert seen["address"].startswith("/queues/amq.rabbitmq.reply-to.")
    assert seen["outcomes"] == ["36"] and seen["got"] == [f"r{i}" for i in range(5)]


def test_the_announced_version(compat_node, client_path) -> None:
    """Product RabbitMQ 4.2.0 (the 1.0 features of 4.2 the client gates on that raftmq has: direct
    reply-to), raftmq's own version beside it."""
    seen = run("version", uri(compat_node), client_path)
    assert seen["product"] == "RabbitMQ" and seen["version"] == "4.2.0" and "raftmq-version" in seen
