"""node/amqp091/window.py: the client's basic.qos window and the deliveries held beyond it."""

from __future__ import annotations

from raftmq.node.amqp091.window import AMPLE_HELD, READAHEAD_MIN_PREFETCH, ClientWindow, assigned_window


def delivery(n: int) -> tuple:
    return (1, n, False, f"m{n}")


def test_read_ahead_only_for_large_prefetches():
    assert assigned_window(0) == 0  # unlimited stays unlimited
    assert assigned_window(1) == 1  # work queues: exact, fair dispatch among slow consumers
    assert assigned_window(READAHEAD_MIN_PREFETCH - 1) == READAHEAD_MIN_PREFETCH - 1
    assert assigned_window(256) == 512
    assert assigned_window(256, readahead=False) == 256


def test_per_consumer_limit_holds_the_excess_and_releases_it_in_order():
    w = ClientWindow()
    w.add_consumer("a", 2)
    for tag in (1, 2):
        assert w.has_room("a")
        w.sent(tag, "a")
    assert not w.has_room("a")
    for n in (3, 4, 5):
        w.hold("a", delivery(n))
    assert w.holds("a") and w.releasable() == []
    w.settled([1])
    assert w.releasable() == [("a", delivery(3))]
    w.sent(3, "a")
    w.settled([2, 3])
    assert w.releasable() == [("a", delivery(4)), ("a", delivery(5))]
    assert not w.holds("a")


def test_acks_may_wait_only_while_plenty_is_held_for_the_client():
    w = ClientWindow()
    w.add_consumer("a", 1)
    w.sent(1, "a")
    for n in range(AMPLE_HELD - 1):
        w.hold("a", delivery(n))
    assert not w.ample()
    w.hold("a", delivery(AMPLE_HELD))
    assert w.ample()
    w.settled([1])
    assert len(w.releasable()) == 1 and not w.ample()


def test_one_consumer_waiting_does_not_block_another():
    w = ClientWindow()
    w.add_consumer("a", 1)
    w.add_consumer("b", 1)
    w.sent(1, "a")
    w.hold("a", delivery(2))
    assert not w.holds("b") and w.has_room("b")


def test_channel_limit_is_shared_by_all_consumers():
    w = ClientWindow()
    w.channel_limit = 2
    w.add_consumer("a", 0)
    w.add_consumer("b", 0)
    w.sent(1, "a")
    w.sent(2, "b")
    assert not w.has_room("a") and not w.has_room("b")
    w.hold("b", delivery(3))
    w.hold("a", delivery(4))
    w.settled([1])
    assert w.releasable() == [("b", delivery(3))]  # one room: the first held, whoever it is for


def test_take_held_and_forget():
    w = ClientWindow()
    w.add_consumer("a", 1)
    w.add_consumer("b", 1)
    w.sent(1, "a")
    w.sent(2, "b")
    w.hold("a", delivery(3))
    w.hold("b", delivery(4))
    assert w.take_held("a") == [delivery(3)]
    assert not w.holds("a") and w.holds("b")
    w.forget()
    assert w.has_room("a") and w.has_room("b") and not w.held


def test_a_cancelled_consumer_is_forgotten_once_its_deliveries_are_settled():
    """A channel that consumes and cancels over and over must not keep an entry per consumer."""
    w = ClientWindow()
    for round_ in range(3):
        tag = f"c{round_}"
        w.add_consumer(tag, 2)
        w.sent(10 * round_ + 1, tag)
        w.sent(10 * round_ + 2, tag)
        w.hold(tag, delivery(10 * round_ + 3))
        assert w.remove_consumer(tag) == [delivery(10 * round_ + 3)]
        assert w._in_client[tag] == 2  # its sent deliveries still count until settled
        w.settled([10 * round_ + 1, 10 * round_ + 2])
    assert w._in_client == {} and w._consumer_limit == {} and w._tag_consumer == {}


def test_bodies_carried_by_held_deliveries_are_counted_until_they_leave_the_hold():
    """A queue group's worker may carry a held delivery's body (node/group_bodies.py): the window
    counts those bytes while it holds them (the connection's held_bytes, which gates the carry
    credit and the memory alarm), and stops counting them when they are released, taken with a
    cancelled consumer, or forgotten (basic.recover).  A reference (no body, as with one group)
    counts nothing."""
    w = ClientWindow()
    w.add_consumer("a", 1)
    w.add_consumer("b", 1)
    w.sent(1, "a")
    w.sent(2, "b")
    w.hold("a", (*delivery(3), b"x" * 100))
    w.hold("a", delivery(4))
    w.hold("b", (*delivery(5), b"y" * 10))
    assert w.body_bytes == 110
    w.settled([1])
    assert [d[1] for _c, d in w.releasable()] == [3]
    assert w.body_bytes == 10
    assert [d[1] for d in w.take_held("b")] == [5]
    assert w.body_bytes == 0
    w.hold("b", (*delivery(6), b"z" * 7))
    w.forget()
    assert w.body_bytes == 0
