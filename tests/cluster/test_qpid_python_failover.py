"""Apache Qpid's Python client (qpid.messaging) fails over between raftmq nodes with its own
reconnect options (issue 23).

qpid.messaging reconnects to ``reconnect_urls`` when its connection breaks, re-attaches its
sessions (session.attach with force, spec L4465ff) and resends what was not completed: at least
once. It cannot follow connection.redirect (it has no handler), so raftmq serves it on whichever
node it reaches, the commands going to the leader through the log. The client is the PyPI release
with only the Python 3 port of tests/interop/qpid_python3.patch.
"""

from __future__ import annotations

import threading
import time

import pytest

from raftmq.ops.local.cluster import Cluster
from tests.support import qpid_python

pytestmark = [pytest.mark.cluster, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

N = 300


@pytest.fixture(scope="module")
def qpid(tmp_path_factory):
    qpid_python.require(tmp_path_factory)


def _connection(first: str, others: list[str]):
    from qpid.messaging import Connection

    return Connection(first, username="guest", password="guest", reconnect=True, reconnect_urls=others,
                      reconnect_interval=0.2, reconnect_timeout=60, heartbeat=2)


def test_qpid_messaging_fails_over_with_its_reconnect_urls(qpid, tmp_path, caplog):
    """A leader kill -9 while qpid.messaging sends (connected to the leader) and receives (connected
    to a follower, which serves it): the producer moves to another node by itself and every message
    arrives (duplicates allowed: at-least-once)."""
    from qpid.messaging import Message

    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        urls = [f"127.0.0.1:{n.port}" for n in sorted(cluster.nodes, key=lambda n: n is not leader)]
        producer = _connection(urls[0], urls[1:])
        consumer = _connection(urls[1], [urls[0], urls[2]])  # a follower: served there, no redirect
        producer.open()
        consumer.open()
        snd = producer.session().sender("qpid-failover; {create: always, node: {durable: true}}")
        rcv_ssn = consumer.session()
        rcv = rcv_ssn.receiver("qpid-failover", capacity=10)
        got: list[str] = []
        errors: list[BaseException] = []

        def drain() -> None:
            deadline = time.monotonic() + 120
            try:
                while len(set(got)) < N and time.monotonic() < deadline:
                    try:
                        message = rcv.fetch(timeout=1)
                    except Exception as exc:  # Empty while failing over
                        if type(exc).__name__ != "Empty":
                            raise
                        continue
                    got.append(message.content)
                    rcv_ssn.acknowledge(message)
            except BaseException as exc:  # noqa: BLE001  (reported by the test thread)
                errors.append(exc)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        killed = None
        for i in range(N):
            if i == N // 3:
                killed = cluster.leader()
                killed.kill9()
            snd.send(Message(f"m{i}", durable=True), sync=True, timeout=60)
        reader.join(150)
        assert not errors, errors
        assert killed is not None
        assert set(got) == {f"m{i}" for i in range(N)}
        assert producer.get_error() is None and consumer.get_error() is None
        # The producer was on the killed leader and reconnected by itself (the client logs it).
        reconnects = [r for r in caplog.records if r.name == "qpid.messaging" and "reconnect succeeded" in r.message]
        assert reconnects, [r.message for r in caplog.records]
        producer.close(timeout=10)
        consumer.close(timeout=10)
