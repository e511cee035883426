"""The storage-fault nemeses' sequence of operations (ops/chaos/nemesis.py), on a recording backend
whose nodes are data directories made here (the damage itself is real, on those files): a node is
killed (with its children) before its files are damaged, one node only is damaged, the -and-kill
form kills the intact leader and runs the damaged node with the lagging third, and the fault's
description names the bytes changed."""

from __future__ import annotations

import random

import pytest

from raftmq.ops.chaos import damage, nemesis


class RecordingBackend:
    """Three nodes as data directories; every call recorded. Not a broker: the harness's other side."""

    size = 3

    def __init__(self, tmp_path, leader: int = 0) -> None:
        self.calls: list[tuple] = []
        self.down: set[int] = set()
        self._leader = leader
        self.dirs = []
        for i in range(self.size):
            data = tmp_path / f"n{i + 1}"
            (data / damage.JOURNAL_DIR).mkdir(parents=True)
            (data / damage.JOURNAL_DIR / "seg-000000000000.log").write_bytes(random.Random(i).randbytes(8192))
            self.dirs.append(data)

    def node_name(self, i: int) -> str:
        return f"n{i + 1}"

    def leader(self) -> int | None:
        return self._leader

    def kill(self, i: int, children: bool = False) -> None:
        self.calls.append(("kill", i, children))
        self.down.add(i)

    def start_node(self, i: int) -> None:
        self.calls.append(("start", i))
        self.down.discard(i)

    def cut(self, pairs) -> None:
        self.calls.append(("cut", tuple(sorted(tuple(sorted(p)) for p in pairs))))

    def heal(self) -> None:
        self.calls.append(("heal",))

    def damage(self, i: int, spec, rng):
        assert i in self.down, "damaged while running"
        self.calls.append(("damage", i, spec.action))
        return damage.damage_dir(self.dirs[i], spec, rng)


@pytest.mark.parametrize("name", ["corrupt", "truncate"])
def test_one_node_is_killed_damaged_and_started_again(tmp_path, name):
    backend = RecordingBackend(tmp_path)
    description, end = nemesis.start_fault(name, backend, random.Random(4))
    (kill, dmg) = backend.calls
    assert kill[0] == "kill" and kill[2] is True and dmg[:2] == ("damage", kill[1])
    assert description.startswith(f"{name} n{kill[1] + 1}: ")
    assert any(f in description for f in ("raft/journal/seg-000000000000.log", damage.SNAPSHOT, damage.BODIES))
    assert any(w in description for w in ("flipped @", "truncated", "deleted", "nothing to damage"))
    end()
    assert backend.calls[-1] == ("start", kill[1]) and not backend.down


def test_damage_and_kill_runs_the_damaged_node_with_the_lagging_one(tmp_path, monkeypatch):
    monkeypatch.setattr(nemesis, "LAG_SECONDS", 0.0)
    for seed in range(8):
        backend = RecordingBackend(tmp_path / str(seed), leader=seed % 3)
        description, end = nemesis.start_fault("corrupt-and-kill", backend, random.Random(seed))
        calls = backend.calls
        damaged = [c[1] for c in calls if c[0] == "damage"]
        assert len(damaged) == 1  # one node damaged
        x = damaged[0]
        kills = [c[1] for c in calls if c[0] == "kill"]
        assert kills[0] == x and len(kills) == 2 and kills[1] != x
        y = kills[1]
        z = ({0, 1, 2} - {x, y}).pop()
        leader = seed % 3
        assert y == leader or x == leader  # the intact node killed is the leader unless X was
        # Z was cut off from both before X was killed; healed before X started again alone with Z
        assert calls[0] == ("cut", tuple(sorted((tuple(sorted((z, x))), tuple(sorted((z, y)))))))
        assert calls.index(("heal",)) < calls.index(("start", x))
        assert backend.down == {y}
        assert description.startswith(f"corrupt n{x + 1} and kill n{y + 1}")
        # the journal (the only file these nodes have) is flipped when chosen, and says where
        assert ("raft/journal/seg-000000000000.log (8192 B) flipped @" in description
                or "raft/journal" not in description)
        end()
        assert calls[-2:] == [("start", y), ("start", x)] and not backend.down
