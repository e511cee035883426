"""Queue groups in the integration tests (issue 34): ``RAFTMQ_RAFT_GROUPS=N`` (``make test-groups``)
runs every test node with N Raft groups, the metadata group in the main process and queue groups
in workers, each with its own data directory (``<data>/groups/g<N>``: journal, bodies, history,
status.json).  A test that looks at a queue's files or figures places the queue with
:func:`queue_arguments` and reads that group's (:func:`group_dir`, :func:`group_status`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

GROUPS = int(os.environ.get("RAFTMQ_RAFT_GROUPS") or 1)
QUEUE_GROUP = 1 if GROUPS > 1 else 0  # where queue_arguments() places a queue


def queue_arguments(**arguments: Any) -> dict:
    """``arguments`` plus ``x-queue-group`` placing the queue in :data:`QUEUE_GROUP` (none with one group)."""
    return {**arguments, "x-queue-group": QUEUE_GROUP} if GROUPS > 1 else dict(arguments)


def group_dir(node: Any, group: int = QUEUE_GROUP) -> Path:
    """The data directory of ``group`` on ``node`` (the node's own for group 0)."""
    return Path(node.data_dir) if group == 0 else Path(node.data_dir) / "groups" / f"g{group}"


def group_status(node: Any, group: int = QUEUE_GROUP, timeout: float = 15.0) -> dict:
    """``status.json`` of ``group`` on ``node``, written after now by the node's current process
    (a queue group's worker carries the node's boot stamp)."""
    start = time.time()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            main = json.loads((Path(node.data_dir) / "status.json").read_text())
            data = main if group == 0 else json.loads((group_dir(node, group) / "status.json").read_text())
        except (OSError, ValueError):
            data = main = None
        if data is not None and main is not None and data["time"] >= start and main["pid"] == node.pid \
                and data.get("boot") == main.get("boot"):
            return data
        time.sleep(0.05)
    raise AssertionError(f"no fresh status.json of group {group}")


def wait_histories(node: Any, timeout: float = 15.0, groups: int = GROUPS) -> None:
    """``RaftmqNode.wait_history`` for every group (``groups``: the node's count, default the
    run's): each group's audit writer wrote every event its group applied (its status.json), twice
    in a row."""
    node.wait_history(timeout)
    for group in range(1, groups):
        deadline = time.monotonic() + timeout
        while True:
            st = group_status(node, group)
            if st.get("audit_last_seq") is not None and st.get("audit_last_seq") == st.get("event_seq"):
                time.sleep(0.6)
                again = group_status(node, group)
                if again.get("audit_last_seq") == again.get("event_seq") == st["event_seq"]:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {group}'s audit history did not catch up: {st}")
            time.sleep(0.1)


def channel(node: Any) -> tuple[Any, Any]:
    """A pika connection to ``node`` and a channel on it."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    return conn, conn.channel()


async def kill_leaders(cluster: Any, kills: int, before: float, down: float) -> int:
    """kill -9 of the cluster's (metadata group's) leader ``kills`` times, ``before`` s after the
    previous one came back, restarting it after ``down`` s; returns the kills made."""
    import asyncio

    made = 0
    for _ in range(kills):
        await asyncio.sleep(before)
        node = await asyncio.to_thread(cluster.leader)
        node.kill9()
        made += 1
        await asyncio.sleep(down)
        await asyncio.to_thread(node.start)
    return made
