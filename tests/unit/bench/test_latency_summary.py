"""bench/latency.py's summary: the medians, the per-round ratios and issue 30's goal lines are
computed from the cells as the issue states them (p50 <= 0.5x RabbitMQ's, p50 < 1 ms, p99 <= 0.5x
RabbitMQ's), and cells measured in the wrong place (MISPLACED) or n/a stay out of them."""

from __future__ import annotations

from bench.latency import METRICS, Cell, per_round_ratios, summarise


def cell(system: str, p50: float, p99: float, placed: bool = True, protocol: str = "0-9-1",
         placement: str = "follower") -> Cell:
    values = dict.fromkeys(METRICS, p50) | {"p99": p99, "p999": p99, "confirm p99": p99}
    return Cell(system, protocol, placement, values, samples=500, placed=placed)


def test_goals_from_the_medians(capsys) -> None:
    """new p50 0.8 ms against RabbitMQ's 2.0 (0.40x: yes, and under 1 ms: yes); p99 4.0 against
    6.0 (0.67x: no).  The second round's new cell is MISPLACED: its 9 ms must not count."""
    rounds = [
        [cell("new", 0.8, 4.0), cell("rabbitmq", 2.0, 6.0)],
        [cell("new", 9.0, 9.0, placed=False), cell("rabbitmq", 2.0, 6.0)],
        [cell("new", 0.8, 4.0), cell("rabbitmq", 2.0, 6.0)],
    ]
    summary = summarise(rounds, ["new", "rabbitmq"])
    assert summary["medians"]["0-9-1 follower"]["new"]["p50"] == 0.8
    assert summary["medians"]["0-9-1 follower"]["rabbitmq"]["p99"] == 6.0
    assert "0-9-1 follower   p50 <= 0.5x RabbitMQ's: yes (0.40x)" in summary["goals"]
    assert "0-9-1 follower   p50 < 1 ms: yes (0.80 ms)" in summary["goals"]
    assert "0-9-1 follower   p99 <= 0.5x RabbitMQ's: no (0.67x)" in summary["goals"]
    out = capsys.readouterr().out
    assert "1 cell(s) ran with the client not where its placement says" in out
    assert "0.40 [0.40-0.40]" in out


def test_na_cells_and_missing_rabbitmq() -> None:
    """A system that cannot do a protocol (n/a) has no median; without RabbitMQ the ratio goals say n/a."""
    na = Cell("old", "0-10", "leader", na="no AMQP 0-10")
    rounds = [[cell("new", 1.5, 3.0, protocol="0-10", placement="leader"), na]]
    summary = summarise(rounds, ["new", "old"])
    assert summary["medians"]["0-10 leader"]["old"]["p50"] is None
    assert "0-10 leader      p50 <= 0.5x RabbitMQ's: n/a (no RabbitMQ figure)" in summary["goals"]
    assert "0-10 leader      p50 < 1 ms: no (1.50 ms)" in summary["goals"]


def test_per_round_ratios_pair_cells_of_the_same_round() -> None:
    """Ratios are taken within a round (the machine drifts between rounds), skipping rounds
    where either cell is missing or misplaced."""
    rounds = [
        [cell("new", 1.0, 2.0), cell("old", 2.0, 2.0)],
        [cell("new", 3.0, 2.0), cell("old", 2.0, 2.0, placed=False)],
        [cell("new", 3.0, 2.0), cell("old", 1.0, 2.0)],
    ]
    assert per_round_ratios(rounds, "0-9-1", "follower", "p50", "old") == [0.5, 3.0]


def test_failed_cells_stay_out(capsys) -> None:
    """A cell that failed (its error kept on the cell) counts in no median and no ratio."""
    rounds = [
        [cell("new", 1.0, 2.0), cell("rabbitmq", 2.0, 4.0)],
        [Cell("new", "0-9-1", "follower", failed="RuntimeError('no round trip finished')"), cell("rabbitmq", 2.0, 4.0)],
    ]
    summary = summarise(rounds, ["new", "rabbitmq"])
    assert summary["medians"]["0-9-1 follower"]["new"]["p50"] == 1.0
    assert per_round_ratios(rounds, "0-9-1", "follower", "p50", "rabbitmq") == [0.5]
    assert "1 cell(s) failed" in capsys.readouterr().out
