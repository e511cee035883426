"""flush_confirms (node/amqp091/channel.py) before and after issue 34's hold-back of out-of-order
confirms, side by side: in-order acks (one Raft group), 32 per flush (a confirm flood's batch),
alternating rounds; prints ns per confirm (best and median).

    .venv/bin/python bench/confirm_order.py [--rounds 9] [--flushes 3000]
"""

from __future__ import annotations

import argparse
import time

from raftmq.node.amqp091 import channel as chmod
from raftmq.node.amqp091.channel import Channel
from raftmq.protocol.amqp091 import methods as m


def before(self: Channel) -> None:
    """flush_confirms as it was before issue 34 (outcomes assumed in publish order)."""
    confirms = self._confirms
    write, number = self.conn.write, self.number
    run_start = None
    for i, (seq, acked) in enumerate(confirms):
        if acked:
            if run_start is None:
                run_start = seq
            if i + 1 < len(confirms) and confirms[i + 1][1]:
                continue
            write(chmod.encode_method_frame(number, m.BasicAck(delivery_tag=seq, multiple=seq > run_start)))
            run_start = None
        else:
            write(chmod.encode_method_frame(number, m.BasicNack(delivery_tag=seq, multiple=False, requeue=False)))
    confirms.clear()


class _Conn:
    def write(self, data: bytes) -> None:
        pass


def _channel() -> Channel:
    ch = Channel.__new__(Channel)
    ch.conn = _Conn()  # type: ignore[assignment]  # a sink in place of the connection (write only)
    ch.number = 1
    ch._confirms = []
    ch._confirms_held = {}
    ch._answered_through = 0
    return ch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--flushes", type=int, default=3000)
    args = parser.parse_args()
    found: dict[str, list[float]] = {"before": [], "after": []}
    for _round in range(args.rounds):
        for name, flush in (("before", before), ("after", Channel.flush_confirms)):
            ch = _channel()
            batches = [[(f * 32 + i + 1, True) for i in range(32)] for f in range(args.flushes)]
            started = time.perf_counter()
            for batch in batches:
                ch._confirms.extend(batch)
                flush(ch)
            found[name].append((time.perf_counter() - started) / (args.flushes * 32) * 1e9)
    for name, values in found.items():
        values.sort()
        print(f"{name}: best {values[0]:.1f}, median {values[len(values) // 2]:.1f} ns per confirm")


if __name__ == "__main__":
    main()
