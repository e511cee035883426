"""Faults for a chaos run: each nemesis starts a fault on a backend and returns how to end it.

| name          | fault                                                          | ends with          |
|---------------|----------------------------------------------------------------|--------------------|
| kill          | kill -9 a random node                                          | start it again     |
| leader-kill   | kill -9 the leader                                             | start it again     |
| pause         | SIGSTOP (docker pause) a random node, the leader half the time  | SIGCONT (unpause)  |
| partition     | cut the leader off from the other nodes (minority / majority)  | heal               |
| bridge        | cut two nodes from each other; the third still sees both      | heal               |
| loss          | drop 20% of the packets arriving at every node                 | heal               |
| restart-all   | kill -9 every node, then start them all                        | (immediate)        |
| disk-full     | fill a node's store filesystem to half its disk_free_limit      | free it            |
|               | (netns backend with small_disks): its disk alarm blocks the    |                    |
|               | publishers connected to it (connection.blocked) until freed    |                    |
"""

from __future__ import annotations

import random
from collections.abc import Callable

NEMESES = ("kill", "leader-kill", "pause", "partition", "bridge", "loss", "restart-all", "disk-full")
LOSS_PROBABILITY = 0.2
DISK_LEFT = 25 * 1024 * 1024  # bytes left free by disk-full: half the default disk_free_limit


def _leader_or_random(backend, rng: random.Random) -> int:
    leader = backend.leader()
    return leader if leader is not None else rng.randrange(backend.size)


def start_fault(name: str, backend, rng: random.Random) -> tuple[str, Callable[[], None]]:
    """Begin fault ``name``; return its description and the function that ends it."""
    n = backend.size
    if name == "kill":
        i = rng.randrange(n)
        backend.kill(i)
        return f"kill -9 {backend.node_name(i)}", lambda: backend.start_node(i)
    if name == "leader-kill":
        i = _leader_or_random(backend, rng)
        backend.kill(i)
        return f"kill -9 leader {backend.node_name(i)}", lambda: backend.start_node(i)
    if name == "pause":
        i = _leader_or_random(backend, rng) if rng.random() < 0.5 else rng.randrange(n)
        backend.pause(i)
        return f"pause {backend.node_name(i)}", lambda: backend.resume(i)
    if name == "partition":
        i = _leader_or_random(backend, rng)
        backend.cut([(i, j) for j in range(n) if j != i])
        return f"partition {backend.node_name(i)} | rest", backend.heal
    if name == "bridge":
        a, b = rng.sample(range(n), 2)
        backend.cut([(a, b)])
        return f"cut {backend.node_name(a)} - {backend.node_name(b)} (bridge)", backend.heal
    if name == "loss":
        for i in range(n):
            backend.loss(i, LOSS_PROBABILITY)
        return f"{int(LOSS_PROBABILITY * 100)}% packet loss", backend.heal
    if name == "restart-all":
        backend.restart_all()
        return "restart all nodes (kill -9)", lambda: None
    if name == "disk-full":
        i = _leader_or_random(backend, rng) if rng.random() < 0.5 else rng.randrange(n)
        backend.fill_disk(i, DISK_LEFT)
        return f"disk-full {backend.node_name(i)}", lambda: backend.free_disk(i)
    raise ValueError(f"unknown nemesis {name!r}; one of {', '.join(NEMESES)}")
