"""RabbitMQ 4's own Python client (rabbitmq-amqp-python-client) against raftmq, run by
test_amqp10_management.py in a subprocess (the client vendors its own proton, which must not meet the
test process's): /management declares, bind, publish through /exchanges/:x/:key, queue info, consume,
purge, unbind, deletes.  Usage: ``python amqp10_rabbitmq_client.py PORT`` with the client's directory on
PYTHONPATH; prints one JSON object with what it saw.
"""

from __future__ import annotations

import json
import sys

from rabbitmq_amqp_python_client import (
    AddressHelper,
    AMQPMessagingHandler,
    Converter,
    Environment,
    ExchangeSpecification,
    ExchangeToQueueBindingSpecification,
    Message,
    QuorumQueueSpecification,
)


class Enough(Exception):
    """Stops Consumer.run() once the handler has what it wanted."""


class TwoMessages(AMQPMessagingHandler):
    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[str] = []

    def on_amqp_message(self, event) -> None:
        self.bodies.append(Converter.bytes_to_string(event.message.body))
        self.delivery_context.accept(event)
        if len(self.bodies) == 2:
            raise Enough()


def main(port: int) -> dict:
    seen: dict = {}
    env = Environment(uri=f"amqp://guest:guest@127.0.0.1:{port}/")
    conn = env.connection()
    conn.dial()
    management = conn.management()
    management.declare_exchange(ExchangeSpecification(name="rmqc-x"))
    management.declare_queue(QuorumQueueSpecification(name="rmqc-q"))
    seen["binding_path"] = management.bind(ExchangeToQueueBindingSpecification(
        source_exchange="rmqc-x", destination_queue="rmqc-q", binding_key="rk"))
    publisher = conn.publisher(AddressHelper.exchange_address("rmqc-x", "rk"))
    seen["outcomes"] = [str(publisher.publish(Message(body=Converter.string_to_bytes(f"hi{i}"))).remote_state)
                        for i in range(5)]
    publisher.close()
    info = management.queue_info("rmqc-q")
    seen["queue_info"] = [info.name, info.message_count, str(info.queue_type), info.is_durable]
    handler = TwoMessages()
    consumer = conn.consumer(AddressHelper.queue_address("rmqc-q"), message_handler=handler)
    try:
        consumer.run()
    except Enough:
        pass
    consumer.close()
    seen["consumed"] = handler.bodies
    seen["purged"] = management.purge_queue("rmqc-q")
    management.unbind(seen["binding_path"])
    management.delete_queue("rmqc-q")
    management.delete_exchange("rmqc-x")
    management.close()
    conn.close()
    return seen


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
