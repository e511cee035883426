"""node/writeflow.py: the parking of deliveries while a client's socket is full."""

from __future__ import annotations

from raftmq.node.writeflow import RESTOP_EVERY, Parking


def test_a_channel_is_stopped_once_it_parked_the_threshold_then_again_every_restop_deliveries():
    parking = Parking(stop_after=1000)
    parking.paused = True
    assert [parking.park(1, "c", ("d", i), 0, 300) for i in range(3)] == [False, False, False]
    assert parking.park(1, "c", ("d", 3), 0, 300) is True  # 1,200 bytes parked: send the stop
    stops = [parking.park(1, "c", ("d", i), 0, 300) for i in range(4, 4 + 2 * RESTOP_EVERY)]
    assert stops.count(True) == 2 and stops[RESTOP_EVERY - 1] and stops[2 * RESTOP_EVERY - 1]
    assert parking.park(2, "c", ("d", 0), 0, 0) is False  # a bounded channel (counted 0) never stops


def test_owned_bytes_follow_parked_auto_ack_bodies_and_order_is_kept():
    parking = Parking(stop_after=10**9)
    parking.paused = True
    parking.park(1, "a", ("x",), 500, 500)  # auto-ack: held only here
    parking.park(1, "m", ("y",), 0, 700)  # manual ack: the queue holds it
    assert parking.owned_bytes == 500 and parking.holding
    parking.paused = False
    assert parking.holding  # older deliveries still parked: new ones must queue behind them
    assert parking.pop()[2] == ("x",) and parking.owned_bytes == 0
    assert parking.pop()[2] == ("y",) and not parking.holding


def test_drained_returns_the_stopped_channels_and_starts_counting_afresh():
    parking = Parking(stop_after=100)
    parking.paused = True
    assert parking.park(3, "c", ("d",), 0, 100)
    parking.park(4, "c", ("d",), 0, 50)
    while parking.items:
        parking.pop()
    assert set(parking.drained()) == {3}
    assert parking.park(4, "c", ("d",), 0, 50) is False  # channel 4's earlier 50 bytes are forgotten
    parking.clear()
    assert not parking.items and parking.owned_bytes == 0 and not parking.stopped
