"""Fixtures for the integration suite: real broker processes, real clients, real sockets.

``broker`` (session scope) starts ONE broker for the whole session:

* ``RAFTMQ_TEST_BROKER=rabbitmq``: Debian's rabbitmq-server through ``tests/support/rabbitmq.py`` (the
  tests skip when it is not installed). This is how the tests themselves are checked: every test must
  pass against RabbitMQ, the reference implementation of 0-9-1.
* anything else (the default, ``raftmq``): a ``RaftmqNode`` on a temporary data directory.

Tests share that broker, so every queue and exchange they create has a unique (uuid) name.
``fresh_node`` gives a test its own raftmq node (to kill and restart); it skips under RabbitMQ.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from raftmq.ops.local.node import RaftmqNode, probe_amqp
from tests.integration.helpers import connect
from tests.support import rabbitmq as rabbitmq_support

KINDS = ("raftmq", "rabbitmq")
AMQP10_TIMEOUT = 10  # seconds, each wait of the ``amqp`` connection
DEFAULT_TEST_TIMEOUT = 60  # seconds, per test (pytest-timeout); every single wait inside is <= 10 s


@dataclass
class Broker:
    """What a test needs to reach the session's broker."""

    kind: str
    host: str
    port: int
    url: str
    process: Any  # the RaftmqNode or RabbitMQ launcher object

    def is_alive(self) -> bool:
        """The broker process still runs and answers the AMQP header with connection.start."""
        if self.kind == "raftmq" and not self.process.is_alive():
            return False
        return probe_amqp(self.host, self.port, timeout=3.0)

    def log_tail(self, n: int = 40) -> str:
        return self.process.log_tail(n)


@pytest.fixture(scope="session")
def broker_kind() -> str:
    kind = (os.environ.get("RAFTMQ_TEST_BROKER") or "raftmq").strip().lower()
    if kind not in KINDS:
        raise pytest.UsageError(f"RAFTMQ_TEST_BROKER must be one of {KINDS}, not {kind!r}")
    return kind


@pytest.fixture(scope="session")
def broker(broker_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if broker_kind == "rabbitmq":
        if not rabbitmq_support.available():
            pytest.skip("rabbitmq-server is not installed (apt-get install -y rabbitmq-server)")
        with rabbitmq_support.RabbitMQ() as rmq:
            assert rmq.port is not None
            yield Broker("rabbitmq", rmq.host, rmq.port, rmq.url, rmq)
        return
    node = RaftmqNode(tmp_path_factory.mktemp("raftmq-broker"))
    with node:
        yield Broker("raftmq", node.host, node.port, node.url, node)


@pytest.fixture
def fresh_node(broker_kind: str, tmp_path) -> Iterator[RaftmqNode]:
    """A private raftmq node for tests that kill and restart it (raftmq only)."""
    if broker_kind == "rabbitmq":
        pytest.skip("restart tests drive a raftmq node (kill -9 / restart); not run against RabbitMQ")
    node = RaftmqNode(tmp_path / "node")
    with node:
        yield node


@pytest.fixture(scope="module")
def module_groups_node(broker_kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaftmqNode]:
    """As ``groups_node``, one for a whole module (its tests use queues of their own; a test that
    stops a worker continues it before it ends)."""
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    with RaftmqNode(tmp_path_factory.mktemp("groups") / "node", env={"RAFTMQ_RAFT_GROUPS": "3"}) as node:
        yield node


@pytest.fixture
def groups_node(broker_kind: str, tmp_path) -> Iterator[RaftmqNode]:
    """A private raftmq node with three Raft groups (issue 34: the metadata group and two queue
    groups in workers), whatever RAFTMQ_RAFT_GROUPS says (raftmq only)."""
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    with RaftmqNode(tmp_path / "node", env={"RAFTMQ_RAFT_GROUPS": "3"}) as node:
        yield node


@pytest.fixture(autouse=True)
def _broker_process_survives(request: pytest.FixtureRequest) -> Iterator[None]:
    """Whatever a test sent, the shared raftmq process must still be running afterwards."""
    yield
    if "broker" in request.fixturenames:
        b = request.getfixturevalue("broker")
        if b.kind == "raftmq" and not b.process.is_alive():
            pytest.fail(f"the raftmq node died during this test\n{b.log_tail()}")


@pytest.fixture
def connections(broker: Broker) -> Iterator[Any]:
    """A factory of pika BlockingConnections to the session broker; all are closed after the test."""
    opened: list[pika.BlockingConnection] = []

    def open_connection(**overrides: Any) -> pika.BlockingConnection:
        c = connect(broker.url, **overrides)
        opened.append(c)
        return c

    yield open_connection
    for c in opened:
        if c.is_open:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - best-effort cleanup of a connection the broker may have closed
                pass


@pytest.fixture
def conn(connections: Any) -> pika.BlockingConnection:
    return connections()


@pytest.fixture
def ch(conn: pika.BlockingConnection) -> BlockingChannel:
    return conn.channel()


@pytest.fixture
def amqp(broker: Broker) -> Iterator[Any]:
    """An AMQP 1.0 connection (python-qpid-proton's BlockingConnection) to the session broker as guest,
    closed after the test (best effort: a test may have had it closed by the broker)."""
    from proton.utils import BlockingConnection

    c = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=AMQP10_TIMEOUT)
    yield c
    try:
        c.close()
    except Exception:  # noqa: BLE001 - best-effort cleanup, as for ``connections``
        pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every integration test gets a hard time limit unless it sets its own."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TEST_TIMEOUT))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """On a failure, attach the tail of the broker's log to the report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when != "call" or not rep.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    for name in ("fresh_node", "broker"):
        proc = funcargs.get(name)
        if proc is not None and hasattr(proc, "log_tail"):
            try:
                rep.sections.append((f"{name} log tail", proc.log_tail(25)))
            except Exception as e:  # noqa: BLE001 - a report must never fail
                rep.sections.append((f"{name} log tail", f"(unavailable: {e})"))
