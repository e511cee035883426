"""node/amqp010/window.py: window credit given back once per completed transfer (spec L6097ff)."""

from raftmq.node.amqp010.window import WindowCredit


def test_completion_gives_back_one_message_and_its_bytes_once():
    """qpid.messaging repeats its whole completed set in every session.completed: a transfer's
    credit comes back the first time a range covers it, never again."""
    w = WindowCredit()
    w.sent(3, "a", 10)
    w.sent(4, "a", 20)
    w.sent(5, "b", 7)
    assert w.completed([(0, 4)])
    assert w.take_grants() == {"a": (2, 30)}
    assert not w.completed([(0, 4)])  # the same ranges again: nothing more
    assert w.take_grants() == {}
    assert w.completed([(0, 5)]) and w.take_grants() == {"b": (1, 7)}


def test_grants_add_up_until_taken_and_a_cancel_drops_them():
    w = WindowCredit()
    for i in range(4):
        w.sent(i, "a", 5)
    w.completed([(0, 0)])
    w.completed([(1, 1)])
    w.cancelled("a")  # the subscription is gone: nothing to give back, nothing owed
    assert w.take_grants() == {} and w.owed == {}
