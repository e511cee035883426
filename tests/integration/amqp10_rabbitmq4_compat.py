"""RabbitMQ 4 behaviours with RabbitMQ 4's own Python client (rabbitmq-amqp-python-client), run by
test_amqp10_rabbitmq4.py in a subprocess (the client vendors its own proton, which must not meet the
test process's).  Usage: ``python amqp10_rabbitmq4_compat.py SCENARIO URI`` with the client on
PYTHONPATH; prints one JSON object with what it saw.  Scenarios:

- ``unbind-gone``: unbind after the binding's queue, then its exchange, are deleted (RabbitMQ 4: 204);
- ``dial``: dial ``URI`` (a vhost); ``{"dialed": true}`` or the exception's class name and the seconds
  dial() took (RabbitMQ 4's client, recovery on as by default, must raise, not reconnect for ever);
- ``annotations``: requeue with message-annotations, consume again; discard with annotations into a
  dead-letter queue, consume it;
- ``local-random``: an x-local-random exchange with three queues, 30 messages;
- ``direct-reply``: a direct reply-to consumer, a publisher on another connection;
- ``version``: what the server's open announced.
"""

from __future__ import annotations

import json
import sys
import time

from rabbitmq_amqp_python_client import (
    AddressHelper,
    AMQPMessagingHandler,
    ConsumerOptions,
    ConsumerSettleStrategy,
    Converter,
    Environment,
    ExchangeCustomSpecification,
    ExchangeSpecification,
    ExchangeToQueueBindingSpecification,
    Message,
    QuorumQueueSpecification,
)
from rabbitmq_amqp_python_client.qpid.proton import symbol


class Enough(Exception):
    """Stops Consumer.run() once the handler has what it wanted."""


class Collect(AMQPMessagingHandler):
    """Accepts ``n`` messages (1.0.1's consumers have only run(): no synchronous consume)."""

    def __init__(self, n: int, settle: bool = True) -> None:
        super().__init__()
        self.n, self.settle, self.messages = n, settle, []

    def on_amqp_message(self, event) -> None:
        self.messages.append(event.message)
        if self.settle:
            self.delivery_context.accept(event)
        if len(self.messages) == self.n:
            raise Enough()


class Requeue(AMQPMessagingHandler):
    def on_amqp_message(self, event) -> None:
        self.delivery_context.requeue_with_annotations(event, {symbol("x-opt-reason"): "retry-later"})
        raise Enough()


class Discard(AMQPMessagingHandler):
    def on_amqp_message(self, event) -> None:
        self.delivery_context.discard_with_annotations(event, {symbol("x-opt-why"): "poison"})
        raise Enough()


def run_once(conn, queue: str, handler: AMQPMessagingHandler) -> None:
    consumer = conn.consumer(AddressHelper.queue_address(queue), message_handler=handler)
    try:
        consumer.run()
    except Enough:
        pass
    consumer.close()


def unbind_gone(env: Environment) -> dict:
    conn = env.connection()
    conn.dial()
    m = conn.management()
    seen = {}
    for gone in ("queue", "exchange"):
        m.declare_exchange(ExchangeSpecification(name=f"ug-x-{gone}"))
        m.declare_queue(QuorumQueueSpecification(name=f"ug-q-{gone}"))
        path = m.bind(ExchangeToQueueBindingSpecification(
            source_exchange=f"ug-x-{gone}", destination_queue=f"ug-q-{gone}", binding_key="k"))
        if gone == "queue":
            m.delete_queue(f"ug-q-{gone}")
        else:
            m.delete_exchange(f"ug-x-{gone}")
        try:
            m.unbind(path)  # raises unless the answer is 204
            seen[gone] = "ok"
        except Exception as exc:  # noqa: BLE001 - what the client raised is the observation
            seen[gone] = f"{type(exc).__name__}: {exc}"
        m.delete_queue(f"ug-q-{gone}")
        m.delete_exchange(f"ug-x-{gone}")
    m.close()
    conn.close()
    return seen


def dial(uri: str) -> dict:
    env = Environment(uri=uri)
    started = time.monotonic()
    try:
        conn = env.connection()
        conn.dial()
        conn.close()
        return {"dialed": True, "seconds": time.monotonic() - started}
    except Exception as exc:  # noqa: BLE001 - the class is what the test checks
        return {"dialed": False, "raised": type(exc).__name__, "seconds": time.monotonic() - started}
    finally:
        try:
            env.close()
        except RuntimeError:
            pass  # 1.0.1's close() of a connection that never opened: "no attribute '_conn'"


def annotations(env: Environment) -> dict:
    conn = env.connection()
    conn.dial()
    m = conn.management()
    m.declare_exchange(ExchangeSpecification(name="ann-dlx"))
    m.declare_queue(QuorumQueueSpecification(name="ann-dead"))
    dl_path = m.bind(ExchangeToQueueBindingSpecification(source_exchange="ann-dlx", destination_queue="ann-dead",
                                                         binding_key="dead"))
    m.declare_queue(QuorumQueueSpecification(name="ann-q", dead_letter_exchange="ann-dlx",
                                             dead_letter_routing_key="dead"))
    publisher = conn.publisher(AddressHelper.queue_address("ann-q"))
    publisher.publish(Message(body=Converter.string_to_bytes("first"), annotations={"x-opt-kept": "yes"}))
    publisher.close()
    run_once(conn, "ann-q", Requeue())
    looked = Collect(1, settle=False)
    run_once(conn, "ann-q", looked)  # unsettled: back to the queue once more, with its annotations
    message = looked.messages[0]
    seen = {"requeued": {str(k): str(v) for k, v in (message.annotations or {}).items()},
            "requeued_body": Converter.bytes_to_string(message.body)}
    run_once(conn, "ann-q", Discard())
    dead = Collect(1)
    run_once(conn, "ann-dead", dead)
    message = dead.messages[0]
    seen["dead"] = {str(k): str(v) for k, v in (message.annotations or {}).items()}
    seen["left"] = [m.queue_info("ann-q").message_count, m.queue_info("ann-dead").message_count]
    m.unbind(dl_path)
    for q in ("ann-q", "ann-dead"):
        m.delete_queue(q)
    m.delete_exchange("ann-dlx")
    m.close()
    conn.close()
    return seen


def local_random(env: Environment) -> dict:
    conn = env.connection()
    conn.dial()
    m = conn.management()
    m.declare_exchange(ExchangeCustomSpecification(name="lr-x", exchange_type="x-local-random"))
    paths = []
    for i in range(3):
        m.declare_queue(QuorumQueueSpecification(name=f"lr-q{i}"))
        paths.append(m.bind(ExchangeToQueueBindingSpecification(source_exchange="lr-x",
                                                               destination_queue=f"lr-q{i}", binding_key="")))
    publisher = conn.publisher(AddressHelper.exchange_address("lr-x"))
    outcomes = [str(publisher.publish(Message(body=Converter.string_to_bytes(f"m{i}"))).remote_state)
                for i in range(30)]
    publisher.close()
    counts = [m.queue_info(f"lr-q{i}").message_count for i in range(3)]
    for path in paths:
        m.unbind(path)
    for i in range(3):
        m.delete_queue(f"lr-q{i}")
    m.delete_exchange("lr-x")
    m.close()
    conn.close()
    return {"outcomes": sorted(set(outcomes)), "counts": counts}


def direct_reply(env: Environment) -> dict:
    consumer_conn = env.connection()
    consumer_conn.dial()
    handler = Collect(5, settle=False)  # pre-settled: a direct reply-to consumer does not settle
    consumer = consumer_conn.consumer(message_handler=handler, consumer_options=ConsumerOptions(
        settle_strategy=ConsumerSettleStrategy.DirectReplyTo))
    address = consumer.address
    publisher_conn = env.connection()
    publisher_conn.dial()
    publisher = publisher_conn.publisher(address)
    outcomes = [str(publisher.publish(Message(body=Converter.string_to_bytes(f"r{i}"))).remote_state)
                for i in range(5)]
    try:
        consumer.run()
    except Enough:
        pass
    got = [Converter.bytes_to_string(m.body) for m in handler.messages]
    publisher.close()
    consumer.close()
    publisher_conn.close()
    consumer_conn.close()
    return {"address": address, "outcomes": sorted(set(outcomes)), "got": got}


def version(env: Environment) -> dict:
    conn = env.connection()
    conn.dial()
    props = {str(k): str(v) for k, v in (conn._conn.conn.remote_properties or {}).items()}
    conn.close()
    return props


def main(scenario: str, uri: str) -> dict:
    if scenario == "dial":
        return dial(uri)
    env = Environment(uri=uri)
    try:
        return {"unbind-gone": unbind_gone, "annotations": annotations, "local-random": local_random,
                "direct-reply": direct_reply, "version": version}[scenario](env)
    finally:
        env.close()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
