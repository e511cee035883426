"""Logins: hashing off the loop, the same time for unknown users, ANONYMOUS under loopback_only (issue 31, items 6, 8).

Found on main: a login flood moved another client's round trip p50 from 2 to 37 ms (PBKDF2 on the
event loop); a login for an existing user took 11.2 ms against 0.3 ms for an unknown one (user
enumeration); with ``amqp10_anonymous_user = "guest"``, 1.0 ANONYMOUS logged in as guest from a
non-loopback address (guest is loopback-only).

1. 200 bounded logins (raw AMQP 1.0 SASL PLAIN, wrong password, 8 threads) while a pika client
   measures publish + get round trips on its open connection: the p50 during the flood is printed
   beside the baseline and asserted under a loose absolute bound (5 ms; main's code: 10.7 ms); every
   flood login is answered with sasl-outcome auth (5.3.3.6 code 1; a refusal as busy is the same).
2. Median login time for a managed user (PBKDF2 record) with a wrong password against an unknown
   user: within 3x (printed; main's code: 11.1 against 0.7 ms, 16x).
3. A 1.0 client that pipelines its AMQP header and open after sasl-init (5.3.2 allows it) gets the
   outcome, then the header and open, in that order.
4. From a network namespace's address (not loopback): ANONYMOUS (SASL, and without SASL) is refused
   for the loopback-only anonymous user, while a PLAIN user without loopback_only logs in from the
   same address.  Skipped when network namespaces are unavailable (not root, no iproute2).
"""

from __future__ import annotations

import base64
import json
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pika
import pytest

from raftmq.ops.chaos import netns
from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.frames import AMQP_HEADER, SASL_HEADER, TYPE_SASL, FrameReader, encode_frame
from tests.integration.helpers import http_node, uniq

READ_TIMEOUT = 10.0
FLOOD_LOGINS = 200
FLOOD_THREADS = 8
SAMPLES = 30


@pytest.fixture(scope="module")
def raftmq_only(broker_kind: str) -> None:
    if broker_kind == "rabbitmq":
        pytest.skip("drives private raftmq nodes (raftmq configuration)")


MANAGED = "flooded"  # a user made through the HTTP API: its password is a PBKDF2 record


def put_json(url: str, body: dict) -> int:
    """PUT ``body`` as guest (an administrator on http_node): the HTTP status."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


@pytest.fixture(scope="module")
def node(raftmq_only, tmp_path_factory) -> Iterator[RaftmqNode]:
    n = http_node(tmp_path_factory.mktemp("logins")).start()
    assert put_json(f"{n.http}/api/users/{MANAGED}", {"password": "right", "tags": ""}) in (201, 204)
    assert put_json(f"{n.http}/api/permissions/%2F/{MANAGED}",
                    {"configure": ".*", "write": ".*", "read": ".*"}) in (201, 204)
    code, _ = sasl_login("127.0.0.1", n.port, "PLAIN", plain(MANAGED, "right"))
    assert code == 0
    yield n
    n.terminate()


def sasl_login(host: str, port: int, mechanism: str, response: bytes | None,
               then: bytes = b"") -> tuple[int | None, bytes]:
    """Send the SASL header and a sasl-init (and ``then`` in the same write): the sasl-outcome code
    (None if the socket closed first) and the octets that followed the outcome frame -- all of them
    until EOF when ``then`` is sent, else none.  Every read is bounded by READ_TIMEOUT."""
    with socket.create_connection((host, port), timeout=READ_TIMEOUT) as sock:
        init = p.SaslInit(mechanism=t.Symbol(mechanism), initial_response=response)
        sock.sendall(SASL_HEADER + encode_frame(init, 0, frame_type=TYPE_SASL) + then)
        data = b""
        deadline = time.monotonic() + READ_TIMEOUT
        while time.monotonic() < deadline:
            code, end = sasl_outcome(data)
            if code is not None and (code != 0 or not then or _has_open(data[end:])):
                return code, data[end:]
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                chunk = b""
            if not chunk:
                code, end = sasl_outcome(data)
                return code, data[end:]
            data += chunk
        raise TimeoutError("no sasl-outcome")


def sasl_outcome(data: bytes) -> tuple[int | None, int]:
    """The code of the sasl-outcome in ``data`` (SASL header, then SASL frames) and where it ends."""
    pos = 8
    while len(data) >= pos + 4:
        size = int.from_bytes(data[pos:pos + 4], "big")
        if size < 8 or len(data) < pos + size:
            break
        for frame in FrameReader(1 << 20).feed(data[pos:pos + size]):
            if isinstance(frame.performative, p.SaslOutcome):
                return frame.performative.code, pos + size
        pos += size
    return None, pos


def _has_open(rest: bytes) -> bool:
    """Whether ``rest`` (what followed the outcome) is the AMQP header, then frames holding an open."""
    if not rest.startswith(AMQP_HEADER):
        return False
    try:
        return any(isinstance(f.performative, p.Open) for f in FrameReader(1 << 20).feed(rest[8:]))
    except Exception:  # a partial frame: not yet
        return False


def plain(user: str, password: str) -> bytes:
    return b"\0" + user.encode() + b"\0" + password.encode()


class RoundTrips:
    """A pika client on an open connection timing basic.publish + basic.get, bounded in count and time."""

    def __init__(self, url: str) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(url))
        self.ch = self.conn.channel()
        self.queue = self.ch.queue_declare(uniq("rt"), exclusive=True).method.queue

    def sample(self, count: int = 400, seconds: float = 20.0, stop: threading.Event | None = None) -> list[float]:
        times = []
        deadline = time.monotonic() + seconds
        while len(times) < count and time.monotonic() < deadline and not (stop and stop.is_set()):
            started = time.perf_counter()
            self.ch.basic_publish("", self.queue, b"x")
            method = None
            while method is None:
                method, _props, _body = self.ch.basic_get(self.queue, auto_ack=True)
            times.append(time.perf_counter() - started)
        return times

    def close(self) -> None:
        self.conn.close()


def test_a_login_flood_leaves_other_clients_round_trips_near_their_baseline(node):
    """200 wrong-password logins of a managed user from 8 threads (one PBKDF2 each) while another
    client measures publish + get on its open connection: every login is refused with sasl-outcome
    auth (code 1), and the p50 round trip during the flood stays under 5 ms (figures printed; on
    this machine 0.3 ms before and during, where main's code gave 0.3 ms before and 10.7 ms during)."""
    rt = RoundTrips(node.url)
    try:
        baseline = rt.sample(200)
        stop = threading.Event()
        during: list[float] = []
        sampler = threading.Thread(target=lambda: during.extend(rt.sample(10_000, 30.0, stop)))

        def one(i: int) -> int | None:
            return sasl_login("127.0.0.1", node.port, "PLAIN", plain(MANAGED, f"wrong-{i}"))[0]

        sampler.start()
        started = time.monotonic()
        with ThreadPoolExecutor(FLOOD_THREADS) as pool:
            codes = list(pool.map(one, range(FLOOD_LOGINS)))
        took = time.monotonic() - started
        stop.set()
        sampler.join(timeout=35)
    finally:
        rt.close()
    p50_before, p50_during = statistics.median(baseline), statistics.median(during)
    print(f"\nround trip p50 {1000 * p50_before:.2f} ms before, {1000 * p50_during:.2f} ms during "
          f"{FLOOD_LOGINS} logins in {took:.2f} s (max during {1000 * max(during):.1f} ms, {len(during)} samples)")
    assert codes == [1] * FLOOD_LOGINS, codes
    assert len(during) >= 20
    assert p50_during < 0.005, (p50_before, p50_during)


def test_unknown_and_existing_users_take_the_same_time(node):
    """Median of 30 wrong-password logins for a managed user (a PBKDF2 record) and for an unknown
    name: within 3x of each other (main: 11.2 ms against 0.3 ms).  Both are refused with
    sasl-outcome auth."""
    def timed(user: str) -> float:
        started = time.perf_counter()
        code, _ = sasl_login("127.0.0.1", node.port, "PLAIN", plain(user, "not-the-password"))
        took = time.perf_counter() - started
        assert code == 1
        return took

    existing, unknown = [], []
    for i in range(SAMPLES):  # interleaved, first one then the other (the first of a pair was ~6 ms slower)
        if i % 2:
            existing.append(timed(MANAGED))
            unknown.append(timed(f"nobody-{i}"))
        else:
            unknown.append(timed(f"nobody-{i}"))
            existing.append(timed(MANAGED))
    a, b = statistics.median(existing), statistics.median(unknown)
    print(f"\nlogin median: existing user {1000 * a:.2f} ms, unknown user {1000 * b:.2f} ms (ratio {a / b:.2f})")
    assert 1 / 3 < a / b < 3, (a, b)


def test_a_pipelined_header_and_open_wait_for_the_sasl_outcome(node):
    """5.3.2: a client may send the AMQP header (and open) right after sasl-init; the node answers
    the outcome (ok), then its header, then its open, in that order, although the password is
    checked in the login pool meanwhile."""
    then = AMQP_HEADER + encode_frame(p.Open(container_id="pipelined"))
    code, rest = sasl_login("127.0.0.1", node.port, "PLAIN", plain("guest", "guest"), then=then)
    assert code == 0
    assert _has_open(rest), rest


# ---------------------------------------------------------------------------------------------- a non-loopback client

@pytest.fixture(scope="module")
def remote_node(raftmq_only, tmp_path_factory) -> Iterator[tuple[RaftmqNode, str]]:
    """A node inside a network namespace, reached from the root namespace's veth address: its clients'
    address is not loopback."""
    if not netns.available():
        pytest.skip("network namespaces unavailable (needs root and iproute2)")
    directory: Path = tmp_path_factory.mktemp("anon-remote")
    config = directory / "raftmq.toml"
    config.write_text('disk_free_limit = 1\namqp10_anonymous_user = "guest"\n'
                      '[users.guest]\npassword = "guest"\nloopback_only = true\ntags = ["administrator"]\n'
                      '[users.remote]\npassword = "pw"\n')
    network = netns.NetnsNetwork(size=1).create()
    try:
        n = RaftmqNode(directory / "data", port=5672, config=config, host=network.addresses[0],
                       command_prefix=network.prefix(0))
        n.start()
        try:
            yield n, network.host_address
        finally:
            n.terminate()
    finally:
        network.destroy()


def test_anonymous_from_a_non_loopback_address_obeys_loopback_only(remote_node):
    """Issue 31 item 6: with amqp10_anonymous_user = guest (loopback_only), a client from the
    namespace's bridge address is refused: SASL ANONYMOUS gets sasl-outcome auth (5.3.3.6 code 1),
    a client skipping SASL gets the SASL header and EOF (2.2); the log names the reason.  A PLAIN
    login of a user without loopback_only from the same address succeeds (code 0), so the refusal
    is the user's limit, not the network."""
    n, _client_address = remote_node
    code, _ = sasl_login(n.host, n.port, "ANONYMOUS", None)
    assert code == 1
    with socket.create_connection((n.host, n.port), timeout=READ_TIMEOUT) as sock:
        sock.sendall(AMQP_HEADER + encode_frame(p.Open(container_id="no-sasl")))
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    assert data == SASL_HEADER, data
    code, _ = sasl_login(n.host, n.port, "PLAIN", plain("remote", "pw"))
    assert code == 0
    assert "can only connect via localhost" in n.log_tail(200)


# ---------------------------------------------------------------------------------------------- the pool's bound

def test_logins_beyond_the_pool_bound_are_refused_at_once(raftmq_only, tmp_path):
    """With login_workers = 1 and login_queue_limit = 2, 40 concurrent wrong-password logins (1.0 SASL
    PLAIN) and 40 concurrent HTTP requests with wrong Basic credentials: every login is answered
    (sasl-outcome auth; HTTP 401, or 503 for the busy refusal), some were refused as busy
    (status.json ``logins_refused_busy``), the refusal is logged at most a few times (once per
    10 s), and a correct login works afterwards.  HTTP requests with credentials verified before
    (guest, interleaved with the flood) all get 200: they are answered without the pool."""
    from tests.integration.helpers import fresh_status

    n = http_node(tmp_path)
    config = Path(n.config)
    config.write_text("login_workers = 1\nlogin_queue_limit = 2\n" + config.read_text())
    n.start()
    try:
        assert put_json(f"{n.http}/api/users/{MANAGED}", {"password": "right", "tags": ""}) in (201, 204)

        def amqp(i: int) -> int | None:
            return sasl_login("127.0.0.1", n.port, "PLAIN", plain(MANAGED, f"wrong-{i}"))[0]

        def http(i: int, user: str = MANAGED, password: str | None = None) -> int:
            credentials = f"{user}:{password or f'wrong-{i}'}"
            request = urllib.request.Request(f"{n.http}/api/overview", headers={
                "Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()})
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return answer.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert http(0, "guest", "guest") == 200  # verified once: remembered
        with ThreadPoolExecutor(20) as pool:
            codes = list(pool.map(amqp, range(40)))
            answers = list(pool.map(lambda i: http(i) if i % 3 else http(i, "guest", "guest"), range(60)))
        statuses = [a for i, a in enumerate(answers) if i % 3]
        assert codes == [1] * 40, codes
        assert set(statuses) <= {401, 503}, statuses
        assert [a for i, a in enumerate(answers) if not i % 3] == [200] * 20, answers
        status = fresh_status(n)
        print(f"\nbusy refusals: {status['logins_refused_busy']} of 80; HTTP answers {sorted(statuses)}")
        assert status["logins_refused_busy"] > 0, status
        lines = [line for line in n.log_tail(2000).splitlines() if "login refused:" in line]
        assert 1 <= len(lines) <= 3, lines
        assert sasl_login("127.0.0.1", n.port, "PLAIN", plain(MANAGED, "right"))[0] == 0
    finally:
        n.terminate()
