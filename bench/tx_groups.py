"""Issue 34, session 20: the cost of a transaction across groups (the two-phase commit of
store/core/tx_groups.py) against one within a group, side by side, alternating rounds.

Systems, each one single node started fresh for the whole run (``RaftmqNode``; or a cluster):

* ``g1``: ``raft_groups = 1`` (today's broker): each transaction publishes to two queues, one
  ``TxCommit`` in the one log.
* ``same``: ``raft_groups = 3``, both queues pinned to queue group 1 (``x-queue-group``): a
  one-group transaction, routed as it is to group 1's worker (the hop, no coordinator).
* ``cross``: ``raft_groups = 3``, one queue in group 1, one in group 2: the two-phase commit
  (TxBegin in group 0, TxPrepare in 1 and 2, TxVote, TxFinish, TxEnded: five log steps, three of
  them in the metadata group, and the hops between the processes).

Load: one pika ``BlockingConnection`` per run, ``tx.select``, then ``--count`` transactions each
of ``--per-queue`` publishes of ``--size`` B to each of the two queues, ``tx.commit`` waited for
(one transaction in flight: a client's tx.commit is synchronous).  Bounded by the count and by
``--time-limit`` seconds.  Rate = commits / wall seconds.  CPU = utime + stime of the node's
main process and its workers (from /proc, before and after), per commit.  The queues are purged
between runs.  Only the side-by-side ratios mean anything on a shared 2-core machine.

``--nodes 3``: each system a 3-node cluster (``Cluster``), the client on a follower of the
metadata group, CPU summed over every process of every node.

Usage::

    python bench/tx_groups.py --count 300 --rounds 3
    python bench/tx_groups.py --nodes 3 --count 200 --rounds 3
    python bench/tx_groups.py --protocol 010 --count 300 --rounds 3   # a 0-10 session's tx.commit
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pika

from raftmq.ops.local.cluster import Cluster
from raftmq.ops.local.node import RaftmqNode

TICKS = 100.0


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


class System:
    def __init__(self, name: str, groups: int, placement: tuple[int, int], root: Path, nodes: int = 1) -> None:
        self.name = name
        self.cluster: Cluster | None = None
        if nodes > 1:
            self.cluster = Cluster(nodes, root / name, extra_config=f"raft_groups = {groups}")
        else:
            self.node = RaftmqNode(root / name, env={"RAFTMQ_RAFT_GROUPS": str(groups)})
        self.placement = placement
        self.queues = (f"{name}-q1", f"{name}-q2")

    def start(self) -> None:
        if self.cluster is not None:
            self.cluster.start()
            # the client on a follower of the metadata group, as bench/ab_cluster.py's
            self.node = next(n for n in self.cluster.nodes if n is not self.cluster.leader(timeout=30))
        else:
            self.node.start()
        conn = pika.BlockingConnection(pika.URLParameters(self.node.url))
        ch = conn.channel()
        for queue, group in zip(self.queues, self.placement, strict=True):
            args = {"x-queue-group": group} if group else {}
            ch.queue_declare(queue, durable=True, arguments=args)
        conn.close()

    def pids(self) -> list[int]:
        nodes = self.cluster.nodes if self.cluster is not None else [self.node]
        out: list[int] = []
        for node in nodes:
            pid = node.pid
            assert pid is not None
            out += [pid, *children(pid)]
        return out

    def run(self, count: int, per_queue: int, size: int, limit: float) -> tuple[float, float, int]:
        conn = pika.BlockingConnection(pika.URLParameters(self.node.url))
        ch = conn.channel()
        ch.tx_select()
        body = b"x" * size
        props = pika.BasicProperties(delivery_mode=2)
        pids = self.pids()
        cpu0, t0 = cpu_seconds(pids), time.perf_counter()
        done = 0
        while done < count and time.perf_counter() - t0 < limit:
            for queue in self.queues:
                for _ in range(per_queue):
                    ch.basic_publish("", queue, body, props)
            ch.tx_commit()
            done += 1
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
        self._check_and_purge(ch, done * per_queue)
        conn.close()
        return done / wall, cpu / max(done, 1), done

    def _check_and_purge(self, ch, expected: int) -> None:
        """Every queue holds ``expected`` messages (else say so), then none."""
        for queue in self.queues:
            got = ch.queue_declare(queue, passive=True).method.message_count
            if got != expected:
                print(f"  !! {self.name}: {queue} holds {got}, expected {expected}", file=sys.stderr)
            ch.queue_purge(queue)

    def run010(self, count: int, per_queue: int, size: int, limit: float) -> tuple[float, float, int]:
        """``run`` with an AMQP 0-10 session (client/amqp010.py): transfers in the open transaction,
        tx.commit waited for (session 21: the two-phase commit inside a session command)."""
        import asyncio

        from raftmq.client.amqp010 import Connection

        body = b"x" * size
        pids = self.pids()

        async def load() -> tuple[float, float, int]:
            client = await Connection.connect([f"127.0.0.1:{self.node.port}"])
            session = await client.session(timeout=0)
            await session.tx_select()
            cpu0, t0 = cpu_seconds(pids), time.perf_counter()
            done = 0
            while done < count and time.perf_counter() - t0 < limit:
                for queue in self.queues:
                    for _ in range(per_queue):
                        session.publish_nowait("", queue, body, persistent=True)
                await session.tx_commit()
                done += 1
            wall, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
            await client.close()
            return wall, cpu, done

        wall, cpu, done = asyncio.run(load())
        conn = pika.BlockingConnection(pika.URLParameters(self.node.url))
        self._check_and_purge(conn.channel(), done * per_queue)
        conn.close()
        return done / wall, cpu / max(done, 1), done

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        else:
            self.node.terminate()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=300, help="transactions per run")
    parser.add_argument("--per-queue", type=int, default=1, help="publishes to each queue per transaction")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per run at most")
    parser.add_argument("--systems", default="g1,same,cross")
    parser.add_argument("--nodes", type=int, default=1, help="3: each system a 3-node cluster, the client on a follower")
    parser.add_argument("--protocol", choices=("091", "010"), default="091",
                        help="010: an AMQP 0-10 session's tx.commit (session 21) instead of pika's")
    args = parser.parse_args(argv)
    specs = {"g1": (1, (0, 0)), "same": (3, (1, 1)), "cross": (3, (1, 2))}
    names = [n for n in args.systems.split(",") if n]
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="txbench") as tmp:
        systems = [System(n, *specs[n], Path(tmp), args.nodes) for n in names]
        try:
            for system in systems:
                system.start()
                run = system.run010 if args.protocol == "010" else system.run
                run(max(args.count // 10, 10), args.per_queue, args.size, args.time_limit)  # warm-up
            for r in range(args.rounds):
                order = systems[r % len(systems):] + systems[:r % len(systems)]
                for system in order:
                    run = system.run010 if args.protocol == "010" else system.run
                    rate, cpu, done = run(args.count, args.per_queue, args.size, args.time_limit)
                    results[system.name].append((rate, cpu))
                    print(f"round {r + 1} {system.name:6s} {done:5d} tx  {rate:8.1f} commits/s  "
                          f"{cpu * 1e3:7.2f} ms CPU/commit", flush=True)
        finally:
            for system in systems:
                system.stop()
    base = names[0]
    base_rate = statistics.median(r for r, _ in results[base])
    base_cpu = statistics.median(c for _, c in results[base])
    print(f"\nmedians over {args.rounds} rounds, {args.count} tx of 2 x {args.per_queue} x {args.size} B:")
    for name in names:
        rate = statistics.median(r for r, _ in results[name])
        cpu = statistics.median(c for _, c in results[name])
        print(f"  {name:6s} {rate:8.1f} commits/s ({rate / base_rate:4.2f}x {base})  "
              f"{cpu * 1e3:7.2f} ms CPU/commit ({cpu / base_cpu:4.2f}x)")


if __name__ == "__main__":
    main()
