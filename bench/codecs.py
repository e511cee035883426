"""Codec micro-benchmark: µs per encode/decode of the hot-path
frames of each protocol, best of several timeit rounds.  Run it on two trees side by side:

    .venv/bin/python -m bench.codecs

Figures are printed, never asserted (timings depend on the machine and its load)."""

from __future__ import annotations

import timeit
from collections.abc import Callable

from raftmq.protocol.amqp010 import codec as c010
from raftmq.protocol.amqp010.frames import Assembly
from raftmq.protocol.amqp091 import methods as m091
from raftmq.protocol.amqp10 import performatives as p10


def cases() -> dict[str, Callable[[], object]]:
    publish = m091.BasicPublish(exchange="amq.direct", routing_key="rk.one", mandatory=True)
    deliver = m091.BasicDeliver(consumer_tag="ctag-1", delivery_tag=12345, exchange="ex", routing_key="rk")
    ack = m091.BasicAck(delivery_tag=12345, multiple=False)
    pub_raw, ack_raw = publish.encode(), ack.encode()

    dp = c010.DeliveryProperties(routing_key="rk.one", delivery_mode=2, priority=4)
    mp = c010.MessageProperties(content_type="text/plain", message_id=None, application_headers={"a": 1})
    xfer = c010.MessageTransfer(destination="amq.direct", accept_mode=0, acquire_mode=0,
                                headers=[dp, mp], body=b"x" * 16)
    track, segments = c010.segments_of(xfer)
    assembly = Assembly(0, track, segments)
    accept = c010.MessageAccept(transfers=[(1, 5)])

    transfer = p10.Transfer(handle=0, delivery_id=7, delivery_tag=b"\x00\x00\x00\x07", message_format=0,
                            settled=False)
    disposition = p10.Disposition(role=True, first=3, last=9, settled=True, state=p10.Accepted())
    props = p10.Properties(message_id="m-1", to="q1", subject="s", content_type="text/plain")
    sections = [p10.Header(durable=True), props, p10.ApplicationProperties({"k": "v"}), p10.Data(b"x" * 16)]
    t_raw, d_raw, s_raw = transfer.encode(), disposition.encode(), p10.encode_sections(sections)
    return {
        "091 BasicPublish.encode": publish.encode,
        "091 BasicDeliver.encode": deliver.encode,
        "091 decode_method(publish)": lambda: m091.decode_method(pub_raw),
        "091 decode_method(ack)": lambda: m091.decode_method(ack_raw),
        "091 BasicDeliver(...) build": lambda: m091.BasicDeliver("ctag-1", 12345, False, "ex", "rk"),
        "010 segments_of(transfer)": lambda: c010.segments_of(xfer),
        "010 decode_assembly(transfer)": lambda: c010.decode_assembly(assembly),
        "010 MessageAccept encode": accept.encode_segment,
        "010 DeliveryProperties(...) build": lambda: c010.DeliveryProperties(routing_key="rk", priority=4),
        "10 Transfer.encode": transfer.encode,
        "10 Disposition.encode": disposition.encode,
        "10 decode_described(transfer)": lambda: p10.decode_described(t_raw),
        "10 decode_described(disposition)": lambda: p10.decode_described(d_raw),
        "10 encode_sections(4)": lambda: p10.encode_sections(sections),
        "10 decode_sections(4)": lambda: p10.decode_sections(s_raw),
        "10 Transfer(...) build": lambda: p10.Transfer(handle=0, delivery_id=7, settled=False),
    }


def main(number: int = 20000, repeat: int = 5) -> None:
    for name, fn in cases().items():
        best = min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6
        print(f"{name:38s} {best:7.3f} µs")


if __name__ == "__main__":
    main()
