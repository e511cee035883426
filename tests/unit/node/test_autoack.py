"""node/amqp091/autoack.py: the credit slices a 0-9-1 channel gives the core for an auto-ack consumer."""

from __future__ import annotations

from raftmq.node.amqp091.autoack import MIN_SLICE, AutoAckCredit

MB = 1 << 20


def test_large_messages_keep_the_smallest_slice_and_no_top_up_while_nothing_is_written() -> None:
    """1 MiB messages with a 1 MiB write_buffer_high: the slice stays MIN_SLICE (4), a top-up comes once
    half of it was written, and the core is never more than 4 ahead of what was written."""
    credit = AutoAckCredit(most=256, high=MB)
    assert credit.granted == MIN_SLICE
    assert credit.wrote(MB) == 0  # 3 still ahead of the socket
    assert credit.wrote(MB) == 2  # 2 ahead: topped up to 4 ahead
    assert credit.granted - credit.written == MIN_SLICE
    for _ in range(20):
        credit.wrote(MB)
        assert credit.granted - credit.written <= MIN_SLICE


def test_small_messages_grow_the_slice_to_the_configured_most() -> None:
    """256-octet messages: the slice grows to ``most`` (write_buffer_high / 256 is larger), topped up at
    half of it, so a fast reader costs one top-up per half slice."""
    credit = AutoAckCredit(most=256, high=MB)
    grants = [credit.wrote(256) for _ in range(1000)]
    assert 128 <= credit.granted - credit.written <= 256
    assert sum(1 for g in grants if g) <= 1000 // 128 + 2


def test_larger_messages_shrink_the_slice_and_small_ones_widen_it_again() -> None:
    """After small messages, large ones bring no top-up until the core is within the smaller slice of the
    socket; later small ones widen it again (the size halves towards them at each top-up)."""
    credit = AutoAckCredit(most=256, high=MB)
    for _ in range(300):
        credit.wrote(256)
    grants = [credit.wrote(MB // 4) for _ in range(300)]
    assert credit.granted - credit.written <= 256
    assert credit.slice() == MIN_SLICE
    assert sum(grants) < 300  # fewer granted than written while the slice was shrinking
    for _ in range(1000):
        credit.wrote(100)
    assert credit.slice() == 256
