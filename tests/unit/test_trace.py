"""The stage tracer's ring and its trace file (raftmq/trace.py, issue 30).

The file is read back by the benchmark (bench/latency_stages.py) only after its magic, length and
CRC-32 check out: a torn or altered file is refused, never half-read.
"""

from __future__ import annotations

import pytest

from raftmq.trace import APPEND, MAGIC, RX, TraceDamaged, Tracer, read_dump


def counter_clock(start: int = 1000):
    ticks = iter(range(start, start + 1_000_000))
    return lambda: next(ticks)


def test_the_ring_keeps_the_newest_events_only():
    """Bounded memory: past its capacity the oldest events go."""
    tracer = Tracer("n1", capacity=3, clock=counter_clock())
    for seq in range(5):
        tracer.add(APPEND, "n1.b", seq, 10 + seq)
    assert [e[3] for e in tracer.events] == [2, 3, 4]
    assert [e[1] for e in tracer.events] == [APPEND] * 3


def test_a_dump_reads_back_exactly(tmp_path):
    tracer = Tracer("n2", clock=counter_clock())
    tracer.address, tracer.origin = "127.0.0.1:4401", "n2.abc"
    tracer.add(RX, "n2.abc", 7)
    tracer.add(APPEND, "n2.abc", 7, 42, ts=5)
    path = str(tmp_path / "trace.msgpack")
    tracer.dump(path)
    trace = read_dump(path)
    assert (trace["node"], trace["address"], trace["origin"]) == ("n2", "127.0.0.1:4401", "n2.abc")
    assert trace["events"] == [(1000, RX, "n2.abc", 7, 0, 0), (5, APPEND, "n2.abc", 7, 42, 0)]
    assert not (tmp_path / "trace.msgpack.tmp").exists()  # written aside and renamed into place


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "short"])
def test_a_damaged_dump_is_refused(tmp_path, damage):
    """Every byte read back is verified: a flipped payload bit, a cut file, a foreign file."""
    tracer = Tracer("n1", clock=counter_clock())
    for seq in range(50):
        tracer.add(APPEND, "n1.b", seq, seq)
    path = tmp_path / "trace.msgpack"
    tracer.dump(str(path))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-7] ^= 0x10
    elif damage == "truncate":
        del data[-3:]
    elif damage == "magic":
        data[:len(MAGIC)] = b"NOTTRACE"
    else:
        del data[10:]
    path.write_bytes(bytes(data))
    with pytest.raises(TraceDamaged):
        read_dump(str(path))


def test_socket_hooks_stamp_and_call_through():
    """on_rx stamps each read before the front end sees it; on_flush stamps only the first write
    of a batch's outputs (``flushing`` is reset per batch by raft/tracing.py)."""
    tracer = Tracer("n1", clock=counter_clock(500))
    seen: list = []
    rx = tracer.on_rx(lambda data: seen.append((data, tracer.last_rx)))
    rx(b"frame")
    assert seen == [(b"frame", 500)]
    flushes: list = []
    flush = tracer.on_flush(lambda: flushes.append(tracer.flushing))
    flush()
    flush()
    assert flushes == [501, 501]  # the second write keeps the first one's stamp
