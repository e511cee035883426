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
| corrupt       | kill -9 a node (the leader half the time), flip bits in one to  | start it again     |
|               | three of its files: the newest journal segment (middle half),  |                    |
|               | the body store and the snapshot (LMDB data pages)              |                    |
| truncate      | kill -9 a node, cut its newest journal segment (to half, or a  | start it again     |
|               | random offset) or its snapshot (to half), or delete the segment |                    |
| corrupt-and-  | issue 29's scenario: cut a third node Z off for LAG_SECONDS so | start Y (and X if  |
| kill,         | that X and Y hold entries Z lacks; kill -9 X and damage it as  | it is still down)  |
| truncate-and- | above; kill -9 Y (the leader, intact); heal and start X: the   |                    |
| kill          | damaged X and the lagging Z run alone for the fault's length   |                    |

The damage nemeses name exactly what they did (files, offsets, bytes before and after, sizes) in the
fault's description, which goes into the run's log and report.json.  They damage one node at a
time (the minority rule); the -and-kill ones have two nodes down at once for the fault's length, the
way restart-all has three: the dangerous case issue 29 describes (a damaged node plus a dead
intact one).  A damaged node may fail to start: the run records it and goes on.

With queue groups (issue 34, ``backend.groups`` > 1) "the leader" is the node that leads the most
groups (ties: the metadata group's leader), so that a leader kill, a leader partition or pause takes
several groups' leaders at once where one node holds them; its description names the groups it
led.  The damage nemeses damage one group's files (drawn at random: ``groups/g<N>/...`` in the
description for a queue group); kills take every process of the node (backends.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from . import damage

DAMAGE_NEMESES = ("corrupt", "truncate", "corrupt-and-kill", "truncate-and-kill")
NEMESES = ("kill", "leader-kill", "pause", "partition", "bridge", "loss", "restart-all", "disk-full",
           *DAMAGE_NEMESES)
# Node configuration for runs with damage nemeses: bodies reach the body store (a small write-behind)
# and are read back from it (a small cache), and snapshots (with journal compaction) happen within a
# short run, so that there is a body store, a snapshot and several segments to damage.
DAMAGE_SETTINGS = {"body_write_behind_bytes": 256 << 10, "body_cache_bytes": 1 << 20,
                   "snapshot_bytes": 8 << 20, "snapshot_entries": 2000}
DAMAGE_CONFIG = "".join(f"{key} = {value}\n" for key, value in DAMAGE_SETTINGS.items())  # netns: TOML
DAMAGE_ENVIRONMENT = {f"RAFTMQ_{key.upper()}": str(value) for key, value in DAMAGE_SETTINGS.items()}  # compose
LAG_SECONDS = 1.5  # -and-kill: how long Z is cut off before X is killed
LOSS_PROBABILITY = 0.2
DISK_LEFT = 25 * 1024 * 1024  # bytes left free by disk-full: half the default disk_free_limit


def _groups(backend) -> int:
    return getattr(backend, "groups", 1)


def _leader_or_random(backend, rng: random.Random) -> int:
    leader = backend.leader()
    if _groups(backend) > 1:
        led = _led(backend)
        if led:
            most = max(len(groups) for groups in led.values())
            busiest = [i for i, groups in led.items() if len(groups) == most]
            return leader if leader in busiest else busiest[0]
    return leader if leader is not None else rng.randrange(backend.size)


def _led(backend) -> dict[int, list[int]]:
    """With queue groups: node -> the groups it leads now."""
    led: dict[int, list[int]] = {}
    for group, i in backend.group_leaders().items():
        if i is not None:
            led.setdefault(i, []).append(group)
    return led


def _leads(backend, i: int) -> str:
    """`` (leads groups 0, 2)`` with queue groups; empty otherwise."""
    if _groups(backend) <= 1:
        return ""
    groups = _led(backend).get(i, [])
    return f" (leads group{'s' if len(groups) != 1 else ''} {', '.join(map(str, groups)) or 'none'})"


def start_fault(name: str, backend, rng: random.Random) -> tuple[str, Callable[[], None]]:
    """Begin fault ``name``; return its description and the function that ends it."""
    n = backend.size
    if name == "kill":
        i = rng.randrange(n)
        leads = _leads(backend, i)
        backend.kill(i)
        return f"kill -9 {backend.node_name(i)}{leads}", lambda: backend.start_node(i)
    if name == "leader-kill":
        i = _leader_or_random(backend, rng)
        leads = _leads(backend, i)
        backend.kill(i)
        return f"kill -9 leader {backend.node_name(i)}{leads}", lambda: backend.start_node(i)
    if name == "pause":
        i = _leader_or_random(backend, rng) if rng.random() < 0.5 else rng.randrange(n)
        leads = _leads(backend, i)
        backend.pause(i)
        return f"pause {backend.node_name(i)}{leads}", lambda: backend.resume(i)
    if name == "partition":
        i = _leader_or_random(backend, rng)
        leads = _leads(backend, i)
        backend.cut([(i, j) for j in range(n) if j != i])
        return f"partition {backend.node_name(i)}{leads} | rest", backend.heal
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
    if name in ("corrupt", "truncate"):
        i = _leader_or_random(backend, rng) if rng.random() < 0.5 else rng.randrange(n)
        what = _kill_and_damage(backend, i, name, rng)
        return f"{name} {backend.node_name(i)}: {what}", lambda: backend.start_node(i)
    if name in ("corrupt-and-kill", "truncate-and-kill"):
        return _damage_and_kill(backend, name.split("-")[0], rng)
    if name == "disk-full":
        i = _leader_or_random(backend, rng) if rng.random() < 0.5 else rng.randrange(n)
        backend.fill_disk(i, DISK_LEFT)
        return f"disk-full {backend.node_name(i)}", lambda: backend.free_disk(i)
    raise ValueError(f"unknown nemesis {name!r}; one of {', '.join(NEMESES)}")


def _kill_and_damage(backend, i: int, kind: str, rng: random.Random) -> str:
    """kill -9 node ``i`` (with any forked child), damage its files; what was damaged."""
    spec = damage.choose_spec(kind, rng)
    backend.kill(i, children=True)
    if _groups(backend) > 1:
        return damage.describe(backend.damage(i, spec, rng, group=rng.randrange(_groups(backend))))
    return damage.describe(backend.damage(i, spec, rng))


def _damage_and_kill(backend, kind: str, rng: random.Random) -> tuple[str, Callable[[], None]]:
    """X damaged, Y (the leader, intact) dead, Z lagging: see the module's table."""
    n = backend.size
    leader = backend.leader()
    x = leader if leader is not None and rng.random() < 0.5 else rng.randrange(n)
    y = leader if leader is not None and leader != x else rng.choice([j for j in range(n) if j != x])
    z = next(j for j in range(n) if j not in (x, y))
    name = backend.node_name
    backend.cut([(z, x), (z, y)])
    time.sleep(LAG_SECONDS)
    try:
        what = _kill_and_damage(backend, x, kind, rng)
        backend.kill(y)
    finally:
        backend.heal()
    description = (f"{kind} {name(x)} and kill {name(y)} ({name(z)} cut off {LAG_SECONDS} s before; "
                   f"{name(x)} and {name(z)} alone): {what}")
    try:
        backend.start_node(x)
    except Exception as exc:  # noqa: BLE001 - a damaged node that cannot start: recorded, retried at the end
        description += f" [{name(x)} did not start: {str(exc).splitlines()[0]}]"

    def end() -> None:
        backend.start_node(y)
        backend.start_node(x)

    return description, end
