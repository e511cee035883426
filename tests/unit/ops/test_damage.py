"""The damage the corrupt/truncate nemeses do (ops/chaos/damage.py), on files made here: where bits
are flipped (the journal's middle half, LMDB data pages past the meta pages), that every change is
recorded byte by byte, that the same seed does the same damage, and cuts and deletes."""

from __future__ import annotations

import random

import lmdb
import pytest

from raftmq.ops.chaos import damage


def node_dir(tmp_path, segment_bytes: int = 40_000):
    """A data directory laid out like a node's: two journal segments (the newest non-empty one and an
    empty one just started), a snapshot LMDB file and a body store LMDB environment with values."""
    data = tmp_path / "node"
    journal = data / damage.JOURNAL_DIR
    journal.mkdir(parents=True)
    (journal / "seg-000000000000.log").write_bytes(random.Random(1).randbytes(segment_bytes))
    (journal / "seg-000000000001.log").write_bytes(random.Random(2).randbytes(segment_bytes))
    (journal / "seg-000000000002.log").write_bytes(b"")
    (journal / "journal.meta").write_text('{"first_index": 0}')
    env = lmdb.open(str(data / damage.SNAPSHOT), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"model", random.Random(3).randbytes(100_000))
    env.close()
    (data / "bodies").mkdir()
    env = lmdb.open(str(data / "bodies"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        for i in range(50):
            txn.put(i.to_bytes(8, "big"), random.Random(i).randbytes(3000))
    env.close()
    return data


def snapshot_of(data):
    return {p: p.read_bytes() for p in data.rglob("*") if p.is_file()}


def changed_offsets(before: bytes, after: bytes) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]


def test_the_newest_non_empty_segment_is_flipped_in_its_middle_half_and_recorded(tmp_path):
    data = node_dir(tmp_path)
    before = snapshot_of(data)
    done = damage.damage_dir(data, damage.DamageSpec("flip", ("journal",)), random.Random(5))
    assert len(done) == 1 and done[0].file == "raft/journal/seg-000000000001.log" and done[0].action == "flip"
    path = data / done[0].file
    after = path.read_bytes()
    size = len(after)
    assert 1 <= len(done[0].flips) <= damage.MAX_FLIPS
    assert changed_offsets(before[path], after) == [off for off, _, _ in done[0].flips]
    for off, old, new in done[0].flips:
        assert size // 4 <= off < 3 * size // 4
        assert before[path][off] == old and after[off] == new and bin(old ^ new).count("1") == 1
    # nothing else changed
    assert {p: b for p, b in snapshot_of(data).items() if p != path} == {p: b for p, b in before.items() if p != path}


def test_lmdb_files_are_flipped_in_data_pages_not_the_meta_pages(tmp_path):
    data = node_dir(tmp_path)
    for target, rel in (("snapshot", damage.SNAPSHOT), ("bodies", damage.BODIES)):
        path = data / rel
        before = path.read_bytes()
        (record,) = damage.damage_dir(data, damage.DamageSpec("flip", (target,)), random.Random(11))
        assert record.file == rel and record.flips
        after = path.read_bytes()
        assert changed_offsets(before, after) == [off for off, _, _ in record.flips]
        for off, old, _new in record.flips:
            page, within = divmod(off, damage.LMDB_PAGE)
            assert page >= damage.LMDB_META_PAGES and within >= damage.LMDB_PAGE_HEADER
            assert any(before[page * damage.LMDB_PAGE:(page + 1) * damage.LMDB_PAGE]) and before[off] == old


def test_the_same_seed_does_the_same_damage(tmp_path):
    spec = damage.DamageSpec("flip", damage.TARGETS)
    first = damage.damage_dir(node_dir(tmp_path / "a"), spec, random.Random(42))
    second = damage.damage_dir(node_dir(tmp_path / "b"), spec, random.Random(42))
    assert [d.describe() for d in first] == [d.describe() for d in second]
    assert damage.describe(first).count("flipped") == 3


def test_truncate_half_random_and_delete(tmp_path):
    data = node_dir(tmp_path)
    seg = data / damage.JOURNAL_DIR / "seg-000000000001.log"
    (half,) = damage.damage_dir(data, damage.DamageSpec("truncate", ("journal",), "half"), random.Random(1))
    assert (half.size, half.new_size) == (40_000, 20_000) and seg.stat().st_size == 20_000
    assert "truncated 40000 -> 20000 B" in half.describe()
    (cut,) = damage.damage_dir(data, damage.DamageSpec("truncate", ("journal",), "random"), random.Random(1))
    assert cut.file.endswith("seg-000000000001.log") and 1 <= cut.new_size < 20_000
    assert seg.stat().st_size == cut.new_size
    (gone,) = damage.damage_dir(data, damage.DamageSpec("delete", ("journal",)), random.Random(1))
    assert gone.action == "delete" and not seg.exists()
    # the newest non-empty segment is now the first one
    assert damage.newest_segment(data).name == "seg-000000000000.log"
    (snap,) = damage.damage_dir(data, damage.DamageSpec("truncate", ("snapshot",)), random.Random(1))
    assert (data / damage.SNAPSHOT).stat().st_size == snap.new_size == snap.size // 2


def test_a_missing_file_is_recorded_not_invented(tmp_path):
    data = tmp_path / "empty"
    data.mkdir()
    done = damage.damage_dir(data, damage.DamageSpec("flip", damage.TARGETS), random.Random(1))
    assert [d.action for d in done] == ["missing"] * 3
    assert all("nothing to damage" in d.describe() for d in done)


def test_specs_the_nemeses_choose():
    rng = random.Random(3)
    corrupt = {damage.choose_spec("corrupt", rng) for _ in range(200)}
    assert all(s.action == "flip" and s.targets for s in corrupt)
    assert {t for s in corrupt for t in s.targets} == set(damage.TARGETS)
    truncate = {damage.choose_spec("truncate", rng) for _ in range(200)}
    assert truncate == {damage.DamageSpec("truncate", ("journal",), "half"),
                        damage.DamageSpec("truncate", ("journal",), "random"),
                        damage.DamageSpec("truncate", ("snapshot",), "half"),
                        damage.DamageSpec("delete", ("journal",))}
    with pytest.raises(ValueError):
        damage.DamageSpec("melt", ("journal",))
