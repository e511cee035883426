"""Storage damage for the ``corrupt`` and ``truncate`` nemeses (issue 29): bit flips in, cuts of and
deletion of a stopped node's data files, drawn from a seeded RNG and recorded byte by byte.

Everything here is a pure function of (the files, the RNG): the backends only find the node's data
directory (a host path for netns, the container's volume for compose) and call :func:`damage_dir`
with the node stopped.  Each :class:`Damage` says which file, which offsets, which bytes before and
after, or which sizes, so a failing run can be reproduced by hand from its report.

The files (one place, as seen in a node's data directory: ``raftmq.ops.local.cluster.Cluster``,
3 nodes, 3,000 persistent messages)::

    <data>/raft/journal/seg-<n:012d>.log   Raft journal segments (records: u32 length, u32 crc, idx, term, command)
    <data>/raft/journal/journal.meta       first index, commit, term and vote (JSON)
    <data>/raft/snapshot.lmdb              the Raft snapshot, an LMDB file (subdir=False)
    <data>/bodies/data.mdb                 the body store, an LMDB environment

Where bits are flipped, and why:

* journal: the newest non-empty segment, in its middle half (``[size/4, 3*size/4)``) -- records a
  majority acknowledged, followed by good ones; damage only at the tail would look like a torn write.
* LMDB files (bodies, snapshot): past the two meta pages at the start (pages 0 and 1), in a data page
  that is not all zeros, past the page header (16 bytes) -- the values (bodies, the pickled model),
  not the meta pages LMDB already falls back from.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

JOURNAL_DIR = "raft/journal"
SEGMENT_PREFIX, SEGMENT_SUFFIX = "seg-", ".log"
SNAPSHOT = "raft/snapshot.lmdb"
BODIES = "bodies/data.mdb"
TARGETS = ("journal", "bodies", "snapshot")
#: What each nemesis may do: ``flip`` (corrupt), ``truncate`` and ``delete`` (truncate).
ACTIONS = ("flip", "truncate", "delete")

LMDB_PAGE = 4096
LMDB_META_PAGES = 2
LMDB_PAGE_HEADER = 16
MAX_FLIPS = 4  # bits flipped per file: 1..MAX_FLIPS spots, one bit each
PAGE_TRIES = 64  # random pages looked at to find one that holds data


@dataclass(frozen=True)
class DamageSpec:
    """What to do to one node: ``action`` on each of ``targets`` (see TARGETS and ACTIONS);
    ``mode`` for truncate: ``half`` (cut to half its size) or ``random`` (a random offset, which
    need not be a record boundary)."""

    action: str
    targets: tuple[str, ...]
    mode: str = "half"

    def __post_init__(self) -> None:
        if self.action not in ACTIONS or not self.targets or any(t not in TARGETS for t in self.targets):
            raise ValueError(f"bad damage spec {self!r}")
        if self.mode not in ("half", "random"):
            raise ValueError(f"bad truncate mode {self.mode!r}")


@dataclass
class Damage:
    """What was done to one file: ``flips`` are (offset, byte before, byte after)."""

    file: str  # relative to the node's data directory
    action: str  # flip | truncate | delete | missing (nothing there to damage)
    size: int = 0  # bytes before
    new_size: int | None = None  # after a truncate (0 after a delete)
    flips: list[tuple[int, int, int]] = field(default_factory=list)

    def describe(self) -> str:
        if self.action == "flip":
            spots = ", ".join(f"@{off} 0x{a:02x}->0x{b:02x}" for off, a, b in self.flips)
            return f"{self.file} ({self.size} B) flipped {spots}"
        if self.action == "truncate":
            return f"{self.file} truncated {self.size} -> {self.new_size} B"
        if self.action == "delete":
            return f"{self.file} ({self.size} B) deleted"
        return f"{self.file}: nothing to damage"


# ---------------------------------------------------------------------------- the files


def segments(data_dir: Path) -> list[Path]:
    """The journal's segments, oldest first (by their number)."""
    directory = Path(data_dir) / JOURNAL_DIR
    if not directory.is_dir():
        return []
    names = [p for p in directory.iterdir()
             if p.name.startswith(SEGMENT_PREFIX) and p.name.endswith(SEGMENT_SUFFIX)]
    return sorted(names, key=lambda p: int(p.name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]))


def newest_segment(data_dir: Path) -> Path | None:
    """The newest segment holding any bytes (the newest one may have just been started, empty)."""
    for path in reversed(segments(data_dir)):
        if path.stat().st_size > 0:
            return path
    return None


def target_file(data_dir: Path, target: str) -> Path:
    """The file ``target`` names in ``data_dir`` (it may not exist: no snapshot yet)."""
    if target == "journal":
        newest = newest_segment(data_dir)
        return newest if newest is not None else Path(data_dir) / JOURNAL_DIR / f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"
    if target == "snapshot":
        return Path(data_dir) / SNAPSHOT
    if target == "bodies":
        return Path(data_dir) / BODIES
    raise ValueError(f"unknown target {target!r}; one of {', '.join(TARGETS)}")


# ---------------------------------------------------------------------------- pure damage


def flip_region(path: Path, size: int, rng: random.Random, lmdb: bool) -> list[int]:
    """Offsets to flip: the journal's middle half, or data pages of an LMDB file (see the module)."""
    spots = rng.randint(1, MAX_FLIPS)
    if not lmdb:
        low, high = (size // 4, 3 * size // 4) if size >= 16 else (0, size)
        return sorted(rng.sample(range(low, high), min(spots, high - low)))
    pages = size // LMDB_PAGE
    if pages <= LMDB_META_PAGES:
        return []
    offsets: list[int] = []
    with open(path, "rb") as fh:
        for _ in range(PAGE_TRIES):
            if len(offsets) >= spots:
                break
            page = rng.randrange(LMDB_META_PAGES, pages)
            fh.seek(page * LMDB_PAGE)
            if any(fh.read(LMDB_PAGE)):
                offset = page * LMDB_PAGE + rng.randrange(LMDB_PAGE_HEADER, LMDB_PAGE)
                if offset not in offsets:
                    offsets.append(offset)
    return sorted(offsets)


def flip_bits(path: Path, rng: random.Random, name: str | None = None, lmdb: bool = False) -> Damage:
    """Flip one random bit at each of 1..MAX_FLIPS offsets of ``path`` (see :func:`flip_region`)."""
    size = path.stat().st_size
    damage = Damage(name or path.name, "flip", size)
    with open(path, "r+b") as fh:
        for offset in flip_region(path, size, rng, lmdb):
            fh.seek(offset)
            before = fh.read(1)[0]
            after = before ^ (1 << rng.randrange(8))
            fh.seek(offset)
            fh.write(bytes([after]))
            damage.flips.append((offset, before, after))
        fh.flush()
        os.fsync(fh.fileno())
    return damage


def truncate_file(path: Path, rng: random.Random, mode: str = "half", name: str | None = None) -> Damage:
    """Cut ``path`` to half its size, or to a random offset in [1, size) (``mode`` random)."""
    size = path.stat().st_size
    new_size = size // 2 if mode == "half" or size < 2 else rng.randrange(1, size)
    os.truncate(path, new_size)
    return Damage(name or path.name, "truncate", size, new_size)


def delete_file(path: Path, name: str | None = None) -> Damage:
    size = path.stat().st_size
    path.unlink()
    return Damage(name or path.name, "delete", size, 0)


def damage_dir(data_dir: Path, spec: DamageSpec, rng: random.Random) -> list[Damage]:
    """Apply ``spec`` to the (stopped) node whose data directory is ``data_dir``; one record per target."""
    data_dir = Path(data_dir)
    done: list[Damage] = []
    for target in spec.targets:
        path = target_file(data_dir, target)
        name = str(path.relative_to(data_dir))
        if not path.is_file() or path.stat().st_size == 0:
            done.append(Damage(name, "missing"))
            continue
        if spec.action == "flip":
            done.append(flip_bits(path, rng, name, lmdb=target != "journal"))
        elif spec.action == "truncate":
            done.append(truncate_file(path, rng, spec.mode, name))
        else:
            done.append(delete_file(path, name))
    return done


def choose_spec(nemesis: str, rng: random.Random) -> DamageSpec:
    """What the ``corrupt`` / ``truncate`` nemesis does this time: corrupt flips bits in one, two or
    all three of the files; truncate cuts the newest segment (to half, or to a random offset) or the
    snapshot (to half), or deletes the newest segment."""
    if nemesis == "corrupt":
        return DamageSpec("flip", tuple(sorted(rng.sample(TARGETS, rng.randint(1, len(TARGETS))))))
    if nemesis == "truncate":
        return rng.choice([DamageSpec("truncate", ("journal",), "half"),
                           DamageSpec("truncate", ("journal",), "random"),
                           DamageSpec("truncate", ("snapshot",), "half"),
                           DamageSpec("delete", ("journal",))])
    raise ValueError(f"no damage for nemesis {nemesis!r}")


def describe(damages: list[Damage]) -> str:
    return "; ".join(d.describe() for d in damages) or "nothing damaged"
