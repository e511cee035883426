"""The management web UI (ops/http/static/index.html) rendered by a real browser: headless Chromium.

Chromium loads the page a node serves at ``/`` as a user would open it with the login in the URL
(``http://user:password@127.0.0.1:PORT/``; the page and the API need HTTP basic auth), runs its
script against the node's live management API, and the test reads the rendered DOM
(``--dump-dom``) and keeps a screenshot (``--screenshot``) of the same page under the test's tmp
dir (its path is printed; ``pytest -s`` shows it).  Checked: a declared queue's depth in the
Queues table, and for a 3-node cluster the Cluster table naming the leader (the ``leader`` row
class, the role Raft reports through /api/nodes) as seen from a follower.

Chromium is Debian's ``chromium`` package (``make system-packages`` installs it as root); without a
chromium binary the tests skip.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pika
import pytest

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.http_api import call

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium, "
                                                          "or `make system-packages` as root)"),
              pytest.mark.timeout(180)]

BROWSER_TIMEOUT = 60.0  # seconds for one headless Chromium run (it takes ~1 s on an idle machine)
VIRTUAL_TIME_MS = 5000  # the page's first refresh happens at load; its timer every 5 s
RENDER_TIMEOUT = 30.0  # seconds for the rendered page to show what the node holds


@dataclass
class Page:
    """What the rendered DOM shows: the status line, the node heading, and each table's rows as
    (cell text, cell class) pairs."""

    status: str = ""
    heading: str = ""
    tables: dict[str, list[list[tuple[str, str]]]] = field(default_factory=dict)

    def rows(self, table: str) -> list[list[str]]:
        return [[text for text, _ in row] for row in self.tables.get(table, [])]


class _DomReader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = Page()
        self._table: str | None = None
        self._in_body = False
        self._cell: tuple[list[str], str] | None = None
        self._capture: str | None = None  # "status" or "heading" while inside those elements

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id")
            self.page.tables[self._table] = []
        elif tag == "tbody" and self._table:
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.page.tables[self._table].append([])
        elif tag == "td" and self._in_body:
            self._cell = ([], attrs.get("class") or "")
        elif attrs.get("id") == "status":
            self._capture = "status"
        elif tag == "h1":
            self._capture = "heading"

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.page.tables[self._table][-1].append(("".join(self._cell[0]).strip(), self._cell[1]))
            self._cell = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "table":
            self._table = None
        elif (tag == "div" and self._capture == "status") or (tag == "h1" and self._capture == "heading"):
            self._capture = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0].append(data)
        elif self._capture == "status":
            self.page.status += data
        elif self._capture == "heading":
            self.page.heading += data


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={profile}", "--window-size=1280,900", f"--virtual-time-budget={VIRTUAL_TIME_MS}",
               *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT,
                          stdin=subprocess.DEVNULL)


def render(url: str, workdir: Path) -> tuple[Page, str]:
    """Load ``url`` in headless Chromium; the page as its script left it, and the raw DOM."""
    done = _chromium(["--dump-dom", url], workdir / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    reader = _DomReader()
    reader.feed(done.stdout)
    return reader.page, done.stdout


def screenshot(url: str, png: Path) -> Path:
    """A PNG of the page (kept as a test artefact: its path is printed)."""
    done = _chromium([f"--screenshot={png}", url], png.parent / "profile")
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    header = png.read_bytes()[:24]  # PNG signature, then the IHDR chunk: width and height
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1280, 900), header
    print(f"UI screenshot: {png}")
    return png


def render_until(url: str, workdir: Path, check, what: str) -> Page:
    """Render again until ``check(page)`` holds (the node may still be electing or applying)."""
    deadline = time.monotonic() + RENDER_TIMEOUT
    while True:
        page, dom = render(url, workdir)
        if check(page):
            return page
        assert time.monotonic() < deadline, f"the rendered page never showed {what}: {page}\n{dom[:3000]}"
        time.sleep(0.5)


def _with_login(base: str, user: str = "guest", password: str = "guest") -> str:
    return base.replace("http://", f"http://{user}:{password}@") + "/"


def _queue_row(page: Page, name: str) -> list[str] | None:
    # Queues columns: vhost, name, durable, ready, unacked, total, consumers, depth change /s
    return next((row for row in page.rows("queues") if row[:2] == ["/", name]), None)


def _publish(amqp_url: str, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        for i in range(count):
            channel.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        connection.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    http_port = free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("ui-node"), extra_args=["--http-port", str(http_port)])
    node.http_base = f"http://127.0.0.1:{http_port}"
    with node:
        deadline = time.monotonic() + 10
        while call(node.http_base, "GET", "/api/overview")[0] != 200:
            assert time.monotonic() < deadline, node.log_tail(20)
            time.sleep(0.1)
        yield node


def test_single_node_page_shows_queue_depth(node, tmp_path):
    queue, depth = "ui-browser-depth", 6
    _publish(node.url, queue, depth)
    url = _with_login(node.http_base)

    def shows_depth(page: Page) -> bool:
        row = _queue_row(page, queue)
        return row is not None and row[3] == str(depth) and row[5] == str(depth)

    page = render_until(url, tmp_path, shows_depth, f"queue {queue} with {depth} ready messages")
    assert page.status.startswith("updated"), page.status  # the script's refresh ran without error
    assert "raftmq@" in page.heading
    row = _queue_row(page, queue)
    assert row[2] == "yes" and row[4] == "0" and row[6] == "0"  # durable, nothing unacked, no consumer
    # A single node is its own leader: the Cluster table marks its row so.
    [member] = page.tables["nodes"]
    assert member[1][0] == "yes" and member[2] == ("single", "leader"), member
    assert ["guest", "administrator"] in page.rows("users")
    screenshot(url, tmp_path / "ui-single-node.png")


@pytest.mark.parametrize("login", [None, ("guest", "wrong")], ids=["anonymous", "wrong-password"])
def test_page_refused_without_a_valid_login(node, tmp_path, login):
    """No login or a wrong one: the node answers 401 and the browser shows none of the page's data
    (headless Chromium, which cannot ask for a login, leaves an empty document)."""
    _publish(node.url, "ui-browser-secret", 1)
    url = node.http_base + "/" if login is None else _with_login(node.http_base, *login)
    page, dom = render(url, tmp_path)
    assert "ui-browser-secret" not in dom and not page.tables and "raftmq" not in dom, dom[:2000]
    status, body = call(node.http_base, "GET", "/", auth=login)  # what the browser was answered
    assert status == 401 and body == {"error": "not_authorized", "reason": "Login failed"}, (status, body)


@pytest.mark.cluster
def test_cluster_page_shows_the_leader(tmp_path):
    cluster = Cluster(3, tmp_path / "cluster")
    bases = {}
    for member in cluster.nodes:
        port = free_port()
        member.extra_args = ["--http-port", str(port)]
        bases[member.node_id] = f"http://127.0.0.1:{port}"
    with cluster:
        cluster.wait_formed()
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        queue, depth = "ui-browser-cluster", 4
        _publish(follower.url, queue, depth)
        url = _with_login(bases[follower.node_id])

        def shows_leader_and_depth(page: Page) -> bool:
            nodes = page.tables.get("nodes", [])
            leaders = [row[0][0] for row in nodes if row[2][1] == "leader"]
            row = _queue_row(page, queue)
            return (len(nodes) == 3 and leaders == [f"raftmq@{leader.node_id}"]
                    and row is not None and row[3] == str(depth))

        page = render_until(url, tmp_path, shows_leader_and_depth,
                            f"leader raftmq@{leader.node_id} and {depth} messages in {queue}")
        roles = {row[0][0]: row[2][0] for row in page.tables["nodes"]}
        assert roles == {f"raftmq@{n.node_id}": ("leader" if n is leader else "follower") for n in cluster.nodes}
        assert page.heading.strip().endswith(f"raftmq@{follower.node_id}")  # the page of a follower
        assert all(row[1][0] == "yes" for row in page.tables["nodes"])
        screenshot(url, tmp_path / "ui-cluster-follower.png")
