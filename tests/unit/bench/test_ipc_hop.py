"""bench/ipc_hop.py with tiny counts (seconds): every transport carries real publishes to a real
group process and back, and the front checks what came back (one confirm per publish, and in the
``deliver`` scenario one delivery per publish; ``Front.throughput`` raises otherwise).  The
shared-memory ring is checked on its own across its wrap-around.  The outputs stand for AMQP 0-9-1
basic.ack as a publisher confirm (0-9-1 reference §1.8.3.13; RabbitMQ's confirm extension) and
basic.deliver with no-ack consumers (§1.8.3.9, §1.8.3.3.5)."""

from __future__ import annotations

from bench.ipc_hop import (
    BATCHES,
    CONN,
    SCENARIOS,
    TRANSPORTS,
    Group,
    Ring,
    codec_split,
    decode_outputs,
    encode_outputs,
    make_batches,
    measure,
    table,
)
from raftmq.store.core.commands import OUT_DELIVER, OUT_REPLY

IN_PROCESS = ("inproc", "codec")


def test_every_transport_carries_every_batch_size() -> None:
    """Each transport x scenario x batch size ran its 200 publishes (none cut by the time bound),
    with CPU counted in the right process: the group's 0 in process, > 0 across a hop; the latency
    samples are lock-step round trips; the table has a row for each run.  A 256 KiB ring: the
    shared-memory runs wrap around it many times."""
    results = measure(list(TRANSPORTS), list(SCENARIOS), count=200, latency_samples=30, window=4,
                      seconds=20.0, nice=5, ring=256 << 10)
    seen = {(r.scenario, r.transport, r.batch) for r in results.runs}
    assert seen == {(s, t, b) for s in SCENARIOS for t in TRANSPORTS for b in BATCHES}
    for run in results.runs:
        assert run.commands == 200
        assert run.tally.replies == 200
        assert run.tally.deliveries == (200 if run.scenario == "deliver" else 0)
        assert run.seconds > 0 and run.front_cpu > 0
        if run.transport in IN_PROCESS:
            assert run.group_cpu == 0
        else:
            assert run.group_cpu > 0, run
    assert {(lat.scenario, lat.transport) for lat in results.latencies} == {
        (s, t) for s in SCENARIOS for t in TRANSPORTS}
    assert all(len(lat.samples) == 30 and lat.pct(0.99) >= lat.pct(0.5) > 0 for lat in results.latencies)
    text = table(results)
    assert text.count("| deliver | shm | ") == 4  # one latency row, three batch rows


def test_ring_wraps_and_keeps_records_whole() -> None:
    """Records of 0-24 bytes through a 64-byte ring (room for two with their lengths), written and
    read in turn (the ring wraps in the middle of lengths and payloads): each comes back byte for byte; a record larger than the
    ring is refused rather than corrupting it."""
    ring = Ring(64)
    try:
        for i in range(200):
            record = bytes((i + j) % 256 for j in range(i % 25))
            ring.write(record)
            if i % 3 == 0:  # two in the ring at once now and then
                ring.write(record[::-1])
                assert ring.read() == record
                assert ring.read() == record[::-1]
            else:
                assert ring.read() == record
        assert ring.tail == ring.head > 64 * 10
        try:
            ring.write(b"x" * 61)
        except ValueError:
            pass
        else:
            raise AssertionError("a record larger than the ring was accepted")
    finally:
        ring.close(unlink=True)


def test_outputs_cross_as_plain_values() -> None:
    """A confirm and a delivery (with its Message and body) encode and decode to what a front end
    needs: the token, the consumer tag, the message's routing key and properties, the body."""
    group = Group("deliver")
    outputs: list = []
    group.apply(make_batches(1, 1, 7)[0], outputs.extend)
    back = decode_outputs(encode_outputs(outputs))
    reply = next(o for o in back if o[1] == OUT_REPLY)
    deliver = next(o for o in back if o[1] == OUT_DELIVER)
    assert reply[0] == CONN and reply[2] == 7 and reply[3][0] == 0  # token 7, Ok
    qid, seq, redelivered, message, body = deliver[4]
    assert deliver[3] == "ctag" and not redelivered
    assert message[2] == "q" and message[3] == b"\x10\x00\x02" and body == b"x" * 256


def test_codec_split_times_each_step() -> None:
    """Each serialisation step of the hop gets a figure (µs per command, > 0): the batch's codec
    (paid by a cluster today) and the outputs' codec of both scenarios (new with a hop)."""
    split = codec_split(batch=10, rounds=5)
    assert set(split) == {"encode_batch", "decode_batch", "encode outputs (confirm)", "decode outputs (confirm)",
                          "encode outputs (deliver)", "decode outputs (deliver)"}
    assert all(us > 0 for us in split.values())
