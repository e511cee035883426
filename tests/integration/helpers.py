"""Small helpers shared by the integration tests (pika blocking client, bounded waits, names)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel

from raftmq.ops.local.node import RaftmqNode, free_port

OP_TIMEOUT = 10.0  # upper bound for any single wait in these tests


def uniq(prefix: str = "t") -> str:
    """A name no other test (or earlier run against the same broker) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + min(timeout, OP_TIMEOUT)
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pika_params(url: str, **overrides: Any) -> pika.URLParameters:
    """URL parameters with every client-side wait bounded."""
    params = pika.URLParameters(url)
    params.socket_timeout = 5
    params.stack_timeout = 10
    params.blocked_connection_timeout = 10
    params.connection_attempts = 1
    for k, v in overrides.items():
        setattr(params, k, v)
    return params


def connect(url: str, **overrides: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika_params(url, **overrides))


def get_bodies(ch: BlockingChannel, queue: str, limit: int = 10_000) -> list[bytes]:
    """Drain ``queue`` with basic.get (auto-ack) and return the bodies in order."""
    out = []
    for _ in range(limit):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        out.append(body)
    return out


def consume_acked(ch: BlockingChannel, queue: str, expected: int, prefetch: int = 64,
                  inactivity: float = 5.0) -> list[bytes]:
    """Consume ``queue`` with manual acks until ``expected`` bodies came or none for
    ``inactivity`` seconds; the bodies in order."""
    ch.basic_qos(prefetch_count=prefetch)
    got: list[bytes] = []
    for method, _props, data in ch.consume(queue, inactivity_timeout=inactivity):
        if method is None:
            break
        got.append(data)
        ch.basic_ack(method.delivery_tag)
        if len(got) == expected:
            break
    ch.cancel()
    return got


def message_count(ch: BlockingChannel, queue: str) -> int:
    """The message count reported by a passive queue.declare (reference 1.7.2.2 declare-ok)."""
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_for_count(ch: BlockingChannel, queue: str, n: int, timeout: float = 5.0) -> None:
    wait_until(lambda: message_count(ch, queue) == n, timeout, what=f"{n} messages in {queue}")


def get_one(ch: BlockingChannel, queue: str, timeout: float = 5.0, auto_ack: bool = True):
    """basic.get until a message arrives (for asynchronous routes such as dead-lettering)."""
    def attempt():
        method, props, body = ch.basic_get(queue, auto_ack=auto_ack)
        return (method, props, body) if method is not None else None
    return wait_until(attempt, timeout, interval=0.05, what=f"a message in {queue}")


def consume(conn: pika.BlockingConnection, ch: BlockingChannel, queue: str, n: int,
            timeout: float = 5.0, auto_ack: bool = True) -> list[tuple[Any, Any, bytes]]:
    """basic.consume until ``n`` deliveries arrived (bounded), cancel, return (method, props, body)."""
    got: list[tuple[Any, Any, bytes]] = []
    tag = ch.basic_consume(queue, lambda _c, m, p, b: got.append((m, p, b)), auto_ack=auto_ack)
    deadline = time.monotonic() + min(timeout, OP_TIMEOUT)
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


def pump(conn: pika.BlockingConnection, seconds: float) -> None:
    """Process I/O for ``seconds`` (to show that nothing more arrives)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=max(0.0, min(0.05, deadline - time.monotonic())))


def round_trip(url: str) -> None:
    """A fresh pika connection can declare, publish and get: the broker is alive and sane."""
    conn = connect(url)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        q = ch.queue_declare(uniq("alive"), exclusive=True).method.queue
        body = uuid.uuid4().bytes
        ch.basic_publish("", q, body)
        method, _props, got = get_one(ch, q)
        assert got == body
        assert method.redelivered is False
    finally:
        conn.close()


def fresh_status(node) -> dict:
    """The node's status.json written after now by its current process (within 5 s)."""
    start = time.time()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            data = json.loads((node.data_dir / "status.json").read_text())
        except (OSError, ValueError):
            data = None
        if data is not None and data["time"] >= start and data["pid"] == node.pid:
            return data
        time.sleep(0.05)
    raise AssertionError("no fresh status.json")


def http_node(directory: Path, rabbitmq_compat: bool = False) -> RaftmqNode:
    """A raftmq node (not started) in ``directory`` with its HTTP API on a free port (``node.http``, its
    base URL) and guest/guest as an administrator; ``rabbitmq_compat`` turns on amqp10_rabbitmq_compat
    (RabbitMQ 4's clients)."""
    config = directory / "node.toml"
    http_port = free_port()
    compat = "amqp10_rabbitmq_compat = true\n" if rabbitmq_compat else ""
    config.write_text(f'{compat}http_port = {http_port}\n'
                      '[users.guest]\npassword = "guest"\ntags = ["administrator"]\n')
    node = RaftmqNode(directory / "data", config=config)
    node.http = f"http://127.0.0.1:{http_port}"
    return node
