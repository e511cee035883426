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


class GroupsBackend(RecordingBackend):
    """The recording backend with queue groups (issue 34): ``leads`` says which groups each node
    leads; every node has a journal segment in each queue group's directory too."""

    groups = 3

    def __init__(self, tmp_path, leader: int, leads: dict[int, int | None]) -> None:
        super().__init__(tmp_path, leader)
        self.leads = leads
        for i, data in enumerate(self.dirs):
            for g in range(1, self.groups):
                journal = data / "groups" / f"g{g}" / damage.JOURNAL_DIR
                journal.mkdir(parents=True)
                (journal / "seg-000000000000.log").write_bytes(random.Random(10 * i + g).randbytes(8192))

    def group_leaders(self) -> dict[int, int | None]:
        return dict(self.leads)

    def damage(self, i: int, spec, rng, group: int = 0):
        assert i in self.down, "damaged while running"
        self.calls.append(("damage", i, spec.action, group))
        done = damage.damage_dir(self.dirs[i] / "groups" / f"g{group}" if group else self.dirs[i], spec, rng)
        for item in done:
            item.file = f"groups/g{group}/{item.file}" if group else item.file
        return done


@pytest.mark.parametrize("name", ["leader-kill", "partition"])
def test_with_groups_the_leader_is_the_node_leading_the_most_groups(tmp_path, name):
    """Issue 34: with queue groups a leader fault takes the node that leads the most groups (here n2
    leads queue groups 1 and 2, n1 only the metadata group), so that it takes several leaders at
    once; the description names the groups the node led."""
    backend = GroupsBackend(tmp_path, leader=0, leads={0: 0, 1: 1, 2: 1})
    description, end = nemesis.start_fault(name, backend, random.Random(1))
    assert "n2 (leads groups 1, 2)" in description
    if name == "leader-kill":
        assert backend.calls[0] == ("kill", 1, False)
    else:
        assert backend.calls[0] == ("cut", ((0, 1), (1, 2)))
    end()


def test_with_groups_a_tie_goes_to_the_metadata_leader(tmp_path):
    backend = GroupsBackend(tmp_path, leader=2, leads={0: 2, 1: 0, 2: None})
    description, _end = nemesis.start_fault("leader-kill", backend, random.Random(1))
    assert backend.calls[0] == ("kill", 2, False) and description.endswith("n3 (leads group 0)")


def test_with_groups_damage_hits_one_groups_directory_and_names_it(tmp_path):
    """The damage nemeses draw one group per fault; a queue group's files are named under
    ``groups/g<N>/`` (the layout of node/worker.py's data directory)."""
    seen = set()
    for seed in range(12):
        backend = GroupsBackend(tmp_path / str(seed), leader=0, leads={0: 0, 1: 0, 2: 0})
        description, _end = nemesis.start_fault("truncate", backend, random.Random(seed))
        (_kill, dmg) = backend.calls
        group = dmg[3]
        seen.add(group)
        if group:
            assert f"groups/g{group}/raft/journal/seg-000000000000.log" in description or "snapshot" in description
        else:
            assert "groups/" not in description
    assert seen == {0, 1, 2}
