"""Celery Flower's broker view reads raftmq's queue lengths through the management HTTP API.

Flower (pip ``flower``) asks a RabbitMQ broker for its queues with ``GET <broker_api>queues/<vhost>``
(flower/utils/broker.py, class RabbitMQ), keeps the queues Celery knows as active, by name (the
workers' queues, or without workers ``task_default_queue`` plus ``task_queues``:
flower/views/__init__.py ``get_active_queue_names``) and shows their
``messages``, ``messages_unacknowledged``, ``messages_ready`` and ``consumers`` on its ``/broker``
page and in ``/api/queues/length``.  Here Flower runs unmodified as a real process
(``celery flower``) against a real raftmq node; the counts it shows must be raftmq's own.

Both with Celery's usual default vhost and a named one.  For the default vhost Flower 2.2.0 asks
``urljoin(broker_api, "queues//")``, which is ``/api/queues/``: every vhost's queues, with a trailing
slash that RabbitMQ 3.10.8 accepts on any /api path (measured with Debian's rabbitmq-server and the
management plugin, and Flower 2.2.0 against it) and raftmq now does too (ops/http/server.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import quote

import pika
import pytest

from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.http_api import call, path

pytest.importorskip("flower", reason="Celery Flower is not installed (pip install flower: the test extra has it)")

pytestmark = pytest.mark.timeout(120)

FLOWER_READY_TIMEOUT = 45.0  # seconds for `celery flower` to import, start Tornado and answer
COUNT_TIMEOUT = 20.0  # seconds for Flower's view to show the expected counts
# Queue -> (messages published, of which delivered and held unacknowledged by one consumer); in the
# named vhost the names get a prefix, so that Flower's all-vhost list for "/" never sees them twice.
ACTIVE = {"celery": (7, 0), "raftmq-flower-video": (5, 2)}
INACTIVE = "raftmq-flower-not-celery"  # holds messages but Celery does not know it: Flower must not list it
VHOST = "flower-vhost"
USER = ("flower-user", "flower-pw")  # tag "management", full permissions on "/" and VHOST

CONFIG_MODULE = textwrap.dedent('''\
    """Celery configuration for tests/integration/test_flower.py: which queues Flower treats as active."""
    from kombu import Queue

    task_default_queue = {default!r}
    task_queues = [Queue(name) for name in {names!r}]
''')


class QueueTable(HTMLParser):
    """The rows of Flower's ``<table id="queue-table">`` as lists of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_table = False
        self._in_body = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == "queue-table":
            self._in_table = True
        elif self._in_table and tag == "tbody":
            self._in_body = True
        elif self._in_body and tag == "tr":
            self.rows.append([])
        elif self._in_body and tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError as exc:
        return 0, str(exc)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        ok, last = predicate()
        if ok:
            return last
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    http_port = free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("flower-node"), extra_args=["--http-port", str(http_port)])
    node.http_base = f"http://127.0.0.1:{http_port}"
    with node:
        _wait(lambda: (call(node.http_base, "GET", "/api/overview")[0] == 200, None), 10, "the HTTP API")
        assert call(node.http_base, "PUT", path("vhosts", VHOST))[0] in (201, 204)
        assert call(node.http_base, "PUT", path("users", USER[0]),
                    body={"password": USER[1], "tags": "management"})[0] in (201, 204)
        for vhost in ("/", VHOST):
            assert call(node.http_base, "PUT", path("permissions", vhost, USER[0]),
                        body={"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
        yield node


@dataclass
class Loaded:
    node: RaftmqNode
    vhost: str

    @property
    def prefix(self) -> str:
        return "" if self.vhost == "/" else "named-"

    @property
    def active(self) -> dict[str, tuple[int, int]]:
        return {self.prefix + name: counts for name, counts in ACTIVE.items()}

    @property
    def inactive(self) -> str:
        return self.prefix + INACTIVE

    @property
    def pika_url(self) -> str:
        return f"amqp://{USER[0]}:{USER[1]}@{self.node.host}:{self.node.port}/{quote(self.vhost, safe='')}"

    @property
    def celery_url(self) -> str:
        """Celery's (kombu's) form: the path after the first "/" is the vhost, so "//" is "/"."""
        return f"amqp://{USER[0]}:{USER[1]}@{self.node.host}:{self.node.port}/{self.vhost}"


@pytest.fixture(scope="module", params=["/", VHOST], ids=["default-vhost", "named-vhost"])
def loaded(node, request):
    """The queues with their messages in one vhost, and one consumer holding some unacknowledged
    (open while the vhost's tests run)."""
    target = Loaded(node, request.param)
    connection = pika.BlockingConnection(pika.URLParameters(target.pika_url))
    channel = connection.channel()
    channel.confirm_delivery()
    for name, (count, _) in [*target.active.items(), (target.inactive, (3, 0))]:
        channel.queue_declare(name, durable=True)
        for i in range(count):
            channel.basic_publish("", name, f"{name}-{i}".encode(),
                                  pika.BasicProperties(delivery_mode=2), mandatory=True)
    held = []
    consumer = connection.channel()
    for name, (_, unacked) in target.active.items():
        if unacked:
            consumer.basic_qos(prefetch_count=unacked)
            consumer.basic_consume(name, lambda ch, method, props, body: held.append(method.delivery_tag))
    deadline = time.monotonic() + 10
    while len(held) < sum(u for _, u in target.active.values()):
        assert time.monotonic() < deadline, f"only {len(held)} deliveries reached the consumer"
        connection.process_data_events(time_limit=0.2)
    yield target
    connection.close()


@pytest.fixture(scope="module")
def flower(loaded, tmp_path_factory):
    """``celery flower`` as a real process (ended by PID); its base URL."""
    workdir = tmp_path_factory.mktemp("flower")
    (workdir / "raftmq_flower_config.py").write_text(CONFIG_MODULE.format(default=loaded.prefix + "celery", names=sorted(loaded.active)))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(workdir), os.environ.get("PYTHONPATH", "")]),
               FLOWER_UNAUTHENTICATED_API="true")  # Flower 2 serves /api/* without auth only with this
    command = [sys.executable, "-m", "celery", "--config", "raftmq_flower_config",
               f"--broker={loaded.celery_url}", "flower",
               f"--broker_api={loaded.node.http_base.replace('http://', f'http://{USER[0]}:{USER[1]}@')}/api/",
               f"--port={port}", "--address=127.0.0.1"]
    log_path = workdir / "flower.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        def ready():
            assert proc.poll() is None, f"flower exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            return _get(base + "/healthcheck")[0] == 200, None

        _wait(ready, FLOWER_READY_TIMEOUT, f"Flower on {base} (log {log_path})")
        yield base
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        print(f"flower log: {log_path}")


def _raftmq_view(loaded: Loaded) -> dict[str, dict]:
    """What raftmq itself says of the active queues (its management API, the source Flower reads)."""
    view = {}
    for name in loaded.active:
        status, queue = call(loaded.node.http_base, "GET", path("queues", loaded.vhost, name))
        assert status == 200, queue
        view[name] = queue
    return view


def _expected(loaded: Loaded) -> dict[str, tuple[int, int, int, int]]:
    """(messages, unacked, ready, consumers) per active queue, from what the fixtures did."""
    return {name: (count, unacked, count - unacked, 1 if unacked else 0)
            for name, (count, unacked) in loaded.active.items()}


def test_raftmq_holds_the_published_counts(loaded):
    view = _raftmq_view(loaded)
    got = {name: (q["messages"], q["messages_unacknowledged"], q["messages_ready"], q["consumers"])
           for name, q in view.items()}
    assert got == _expected(loaded)


def test_flower_queue_lengths_api(loaded, flower):
    """GET /api/queues/length: Flower's JSON of the active queues' lengths, read from raftmq."""

    def lengths():
        status, body = _get(flower + "/api/queues/length")
        if status != 200:
            return False, (status, body[:300])
        queues = {q["name"]: q for q in json.loads(body)["active_queues"]}
        return {name: q.get("messages") for name, q in queues.items()} == {n: c for n, (c, _) in loaded.active.items()}, queues

    queues = _wait(lengths, COUNT_TIMEOUT, "Flower's /api/queues/length to show raftmq's counts")
    assert loaded.inactive not in queues
    for name, counts in _expected(loaded).items():
        q = queues[name]
        assert (q["messages"], q["messages_unacknowledged"], q["messages_ready"], q["consumers"]) == counts
        assert q["vhost"] == loaded.vhost and q["durable"] is True


def test_flower_broker_page(loaded, flower):
    """GET /broker: the HTML table a Flower user looks at (Queue, Messages, Unacked, Ready, Consumers)."""

    def table():
        status, html = _get(flower + "/broker")
        if status != 200:
            return False, (status, html[:300])
        parser = QueueTable()
        parser.feed(html)
        rows = {row[0]: tuple(row[1:5]) for row in parser.rows if len(row) >= 5}
        want = {name: tuple(str(v) for v in counts) for name, counts in _expected(loaded).items()}
        return rows == want, rows

    rows = _wait(table, COUNT_TIMEOUT, "Flower's /broker page to show raftmq's queues and counts")
    print(f"Flower /broker rows (queue: messages, unacked, ready, consumers): {rows}")
    assert loaded.inactive not in rows
