"""node/amqp091/autoack.py: the credit slices a 0-9-1 channel gives the core for an auto-ack consumer."""

from __future__ import annotations

from raftmq.node.amqp091.autoack import MIN_SLICE, AutoAckCredit

MB = 1 << 20


def test_large_messages_keep_the_smallest_slice_and_no_top_up_while_nothing_is_written() -> None:
    """1 MiB messages with a 1 MiB write_buffer_high: the slice stays MIN_SLICE (4), a top-up comes once
    half of it was written, and nothing is granted beyond 4 ahead of what was written."""
    credit = AutoAckCredit(most=256, high=MB)
    assert credit.granted == MIN_SLICE
    assert credit.wrote(MB) == 0  # 3 still ahead of the socket
    assert credit.wrote(MB) == 2  # 2 ahead: topped up to 4 ahead
    assert credit.granted - credit.written == MIN_SLICE


def test_small_messages_grow_the_slice_to_the_configured_most() -> None:
    """256-octet messages: the slice grows to ``most`` (write_buffer_high / 256 is larger), topped up at
    half of it, so a fast reader costs one top-up per half slice."""
    credit = AutoAckCredit(most=256, high=MB)
    grants = [credit.wrote(256) for _ in range(1000)]
    assert credit.granted - credit.written <= 256
    assert credit.granted - credit.written > 128 - 1
    assert sum(1 for g in grants if g) <= 1000 // 128 + 2


def test_the_recent_size_decays_towards_smaller_messages() -> None:
    """After large messages, small ones widen the slice again (the size is a maximum decaying by 1/8)."""
    credit = AutoAckCredit(most=256, high=MB)
    credit.wrote(MB)
    assert credit.slice() == MIN_SLICE
    for _ in range(100):
        credit.wrote(100)
    assert credit.slice() == 256
