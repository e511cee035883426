"""The /management node (RabbitMQ 4's HTTP-over-AMQP v2) with python-qpid-proton, and RabbitMQ 4's own
Python client, rabbitmq-amqp-python-client, running unchanged against a node with
``amqp10_rabbitmq_compat`` (the client refuses a server whose product is not "RabbitMQ" 4+).

The client is installed at test time with pip into a cache directory outside the repository
(``RAFTMQ_PIP_CACHE``, default ``~/.cache/raftmq-test-pip``); the test skips when that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from raftmq.ops.local.node import RaftmqNode

proton = pytest.importorskip("proton")
from proton import Message  # noqa: E402
from proton.reactor import LinkOption  # noqa: E402
from proton.utils import BlockingConnection  # noqa: E402

CLIENT_VERSION = "1.0.1"
SCRIPT = Path(__file__).with_name("amqp10_rabbitmq_client.py")


@pytest.fixture(scope="module")
def compat_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("amqp10-mgmt")
    config = directory / "node.toml"
    config.write_text('amqp10_rabbitmq_compat = true\n[users.guest]\npassword = "guest"\n'
                      '[users.limited]\npassword = "pw"\npermissions = {"/" = ["^mine", ".*", ".*"]}\n')
    node = RaftmqNode(directory / "data", config=config)
    with node:
        yield node


class Paired(LinkOption):
    """RabbitMQ 4's management link pair: link property paired, the /management address on both ends."""

    def apply(self, link) -> None:
        link.properties = {proton.symbol("paired"): True}
        link.source.address = "/management"
        link.target.address = "/management"
        link.snd_settle_mode = proton.Link.SND_SETTLED


class Management:
    def __init__(self, port: int, user: str = "guest", password: str = "guest") -> None:
        self.conn = BlockingConnection(f"amqp://{user}:{password}@127.0.0.1:{port}", timeout=10)
        self.sender = self.conn.create_sender("/management", options=Paired())
        self.receiver = self.conn.create_receiver("/management", options=Paired())

    def request(self, method: str, path: str, body=None) -> tuple[str, object]:
        request_id = str(uuid.uuid4())
        self.sender.send(Message(id=request_id, address=path, subject=method, reply_to="$me", body=body))
        answer = self.receiver.receive(timeout=10)
        assert answer.correlation_id == request_id
        return answer.subject, answer.body

    def close(self) -> None:
        self.conn.close()


def test_management_requests(compat_node) -> None:
    """Status codes as RabbitMQ 4: 201 created, 200 existed, 409 inequivalent, 404, 204, 400."""
    m = Management(compat_node.port)
    try:
        spec = {"durable": True, "exclusive": False, "auto_delete": False, "arguments": {}}
        assert m.request("PUT", "/queues/mq1", spec)[0] == "201"
        assert m.request("PUT", "/queues/mq1", spec)[0] == "200"
        assert m.request("PUT", "/queues/mq1", {**spec, "durable": False})[0] == "409"
        status, info = m.request("GET", "/queues/mq1")
        assert status == "200" and info["name"] == "mq1" and info["durable"] and info["message_count"] == 0
        assert m.request("GET", "/queues/nope")[0] == "404"
        assert m.request("PUT", "/exchanges/mx", {"type": "topic", "durable": True, "auto_delete": False,
                                                  "internal": False, "arguments": {}})[0] == "204"
        binding = {"source": "mx", "binding_key": "a.*", "destination_queue": "mq1", "arguments": {}}
        assert m.request("POST", "/bindings", binding)[0] == "204"
        m.conn.create_sender("/exchanges/mx/a.b").send(Message(body="routed"))
        assert m.request("GET", "/queues/mq1")[1]["message_count"] == 1
        assert m.request("DELETE", "/queues/mq1/messages") == ("200", {"message_count": 1})
        assert m.request("DELETE", "/bindings/src=mx;dstq=mq1;key=a.%2A;args=")[0] == "204"
        assert m.request("DELETE", "/exchanges/mx")[0] == "204"
        assert m.request("DELETE", "/queues/mq1") == ("200", {"message_count": 0})
        assert m.request("PATCH", "/queues/mq1")[0] == "400"
    finally:
        m.close()


def test_management_is_authorized(compat_node) -> None:
    """Access.authorize decides for /management too: configure on the queue name."""
    m = Management(compat_node.port, "limited", "pw")
    try:
        spec = {"durable": False, "exclusive": False, "auto_delete": False, "arguments": {}}
        assert m.request("PUT", "/queues/theirs", spec)[0] == "403"
        assert m.request("PUT", "/queues/mine-1", spec)[0] == "201"
        assert m.request("DELETE", "/queues/mine-1")[0] == "200"
    finally:
        m.close()


@pytest.fixture(scope="session")
def rabbitmq_client_dir() -> Path:
    cache = Path(os.environ.get("RAFTMQ_PIP_CACHE", Path.home() / ".cache" / "raftmq-test-pip"))
    target = cache / f"rabbitmq-amqp-python-client-{CLIENT_VERSION}"
    if not (target / "rabbitmq_amqp_python_client").exists():
        result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                                 f"rabbitmq-amqp-python-client=={CLIENT_VERSION}"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"pip could not install rabbitmq-amqp-python-client: {result.stderr[-500:]}")
    return target


def test_rabbitmq_amqp_python_client_runs_unchanged(compat_node, rabbitmq_client_dir) -> None:
    env = {**os.environ, "PYTHONPATH": str(rabbitmq_client_dir)}
    result = subprocess.run([sys.executable, str(SCRIPT), str(compat_node.port)], capture_output=True,
                            text=True, timeout=60, env=env, cwd=str(rabbitmq_client_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["binding_path"] == "/bindings/src=rmqc-x;dstq=rmqc-q;key=rk;args="
    assert seen["outcomes"] == ["36"] * 5  # Delivery.ACCEPTED (0x24, 3.4.2)
    assert seen["queue_info"] == ["rmqc-q", 5, "QueueType.quorum", True]
    assert seen["consumed"] == ["hi0", "hi1"] and seen["purged"] == 3
