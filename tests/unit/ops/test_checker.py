"""The chaos checker itself: histories with a lost or duplicated message must be judged invalid."""

from __future__ import annotations

from raftmq.ops.chaos.checker import Fault, Operation, check


def enq(v, status="ok", kind="0-9-1", t=0.0):
    return Operation("enqueue", v, status, client_kind=kind, time=t)


def deq(v):
    return Operation("dequeue", v, "ok")


def test_a_clean_history_is_valid():
    report = check([enq(1), enq(2), deq(1), deq(2)])
    assert report.valid and report.confirmed == 2 and report.received == 2


def test_a_lost_confirmed_message_is_invalid():
    report = check([enq(1), enq(2), deq(1)])
    assert not report.valid and report.lost == [2]


def test_unknown_outcomes_may_be_missing_or_present():
    report = check([enq(1), enq(2, "info"), enq(3, "info"), deq(1), deq(3)])
    assert report.valid and report.recovered == 1


def test_duplicates_are_allowed_for_0_9_1_and_invalid_for_0_10():
    at_least_once = check([enq(1), deq(1), deq(1)])
    assert at_least_once.valid and at_least_once.duplicated["0-9-1"] == [1]
    exactly_once = check([enq(1, kind="0-10"), deq(1), deq(1)])
    assert not exactly_once.valid and exactly_once.duplicated["0-10"] == [1]


def test_an_unexpected_message_is_invalid():
    report = check([enq(1), deq(1), deq(99)])
    assert not report.valid and report.unexpected == [99]


def test_failed_enqueues_must_not_appear():
    report = check([enq(1, "fail"), deq(1)])
    assert not report.valid and report.unexpected == [1]


def test_availability_after_each_heal():
    history = [enq(1, t=1.0), enq(2, t=5.5), enq(3, t=6.0), deq(1), deq(2), deq(3)]
    report = check(history, faults=[Fault("partition", 2.0, 4.0)])
    # No confirm from the fault's start (2.0) until 5.5; then a short gap and the window's end (9.0).
    assert report.availability == [{"fault": "partition", "healed_at": 4.0, "first_confirm_after_s": 1.5,
                                     "longest_gap_s": 3.5}]
    assert "VALID" in report.summary()


def test_duplicates_are_invalid_for_the_deduplicating_0_9_1_publisher():
    """Issue 21: a 0-9-1 publisher that resends with x-deduplication-header into a deduplicating
    queue must see each message once; an unconfirmed first attempt resent and confirmed is fine."""
    resent_once = check([enq(1, "info", kind="0-9-1-dedup"), enq(1, kind="0-9-1-dedup"), deq(1)])
    assert resent_once.valid and resent_once.duplicated["0-9-1-dedup"] == []
    twice = check([enq(1, "info", kind="0-9-1-dedup"), enq(1, kind="0-9-1-dedup"), deq(1), deq(1)])
    assert not twice.valid and twice.duplicated["0-9-1-dedup"] == [1]


def test_damaged_deliveries_are_counted_and_invalid():
    """Issue 29: a delivery whose body is not what was published is counted as damaged (next to lost),
    makes the run invalid, and does not count as the message received: a confirmed message received
    only damaged is lost as well."""
    damaged = Operation("dequeue", 2, "ok", damaged=True)
    report = check([enq(1), enq(2), deq(1), damaged])
    assert not report.valid and report.damaged == [2] and report.damaged_count == 1
    assert report.lost == [2] and report.lost_count == 1 and report.received == 2
    assert "damaged 1" in report.summary()
    # received intact too (a redelivery from an intact copy): not lost, still invalid for the bad one
    again = check([enq(1), deq(1), Operation("dequeue", 1, "ok", damaged=True), deq(1)])
    assert not again.valid and again.lost == [] and again.damaged == [1] and again.unexpected == []
    # an unreadable number (-1) is damaged, not unexpected
    garbled = check([enq(1), deq(1), Operation("dequeue", -1, "ok", damaged=True)])
    assert not garbled.valid and garbled.damaged == [-1] and garbled.unexpected == []


def test_workload_bodies_check_themselves():
    """The workload's bodies carry their number and a CRC32C of a payload that depends on the number
    only; any flipped bit (in the number, the CRC or the payload), a cut or a wrong length is damage."""
    from raftmq.ops.chaos.workload import make_body, read_body

    body = make_body(1_000_000_007, 512)
    assert read_body(body, 512) == (1_000_000_007, True)
    for offset in (0, 5, len(body) // 2, len(body) - 1):
        flipped = bytearray(body)
        flipped[offset] ^= 0x10
        assert read_body(bytes(flipped), 512)[1] is False
    assert read_body(body[:-1], 512) == (1_000_000_007, False)
    assert read_body(b"garbage", 512) == (-1, False)
    assert read_body(make_body(8, 512), 512) == (8, True)
    assert read_body(make_body(8, 64), 512) == (8, False)  # the wrong length is damage too


def test_a_damaged_body_is_described():
    """The report says how a damaged body differs (length, bytes differing, the first offset), so a
    damaged delivery can be traced to the bytes flipped on disk."""
    from raftmq.ops.chaos.workload import body_difference, make_body, read_body

    body = bytearray(make_body(42, 256))
    body[100] ^= 1
    body[200] ^= 4
    value, intact = read_body(bytes(body), 256)
    assert (value, intact) == (42, False)
    note = body_difference(bytes(body), 42, 256)
    assert note == f"message 42: {len(body)} B (published {len(body)} B), 2 bytes differ, the first at offset 100"
    report = check([enq(42), Operation("dequeue", 42, "ok", "c091", time=3.0, damaged=True, note=note)])
    assert report.damaged_examples == [f"c091 t=3.0: {note}"]
