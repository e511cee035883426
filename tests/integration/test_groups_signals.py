"""SIGUSR1 (write digest.json, node/status.py) sent to a node with queue groups while it starts
(issue 34): the main process passes it on to its workers, which may still be opening their stores;
the default action of SIGUSR1 ends a process, and a worker that ends stops its node.  Seen with 3
groups in tests/cluster/test_replication.py (a returning follower's worker: exit code -10).

Checked with a real node (3 groups): SIGUSR1 every 20 ms from the moment its main process answers
it (status.json written) until it is ready and a second more; the node and both workers keep
running, and SIGUSR1 afterwards (again until answered: a worker still starting ignores it) writes
every group's digest.json.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from raftmq.ops.local.node import RaftmqNode
from tests.integration.helpers import wait_until

GROUPS = {"RAFTMQ_RAFT_GROUPS": "3"}


def test_sigusr1_while_a_node_with_groups_starts_ends_nothing(tmp_path, broker_kind):
    if broker_kind == "rabbitmq":
        pytest.skip("raftmq's queue groups")
    node = RaftmqNode(tmp_path / "node", env=GROUPS)
    stop = threading.Event()
    sent = [0]

    def answering() -> bool:
        """The main process's status loop runs (its SIGUSR1 handler is installed): from here on a
        signal to it is passed on to the workers, which may still be starting.  (Before that a
        process's SIGUSR1 ends it, as any process still being loaded by the interpreter.)"""
        try:
            return json.loads((node.data_dir / "status.json").read_text()).get("pid") == node.pid
        except (OSError, ValueError):
            return False

    def spam() -> None:
        while not stop.is_set():
            pid = node.pid
            if pid is not None and answering():
                try:
                    os.kill(pid, signal.SIGUSR1)
                    sent[0] += 1
                except OSError:
                    pass
            time.sleep(0.02)

    spammer = threading.Thread(target=spam, daemon=True)
    spammer.start()
    try:
        node.start()
        time.sleep(1.0)
    finally:
        stop.set()
        spammer.join()
    try:
        assert sent[0] > 10, sent
        assert node.is_alive(), node.log_tail(40)
        log = node.log_path.read_text()
        assert "its worker is gone" not in log, node.log_tail(40)
        started = time.time()
        paths = [node.data_dir / "digest.json"] + [node.data_dir / "groups" / f"g{g}" / "digest.json" for g in (1, 2)]

        def written() -> bool:
            """Asked again each time: a worker still starting ignores it (its handler comes with
            its status loop)."""
            os.kill(node.pid, signal.SIGUSR1)
            time.sleep(0.3)
            try:
                return all(json.loads(p.read_text())["time"] >= started for p in paths)
            except (OSError, ValueError):
                return False

        wait_until(written, timeout=30, what="every group's digest.json")
    finally:
        node.kill9()
