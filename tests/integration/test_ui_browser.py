"""The management UI (ops/http/static/index.html, app.js) worked by a real browser: headless Chromium.

Chromium is driven over the DevTools protocol (its ``--remote-debugging-port``, a websocket, spoken
here with aiohttp's client): the test types into the page's fields and clicks its buttons as a user
does, waits for what the page shows, and saves screenshots under the test's tmp dir (paths printed;
``pytest -s`` shows them).  The broker is a real node; the page's script talks to it with its
session cookie and CSRF token (ops/http/session.py).

Checked (issue 35, part one):
1. ``test_work_in_the_ui``, one node: the login form; logging in as guest; declaring a queue and an
   exchange from their forms; binding the queue to the exchange on the queue's page; publishing
   through the exchange's page and getting the message back on the queue's page (payload, routing
   key, exchange); purging and deleting the queue (checked through the API with Basic credentials);
   adding a user with the management tag and setting its permissions on the Admin page; logging out
   and in as that user: no Admin tab, no Nodes section (the tags, as RabbitMQ), 403 from the API for
   an admin call, and a change without the CSRF token refused (403) while the page's own works.
   Part three: the queue's page shows its message rates and totals (publish, deliver/get, ack:
   RabbitMQ's per-queue message_stats) after the get, with a chart; purge and delete ask first
   (Cancel leaves the message, Yes purges / deletes).
   Also part three: the queue's audit events button says how to keep and read a history (this
   node keeps none); the Sessions page lists a detached 0-10 session with the time it stays
   resumable; the Delayed & dedup page shows a message held by an x-delayed-message exchange.
2. ``test_wrong_password``: the form says "Login failed" and shows no data.
3. ``test_cluster_overview_shows_the_leader`` (cluster mark): a follower's Overview names the leader;
   the queue workflow of 1. (declare, bind, publish, get, purge, delete) on the follower's pages;
   after the kill -9 below, a management user added there logs in and sees what its tags allow;
   then (part two) its Cluster page (GET /api/raftmq/cluster, ops/http/raftview.py) shows the same
   leader, three members with term, commit and applied index, the leader as a connected partner and
   the leader in its history; the test kills -9 the leader's process (by the PID it started) and
   the page, still open on the surviving follower, shows another leader, the old one not running,
   a leader change counted and the change in its history (old leader -> new, higher term).
   Screenshots before and after.
   Part three (before the kill): the follower's Connections and Channels pages list a client of
   the leader with the leader's node name (every member's, ops/http/members.py); the Cluster page
   shows every member's own commit and applied index as that member reports it, the snapshots each
   member wrote (Raft index, size, time), and the "Compare
   state digests" button shows three digests that do not disagree (GET /api/raftmq/digests).
4. In ``test_work_in_the_ui``: the Cluster tab of one node ("single", no changes); a management
   user has no Cluster tab and gets 403 from /api/raftmq/cluster (monitoring only, as /api/nodes).

Chromium is Debian's ``chromium`` package (``make system-packages`` installs it as root); without a
chromium binary the tests skip.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp
import pika
import pytest

from raftmq.client.amqp010 import Connection
from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import RaftmqNode, free_port
from tests.support.http_api import call, path

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian: apt-get install chromium, "
                                                          "or `make system-packages` as root)"),
              pytest.mark.timeout(240)]

START_TIMEOUT = 30.0  # seconds for Chromium to open its DevTools port
WAIT_TIMEOUT = 20.0  # seconds for the page to show what an action should show


class Browser:
    """One headless Chromium process and its first tab, driven over the DevTools protocol."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        profile = workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--window-size=1280,900", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.loop = asyncio.new_event_loop()
        self.messages = 0
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + START_TIMEOUT
            while not (port_file.exists() and port_file.read_text().strip()):
                assert self.process.poll() is None, "chromium exited"
                assert time.monotonic() < deadline, "chromium opened no DevTools port"
                time.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as answer:
                        targets = json.load(answer)
                    page = next(t for t in targets if t["type"] == "page")
                    break
                except (OSError, StopIteration):
                    assert time.monotonic() < deadline, "no page target in chromium"
                    time.sleep(0.2)
            self.session = self.loop.run_until_complete(self._connect(page["webSocketDebuggerUrl"]))
            self.send("Page.enable")
            self.send("Runtime.enable")
        except BaseException:
            self.close()
            raise

    async def _connect(self, url: str):
        self.http = aiohttp.ClientSession()
        return await self.http.ws_connect(url, max_msg_size=64 << 20)

    def send(self, method: str, **params) -> dict:
        """One DevTools command and its result (events in between are skipped)."""
        self.messages += 1
        ident = self.messages

        async def roundtrip() -> dict:
            await self.session.send_str(json.dumps({"id": ident, "method": method, "params": params}))
            async with asyncio.timeout(WAIT_TIMEOUT):
                while True:
                    message = await self.session.receive()
                    assert message.type == aiohttp.WSMsgType.TEXT, message
                    data = json.loads(message.data)
                    if data.get("id") == ident:
                        assert "error" not in data, data
                        return data["result"]

        return self.loop.run_until_complete(roundtrip())

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && typeof start === 'function'", f"{url} loaded")

    def wait(self, expression: str, what: str, timeout: float = WAIT_TIMEOUT):
        """Poll ``expression`` until it is truthy; its value (an element counts as true)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(f"(() => {{ try {{ const v = {expression}; return v instanceof Node ? true : v; }}"
                            " catch (e) { return null; } })()")
            if value:
                return value
            if time.monotonic() > deadline:
                flash = self.js("document.getElementById('flash') && document.getElementById('flash').textContent")
                main = self.js("document.body.innerText.slice(0, 1500)")
                raise AssertionError(f"the page never showed {what} (flash: {flash!r})\n{main}")
            time.sleep(0.1)

    def fill(self, element_id: str, value: str) -> None:
        self.js(f"(() => {{ const el = document.getElementById({json.dumps(element_id)}); el.value = {json.dumps(value)};"
                " el.dispatchEvent(new Event('input', {bubbles: true}));"
                " el.dispatchEvent(new Event('change', {bubbles: true})); })()")

    def click(self, element_id: str) -> None:
        self.wait(f"document.getElementById({json.dumps(element_id)})", f"#{element_id}")
        self.js(f"document.getElementById({json.dumps(element_id)}).click()")

    def text(self, element_id: str) -> str:
        return self.js(f"(document.getElementById({json.dumps(element_id)}) || {{}}).textContent || ''")

    def visible(self, element_id: str) -> bool:
        return self.js(f"(() => {{ const el = document.getElementById({json.dumps(element_id)});"
                       " return !!el && el.getClientRects().length > 0; })()")  # rendered: has a box

    def go(self, fragment: str, ready: str, what: str) -> None:
        """Follow an in-page link (#/...) and wait for the view's content."""
        self.js(f"location.hash = {json.dumps(fragment)}")
        self.wait(f"document.getElementById('view-title') && {ready}", what)

    def flash_after(self, element_id: str, expected: str) -> None:
        self.js("document.getElementById('flash').textContent = ''")
        self.click(element_id)
        self.wait(f"document.getElementById('flash').textContent === {json.dumps(expected)}", repr(expected))

    def screenshot(self, name: str) -> Path:
        png = self.workdir / name
        data = self.send("Page.captureScreenshot", format="png")["data"]
        png.write_bytes(base64.b64decode(data))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        print(f"UI screenshot: {png}")
        return png

    def login(self, user: str, password: str) -> None:
        self.wait("!document.getElementById('login').hidden", "the login form")
        self.fill("login-username", user)
        self.fill("login-password", password)
        self.click("login-submit")
        self.wait(f"!document.getElementById('app').hidden && document.getElementById('user-name').textContent"
                  f" === {json.dumps(user)}", f"the UI logged in as {user}")

    def close(self) -> None:
        try:
            if getattr(self, "session", None) is not None:
                self.loop.run_until_complete(self.session.close())
            if getattr(self, "http", None) is not None:
                self.loop.run_until_complete(self.http.close())
        finally:
            self.loop.close()
            self.process.terminate()  # the Chromium this test started, by its own handle
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path)
    try:
        yield b
    finally:
        b.close()


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


def _queue_workflow(browser, base: str, queue: str, exchange: str) -> None:
    """Declare a queue and a direct exchange from their forms, bind them on the queue's page,
    publish on the exchange's page, get the message back on the queue's page, purge and delete it
    (each confirmed with Yes); each step checked through the API of the node the page talks to."""
    def queue_api():
        return call(base, "GET", path("queues", "/", queue))

    browser.go("#/queues", "document.getElementById('queues-table')", "the Queues page")
    browser.fill("queue-name", queue)
    browser.flash_after("queue-add", f"Queue {queue} added.")
    assert _until(lambda: queue_api()[0] == 200, "the queue declared")
    browser.go("#/exchanges", "document.getElementById('exchanges-table')", "the Exchanges page")
    browser.fill("exchange-name", exchange)
    browser.fill("exchange-type", "direct")
    browser.flash_after("exchange-add", f"Exchange {exchange} added.")
    browser.go(f"#/queues/%2F/{queue}", "document.getElementById('queue-info')", "the queue's page")
    browser.fill("bind-source", exchange)
    browser.fill("bind-key", "k")
    browser.flash_after("bind-add", "Binding added.")
    browser.go(f"#/exchanges/%2F/{exchange}", "document.getElementById('exchange-info')", "the exchange's page")
    browser.fill("publish-key", "k")
    browser.fill("publish-payload", "through the cluster")
    browser.flash_after("publish-send", "Message published.")
    assert _until(lambda: queue_api()[1].get("messages") == 1, "the message in the queue")
    browser.go(f"#/queues/%2F/{queue}", "document.getElementById('queue-info')", "the queue's page")
    browser.click("get-messages")
    assert browser.wait("document.querySelector('#get-results pre.payload') &&"
                        " document.querySelector('#get-results pre.payload').textContent",
                        "the message got") == "through the cluster"
    browser.click("queue-purge")
    browser.flash_after("confirm-yes", "Queue contents purged.")
    assert _until(lambda: queue_api()[1].get("messages") == 0, "the queue purged")
    browser.click("queue-delete")
    browser.flash_after("confirm-yes", f"Queue {queue} deleted.")
    assert _until(lambda: queue_api()[0] == 404, "the queue deleted")


def _queue(node, name: str):
    return call(node.http_base, "GET", path("queues", "/", name))


def _until(check, what: str, timeout: float = WAIT_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def test_work_in_the_ui(node, browser):
    queue, exchange, user = "ui-orders", "ui-x", "ui-alice"
    browser.open(node.http_base + "/")
    # (the form shows once /api/whoami has answered 401: wait for it, the page script is async)
    browser.wait("document.getElementById('login').getClientRects().length > 0", "the login form")
    assert browser.visible("login") and not browser.visible("app")
    browser.screenshot("ui-login.png")
    browser.login("guest", "guest")
    assert browser.visible("tab-admin") and "administrator" in browser.text("user-tags")
    browser.wait("document.getElementById('nodes')", "the Nodes table of the Overview")
    assert browser.js("document.querySelector('#nodes tbody td.leader').textContent") == "single"
    assert browser.visible("tab-cluster")
    browser.go("#/cluster", "document.getElementById('raft-members')", "the Cluster page")
    assert browser.js("document.querySelector('#raft-members tbody td.leader').textContent") == "single"
    status, raft = call(node.http_base, "GET", "/api/raftmq/cluster")
    assert status == 200 and raft["clustered"] is False and raft["leader"] == raft["node"]
    assert raft["leader_changes"] == 0 and raft["recent_leader_changes"] == []

    # Queues: declare one from the form (server-side list: filtered by name).
    browser.go("#/queues", "document.getElementById('queues-table')", "the Queues page")
    browser.fill("queue-name", queue)
    browser.flash_after("queue-add", f"Queue {queue} added.")
    browser.fill("queues-filter", "orders")
    browser.wait(f"[...document.querySelectorAll('#queues-table tbody tr')].some(r => r.cells[1].textContent"
                 f" === {json.dumps(queue)})", "the new queue in the filtered list")
    assert _queue(node, queue)[1]["durable"] is True

    # Exchanges: declare a direct exchange.
    browser.go("#/exchanges", "document.getElementById('exchanges-table')", "the Exchanges page")
    browser.fill("exchange-name", exchange)
    browser.fill("exchange-type", "direct")
    browser.flash_after("exchange-add", f"Exchange {exchange} added.")
    assert call(node.http_base, "GET", path("exchanges", "/", exchange))[1]["type"] == "direct"

    # The queue's page: bind it to the exchange.
    browser.go(f"#/queues/%2F/{queue}", "document.getElementById('queue-info')", "the queue's page")
    browser.fill("bind-source", exchange)
    browser.fill("bind-key", "new-order")
    browser.flash_after("bind-add", "Binding added.")
    browser.wait(f"document.getElementById('queue-bindings-table').textContent.includes({json.dumps(exchange)})",
                 "the binding on the queue's page")

    # The exchange's page: publish with the binding's key.
    browser.go(f"#/exchanges/%2F/{exchange}", "document.getElementById('exchange-info')", "the exchange's page")
    browser.fill("publish-key", "new-order")
    browser.fill("publish-payload", "order 42 from the UI")
    browser.flash_after("publish-send", "Message published.")
    assert _until(lambda: _queue(node, queue)[1]["messages"] == 1, "the message in the queue")

    # Back on the queue's page: get it (requeued), purge, delete.
    browser.go(f"#/queues/%2F/{queue}", "document.getElementById('queue-info')", "the queue's page")
    browser.click("get-messages")
    payload = browser.wait("document.querySelector('#get-results pre.payload') &&"
                           " document.querySelector('#get-results pre.payload').textContent", "the message got")
    assert payload == "order 42 from the UI"
    assert browser.js("document.getElementById('get-results').firstChild.className") == "message"
    details = browser.text("message-1")
    assert exchange in details and "new-order" in details
    browser.js("document.getElementById('get-results').scrollIntoView()")
    browser.screenshot("ui-queue-get.png")
    # Part three: the queue's message rates (RabbitMQ's per-queue message_stats: publish,
    # deliver_get, ack with *_details.rate; ops/http/rates.py) -- the get counts as a delivery.
    totals = browser.wait(
        "(() => { const r = document.querySelector('#queue-rates-table tbody tr');"
        " const c = r && [...r.cells].map(c => c.textContent); return c && c[3] === '1' && c[4] === '1' && c; })()",
        "the queue's totals: 1 published, 1 delivered or got")
    assert totals[0].endswith("/s") and totals[1].endswith("/s")  # rates shown per second
    assert browser.js("!!document.getElementById('queue-chart')")
    stats = _queue(node, queue)[1]["message_stats"]
    assert (stats["publish"], stats["deliver_get"], stats["ack"]) == (1, 1, 0)
    assert {"publish_details", "deliver_get_details", "ack_details"} <= set(stats)
    browser.js("document.getElementById('queue-rates').scrollIntoView()")
    browser.screenshot("ui-queue-rates.png")
    # The queue's audit events: this node keeps no history, so the page says how to keep and read one.
    browser.click("queue-audit-show")
    hint = browser.wait("document.getElementById('queue-audit-hint') &&"
                        " document.getElementById('queue-audit-hint').textContent", "the audit hint")
    assert "audit_retention" in hint and "raftmq audit" in hint
    # Purge and delete ask first (part three): Cancel leaves the queue as it was.
    browser.click("queue-purge")
    assert "Purge every ready message" in browser.wait("document.getElementById('confirm-question') &&"
                                                       " document.getElementById('confirm-question').textContent",
                                                       "the purge question")
    browser.screenshot("ui-queue-purge-confirm.png")
    browser.click("confirm-no")
    browser.wait("!document.getElementById('confirm')", "the question gone after Cancel")
    assert _queue(node, queue)[1]["messages"] == 1
    browser.click("queue-purge")
    browser.flash_after("confirm-yes", "Queue contents purged.")
    assert _queue(node, queue)[1]["messages"] == 0
    browser.click("queue-delete")
    assert _queue(node, queue)[0] == 200  # not before the answer
    browser.flash_after("confirm-yes", f"Queue {queue} deleted.")
    browser.wait("location.hash === '#/queues'", "the Queues page after the delete")
    assert _queue(node, queue)[0] == 404

    # raftmq's own pages (part three): a detached 0-10 session on the Sessions page, a delayed
    # message on the Delayed & dedup page.
    async def detached_session() -> None:
        conn = await Connection.connect([f"127.0.0.1:{node.port}"])
        await conn.session(name=b"ui-browser-session", timeout=120)
        await conn.close()

    asyncio.run(asyncio.wait_for(detached_session(), 30))
    browser.click("tab-sessions")
    row = browser.wait("(() => { const r = [...document.querySelectorAll('#sessions-table tbody tr')].find("
                       "r => r.cells[1].textContent === 'ui-browser-session');"
                       " return r && r.cells[4].textContent === 'detached' && [...r.cells].map(c => c.textContent); })()",
                       "the detached session")
    assert row[0] == "0-10 session" and row[3] == "guest" and row[6] != ""  # resumable until
    browser.screenshot("ui-sessions.png")
    amqp = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        ch = amqp.channel()
        ch.exchange_declare("ui-later", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
        ch.basic_publish("ui-later", "", b"later", pika.BasicProperties(headers={"x-delay": 600_000}))
        amqp.process_data_events(time_limit=0.2)
    finally:
        amqp.close()
    browser.click("tab-held")
    browser.wait("[...document.querySelectorAll('#held-exchanges tbody tr')].some(r => r.cells[1].textContent ==="
                 " 'ui-later' && r.cells[3].textContent === '1')", "the delayed message on ui-later")
    assert int(browser.js("document.querySelector('#held-totals tbody tr').cells[0].textContent")) >= 1
    browser.screenshot("ui-held.png")

    # Admin: add a management user and give it permissions on "/".
    browser.go("#/users", "document.getElementById('users-table')", "the Admin page")
    browser.fill("user-name-new", user)
    browser.fill("user-password", "alice-pw")
    browser.click("tag-management")
    assert browser.js("document.getElementById('user-tags-new').value") == "management"
    browser.flash_after("user-add", f"User {user} added.")
    browser.fill("perm-user", user)
    browser.flash_after("perm-set", "Permission set.")
    browser.wait(f"document.getElementById('permissions-table').textContent.includes({json.dumps(user)})",
                 "the new user's permissions")
    browser.screenshot("ui-admin.png")
    status, perms = call(node.http_base, "GET", path("users", user, "permissions"))
    assert status == 200 and perms == [{"user": user, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]
    assert call(node.http_base, "GET", path("users", user))[1]["tags"] == ["management"]

    # Log out, log in as the new user: what its tags allow, and no more.
    browser.click("logout")
    browser.wait("!document.getElementById('login').hidden", "the login form after logging out")
    browser.login(user, "alice-pw")
    assert not browser.visible("tab-admin")
    browser.wait("document.getElementById('object-totals')", "the Overview")
    assert browser.js("document.getElementById('nodes') === null")  # Nodes: monitoring only
    assert not browser.visible("tab-cluster")  # the Raft view: monitoring only
    browser.go("#/users", "true", "a try at the Admin page")
    assert browser.js("document.getElementById('users-table') === null")  # the page shows the Overview
    ui = "'X-Requested-With': 'XMLHttpRequest'"
    assert browser.js(f"fetch('/api/users', {{headers: {{{ui}}}}}).then(r => r.status)") == 403
    assert browser.js(f"fetch('/api/raftmq/cluster', {{headers: {{{ui}}}}}).then(r => r.status)") == 403
    # CSRF: the cookie alone does not make a change; with the page's token it does.
    def put(headers: str) -> str:
        return (f"fetch('/api/queues/%2F/ui-alice-q', {{method: 'PUT', headers: {{{ui}, {headers}"
                "'Content-Type': 'application/json'}, body: '{}'}).then(r => r.status)")

    assert browser.js(put("")) == 403
    assert _queue(node, "ui-alice-q")[0] == 404
    assert browser.js(put("'X-CSRF-Token': state.csrf, ")) == 201
    browser.screenshot("ui-management-user.png")


def test_wrong_password(node, browser):
    browser.open(node.http_base + "/")
    browser.wait("!document.getElementById('login').hidden", "the login form")
    browser.fill("login-username", "guest")
    browser.fill("login-password", "not-the-password")
    browser.click("login-submit")
    browser.wait("document.getElementById('login-error').textContent === 'Login failed'", "Login failed")
    assert not browser.visible("app") and browser.js("document.getElementById('main').children.length") == 0


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


ELECTION_TIMEOUT = 60.0  # seconds for the page to show a new leader after a kill -9 (slow shared machine)


def _cluster_page(browser, leader_name: str, what: str, timeout: float = WAIT_TIMEOUT) -> dict:
    """Wait until the Cluster page's members table marks ``leader_name`` (and only it) leader; the
    page's summary, members and leader history as {"summary": {column: text}, "members": {name: [cells]},
    "changes": [[cells]]}."""
    return browser.wait(
        "(() => { const cells = r => [...r.cells].map(c => c.textContent);"
        " const rows = [...document.querySelectorAll('#raft-members tbody tr')];"
        " const leaders = rows.filter(r => r.cells[2].classList.contains('leader')).map(r => r.cells[0].textContent);"
        f" if (rows.length !== 3 || leaders.length !== 1 || leaders[0] !== {json.dumps(leader_name)}) return null;"
        " const heads = [...document.querySelectorAll('#raft-summary thead th')].map(t => t.textContent);"
        " const values = cells(document.querySelector('#raft-summary tbody tr'));"
        " return {summary: Object.fromEntries(heads.map((k, i) => [k, values[i]])),"
        " members: Object.fromEntries(rows.map(r => [r.cells[0].textContent, cells(r)])),"
        " changes: [...document.querySelectorAll('#leader-changes tbody tr')].map(cells)}; })()",
        what, timeout)


@pytest.mark.cluster
def test_cluster_overview_shows_the_leader(tmp_path, browser):
    """A follower's Overview lists the three members and marks the leader Raft reports; its Cluster
    page shows the Raft view, and after kill -9 of the leader a new leader and the change (checks 3)."""
    # (snapshots every 30 entries at most once a second: the Cluster page's snapshots table fills)
    cluster = Cluster(3, tmp_path / "cluster", extra_config="snapshot_entries = 30\nsnapshot_seconds = 1.0")
    bases = {}
    for member in cluster.nodes:
        port = free_port()
        member.extra_args = ["--http-port", str(port)]
        bases[member.node_id] = f"http://127.0.0.1:{port}"
    with cluster:
        cluster.wait_formed()
        leader = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not leader)
        _publish(follower.url, "ui-browser-cluster", 4)
        _publish(follower.url, "ui-browser-entries", 40)  # 40 confirmed publishes: log entries to snapshot
        browser.open(bases[follower.node_id] + "/")
        browser.login("guest", "guest")
        leader_name = f"raftmq@{leader.node_id}"
        roles = browser.wait(
            "(() => { const rows = [...document.querySelectorAll('#nodes tbody tr')];"
            " const leaders = rows.filter(r => r.cells[2].classList.contains('leader')).map(r => r.cells[0].textContent);"
            f" return rows.length === 3 && leaders.length === 1 && leaders[0] === {json.dumps(leader_name)}"
            # a follower's link to the other follower may still be connecting: its role "unknown" then
            " && rows.every(r => r.cells[2].textContent !== 'unknown')"
            " && Object.fromEntries(rows.map(r => [r.cells[0].textContent, r.cells[2].textContent])); })()",
            f"the leader {leader_name}")
        assert roles == {f"raftmq@{n.node_id}": ("leader" if n is leader else "follower") for n in cluster.nodes}
        assert browser.text("node").endswith(f"raftmq@{follower.node_id}")
        browser.wait("document.getElementById('queued').textContent.includes('4')", "4 queued messages")
        browser.screenshot("ui-cluster-follower.png")

        # The queue workflow of test_work_in_the_ui, on the follower of a 3-node cluster (issue 35
        # checks it against a cluster): declare, bind, publish, get back, purge, delete.
        _queue_workflow(browser, bases[follower.node_id], "ui-c-orders", "ui-c-x")

        # Part three: the Connections page of the follower lists a client of another member (the
        # leader), with its node; the Channels page its channel.
        elsewhere = pika.BlockingConnection(pika.URLParameters(leader.url))
        elsewhere.channel()
        browser.click("tab-connections")
        shown = browser.wait(
            "(() => { const rows = [...document.querySelectorAll('#connections-table tbody tr')];"
            " const r = rows.find(r => r.cells[1].textContent === " + json.dumps(leader_name) + ");"
            " return r && [...r.cells].map(c => c.textContent); })()", f"a connection on {leader_name}")
        assert shown[2] == "guest" and shown[5] == "1"  # user, channels
        browser.screenshot("ui-cluster-connections.png")
        browser.click("tab-channels")
        browser.wait("[...document.querySelectorAll('#channels-table tbody tr')].some(r => r.cells[1].textContent === "
                     + json.dumps(leader_name) + ")", f"a channel on {leader_name}")

        # The Cluster page (raftmq's own): the Raft view from the follower.
        browser.click("tab-cluster")
        before = _cluster_page(browser, leader_name, f"the Cluster page with the leader {leader_name}")
        # Each member's own commit and applied index, asked from it (ops/http/members.py): the
        # columns after the leader's lag, filled for all three members.
        reported = browser.wait(
            "(() => { const rows = [...document.querySelectorAll('#raft-members tbody tr')];"
            " const ok = rows.length === 3 && rows.every(r => /^[0-9]+$/.test(r.cells[7].textContent)"
            " && /^[0-9]+$/.test(r.cells[8].textContent));"
            " return ok && Object.fromEntries(rows.map(r => [r.cells[0].textContent, r.cells[9].textContent])); })()",
            "every member's reported indexes")
        assert reported[leader_name].startswith("leader / ")
        # The last snapshots each member wrote (written by its own Raft: index, size, time).
        snapshots = browser.wait(
            "(() => { const rows = [...document.querySelectorAll('#snapshots tbody tr')].map(r => [...r.cells].map("
            "c => c.textContent)); return new Set(rows.map(r => r[0])).size === 3 && rows; })()",
            "a snapshot of every member on the Cluster page", 40)
        assert all(int(row[2]) >= 1 and row[3].endswith("B") and row[4] in ("written", "loaded") for row in snapshots)
        # Replicas' digests side by side: asked with the button; at one applied index they agree.
        browser.click("digests-compare")
        verdict = browser.wait("document.getElementById('digests-verdict') &&"
                               " [...document.querySelectorAll('#digests tbody tr')].filter("
                               " r => /^[0-9a-f]{64}$/.test(r.cells[2].textContent)).length === 3 &&"
                               " document.getElementById('digests-verdict').textContent", "the digests", 40)
        assert "DIFFERENT" not in verdict, verdict
        browser.screenshot("ui-cluster-digests.png")
        assert before["summary"]["Seen from"] == f"raftmq@{follower.node_id}"
        assert before["summary"]["Leader"] == leader_name
        assert leader_name in before["summary"]["Connected partners"]
        term_before = int(before["summary"]["Term"])
        assert term_before >= 1
        me = before["members"][f"raftmq@{follower.node_id}"]
        assert me[2] == "follower" and int(me[4]) >= 1 and int(me[5]) >= 1  # commit, applied index
        assert me[6] == ""  # lag: the leader's knowledge, not shown on a follower
        assert before["changes"] and before["changes"][0][2] == leader_name  # the newest first
        changes_before = int(before["summary"]["Leader changes"])
        browser.screenshot("ui-cluster-raft-before.png")

        # kill -9 the leader (the process this test started, by its PID): the page on the surviving
        # follower shows another leader, the old one down, and the change.
        leader.kill9()
        try:
            elsewhere.close()
        except Exception:  # noqa: BLE001 - its node was just killed
            pass
        after = browser.wait(
            "(() => { const rows = [...document.querySelectorAll('#raft-members tbody tr')];"
            " const leaders = rows.filter(r => r.cells[2].classList.contains('leader')).map(r => r.cells[0].textContent);"
            f" return leaders.length === 1 && leaders[0] !== {json.dumps(leader_name)} && leaders[0]; }})()",
            "a new leader on the Cluster page", ELECTION_TIMEOUT)
        new_leader = cluster.leader(exclude=leader)
        assert after == f"raftmq@{new_leader.node_id}"
        view = _cluster_page(browser, after, "the Cluster page after the election")
        assert view["members"][leader_name][1] == "no"  # the killed leader: not running
        assert int(view["summary"]["Leader changes"]) >= changes_before + 1
        assert int(view["summary"]["Term"]) > term_before
        newest = view["changes"][0]  # [time, term, leader, previous leader]
        assert newest[2] == after and int(newest[1]) > term_before
        assert any(change[3] == leader_name for change in view["changes"])  # the change away from the old one
        browser.screenshot("ui-cluster-raft-after.png")

        # After the failover, on the same follower: add a management user with permissions on "/",
        # log in as it, and see only what its tags allow (the Admin page and the Raft view refused).
        user = "ui-c-alice"
        browser.go("#/users", "document.getElementById('users-table')", "the Admin page")
        browser.fill("user-name-new", user)
        browser.fill("user-password", "alice-pw")
        browser.click("tag-management")
        browser.flash_after("user-add", f"User {user} added.")
        browser.fill("perm-user", user)
        browser.flash_after("perm-set", "Permission set.")
        base = bases[follower.node_id]
        assert _until(lambda: call(base, "GET", path("users", user, "permissions"))[0] == 200, "the permissions")
        browser.click("logout")
        browser.wait("!document.getElementById('login').hidden", "the login form after logging out")
        browser.login(user, "alice-pw")
        browser.wait("document.getElementById('object-totals')", "the Overview as the new user")
        assert not browser.visible("tab-admin") and not browser.visible("tab-cluster")
        ui = "'X-Requested-With': 'XMLHttpRequest'"
        assert browser.js(f"fetch('/api/users', {{headers: {{{ui}}}}}).then(r => r.status)") == 403
        browser.screenshot("ui-cluster-management-user.png")
