"""AMQP 0-9-1 basic properties as the core's neutral message properties (store/core/message.py).

The fields match one for one (the neutral form is named after 0-9-1's); 0-9-1's deprecated
``cluster-id`` travels as the annotation ``cluster-id``.  Annotations from other protocols (AMQP 1.0
message-annotations and properties without a 0-9-1 field) become headers, as RabbitMQ 4 maps them:
``x-``-prefixed keys as they are, others prefixed ``x-amqp-``.  docs/message-mapping.md.
"""

from __future__ import annotations

from raftmq.protocol.amqp091.errors import AMQPError
from raftmq.store.core.message import AMQP091, Properties

from .properties import BasicProperties, decode_properties, encode_properties


class Amqp091Format:
    number = AMQP091
    name = "AMQP 0-9-1 basic properties"

    def decode(self, raw: bytes) -> Properties:
        try:
            p = decode_properties(raw)
        except (AMQPError, IndexError, UnicodeDecodeError) as exc:
            raise ValueError(f"0-9-1 properties do not decode: {exc}") from exc
        return Properties(
            content_type=p.content_type, content_encoding=p.content_encoding, headers=p.headers,
            delivery_mode=p.delivery_mode, priority=p.priority, correlation_id=p.correlation_id,
            reply_to=p.reply_to, expiration=p.expiration, message_id=p.message_id, timestamp=p.timestamp,
            type=p.type, user_id=p.user_id, app_id=p.app_id,
            annotations={"cluster-id": p.cluster_id} if p.cluster_id is not None else {})

    def encode(self, properties: Properties) -> bytes:
        headers = dict(properties.headers) if properties.headers else {}
        cluster_id = None
        for key, value in properties.annotations.items():
            if key == "cluster-id":
                cluster_id = value
            else:
                headers.setdefault(key if key.startswith("x-") else f"x-amqp-{key}", value)
        return encode_properties(BasicProperties(
            content_type=properties.content_type, content_encoding=properties.content_encoding,
            headers=headers or None, delivery_mode=properties.delivery_mode, priority=properties.priority,
            correlation_id=properties.correlation_id, reply_to=properties.reply_to,
            expiration=properties.expiration, message_id=properties.message_id,
            timestamp=properties.timestamp, type=properties.type, user_id=properties.user_id,
            app_id=properties.app_id, cluster_id=cluster_id))


FORMAT = Amqp091Format()
