"""Damaged bodies (issue 29; store/disk/body_store.py "Checksums", store/disk/bodies.py "Damaged bodies"):
bytes flipped in a stored body, a segment header, a loose value or dead marks -- through LMDB or
directly in data.mdb -- are detected when read and by ``verify_body_store``; a damaged body is
never returned, is replaced from a peer (the real request/answer encoding, each copy checked
against its checksum), or refused; the scrubber finds damage no read met; a store of the first
format (no checksums) opens, is upgraded, and verifies.

Real LMDB environments in temporary directories; the "peer" is another real ``Bodies`` answering
through ``body_fetch.serve``."""

from __future__ import annotations

import os
import random
import shutil
import struct
from array import array

import lmdb
import pytest

from raftmq.store.core.commands import OUT_DELIVER
from raftmq.store.disk.bodies import Bodies, fill_bodies
from raftmq.store.disk.body_fetch import FetchError, decode_answer, encode_answer, fetch_intact, serve
from raftmq.store.disk.body_scrub import BodyScrubber
from raftmq.store.disk.body_store import MAGIC, BodyStore, verify_body_store

KEY = struct.Struct(">Q")


def body_of(msg_id: int, size: int = 100) -> bytes:
    return (msg_id.to_bytes(8, "big") * (size // 8 + 1))[:size]


def open_store(path) -> BodyStore:
    return BodyStore(str(path), map_size=1 << 28)


def write_mixed_store(path) -> dict[int, bytes]:
    """A closed store with B-tree pages of small values (segments of 3 x 100 B), overflow pages
    (5,000 B bodies) and a body put again under its id; returns what each id holds."""
    store = open_store(path)
    for first in range(0, 300, 3):
        store.commit([(i, body_of(i)) for i in range(first, first + 3)], ())
    store.commit([(i, body_of(i, 5000)) for i in range(1000, 1010)], ())
    store.put_many([(4, b"replaced")])
    store.sync()
    store.close()
    expected = {i: body_of(i) for i in range(300)} | {i: body_of(i, 5000) for i in range(1000, 1010)}
    expected[4] = b"replaced"
    return expected


def flip_value(store: BodyStore, db, key: bytes, pos: int, xor: int = 0x5A) -> None:
    """Flip one byte of a stored value through LMDB (what a bad disk sector does to a value)."""
    with store.env.begin(write=True) as txn:
        value = bytearray(txn.get(key, db=db))
        value[pos] ^= xor
        txn.put(key, bytes(value), db=db)


def segment_key(store: BodyStore, index: int = 0) -> bytes:
    return KEY.pack(store._segments[index].key)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "bodies"


def filled(path, n: int = 30, per_segment: int = 10) -> BodyStore:
    store = open_store(path)
    for first in range(1, n + 1, per_segment):
        store.commit([(i, body_of(i)) for i in range(first, first + per_segment)], ())
    return store


# ---------------------------------------------------------------------------- detection


def test_a_flipped_body_byte_is_detected_on_read_and_by_verify(path):
    """A body's byte flipped inside its segment: get_many leaves it out and reports it, the other
    bodies read intact, verify_body_store names it; counted once however often it is read."""
    store = filled(path)
    header = 16 * 10 + 16
    flip_value(store, store.segments_db, segment_key(store, 1), header + 3 * 100 + 7)  # message 14
    damaged: list[int] = []
    found = store.get_many(range(1, 31), damaged)
    assert damaged == [14] and 14 not in found
    assert all(found[i] == body_of(i) for i in found) and len(found) == 29
    store.get_many([14])
    assert store.damaged_total == 1 and store.damaged == {14}
    store.close()
    report = verify_body_store(str(path))
    assert [(d.where, d.what) for d in report] == [("segment 2, message 14", "checksum mismatch")]


def test_a_segment_value_gone_under_a_live_index_is_reported_damaged_never_returned(path):
    """The index (from the headers) lists a segment whose value LMDB no longer has: each of its
    live bodies read is reported damaged and left out; the other segments read intact.  (This was
    a TypeError caught on the read path; get_many now checks for the missing value.)"""
    store = filled(path)
    with store.env.begin(write=True) as txn:
        txn.delete(segment_key(store, 1), db=store.segments_db)  # messages 11-20
    damaged: list[int] = []
    found = store.get_many(range(1, 31), damaged)
    assert damaged == list(range(11, 21)) and sorted(found) == [*range(1, 11), *range(21, 31)]
    assert all(found[i] == body_of(i) for i in found)
    store.close()


def test_a_damaged_header_is_replaced_by_the_segments_copy(path):
    """The ``heads`` copy of a header fails its checksum at open: the segment's own copy is used
    (and written back), so no body is lost; verify reported it before."""
    store = filled(path)
    flip_value(store, store.heads_db, segment_key(store, 0), 8 + 8 * 3)  # an id in the header
    store.close()
    assert any("header" in d.what for d in verify_body_store(str(path)))
    store = open_store(path)
    assert [d.what for d in store.damage] == ["header: header checksum mismatch; replaced by the segment's copy"]
    assert store.get_many(range(1, 31)) == {i: body_of(i) for i in range(1, 31)}
    store.close()
    assert verify_body_store(str(path)) == []  # written back


def test_both_copies_of_a_header_damaged_drop_the_segment_its_bodies_go_missing(path):
    """Neither header copy verifies: the segment is dropped (never read through a header that
    cannot be trusted); its ids are *missing*, which a cluster node fetches at start."""
    store = filled(path)
    key = segment_key(store, 0)
    flip_value(store, store.heads_db, key, 5)
    flip_value(store, store.segments_db, key, 5)
    store.close()
    store = open_store(path)
    assert "segment dropped" in store.damage[0].what
    assert store.missing(range(1, 31)) == list(range(1, 11))
    assert store.get_many(range(1, 31)) == {i: body_of(i) for i in range(11, 31)}
    store.close()


def test_damaged_loose_value_and_dead_marks_are_detected(path):
    """A loose body (one re-put inside a segment's range) and a segment's dead marks carry their
    own checksums: a flipped loose byte makes the body damaged; flipped marks are reported at
    open and ignored (every body kept live -- a restart's sweep deletes what is not needed -- but
    one replaced by a loose copy, whose loose copy is the body: never the segment's older one)."""
    store = filled(path)
    store.delete_many([3, 4])
    store.put_many([(5, b"another body")])  # inside segment 1's range: loose
    flip_value(store, store.loose_db, KEY.pack(5), 6)
    flip_value(store, store.dead_db, segment_key(store, 0), 2)
    store.close()
    report = {(d.where, d.what) for d in verify_body_store(str(path))}
    assert ("loose message 5", "checksum mismatch") in report
    assert ("dead marks of segment 1", "checksum mismatch") in report
    store = open_store(path)
    assert any("dead marks" in d.where for d in store.damage)
    damaged: list[int] = []
    assert 5 not in store.get_many([3, 5], damaged) and damaged == [5]  # not the segment's old copy
    assert store.get(3) == body_of(3)  # kept live: its mark could not be trusted
    store.close()


def test_every_damaged_position_in_a_segment_is_detected_never_returned(tmp_path):
    """Table over every byte of a small segment (header, ids, offsets, checksums, bodies), in the
    ``segments`` copy and in the ``heads`` copy: after the flip and a reopen, each read returns
    the right body or nothing, never other bytes, and verify_body_store reports something."""
    clean = tmp_path / "clean"
    store = open_store(clean)
    items = [(i, body_of(i, 20 + i)) for i in (7, 8, 9)]
    store.commit(items, ())
    key = segment_key(store)
    with store.env.begin() as txn:
        segment_size = len(txn.get(key, db=store.segments_db))
        header_size = len(txn.get(key, db=store.heads_db))
    store.close()
    right = dict(items)
    cases = [("segments", pos) for pos in range(segment_size)] + [("heads", pos) for pos in range(header_size)]
    for db_name, pos in cases:
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        store = open_store(work)
        flip_value(store, store.segments_db if db_name == "segments" else store.heads_db, key, pos)
        store.close()
        assert verify_body_store(str(work)), (db_name, pos)
        store = open_store(work)
        got = store.get_many([7, 8, 9])
        assert all(right[i] == b for i, b in got.items()), (db_name, pos)
        if db_name == "heads":
            assert got == right, (db_name, pos)  # the segment's copy of the header stands in
        store.close()


def test_bytes_flipped_in_data_mdb_are_never_returned(tmp_path):
    """Flips straight into the file (seeded positions anywhere past LMDB's meta pages, in a store
    with B-tree pages of small values as well as overflow pages): whatever opening and reading
    make of it, no read returns bytes other than the body written under that id."""
    clean = tmp_path / "clean"
    expected = write_mixed_store(clean)
    detected = 0
    for seed in range(40):
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(clean, work)
        data = bytearray((work / "data.mdb").read_bytes())
        rng = random.Random(seed)
        positions = [rng.randrange(8192, len(data)) for _ in range(4)]
        for pos in positions:
            data[pos] ^= rng.randrange(1, 256)
        (work / "data.mdb").write_bytes(bytes(data))
        detected += bool(verify_body_store(str(work)))
        store = open_store(work)
        got = store.get_many(expected)
        wrong = [i for i, b in got.items() if b != expected[i]]
        assert not wrong, (seed, positions, wrong)
        store.put_many([(5000, b"after")])  # the store stays writable
        assert store.get(5000) == b"after"
        store.close()
    assert detected >= 30  # most flips land in bytes that matter (a few hit unused page space)


# ---------------------------------------------------------------------------- writes keep damage visible


def test_a_replay_of_the_same_body_repairs_a_damaged_copy(path):
    """A journal replay re-puts a body: an intact stored copy is kept (nothing written); a damaged
    one is replaced (the compare reads and verifies it)."""
    store = filled(path)
    flip_value(store, store.segments_db, segment_key(store, 0), 16 * 10 + 16 + 5)  # message 1
    assert store.put_many([(2, body_of(2))]) == 0
    assert store.put_many([(1, body_of(1))]) == 1
    assert store.get(1) == body_of(1) and not store.damaged
    store.close()
    assert verify_body_store(str(path)) == []


def test_compaction_keeps_a_damaged_body_detectable(path):
    """Compaction copies a damaged body with the checksum it was written with: still detected
    after the rewrite (not sealed under a fresh checksum)."""
    store = filled(path, n=10)
    flip_value(store, store.segments_db, segment_key(store, 0), 16 * 10 + 16 + 9 * 100 + 1)  # message 10
    store.delete_many(range(1, 9))
    assert store.compact() == 1
    damaged: list[int] = []
    assert store.get_many([9, 10], damaged) == {9: body_of(9)} and damaged == [10]
    store.close()
    assert [d.where for d in verify_body_store(str(path))] == ["segment 1, message 10"]


# ---------------------------------------------------------------------------- old format


def write_first_format(path, segments: list[list[tuple[int, bytes]]], loose: dict[int, bytes],
                       dead: dict[int, bytes]) -> None:
    """A store as the previous version wrote it: segments ``count, ids, offsets, bodies`` with no
    checksum, loose values that are the bodies, dead marks without checksum, no meta table."""
    os.makedirs(path, exist_ok=True)
    env = lmdb.open(str(path), map_size=1 << 26, max_dbs=4)
    dbs = {name: env.open_db(name) for name in (b"segments", b"heads", b"loose", b"dead")}
    with env.begin(write=True) as txn:
        for key, items in enumerate(segments, 1):
            offsets = array("I", [0])
            for _, body in items:
                offsets.append(offsets[-1] + len(body))
            header = struct.pack("<I", len(items)) + array("Q", [i for i, _ in items]).tobytes() + offsets.tobytes()
            txn.put(KEY.pack(key), header + b"".join(b for _, b in items), db=dbs[b"segments"])
            txn.put(KEY.pack(key), header, db=dbs[b"heads"])
        for msg_id, body in loose.items():
            txn.put(KEY.pack(msg_id), body, db=dbs[b"loose"])
        for key, marks in dead.items():
            txn.put(KEY.pack(key), marks, db=dbs[b"dead"])
    env.close()


def test_a_store_of_the_first_format_opens_and_is_given_checksums(path):
    """The previous format (no checksums) opens with the same bodies, dead marks and loose bodies;
    verify says it cannot be checked before, and finds nothing after the one-way upgrade; the
    upgrade resumes if interrupted (an upgraded segment is recognised by its magic)."""
    write_first_format(path, [[(i, body_of(i)) for i in range(1, 6)], [(i, body_of(i)) for i in range(10, 13)]],
                       loose={3: b"loose three"}, dead={1: b"\x01\x00\x00\x01\x01"})
    assert [d.where for d in verify_body_store(str(path))] == ["format"]
    store = open_store(path)
    assert store.upgraded == 2
    assert store.ids() == [1, 3, 4, 5, 10, 11, 12]  # 2 deleted; 3 replaced by its loose copy
    assert store.get_many([1, 2, 3, 4, 10]) == {1: body_of(1), 3: b"loose three", 4: body_of(4), 10: body_of(10)}
    with store.env.begin() as txn:
        assert txn.get(KEY.pack(1), db=store.segments_db)[:4] == MAGIC
    store.close()
    assert verify_body_store(str(path)) == []
    store = open_store(path)
    assert store.upgraded == 0 and store.get(12) == body_of(12)
    store.close()


# ---------------------------------------------------------------------------- repair and refusal


def peer_bodies(tmp_path, name: str, ids) -> Bodies:
    store = open_store(tmp_path / name)
    store.put_many([(i, body_of(i)) for i in ids])
    return Bodies(store, cache_bytes=1 << 20)


def repairer_from(*peers: Bodies, tamper: bool = False):
    """Asks ``peers`` through the real request/answer encoding (serve / fetch_intact)."""

    def ask_of(peer: Bodies):
        def ask(request: bytes) -> bytes:
            answer = serve(peer, request)
            if tamper:  # the bytes change after the member checksummed them (transit, memory)
                answer = answer.replace(body_of(1)[:16], b"X" * 16)
            return answer
        return ask

    def repair(ids: list[int]) -> dict[int, bytes]:
        return fetch_intact(ids, [ask_of(p) for p in peers], lambda i: None)

    return repair


def test_a_damaged_body_is_repaired_from_a_peer_while_the_read_waits(tmp_path):
    """A read (the cache's miss) that meets a damaged body fetches it from a member, writes it back
    and returns it: the delivery gets the intact body; counted damaged once and repaired once."""
    bodies = Bodies(filled(tmp_path / "here"), cache_bytes=1 << 20)
    flip_value(bodies.store, bodies.store.segments_db, segment_key(bodies.store), 16 * 10 + 16 + 1)  # message 1
    bodies.repairer = repairer_from(peer_bodies(tmp_path, "peer", range(1, 31)))
    assert bodies.for_send(1, lambda: [2, 3]) == body_of(1)
    assert bodies.damaged == 1 and bodies.stats.repaired == 1 and bodies.stats.refused == 0
    assert bodies.store.get(1) == body_of(1) and not bodies.store.damaged  # written back


def test_a_peer_copy_that_fails_its_checksum_is_not_used_the_next_member_is_asked(tmp_path):
    """The first member's answer is altered after it was checksummed: refused (FetchError inside
    fetch_intact), and the intact copy of the second member is the one written."""
    bodies = Bodies(filled(tmp_path / "here"), cache_bytes=1 << 20)
    flip_value(bodies.store, bodies.store.segments_db, segment_key(bodies.store), 16 * 10 + 16 + 1)
    peer = peer_bodies(tmp_path, "peer", range(1, 31))
    with pytest.raises(FetchError):
        decode_answer(encode_answer([(1, body_of(1))]).replace(body_of(1)[:16], b"X" * 16))
    tampered = repairer_from(peer, tamper=True)
    assert tampered([1]) == {}
    good = repairer_from(peer)

    def both(ids):
        return tampered(ids) or good(ids)

    bodies.repairer = both
    assert bodies.get(1) == body_of(1) and bodies.stats.repaired == 1


def test_a_member_with_a_damaged_copy_does_not_serve_it(tmp_path):
    """Serving a peer reads through the same verification: a member whose own copy is damaged
    leaves it out of its answer (the asker tries the next member)."""
    peer = peer_bodies(tmp_path, "peer", range(1, 11))
    flip_value(peer.store, peer.store.segments_db, segment_key(peer.store), 16 * 10 + 16 + 2)  # message 1
    assert [i for i, _ in decode_answer(serve(peer, b"\x92\x01\x93\x01\x02\x03"))] == [2, 3]
    assert peer.stats.repaired == 0  # the Raft thread never fetches


def test_with_no_intact_copy_the_delivery_is_refused_not_sent_and_counted(tmp_path, caplog):
    """One node (no repairer): a held delivery's read says None (dropped unsent, its message stays
    held), logged at ERROR with the message id and queue; a non-holding delivery is removed from
    the outputs instead of being sent damaged or empty."""
    bodies = Bodies(filled(tmp_path / "here"), cache_bytes=1 << 20)
    bodies.queue_name = {5: "orders"}.get
    flip_value(bodies.store, bodies.store.segments_db, segment_key(bodies.store), 16 * 10 + 16 + 1)  # message 1
    with caplog.at_level("ERROR"):
        assert bodies.for_send(1, None, qid=5) is None
    assert bodies.stats.refused == 1 and bodies.stats.gone == 0
    assert "message 1 in queue 'orders'" in caplog.text

    class Message:
        def __init__(self, msg_id):
            self.id = msg_id

    outputs = [("c1", OUT_DELIVER, 1, "tag", (5, 1, False, Message(1))),
               ("c1", OUT_DELIVER, 1, "tag", (5, 2, False, Message(2)))]
    fill_bodies(outputs, bodies)
    assert [out[4][3].id for out in outputs] == [2] and outputs[0][4][4] == body_of(2)
    assert bodies.stats.refused == 2


def test_after_a_failed_repair_reads_do_not_ask_members_again_at_once(tmp_path):
    """A repair that found nothing pauses further attempts from reads (the loop would wait at every
    read of a node whose members are down); the scrubber's attempts (wait=True) still go."""
    bodies = Bodies(filled(tmp_path / "here"), cache_bytes=1 << 20)
    calls = []

    def nobody(ids):
        calls.append(list(ids))
        return {}

    bodies.repairer = nobody
    flip_value(bodies.store, bodies.store.segments_db, segment_key(bodies.store), 16 * 10 + 16 + 1)
    assert bodies.get(1) is None and bodies.get(1) is None
    assert calls == [[1]]
    assert bodies.repair([1], wait=True) == {} and len(calls) == 2


# ---------------------------------------------------------------------------- scrubber


def test_the_scrubber_finds_damage_no_read_met_and_repairs_it(tmp_path):
    """Slices of at most ``slice_bytes`` over segments then loose bodies, a whole pass returning to
    the start; a damaged body in each is found and replaced from the peer."""
    bodies = Bodies(filled(tmp_path / "here", n=40), cache_bytes=1 << 20)
    store = bodies.store
    store.put_many([(5, body_of(5) + b"!")])  # loose (replaces 5)
    flip_value(store, store.segments_db, segment_key(store, 2), 16 * 10 + 16 + 4 * 100 + 50)  # message 25
    flip_value(store, store.loose_db, KEY.pack(5), 10)
    peer = peer_bodies(tmp_path, "peer", range(1, 41))
    peer.store.put_many([(5, body_of(5) + b"!")])
    bodies.repairer = repairer_from(peer)
    scrubber = BodyScrubber(bodies, bytes_per_second=1 << 20, slice_bytes=1000)
    position, slices = (0, 0), 0
    while True:
        position, read = scrubber.step(position)
        slices += 1
        assert read <= 1000 + 100
        if position == (0, 0):
            break
    assert slices >= 4
    assert scrubber.found == 2 and bodies.stats.repaired == 2
    assert store.get_many([5, 25]) == {5: body_of(5) + b"!", 25: body_of(25)}
    assert bodies.damaged == 2 and not store.damaged


def test_the_scrubber_retries_a_repair_no_member_could_answer(tmp_path, monkeypatch):
    """No member had an intact copy when the damage was found (the one that has it was down or
    behind): the scrubber asks again every REPAIR_RETRY_SECONDS while it waits between passes,
    and the body is replaced once a member has it."""
    import raftmq.store.disk.body_scrub as body_scrub

    monkeypatch.setattr(body_scrub, "REPAIR_RETRY_SECONDS", 0.01)
    bodies = Bodies(filled(tmp_path / "here", n=20), cache_bytes=1 << 20)
    store = bodies.store
    flip_value(store, store.segments_db, segment_key(store, 1), 16 * 10 + 16 + 4 * 100 + 50)  # message 15
    peer = peer_bodies(tmp_path, "peer", range(1, 21))
    asked: list[list[int]] = []
    answer = repairer_from(peer)

    def down_at_first(ids):
        asked.append(list(ids))
        return {} if len(asked) == 1 else answer(ids)

    bodies.repairer = down_at_first
    scrubber = BodyScrubber(bodies, bytes_per_second=1 << 20)
    position = (0, 0)
    while True:
        position, _read = scrubber.step(position)
        if position == (0, 0):
            break
    assert store.damaged == {15} and asked == [[15]]  # found; no member answered
    scrubber._wait(0.2)
    assert not store.damaged and store.get_many([15]) == {15: body_of(15)}
    assert asked[1] == [15]
