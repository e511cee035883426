"""Unbinding when an end of the binding is gone (issue 32), applied to the state machine directly.

0-9-1 (RabbitMQ 3.x ``rabbit_binding:remove``, which drops not-found resources with
``absent_errs_only``): queue.unbind / exchange.unbind naming an exchange or a queue that no longer
exists succeed, the channel stays open; bind keeps 404. 0-10 (shared/specs/amqp-0-10.txt,
exchange.unbind exceptions non-existent-queue L7486ff and non-existent-exchange L7492ff): not-found,
from store/core/session_rules.py before the core's handler.
"""

from __future__ import annotations

import pytest

from raftmq.store.applier import StoredMachine
from raftmq.store.core.commands import ERR, OK, Op, VhostAdd
from raftmq.store.disk.snapshot import digest
from tests.unit.store.test_machine import C, Driver, declare
from tests.unit.store.test_sessions import attach


@pytest.fixture
def driver() -> Driver:
    d = Driver(StoredMachine())
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    return d


def _channel_open(driver: Driver, conn: str = C, number: int = 1) -> bool:
    return number in driver.machine.channels.get(conn, {})


def _exchange(driver: Driver, name: str, kind: str = "direct", auto_delete: bool = False) -> None:
    driver.ok(Op.EXCHANGE_DECLARE, "/", name, kind, False, False, auto_delete, False, {})


def test_queue_unbind_from_a_missing_exchange_is_ok_and_keeps_the_channel(driver):
    """queue.unbind from an exchange that does not exist: OK (RabbitMQ's unbind-ok), no channel close;
    the queue and the channel go on as before."""
    declare(driver, "q")
    driver.ok(Op.QUEUE_UNBIND, "/", "q", "gone", "k", {})
    assert _channel_open(driver)
    assert "q" in driver.machine.vhosts["/"].queues
    declare(driver, "q2")  # the same channel still takes commands


def test_queue_unbind_of_a_missing_queue_is_ok(driver):
    """queue.unbind naming a queue that does not exist, from an existing exchange: OK, and the
    exchange's other bindings are untouched."""
    _exchange(driver, "x")
    declare(driver, "q")
    driver.ok(Op.QUEUE_BIND, "/", "q", "x", "k", {})
    driver.ok(Op.QUEUE_UNBIND, "/", "gone", "x", "k", {})
    assert _channel_open(driver)
    bindings = driver.machine.vhosts["/"].exchanges["x"].bindings
    assert [(b.destination, b.routing_key) for b in bindings] == [("q", "k")]


def test_exchange_unbind_with_either_end_missing_is_ok(driver):
    """exchange.unbind (RabbitMQ's extension) with a missing source, then a missing destination: OK."""
    _exchange(driver, "x")
    driver.ok(Op.EXCHANGE_UNBIND, "/", "x", "gone-source", "k", {})
    driver.ok(Op.EXCHANGE_UNBIND, "/", "gone-destination", "x", "k", {})
    assert _channel_open(driver)


def test_unbind_after_the_dead_letter_exchange_auto_deleted(driver):
    """aio-pika's patterns.RPC close(): its queue's binding to an auto-delete exchange goes with the
    queue, the exchange auto-deletes with its last binding, and the unbind that follows is OK."""
    _exchange(driver, "dlx", auto_delete=True)
    declare(driver, "rpc")
    driver.ok(Op.QUEUE_BIND, "/", "rpc", "dlx", "rpc", {})
    driver.ok(Op.QUEUE_DELETE, "/", "rpc", False, False)
    assert "dlx" not in driver.machine.vhosts["/"].exchanges
    driver.ok(Op.QUEUE_UNBIND, "/", "rpc", "dlx", "rpc", {})
    assert _channel_open(driver)


def test_an_existing_binding_is_still_removed_and_a_missing_one_is_ok(driver):
    """With both ends present an unbind removes the binding; unbinding it again is OK (as before)."""
    _exchange(driver, "x")
    declare(driver, "q")
    driver.ok(Op.QUEUE_BIND, "/", "q", "x", "k", {})
    driver.ok(Op.QUEUE_UNBIND, "/", "q", "x", "k", {})
    assert driver.machine.vhosts["/"].exchanges["x"].bindings == []
    driver.ok(Op.QUEUE_UNBIND, "/", "q", "x", "k", {})


def test_bind_to_a_missing_exchange_or_queue_is_still_404(driver):
    """Bind keeps RabbitMQ's 404 NOT_FOUND for a missing exchange or queue (and the channel closes)."""
    _exchange(driver, "x")
    declare(driver, "q")
    result, _ = driver.call(Op.QUEUE_BIND, "/", "q", "gone", "k", {})
    assert result[0] == ERR and result[1] == 404
    driver.ok(Op.CHANNEL_OPEN, ch=2)
    result, _ = driver.call(Op.QUEUE_BIND, "/", "gone", "x", "k", {}, ch=2)
    assert result[0] == ERR and result[1] == 404
    driver.ok(Op.CHANNEL_OPEN, ch=3)
    result, _ = driver.call(Op.EXCHANGE_BIND, "/", "x", "gone", "k", {}, ch=3)
    assert result[0] == ERR and result[1] == 404


def test_unbind_still_refuses_the_default_exchange_and_another_connections_exclusive_queue(driver):
    """What RabbitMQ refuses before or besides the lookup stays refused: the default exchange (403,
    even for a missing queue) and an existing exclusive queue of another connection (405)."""
    result, _ = driver.call(Op.QUEUE_UNBIND, "/", "gone", "", "gone", {})
    assert result[0] == ERR and result[1] == 403
    assert not _channel_open(driver)  # a refusal closes the channel, as before
    driver.ok(Op.CHANNEL_OPEN)
    _exchange(driver, "x")
    driver.ok(Op.CHANNEL_OPEN, ch=2)
    driver.ok(Op.QUEUE_DECLARE, "/", "ex", False, False, True, False, {}, ch=2)
    driver.ok(Op.QUEUE_BIND, "/", "ex", "x", "k", {}, ch=2)
    driver.ok(Op.CHANNEL_OPEN, conn="conn-2")
    result, _ = driver.call(Op.QUEUE_UNBIND, "/", "ex", "x", "k", {}, conn="conn-2")
    assert result[0] == ERR and result[1] == 405
    assert len(driver.machine.vhosts["/"].exchanges["x"].bindings) == 1


def test_replicas_agree():
    """The lenient unbind depends only on the replicated state: two machines applying the same log
    answer alike and end with the same digest."""
    answers = []
    for _ in range(2):
        d = Driver(StoredMachine())
        d.apply(VhostAdd(None, None, "/"))
        d.ok(Op.CHANNEL_OPEN)
        declare(d, "q")
        results = [d.call(Op.QUEUE_UNBIND, "/", "q", "gone", "k", {})[0],
                   d.call(Op.QUEUE_UNBIND, "/", "gone", "amq.direct", "k", {})[0]]
        answers.append((results, digest(d.machine)))
    assert answers[0] == answers[1]
    assert [r[0] for r in answers[0][0]] == [OK, OK]


def test_0_10_unbind_of_a_missing_queue_or_exchange_is_not_found():
    """0-10 keeps its spec: exchange.unbind of a missing queue is not-found (non-existent-queue,
    L7486ff), of a missing exchange not-found (non-existent-exchange, L7492ff)."""
    for queue, exchange, rule in (("gone", "amq.direct", "non-existent-queue"),
                                  ("q", "gone", "non-existent-exchange")):
        m = StoredMachine()
        m.apply_batch(1, [VhostAdd(None, None, "/")])
        a, _ = attach(m, "n1.x.1")
        assert a.command(Op.QUEUE_DECLARE, "/", "q", False, False, False, False, {})[0] == OK
        result = a.command(Op.QUEUE_UNBIND, "/", queue, exchange, "k", {})
        assert result[0] == ERR and result[1] == 404 and rule in result[2], result
