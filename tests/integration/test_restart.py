"""Durability across kill -9 (raftmq only: the test drives its own node through ``fresh_node``).

reference 1.7.2.1.4 (queue.declare durable): "Durable queues remain active when a server restarts.
Non-durable queues (transient queues) are purged if/when a server restarts." reference 1.6.2.1.5 says the
same of exchanges; reference 1.7.2.3 (queue.bind): "Bindings of durable queues to durable exchanges are
automatically durable and the server MUST restore such bindings after a server restart." The basic class
guidelines (reference 1.8) ask the server to keep persistent messages on reliable storage; raftmq goes
further and promises that a publisher confirm means the message is on disk, so nothing confirmed may be
lost to a SIGKILL.
"""

from __future__ import annotations

from collections.abc import Callable

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.integration.helpers import connect, get_bodies, get_one, message_count, uniq

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
N = 200


def populate(url: str) -> dict[str, str]:
    """Create durable and transient state, every publish confirmed; leave one message delivered, unacked."""
    names = {k: uniq(k) for k in ("durable_q", "mixed_q", "unacked_q", "transient_q", "durable_x",
                                  "transient_x")}
    conn = connect(url)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(names["durable_q"], durable=True)
    ch.queue_declare(names["mixed_q"], durable=True)
    ch.queue_declare(names["unacked_q"], durable=True)
    ch.queue_declare(names["transient_q"], durable=False)
    ch.exchange_declare(names["durable_x"], "direct", durable=True)
    ch.exchange_declare(names["transient_x"], "fanout", durable=False)
    ch.queue_bind(names["durable_q"], names["durable_x"], "k")
    for i in range(N):
        ch.basic_publish("", names["durable_q"], b"%03d" % i, PERSISTENT)  # confirmed one by one
    for i in range(10):
        ch.basic_publish("", names["mixed_q"], b"p%d" % i, PERSISTENT)
        ch.basic_publish("", names["mixed_q"], b"t%d" % i, TRANSIENT)
    ch.basic_publish("", names["transient_q"], b"gone", PERSISTENT)
    for i in range(3):
        ch.basic_publish("", names["unacked_q"], b"u%d" % i, PERSISTENT)
    assert message_count(ch, names["durable_q"]) == N
    method, _, body = get_one(ch, names["unacked_q"], auto_ack=False)  # delivered, never acked
    assert body == b"u0" and method.redelivered is False
    return names


def verify_after_crash(url: str, names: dict[str, str]) -> None:
    conn = connect(url)
    try:
        ch = conn.channel()
        # all 200 confirmed persistent messages, in publication order, still persistent
        assert message_count(ch, names["durable_q"]) == N
        got = []
        for _ in range(N):
            method, props, body = ch.basic_get(names["durable_q"], auto_ack=True)
            assert method is not None, f"only {len(got)} of {N} messages survived"
            assert props.delivery_mode == 2
            got.append(body)
        assert got == [b"%03d" % i for i in range(N)]
        assert ch.basic_get(names["durable_q"], auto_ack=True)[0] is None

        # the durable binding of the durable queue to the durable exchange was restored
        ch.confirm_delivery()
        ch.exchange_declare(names["durable_x"], passive=True)
        ch.basic_publish(names["durable_x"], "k", b"via-restored-binding")
        assert get_bodies(ch, names["durable_q"]) == [b"via-restored-binding"]

        # transient messages in a durable queue are gone, persistent ones stay in order
        assert get_bodies(ch, names["mixed_q"]) == [b"p%d" % i for i in range(10)]

        # the delivered-but-unacked message is back, flagged as possibly delivered before
        seen = {}
        for _ in range(3):
            method, _, body = get_one(ch, names["unacked_q"])
            seen[body] = method.redelivered
        assert set(seen) == {b"u0", b"u1", b"u2"}
        assert seen[b"u0"] is True

        # non-durable queue and exchange are gone
        for declare in (lambda c: c.queue_declare(names["transient_q"], passive=True),
                        lambda c: c.exchange_declare(names["transient_x"], passive=True)):
            c = conn.channel()
            with pytest.raises(ChannelClosedByBroker) as info:
                declare(c)
            assert info.value.reply_code == 404
    finally:
        conn.close()


def crash_and_recover(url: str, restart: Callable[[], str]) -> None:
    names = populate(url)
    new_url = restart()
    verify_after_crash(new_url, names)


def test_confirmed_persistent_messages_survive_kill_9(fresh_node):
    """200 confirmed persistent messages in a durable queue survive SIGKILL, in order; transient messages,
    the non-durable queue and exchange do not; durable bindings come back; unacked -> redelivered."""
    def restart() -> str:
        fresh_node.restart(hard=True)  # SIGKILL, then the same data dir and port
        assert fresh_node.is_alive()
        return fresh_node.url

    crash_and_recover(fresh_node.url, restart)


def test_recovery_is_repeatable(fresh_node):
    """Recovering must not rewrite state it cannot read back: a second kill -9 right after the first
    recovery (no new writes) recovers the same queue, and a plain restart (SIGTERM) keeps it too."""
    conn = connect(fresh_node.url)
    ch = conn.channel()
    ch.confirm_delivery()
    q = uniq("again")
    ch.queue_declare(q, durable=True)
    for i in range(20):
        ch.basic_publish("", q, b"%02d" % i, PERSISTENT)
    fresh_node.restart(hard=True)
    conn = connect(fresh_node.url)
    assert message_count(conn.channel(), q) == 20
    conn.close()
    fresh_node.restart(hard=True)
    fresh_node.restart(hard=False)
    conn = connect(fresh_node.url)
    try:
        assert get_bodies(conn.channel(), q) == [b"%02d" % i for i in range(20)]
    finally:
        conn.close()


def test_a_node_refuses_to_start_on_a_store_written_by_a_newer_raftmq(broker_kind, tmp_path):
    """raftmq/versions.py: a real node process on an LMDB store stamped with a newer format stops at
    once with exit status 78 and says why, instead of reading tables whose meaning it does not know."""
    if broker_kind != "raftmq":
        pytest.skip("starts a raftmq node process")
    import subprocess
    import sys

    import msgpack

    from raftmq.ops.local.node import free_port
    from raftmq.store.disk.durable import DurableStore
    from raftmq.versions import EXIT_FORMAT_TOO_NEW, STORE_FORMAT

    data = tmp_path / "data"
    store = DurableStore(str(data / "state"))
    with store.env.begin(write=True) as txn:
        txn.put(b"format", msgpack.packb(STORE_FORMAT + 1), db=store.db["meta"])
    store.close()
    done = subprocess.run([sys.executable, "-m", "raftmq", "server", "--host", "127.0.0.1", "--port",
                           str(free_port()), "--data-dir", str(data)], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_FORMAT_TOO_NEW, (done.returncode, done.stderr[-2000:])
    assert "newer than" in done.stdout + done.stderr
