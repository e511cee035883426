"""store/disk/body_reader.py: a body store (and a single node's durable message records) read by a
process that does not write them (issue 34: a queue group's worker writes, the node's main process
reads; docs/design.md "Bodies across the link").

What is checked: the reader finds what ``BodyStore.get_many`` finds -- live bodies in segments,
loose bodies replacing dead positions, nothing for deleted ids -- also after the writer compacted or
deleted segments the reader had seen; every body it returns verifies against its CRC32C, and a
damaged one is reported, never returned (the rule that every byte read back from disk is verified);
a single node's persistent bodies are read from the durable store's sealed records; and reads stay
exact while another process writes, deletes and compacts.
"""

from __future__ import annotations

import multiprocessing
import random
import shutil

import pytest

from raftmq.store.core.effects import PUT_WITH_BODY
from raftmq.store.core.persistence import U64
from raftmq.store.disk.body_reader import BodyReader
from raftmq.store.disk.body_store import BodyStore
from raftmq.store.disk.durable import DurableStore
from tests.unit.store.test_body_store_integrity import KEY, body_of, flip_value, open_store, write_mixed_store


def test_reads_segments_loose_bodies_and_dead_marks_as_the_writer_does(tmp_path):
    """Three segments, deletes (dead marks), a deleted id put again with another body (a loose
    value, BodyStore._plan), then compaction and a whole segment deleted: a reader whose idea of
    the segments predates the changes still returns exactly the writer's bodies."""
    path = tmp_path / "bodies"
    store = open_store(path)
    for first in (1, 11, 21):
        store.commit([(i, body_of(i)) for i in range(first, first + 10)], ())
    store.delete_many([3, 4, 15])
    store.put_many([(4, b"put again")])
    expected = {i: body_of(i) for i in range(1, 31) if i not in (3, 4, 15)} | {4: b"put again"}
    assert store.get_many(range(0, 40)) == expected
    store.close()

    reader = BodyReader(str(path))
    damaged: list[int] = []
    assert reader.get_many(range(0, 40), damaged) == expected
    assert not damaged
    reader.close()

    store = open_store(path)
    store.delete_many([i for i in range(1, 11) if i not in (2, 4)] + list(range(12, 15)))  # segment 1: 2 live
    store.delete_many([11, 16, 17, 18, 19, 20])  # the second segment wholly: deleted
    assert store.compact(below=1.0) >= 1
    store.commit([(i, body_of(i)) for i in range(31, 41)], ())
    expected = {2: body_of(2), 4: b"put again"} | {i: body_of(i) for i in range(21, 41)}
    assert store.get_many(range(0, 50)) == expected
    store.close()
    assert reader.get_many(range(0, 50), damaged) == expected  # (its old ranges: verified, not trusted)
    assert not damaged
    reader.close()


def test_a_damaged_body_is_reported_never_returned(tmp_path):
    """A byte flipped in a segment's body, in a loose value and in a segment's header: the reader
    returns every other body and reports those ids damaged."""
    path = tmp_path / "bodies"
    store = open_store(path)
    store.commit([(i, body_of(i)) for i in range(1, 11)], ())
    store.commit([(i, body_of(i)) for i in range(11, 21)], ())
    store.delete_many([5])
    store.put_many([(5, b"loose one")])
    first, second = KEY.pack(store._segments[0].key), KEY.pack(store._segments[1].key)
    flip_value(store, store.segments_db, first, -3)  # the last body of segment 1 (id 10)
    flip_value(store, store.loose_db, KEY.pack(5), 6)
    flip_value(store, store.segments_db, second, 9)  # the stored header of segment 2: its count
    store.close()
    reader = BodyReader(str(path))
    damaged: list[int] = []
    got = reader.get_many(range(1, 21), damaged)
    assert got == {i: body_of(i) for i in range(1, 10) if i != 5}
    assert set(damaged) == {5, 10, *range(11, 21)}
    assert not set(got) & set(damaged)
    reader.close()
    # a segment value lost under its header (a store rebuilt from what LMDB could still read):
    # its bodies are damaged, as for the writer, not gone
    store = open_store(path)
    with store.env.begin(write=True) as txn:
        txn.delete(first, db=store.segments_db)
    store.close()
    damaged = []
    assert reader.get_many(range(1, 5), damaged) == {}
    assert damaged == [1, 2, 3, 4]
    reader.close()


def test_bytes_flipped_in_the_file_are_never_returned(tmp_path):
    """Flips straight into data.mdb (seeded positions past LMDB's meta pages): whatever the reader
    meets, it returns no bytes but the body written under that id, and never raises."""
    clean = tmp_path / "clean"
    expected = write_mixed_store(clean)
    for seed in range(25):
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        data = bytearray((work / "data.mdb").read_bytes())
        rng = random.Random(seed)
        for pos in [rng.randrange(8192, len(data)) for _ in range(4)]:
            data[pos] ^= rng.randrange(1, 256)
        (work / "data.mdb").write_bytes(bytes(data))
        reader = BodyReader(str(work))
        got = reader.get_many(expected)
        assert not [i for i, body in got.items() if body != expected[i]], seed
        reader.close()


def test_a_single_nodes_persistent_bodies_come_from_the_durable_records(tmp_path):
    """On a single node a persistent message's body is in the durable store's message record
    (sealed, store/disk/sealed.py), not in the body store: the reader finds it there; a record
    whose bytes were changed fails its seal and is reported damaged."""
    state = DurableStore(str(tmp_path / "state"), map_size=1 << 28)
    ops = [(PUT_WITH_BODY, "messages", U64.pack(i), [i, "ex", "rk", None, b"", True, 0, 0], 3, i) for i in (7, 8)]
    state.commit(ops, (0, 9), None, lambda i: b"persistent %d" % i)
    with state.env.begin(write=True, db=state.db["messages"]) as txn:
        raw = bytearray(txn.get(U64.pack(8)))
        raw[-2] ^= 0x11
        txn.put(U64.pack(8), bytes(raw))
    state.env.close()
    open_store(tmp_path / "bodies").close()  # (an empty body store, as a single node's usually is)
    reader = BodyReader(str(tmp_path / "bodies"), str(tmp_path / "state"))
    damaged: list[int] = []
    assert reader.get_many([7, 8, 9], damaged) == {7: b"persistent 7"}
    assert damaged == [8]
    reader.close()


def _writer(path: str, conn) -> None:
    """A writer process: each command from ``conn`` is carried out on the store, then acknowledged."""
    store = BodyStore(path, map_size=1 << 28)
    while True:
        command = conn.recv()
        if command is None:
            break
        kind, arg = command
        if kind == "put":
            store.commit([(i, body_of(i, 300 + i % 500)) for i in arg], ())
        elif kind == "delete":
            store.delete_many(arg)
        elif kind == "compact":
            store.compact(below=1.0)
        conn.send(True)
    store.close()
    conn.send(True)


@pytest.mark.timeout(60)
def test_reads_are_exact_while_another_process_writes_deletes_and_compacts(tmp_path):
    """A forked writer puts batches, deletes most of what came before (whole segments go) and
    compacts, as a queue group's worker does; after each step the reader, in this process, returns
    exactly the live bodies, with their sizes."""
    path = str(tmp_path / "bodies")
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_writer, args=(path, theirs))
    child.start()
    try:
        reader = BodyReader(path)
        live: set[int] = set()
        rng = random.Random(7)
        next_id = 1
        for step in range(30):
            batch = list(range(next_id, next_id + rng.randrange(1, 40)))
            next_id = batch[-1] + 1
            ours.send(("put", batch))
            assert ours.recv()
            live.update(batch)
            gone = [i for i in sorted(live) if rng.random() < 0.6]
            ours.send(("delete", gone))
            assert ours.recv()
            live.difference_update(gone)
            if step % 5 == 4:
                ours.send(("compact", None))
                assert ours.recv()
            damaged: list[int] = []
            got = reader.get_many(range(0, next_id), damaged)
            assert not damaged
            assert got == {i: body_of(i, 300 + i % 500) for i in live}, step
        ours.send(None)
        assert ours.recv()
        reader.close()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def _mapped_kib(path: str) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, current = 0, None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                current = head[5] if len(head) > 5 else None
            elif line.startswith("Rss:") and current == path:
                total += int(head[1])
    return total


def test_the_writers_pages_read_do_not_stay_in_the_readers_memory(tmp_path):
    """LMDB maps a whole segment value (here 8 MiB) into the reading process when one body of it is
    read; the reader drops those pages from its page tables when asked after reads (the page cache
    keeps them; the main process asks 50 ms after its reads), so a main process reading a worker's
    bodies does not hold the worker's file in its RSS."""
    path = tmp_path / "bodies"
    store = open_store(path)
    store.commit([(i, bytes([i % 256]) * 65536) for i in range(1, 129)], ())
    store.close()
    reader = BodyReader(str(path))
    assert reader.get_many([64]) == {64: bytes([64]) * 65536}
    assert reader.mapped
    reader.drop_pages()
    assert _mapped_kib(str(path / "data.mdb")) < 1024
    reader.close()
