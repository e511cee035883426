"""The chaos workload: clients that record every operation's outcome for the checker.

* ``Publisher091``: numbered persistent messages with publisher confirms (pika), failing over
  between nodes by itself on any error.  At-least-once: a message whose confirm was lost with the
  connection is recorded ``info`` and may show up twice.
* ``Publisher091(dedup=True)``: the same into a queue with ``x-message-deduplication``; every
  message carries ``x-deduplication-header`` = its number, and a message whose confirm was lost
  with the connection is published again (same number, same header) on the next node until it is
  confirmed.  Exactly-once: the replicated deduplication cache (store/core/dedup.py) drops the resend.
  Its queue is only drained at the end, like the 0-10 one.
* ``Publisher010``: the AMQP 0-10 client with session resume (it replays across failovers by
  itself).  Exactly-once: no message of it may be received twice.
* ``Consumer091``: consumes the 0-9-1 queue during the run with manual acks, failing over like
  the publisher; a delivery whose ack is lost with its connection comes again (at-least-once).
  The 0-10 queue is only drained at the end, so that consumer-side redeliveries never blur the
  publisher's exactly-once check.
* ``drain``: after the faults are healed, read everything left in a queue.

Bodies check themselves (issue 29): ``make_body(value)`` is ``b"<value>:<crc32c of payload, hex>:"``
followed by a payload derived from the value alone (a BLAKE2b stream), so every consumer checks each
delivered body against what was published (``read_body``: the exact bytes ``make_body`` gives for the
number it carries) and records a body that differs as a *damaged* delivery -- the checker counts them.

Every publisher stops after ``limit`` messages as well as when told to (a bounded load).

With queue groups (issue 34, ``groups`` > 1) the 0-9-1 queues are placed with ``x-queue-group``
(``placement``): the plain one in queue group 1, the deduplicating one in group 2 (1 if there are
only two groups), every declare of a queue with the same argument; the 0-10 queue stays in the
metadata group, where sessions live (docs/design.md, "Sharded Raft groups").

Operations carry the time their outcome was known (seconds since the run's start) and, for
confirmed publishes, the confirm latency: the timeline plot shows both.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

import crc32c

from .checker import Operation

Q091, Q010, Q091_DEDUP = "chaos-091", "chaos-010", "chaos-091-dedup"
# The deduplicating queue: entries outlive their messages for 10 minutes (x-cache-ttl), longer than
# any resend, within a cache that holds every message of a long run.
DEDUP_ARGUMENTS = {"x-message-deduplication": True, "x-cache-ttl": 600_000, "x-cache-size": 2_000_000}
DEDUP_FIRST = 2_000_000_000  # its message numbers (0-9-1 from 1, 0-10 from 1e9)
BODY_BYTES = 512  # payload bytes of each message
LIMIT = 1_000_000  # messages per publisher, at most


def placement(queue: str, groups: int) -> dict[str, int]:
    """The ``x-queue-group`` argument of a workload queue with ``groups`` Raft groups (none with one)."""
    if groups <= 1 or queue == Q010:
        return {}
    return {"x-queue-group": 2 if queue == Q091_DEDUP and groups > 2 else 1}


def make_body(value: int, size: int = BODY_BYTES) -> bytes:
    """The body of message ``value``: its number, the CRC32C of its payload, the payload (``size``
    bytes that depend on the number only)."""
    seed = value.to_bytes(8, "little")
    stream = b"".join(hashlib.blake2b(seed + block.to_bytes(4, "little")).digest()
                      for block in range(-(-size // 64)))
    payload = stream[:size]
    return b"%d:%08x:" % (value, crc32c.crc32c(payload)) + payload


def read_body(body: bytes, size: int = BODY_BYTES) -> tuple[int, bool]:
    """(the number a delivered body carries, -1 if unreadable; whether it is exactly what was published)."""
    head = body.split(b":", 1)[0]
    try:
        value = int(head)
    except ValueError:
        return -1, False
    if not head.isdigit() or value < 0:
        return -1, False
    return value, body == make_body(value, size)


def body_difference(body: bytes, value: int, size: int = BODY_BYTES) -> str:
    """How a damaged ``body`` differs from what message ``value`` was published with."""
    if value < 0:
        return f"unreadable number: {len(body)} B, starts {body[:24]!r}"
    expected = make_body(value, size)
    first = next((i for i, (a, b) in enumerate(zip(body, expected, strict=False)) if a != b),
                 min(len(body), len(expected)))
    differing = sum(a != b for a, b in zip(body, expected, strict=False))
    return (f"message {value}: {len(body)} B (published {len(expected)} B), {differing} bytes differ, "
            f"the first at offset {first}")


def _dequeued(body: bytes, client: str, clock, size: int) -> Operation:
    value, intact = read_body(body, size)
    if intact:
        return Operation("dequeue", value, "ok", client, time=clock())
    return Operation("dequeue", value, "ok", client, time=clock(), damaged=True,
                     note=body_difference(body, value, size))


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


class Publisher091(threading.Thread):
    def __init__(self, urls: list[str], history: list[Operation], clock: Clock, name: str = "p091",
                 dedup: bool = False, body_bytes: int = BODY_BYTES, limit: int = LIMIT, groups: int = 1) -> None:
        super().__init__(daemon=True, name=name)
        self.urls, self.history, self.clock = urls, history, clock
        self.groups = groups
        self.body_bytes, self.limit = body_bytes, limit
        self.stop = threading.Event()
        self.client = name
        self.dedup = dedup
        self.queue = Q091_DEDUP if dedup else Q091
        self.kind = "0-9-1-dedup" if dedup else "0-9-1"
        self.resent = 0  # dedup: publishes repeated after a lost confirm

    def run(self) -> None:
        import pika

        first = seq = DEDUP_FIRST if self.dedup else 0
        i = 0
        unconfirmed: int | None = None  # dedup: the number whose confirm was lost, to publish again
        kind = self.kind
        while not self.stop.is_set() and (seq - first < self.limit or unconfirmed is not None):
            url = self.urls[i % len(self.urls)]
            i += 1
            try:
                conn = pika.BlockingConnection(pika.URLParameters(
                    url + "?connection_attempts=1&socket_timeout=2&blocked_connection_timeout=5"))
                ch = conn.channel()
                ch.confirm_delivery()
                arguments = {**(DEDUP_ARGUMENTS if self.dedup else {}), **placement(self.queue, self.groups)}
                ch.queue_declare(self.queue, durable=True, arguments=arguments or None)
                while not self.stop.is_set():
                    if unconfirmed is None and seq - first >= self.limit:
                        break
                    if unconfirmed is not None:
                        value, unconfirmed = unconfirmed, None
                        self.resent += 1
                    else:
                        seq += 1
                        value = seq
                    headers = {"x-deduplication-header": str(value)} if self.dedup else None
                    started = self.clock()
                    try:
                        ch.basic_publish("", self.queue, make_body(value, self.body_bytes),
                                         pika.BasicProperties(delivery_mode=2, headers=headers))
                    except (pika.exceptions.UnroutableError, pika.exceptions.NackError):
                        self.history.append(Operation("enqueue", value, "fail", self.client, kind, self.clock()))
                        continue
                    except Exception:
                        self.history.append(Operation("enqueue", value, "info", self.client, kind, self.clock()))
                        if self.dedup:
                            unconfirmed = value
                        raise
                    done = self.clock()
                    self.history.append(Operation("enqueue", value, "ok", self.client, kind, done, done - started))
                conn.close()
            except Exception:  # noqa: BLE001 - any failure: try the next node
                time.sleep(0.1)


class Publisher010(threading.Thread):
    def __init__(self, hosts: list[str], history: list[Operation], clock: Clock, name: str = "p010",
                 body_bytes: int = BODY_BYTES, limit: int = LIMIT) -> None:
        super().__init__(daemon=True, name=name)
        self.hosts, self.history, self.clock = hosts, history, clock
        self.body_bytes, self.limit = body_bytes, limit
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.client = name

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported by the runner
            self.error = exc

    async def _run(self) -> None:
        from raftmq.client.amqp010 import Connection

        conn = await Connection.connect(self.hosts, reconnect_timeout=120)
        session = await conn.session(f"chaos-{self.client}".encode(), timeout=300)
        await session.queue_declare(Q010, durable=True)
        first = seq = 1_000_000_000
        while not self.stop.is_set() and seq - first < self.limit:
            seq += 1
            started = self.clock()
            await session.publish("", Q010, make_body(seq, self.body_bytes), persistent=True)
            done = self.clock()
            self.history.append(Operation("enqueue", seq, "ok", self.client, "0-10", done, done - started))
        await conn.close()


class Consumer091(threading.Thread):
    def __init__(self, urls: list[str], history: list[Operation], clock: Clock, name: str = "c091",
                 body_bytes: int = BODY_BYTES, groups: int = 1) -> None:
        super().__init__(daemon=True, name=name)
        self.urls, self.history, self.clock = urls, history, clock
        self.groups = groups
        self.body_bytes = body_bytes
        self.stop = threading.Event()
        self.client = name

    def run(self) -> None:
        import pika

        i = 1  # start on another node than the publisher
        while not self.stop.is_set():
            url = self.urls[i % len(self.urls)]
            i += 1
            try:
                conn = pika.BlockingConnection(pika.URLParameters(url + "?connection_attempts=1&socket_timeout=2"))
                ch = conn.channel()
                ch.basic_qos(prefetch_count=100)
                ch.queue_declare(Q091, durable=True, arguments=placement(Q091, self.groups) or None)
                for method, _props, body in ch.consume(Q091, inactivity_timeout=0.2):
                    if self.stop.is_set():
                        break
                    if method is None:
                        continue
                    self.history.append(_dequeued(body, self.client, self.clock, self.body_bytes))
                    ch.basic_ack(method.delivery_tag)
                conn.close()
            except Exception:  # noqa: BLE001 - any failure: try the next node
                time.sleep(0.1)


def drain(url: str, queue: str, history: list[Operation], clock: Clock, timeout: float = 300.0,
          body_bytes: int = BODY_BYTES) -> int:
    """Read everything left in ``queue``; the number of messages read.

    A consumer with a deep prefetch and batched acks (one ``basic.get`` per message would be one
    Raft round trip each); done when nothing arrives for a second and the queue reports empty.
    """
    import pika

    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(url + "?connection_attempts=3&socket_timeout=5"))
            break
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    count = 0
    last_tag = None
    for method, _props, body in ch.consume(queue, inactivity_timeout=1.0):
        if method is None:
            if last_tag is not None:
                ch.basic_ack(last_tag, multiple=True)
                last_tag = None
            if ch.queue_declare(queue, passive=True).method.message_count == 0 or time.monotonic() > deadline:
                break
            continue
        history.append(_dequeued(body, "drain", clock, body_bytes))
        count += 1
        last_tag = method.delivery_tag
        if count % 200 == 0:
            ch.basic_ack(last_tag, multiple=True)
            last_tag = None
    ch.cancel()
    conn.close()
    return count
