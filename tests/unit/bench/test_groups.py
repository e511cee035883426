"""bench/groups.py's pure parts (issue 34's "How we will check it"): the command line and its checks,
the CPU accounting from /proc/<pid>/stat and /proc/stat (proc(5): utime, stime, cutime, cstime are
fields 14-17 in clock ticks; the "cpu" line's fourth and fifth values are idle and iowait), the
per-run arithmetic (rate over the wall time from the first publisher's start to the last one's end,
CPU per confirmed message) and the summary's medians and ratios.  The figures are made up: nothing
here measures or asserts a timing.  The publishers themselves speak AMQP 0-9-1 with publisher
confirms (basic.publish, reference §1.8.3.7; confirm.select, RabbitMQ's extension) against real
brokers only when the script runs."""

from __future__ import annotations

import math
import os

import pytest

from bench.groups import (
    TICKS,
    Publisher,
    Run,
    broker_config,
    cpu_delta,
    cpu_deltas,
    cpu_seconds,
    format_summary,
    machine_ticks,
    orders,
    parse_args,
    spread,
    stat_seconds,
    summarise,
)


def test_defaults_and_systems() -> None:
    """Defaults: one node, one against split (2 brokers), 2 publishers x 20,000 x 256 B, window 1,000;
    --groups and --rabbitmq add their systems; --systems picks and orders them (first = baseline)."""
    args = parse_args([])
    assert (args.nodes, args.systems, args.split, args.publishers) == (1, ["one", "split"], 2, 2)
    assert (args.count, args.size, args.window, args.groups) == (20_000, 256, 1000, None)
    args = parse_args(["--nodes", "3", "--groups", "3", "--rabbitmq"])
    assert args.systems == ["one", "split", "groups", "rabbitmq"]
    args = parse_args(["--nodes", "3", "--systems", "rabbitmq, one", "--client-on", "leader", "--own-sessions"])
    assert (args.systems, args.client_on, args.own_sessions) == (["rabbitmq", "one"], "leader", True)
    assert parse_args([]).own_sessions is False


@pytest.mark.parametrize("argv", [
    ["--systems", "one,nine"],           # unknown system
    ["--systems", "one,one"],            # twice
    ["--systems", "groups"],             # groups without --groups N
    ["--rabbitmq"],                      # RabbitMQ only as a 3-node cluster
    ["--nodes", "2"],                    # 1 or 3
    ["--count", "0"],
    ["--groups", "0"],
])
def test_bad_command_lines_are_refused(argv: list[str]) -> None:
    """Each of these is a usage error (argparse exits with status 2), not a run."""
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2


def test_groups_passes_its_setting_through() -> None:
    """The groups system's brokers get 'raft_groups = N' and every --broker-config line; the others
    only the extra lines (and all of them disk_free_limit = 1)."""
    args = parse_args(["--groups", "4", "--broker-config", "raft_workers = 2", "--broker-config", "x = 1"])
    assert broker_config(args, "groups").splitlines() == ["disk_free_limit = 1", "raft_groups = 4",
                                                          "raft_workers = 2", "x = 1"]
    assert "raft_groups" not in broker_config(args, "one")
    assert broker_config(args, "split").splitlines()[-1] == "x = 1"


def test_stat_seconds_reads_fields_14_to_17() -> None:
    """A command name with spaces and a ')' must not shift the fields: utime 100 + stime 50 +
    cutime 7 + cstime 3 ticks."""
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "10", "0", "0", "0", "100", "50", "7", "3", "20"]
    line = "1234 (python3 -m x) y) " + " ".join(fields) + " 0 1 0 12345\n"
    assert stat_seconds(line) == pytest.approx(160 / TICKS)


def test_cpu_seconds_of_this_process_and_a_gone_one() -> None:
    """This process is read (a non-negative figure); a PID that does not exist is left out."""
    got = cpu_seconds([os.getpid(), 2**22 + 12345])
    assert list(got) == [os.getpid()]
    assert got[os.getpid()] >= 0


def test_cpu_delta() -> None:
    """Processes in both samples count their difference; one started meanwhile counts from zero;
    one that ended meanwhile is left out."""
    assert cpu_delta({1: 2.0, 2: 5.0, 3: 1.0}, {1: 2.5, 2: 6.0, 4: 0.25}) == pytest.approx(0.5 + 1.0 + 0.25)
    assert cpu_deltas({1: 2.0, 3: 1.0}, {1: 2.5, 4: 0.25}) == {1: pytest.approx(0.5), 4: pytest.approx(0.25)}


def test_machine_ticks() -> None:
    """busy = user + nice + system + irq + softirq + steal (idle and iowait out); total = all eight."""
    stat = "cpu  100 10 50 1000 40 0 5 1 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert machine_ticks(stat) == (166, 40, 1206)


def run(system: str, acked: tuple[int, ...], spans: tuple[tuple[float, float], ...], broker: float,
        clients: tuple[float, ...], busiest: float = 0.0) -> Run:
    pubs = tuple(Publisher(a, 0, s, e, c) for a, (s, e), c in zip(acked, spans, clients, strict=True))
    return Run(system, pubs, broker, machine_busy=2.0, busiest=busiest)


def test_run_arithmetic() -> None:
    """Two publishers of 10,000 each, from t=100.0 and t=100.5 to t=102.0 and t=101.0: 20,000 over
    2.0 s = 10,000 msg/s; 0.4 s of broker CPU = 20 µs/msg; clients 0.1 + 0.2 s = 15 µs/msg; ours
    0.7 s of CPU over 2 s = 0.35 cores, the machine's 2.0 s = 1.0 core, so 0.65 for the others."""
    r = run("one", (10_000, 10_000), ((100.0, 102.0), (100.5, 101.0)), 0.4, (0.1, 0.2))
    assert r.confirmed == 20_000
    assert r.wall == pytest.approx(2.0)
    assert r.rate == pytest.approx(10_000)
    assert r.broker_us == pytest.approx(20.0)
    assert r.client_us == pytest.approx(15.0)
    assert r.values()["total_us"] == pytest.approx(35.0)
    assert r.values()["busiest_us"] == pytest.approx(0.0)  # no busiest given here
    assert r.cores == pytest.approx(0.35)
    assert r.others == pytest.approx(0.65)


def test_cpu_bound_projection() -> None:
    """20,000 messages; brokers 0.4 s (the busiest process 0.3 s), publishers 0.1 and 0.2 s: on 2
    cores the 0.7 s shared is 0.35 s of wall time, more than any one process's 0.3 s, so 20,000 /
    0.35 = 57,143 msg/s; on 4 cores the busiest broker process (0.3 s) bounds it: 66,667 msg/s; a
    publisher that needs 0.5 s alone bounds it to 40,000."""
    r = run("one", (10_000, 10_000), ((0.0, 2.0), (0.0, 2.0)), 0.4, (0.1, 0.2), busiest=0.3)
    assert r.values()["busiest_us"] == pytest.approx(15.0)  # 0.3 s / 20,000
    assert r.ceiling(2) == pytest.approx(20_000 / 0.35)
    assert r.ceiling(4) == pytest.approx(20_000 / 0.3)
    assert run("one", (10_000, 10_000), ((0.0, 2.0), (0.0, 2.0)), 0.4, (0.1, 0.5), busiest=0.3).ceiling(4) \
        == pytest.approx(40_000)


def test_summary_medians_and_ratios() -> None:
    """Three rounds; split's rates 15k, 18k, 14k against one's 10k, 10k, 12k: medians 15k and 10k,
    ratio 1.5, per-round ratios 1.5, 1.8 and 1.1667.  Broker CPU per message 20/20/22 against
    22/22/22 µs: median ratio 20/22 = 0.91, range 0.91-1.0."""
    def pair(one_rate: int, split_rate: int, one_cpu: float, split_cpu: float) -> dict[str, Run]:
        return {"one": run("one", (one_rate,), ((0.0, 1.0),), one_rate * one_cpu / 1e6, (0.1,)),
                "split": run("split", (split_rate,), ((0.0, 1.0),), split_rate * split_cpu / 1e6, (0.1,))}

    rounds = [pair(10_000, 15_000, 22, 20), pair(10_000, 18_000, 22, 20), pair(12_000, 14_000, 22, 22)]
    summary = summarise(rounds, ["one", "split"])
    assert summary.rounds == 3
    assert summary.medians["one"]["rate"] == pytest.approx(10_000)
    assert summary.medians["split"]["rate"] == pytest.approx(15_000)
    ratio, paired, low, high = summary.ratios["split"]["rate"]
    assert (ratio, paired, low, high) == (pytest.approx(1.5), pytest.approx(1.5), pytest.approx(14 / 12),
                                          pytest.approx(1.8))
    ratio, paired, low, high = summary.ratios["split"]["broker_us"]
    assert (ratio, paired, low, high) == (pytest.approx(20 / 22), pytest.approx(20 / 22), pytest.approx(20 / 22),
                                          pytest.approx(1.0))
    assert "one" not in summary.ratios
    text = format_summary(summary, ["one", "split"])
    assert "confirmed msg/s" in text and "1.50 (1.50) [1.17-1.80]" in text


def test_paired_ratio_differs_from_the_ratio_of_medians() -> None:
    """Rounds that drift: one 10k, 30k, 20k; split 12k, 24k, 40k.  Medians 20k and 24k (1.2);
    per-round ratios 1.2, 0.8, 2.0: their median 1.2, range 0.8-2.0.  And one 10k, 20k, 30k with
    split 5k, 24k, 33k: medians 20k, 24k (1.2) but per round 0.5, 1.2, 1.1 -> median 1.1."""
    def runs(a: int, b: int) -> dict[str, Run]:
        return {"one": run("one", (a,), ((0.0, 1.0),), 0.01, (0.1,)),
                "split": run("split", (b,), ((0.0, 1.0),), 0.01, (0.1,))}

    summary = summarise([runs(10_000, 12_000), runs(30_000, 24_000), runs(20_000, 40_000)], ["one", "split"])
    assert summary.ratios["split"]["rate"] == tuple(pytest.approx(v) for v in (1.2, 1.2, 0.8, 2.0))
    summary = summarise([runs(10_000, 5_000), runs(20_000, 24_000), runs(30_000, 33_000)], ["one", "split"])
    assert summary.ratios["split"]["rate"] == tuple(pytest.approx(v) for v in (1.2, 1.1, 0.5, 1.2))


def test_summary_skips_rounds_without_a_system() -> None:
    """A system missing from a round (e.g. it failed) leaves that round out of its ratios; a ratio
    to a zero is NaN."""
    rounds = [{"one": run("one", (100,), ((0.0, 1.0),), 0.001, (0.0,)),
               "split": run("split", (200,), ((0.0, 1.0),), 0.001, (0.0,))},
              {"one": run("one", (100,), ((0.0, 1.0),), 0.001, (0.0,))}]
    summary = summarise(rounds, ["one", "split"])
    assert summary.ratios["split"]["rate"] == tuple(pytest.approx(2.0) for _ in range(4))
    assert math.isnan(summary.ratios["split"]["client_us"][0])  # 0 against 0 µs: no ratio, no crash


def test_orders_and_spread() -> None:
    """Every system runs first equally often over the permutations; publishers go round robin."""
    all_orders = orders(["one", "split", "rabbitmq"])
    assert len(all_orders) == 6
    assert sorted(o[0] for o in all_orders) == ["one", "one", "rabbitmq", "rabbitmq", "split", "split"]
    assert spread(["a", "b"], 3) == ["a", "b", "a"]
