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


def test_window_credit_is_ample_while_half_the_window_is_left():
    """Issue 30: the credit a completion gives back may wait a little for company (deferrable)
    only while the destination still has half its window: a starved consumer's credit goes at
    once.  Small windows (under 4) and destinations without a known window never wait."""
    window = WindowCredit()
    assert not window.ample("d")  # no message.flow seen
    window.flow("d", 10)
    for transfer_id in range(4):
        window.sent(transfer_id, "d", 100)
    assert window.ample("d")  # 4 of 10 outstanding
    window.sent(4, "d", 100)
    assert not window.ample("d")  # 5 of 10: half the window is used
    window.completed([(0, 1)])
    assert window.ample("d")
    window.flow("e", 2)
    assert not window.ample("e")
    window.cancelled("d")
    assert not window.ample("d")
