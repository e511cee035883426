"""The chaos workload: clients that record every operation's outcome for the checker.

* ``Publisher091``: numbered persistent messages with publisher confirms (pika), failing over
  between nodes by itself on any error.  At-least-once: a message whose confirm was lost with the
  connection is recorded ``info`` and may show up twice.
* ``Publisher010``: the AMQP 0-10 client with session resume (it replays across failovers by
  itself).  Exactly-once: no message of it may be received twice.
* ``Consumer091``: consumes the 0-9-1 queue during the run with manual acks, failing over like
  the publisher; a delivery whose ack is lost with its connection comes again (at-least-once).
  The 0-10 queue is only drained at the end, so that consumer-side redeliveries never blur the
  publisher's exactly-once check.
* ``drain``: after the faults are healed, read everything left in a queue.

Operations carry the time their outcome was known (seconds since the run's start) and, for
confirmed publishes, the confirm latency: the timeline plot shows both.
"""

from __future__ import annotations

import asyncio
import threading
import time

from .checker import Operation

Q091, Q010 = "chaos-091", "chaos-010"


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


class Publisher091(threading.Thread):
    def __init__(self, urls: list[str], history: list[Operation], clock: Clock, name: str = "p091") -> None:
        super().__init__(daemon=True, name=name)
        self.urls, self.history, self.clock = urls, history, clock
        self.stop = threading.Event()
        self.client = name

    def run(self) -> None:
        import pika

        seq, i = 0, 0
        while not self.stop.is_set():
            url = self.urls[i % len(self.urls)]
            i += 1
            try:
                conn = pika.BlockingConnection(pika.URLParameters(
                    url + "?connection_attempts=1&socket_timeout=2&blocked_connection_timeout=5"))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(Q091, durable=True)
                while not self.stop.is_set():
                    seq += 1
                    started = self.clock()
                    try:
                        ch.basic_publish("", Q091, str(seq).encode(), pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.UnroutableError:
                        self.history.append(Operation("enqueue", seq, "fail", self.client, "0-9-1", self.clock()))
                        continue
                    except pika.exceptions.NackError:
                        self.history.append(Operation("enqueue", seq, "fail", self.client, "0-9-1", self.clock()))
                        continue
                    except Exception:
                        self.history.append(Operation("enqueue", seq, "info", self.client, "0-9-1", self.clock()))
                        raise
                    done = self.clock()
                    self.history.append(Operation("enqueue", seq, "ok", self.client, "0-9-1", done, done - started))
                conn.close()
            except Exception:  # noqa: BLE001 - any failure: try the next node
                time.sleep(0.1)


class Publisher010(threading.Thread):
    def __init__(self, hosts: list[str], history: list[Operation], clock: Clock, name: str = "p010") -> None:
        super().__init__(daemon=True, name=name)
        self.hosts, self.history, self.clock = hosts, history, clock
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
        seq = 1_000_000_000
        while not self.stop.is_set():
            seq += 1
            started = self.clock()
            await session.publish("", Q010, str(seq).encode(), persistent=True)
            done = self.clock()
            self.history.append(Operation("enqueue", seq, "ok", self.client, "0-10", done, done - started))
        await conn.close()


class Consumer091(threading.Thread):
    def __init__(self, urls: list[str], history: list[Operation], clock: Clock, name: str = "c091") -> None:
        super().__init__(daemon=True, name=name)
        self.urls, self.history, self.clock = urls, history, clock
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
                ch.queue_declare(Q091, durable=True)
                for method, _props, body in ch.consume(Q091, inactivity_timeout=0.2):
                    if self.stop.is_set():
                        break
                    if method is None:
                        continue
                    self.history.append(Operation("dequeue", int(body), "ok", self.client, time=self.clock()))
                    ch.basic_ack(method.delivery_tag)
                conn.close()
            except Exception:  # noqa: BLE001 - any failure: try the next node
                time.sleep(0.1)


def drain(url: str, queue: str, history: list[Operation], clock: Clock, timeout: float = 300.0) -> int:
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
        history.append(Operation("dequeue", int(body), "ok", "drain", time=clock()))
        count += 1
        last_tag = method.delivery_tag
        if count % 200 == 0:
            ch.basic_ack(last_tag, multiple=True)
            last_tag = None
    ch.cancel()
    conn.close()
    return count
