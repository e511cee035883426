"""Message bodies on disk (issue 18): the LMDB body store, the bounded cache with read-ahead, the
write-behind/deferred-delete rules of ``Bodies``, and a follower's catch-up after a snapshot.

Every test uses real LMDB environments in a temporary directory (no mocks)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftmq.store.disk.bodies import Bodies, BodyEffects, DictBodies
from raftmq.store.disk.body_cache import BodyCache
from raftmq.store.disk.body_fetch import (
    FetchError,
    catch_up,
    decode_answer,
    decode_request,
    encode_answer,
    encode_request,
    plan,
    serve,
)
from raftmq.store.disk.body_store import BodyStore


def body_of(msg_id: int, size: int = 100) -> bytes:
    return (msg_id.to_bytes(8, "big") * (size // 8 + 1))[:size]


@pytest.fixture
def store(tmp_path):
    s = BodyStore(str(tmp_path / "bodies"), map_size=1 << 28)
    yield s
    s.close()


# ---------------------------------------------------------------------------- BodyStore


def test_store_put_get_delete_by_id(store):
    assert store.put_many([(1, b"one"), (2, b"two"), (3, b"")]) == 3
    assert store.get(2) == b"two"
    assert store.get(3) == b""  # an empty body is a body, not an absence
    assert store.get(4) is None
    assert store.get_many([3, 1, 9]) == {1: b"one", 3: b""}
    assert store.delete_many([2, 9]) == 1
    assert store.ids() == [1, 3]
    assert store.missing([1, 2, 3, 4]) == [2, 4]
    assert len(store) == 2


def test_store_keys_in_id_order(store):
    """Big-endian keys: LMDB's order is the ids' order, so reading a queue in order reads keys in order."""
    store.put_many([(i, b"x") for i in (300, 2, 1 << 40, 70000)])
    assert store.ids() == [2, 300, 70000, 1 << 40]


def test_store_survives_reopen(tmp_path):
    path = str(tmp_path / "b")
    s = BodyStore(path, map_size=1 << 24)
    s.commit([(5, b"five"), (6, b"six")], [6])
    s.sync()
    s.close()
    s = BodyStore(path, map_size=1 << 24)
    assert s.ids() == [5] and s.get(5) == b"five"
    s.close()


def test_store_flushes_in_the_background_as_bytes_are_written(tmp_path):
    """Every ``background_flush_bytes`` written starts an fdatasync in a thread of its own (one at a
    time), so a checkpoint's sync has only the last few bytes left; reads are unaffected."""
    path = str(tmp_path / "b")
    s = BodyStore(path, map_size=1 << 26, background_flush_bytes=64 << 10)
    body = b"b" * 4096
    for batch in range(8):  # 8 x 32 KiB: a flush every two batches, unless one is still running
        s.commit([(batch * 8 + i, body) for i in range(8)], [])
        if s._flushing is not None:
            s._flushing.join()
    assert s.background_flushes == 4
    assert s._unflushed == 0
    s.commit([(100, body)], [])
    assert s._unflushed > 0
    s.sync()
    assert s._unflushed == 0
    s.close()
    s = BodyStore(path, map_size=1 << 26)
    assert len(s.ids()) == 65 and s.get(63) == body
    s.close()


# ---------------------------------------------------------------------------- BodyCache


class CountingLoader:
    def __init__(self, store: BodyStore) -> None:
        self.store, self.calls = store, 0

    def __call__(self, ids):
        self.calls += 1
        return self.store.get_many(ids)


def test_cache_hit_miss_and_bound(store):
    store.put_many([(i, body_of(i, 100)) for i in range(10)])
    cache = BodyCache(350, store.get_many)
    for i in range(4):
        assert cache.get(i) == body_of(i, 100)
    assert cache.misses == 4 and cache.bytes == 300 and len(cache) == 3  # 0 evicted (LRU)
    assert 0 not in cache and cache.evicted == 1
    assert cache.get(3) == body_of(3, 100) and cache.hits == 1
    assert cache.get(99) is None and 99 not in cache


def test_cache_admit_never_evicts(store):
    cache = BodyCache(250, store.get_many)
    assert cache.admit(1, b"a" * 100) and cache.admit(2, b"b" * 100)
    assert not cache.admit(3, b"c" * 100)  # no room: not cached, nothing evicted
    assert cache.bytes == 200 and 1 in cache and 2 in cache and cache.evicted == 0


def test_read_ahead_loads_in_one_call_and_protects_its_run(store):
    """A consumer's next ids come in with one store read; read-ahead never evicts what it just
    brought in (reading further would push out what the consumer needs first)."""
    store.put_many([(i, body_of(i, 100)) for i in range(20)])
    loader = CountingLoader(store)
    cache = BodyCache(500, loader)
    cache.get(100)  # a miss that finds nothing: one call
    assert cache.read_ahead(range(0, 10)) == 5  # room for 5: the first five, in order
    assert loader.calls == 2
    assert [i in cache for i in range(10)] == [True] * 5 + [False] * 5
    for i in range(5):
        cache.get(i)
    assert cache.hits == 5
    # the next window evicts the consumed (older) ones
    assert cache.read_ahead(range(5, 10)) == 5 and all(i in cache for i in range(5, 10))


def test_body_larger_than_cache_is_served_not_cached(store):
    store.put_many([(1, b"z" * 1000)])
    cache = BodyCache(100, store.get_many)
    assert cache.get(1) == b"z" * 1000
    assert cache.bytes == 0 and len(cache) == 0
    assert cache.read_ahead([1]) == 0 and not cache.admit(1, b"z" * 1000)


OPS = st.lists(
    st.tuples(st.sampled_from(["get", "admit", "ahead", "discard"]), st.integers(0, 40), st.integers(1, 8)),
    max_size=200,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(0, 3000), sizes=st.lists(st.integers(0, 700), min_size=41, max_size=41), ops=OPS)
def test_cache_bound_holds_under_any_sequence(tmp_path_factory, limit, sizes, ops):
    """Whatever the sequence of gets, admits, read-aheads and discards: the cached bytes never
    exceed the limit, the byte count equals the bodies held, and every get returns the stored body."""
    path = str(tmp_path_factory.mktemp("cache"))
    s = BodyStore(path, map_size=1 << 24)
    try:
        bodies = {i: body_of(i, sizes[i]) for i in range(41) if i % 7 != 3}  # some ids have no body
        s.put_many(bodies.items())
        cache = BodyCache(limit, s.get_many)
        for op, msg_id, n in ops:
            if op == "get":
                assert cache.get(msg_id) == bodies.get(msg_id)
            elif op == "admit" and msg_id in bodies:
                cache.admit(msg_id, bodies[msg_id])
            elif op == "ahead":
                cache.read_ahead(range(msg_id, msg_id + n))
            elif op == "discard":
                cache.discard(msg_id)
            assert cache.bytes <= limit
            assert cache.bytes == sum(len(b) for b in cache._entries.values())
            assert all(cache._entries[i] == bodies[i] for i in cache._entries)
    finally:
        s.close()


def test_a_batch_is_one_segment_and_a_4k_body_takes_4k_of_disk(store):
    """One value per write: a 4 KiB body no longer takes two overflow pages of its own."""
    before = store.disk_bytes()
    store.put_many([(i, body_of(i, 4096)) for i in range(1, 1001)])
    per_body = (store.disk_bytes() - before) / 1000
    assert 4096 <= per_body < 4300, per_body
    assert store.get_many([5, 999, 2000]) == {5: body_of(5, 4096), 999: body_of(999, 4096)}


def test_an_id_inside_a_segments_range_is_stored_loose(store):
    store.put_many([(1, b"a"), (2, b"b"), (4, b"d")])
    assert store.put_many([(3, b"c"), (1, b"a"), (9, b"i")]) == 2  # the same body again: kept as it is
    # Another body for a stored id replaces it: what the last apply made of the id counts.
    assert store.put_many([(2, b"again")]) == 1
    assert store.ids() == [1, 2, 3, 4, 9]
    assert store.get_many(range(10)) == {1: b"a", 2: b"again", 3: b"c", 4: b"d", 9: b"i"}
    assert store.put_many([(2, b"third")]) == 1 and store.get(2) == b"third" and len(store) == 5
    assert store.delete_many([3, 9, 7]) == 2 and store.ids() == [1, 2, 4]


def test_compaction_rewrites_a_mostly_dead_segment_and_reopen_keeps_it(tmp_path):
    path = str(tmp_path / "b")
    s = BodyStore(path, map_size=1 << 26)
    s.put_many([(i, body_of(i, 1000)) for i in range(100)])
    s.delete_many(range(0, 100, 2))  # half dead: kept as it is
    assert s.compact() == 0
    s.delete_many([i for i in range(1, 100, 2) if i % 5])  # 10 of 100 left: rewritten
    assert s.compact() == 1
    s.close()
    s = BodyStore(path, map_size=1 << 26)
    assert s.ids() == [5, 15, 25, 35, 45, 55, 65, 75, 85, 95]
    assert all(s.get(i) == body_of(i, 1000) for i in s.ids())
    s.delete_many(s.ids())
    assert len(s) == 0 and s.get_many(range(100)) == {}
    s.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(st.integers(0, 300), max_size=40)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 300), max_size=40)),
    st.tuples(st.just("compact"), st.just([])),
    st.tuples(st.just("reopen"), st.just([])),
), max_size=25))
def test_the_store_holds_what_a_dict_would(tmp_path_factory, ops):
    """Any sequence of puts (repeats and ids inside earlier segments' ranges included), deletes,
    compactions and reopenings leaves exactly the bodies a dict would hold."""
    path = str(tmp_path_factory.mktemp("model") / "b")
    s = BodyStore(path, map_size=1 << 26)
    model: dict[int, bytes] = {}
    try:
        for op, ids in ops:
            if op == "put":
                s.put_many([(i, body_of(i, 10 + i)) for i in ids])
                for i in ids:
                    model.setdefault(i, body_of(i, 10 + i))
            elif op == "delete":
                s.delete_many(ids)
                for i in ids:
                    model.pop(i, None)
            elif op == "compact":
                s.compact()
            else:
                s.close()
                s = BodyStore(path, map_size=1 << 26)
            assert s.ids() == sorted(model)
        assert s.get_many(range(301)) == model
        assert s.missing(range(301)) == [i for i in range(301) if i not in model]
    finally:
        s.close()


# ---------------------------------------------------------------------------- Bodies


def test_acked_while_pending_is_never_written(store):
    b = Bodies(store, cache_bytes=1 << 20, write_behind_bytes=1 << 20)
    b.carry_out(BodyEffects(puts=[(1, b"a" * 10), (2, b"b" * 10)]))
    b.carry_out(BodyEffects(deletes=[1]))
    assert b.get(1) is None and b.get(2) == b"b" * 10
    b.checkpoint()
    assert store.ids() == [2] and b.stats.cancelled == 1 and b.stats.written == 1


def test_write_behind_spills_oldest_past_its_bound(store):
    b = Bodies(store, cache_bytes=250, write_behind_bytes=400)
    b.carry_out(BodyEffects(puts=[(i, body_of(i, 100)) for i in range(6)]))
    # 600 pending > 400: the oldest written until 200 remain
    assert store.ids() == [0, 1, 2, 3] and b.pending_bytes == 200
    assert b.cache.bytes == 0  # written, not cached: the cache is for what consumers read next
    assert b.held_bytes == 200
    assert all(b.get(i) == body_of(i, 100) for i in range(6))


def test_deletes_wait_for_the_checkpoint_after_next(store):
    """A body deleted after checkpoint k stays on disk until checkpoint k+1: a restart from
    snapshot k, and a follower fetching for snapshot k, still find it."""
    b = Bodies(store, cache_bytes=1 << 20)
    b.carry_out(BodyEffects(puts=[(1, b"x"), (2, b"y")]))
    b.checkpoint()  # k: both on disk
    b.carry_out(BodyEffects(deletes=[1]))
    assert store.ids() == [1, 2]
    b.checkpoint()  # k+1: the delete from before it is not applied yet ...
    assert store.ids() == [1, 2]
    b.checkpoint()  # ... at the next one it is
    assert store.ids() == [2] and b.stats.deleted == 1


def test_restart_sweep_deletes_unreferenced(tmp_path):
    path = str(tmp_path / "b")
    s = BodyStore(path, map_size=1 << 24)
    b = Bodies(s, cache_bytes=1 << 20)
    b.carry_out(BodyEffects(puts=[(i, b"m") for i in range(5)]))
    b.checkpoint()
    b.carry_out(BodyEffects(deletes=[0, 3]))  # deletes still waiting when the node stops
    s.close()
    s = BodyStore(path, map_size=1 << 24)
    b = Bodies(s, cache_bytes=1 << 20)
    assert b.sweep(live={1, 2, 4}) == 2
    assert s.ids() == [1, 2, 4]
    s.close()


def test_a_dead_letter_copy_shares_its_originals_body(store):
    """A put may name another message's id (a dead-letter copy): stored again under its own id, it
    outlives the original."""
    b = Bodies(store, cache_bytes=1 << 20, write_behind_bytes=1 << 20)
    b.put([(1, b"original")])
    b.put([(2, 1)])
    b.drop([1])
    assert b.get(1) is None and b.get(2) == b"original"
    b.put([(3, 99)])  # a source this node never had: counted, logged, not stored
    assert b.get(3) is None and b.stats.lost == 1


def test_dict_bodies_shares_a_copys_body_and_stores_nothing_for_an_unknown_source():
    """DictBodies (a machine carrying its own effects out) as Bodies above: a dead-letter copy takes
    its original's body; a copy of a body never held is not stored at all (it stored None under the
    copy's id, so that ``bodies`` claimed a body it did not have; found by mypy: dict[int, bytes])."""
    b = DictBodies()
    b.put([(1, b"original"), (2, 1)])
    b.drop([1])
    assert b.bodies == {2: b"original"}
    b.put([(3, 99)])
    assert b.bodies == {2: b"original"} and b.get(3) is None


def test_a_single_node_deletes_at_once_and_reads_persistent_bodies_from_its_fallback(store):
    """No snapshots on a single node: nothing waits for a checkpoint.  Its persistent bodies after a
    restart are in the durable store's message records (the fallback)."""
    durable = {7: b"persistent"}
    b = Bodies(store, cache_bytes=1 << 20, write_behind_bytes=10,
               fallback=lambda ids: {i: durable[i] for i in ids if i in durable}, defer_deletes=False)
    b.put([(i, body_of(i, 20)) for i in range(3)])  # past the write-behind bound: written
    assert store.ids() == [0, 1, 2]
    b.drop(range(3))
    b.put([(5, body_of(5, 20))])  # the next write carries the deletes
    assert 0 not in store.ids() and b.stats.deleted == 3
    assert b.get(7) == b"persistent" and b.get(8) is None


def test_after_install_keeps_what_the_snapshot_holds_and_reports_what_is_missing(store):
    b = Bodies(store, cache_bytes=1 << 20, write_behind_bytes=1 << 20)
    b.put([(1, b"one"), (2, b"two")])
    b.checkpoint()
    b.put([(3, b"three"), (4, b"four")])  # pending
    missing = b.after_install({2: 3, 4: 4, 5: 4}, legacy=[(5, b"five")])
    assert missing == {}  # 2 on disk, 4 kept from pending, 5 from the old snapshot format
    assert store.ids() == [2, 4, 5] and b.pending_bytes == 0
    assert b.after_install({2: 3, 6: 10}) == {6: 10}  # 6 must be fetched


def test_fill_bodies_gives_each_output_its_body_reading_the_disk_once(store):
    from raftmq.store.core.commands import OK, OUT_DELIVER, OUT_REPLY, GotMessage, Ok
    from raftmq.store.core.model import Message
    from raftmq.store.disk.bodies import fill_bodies

    b = Bodies(store, cache_bytes=1 << 20, write_behind_bytes=0)
    b.put([(i, body_of(i)) for i in range(1, 6)])  # all written (no write-behind room), cached
    b.cache.clear()
    msgs = {i: Message(i, "", "q", b"", 100, True, 0, 0) for i in range(1, 6)}
    outputs = [("c", OUT_DELIVER, 1, "tag", (9, i, False, msgs[i])) for i in (1, 2)]
    outputs.append(("c", OUT_REPLY, 5, Ok(OK, GotMessage(9, 3, False, msgs[3], 0)), 1))
    fill_bodies(outputs, b, upcoming=lambda qid: [3, 4] if qid == 9 else [])
    assert [o[4][4] for o in outputs[:2]] == [body_of(1), body_of(2)]
    assert outputs[2][3].value.body == body_of(3)
    # 1 and 2 missed the cache: read with the queue's next ids (3, 4) in one store read.
    assert b.cache.loaded == 4 and b.cache.misses == 0 and 4 in b.cache


# ---------------------------------------------------------------------------- follower catch-up


def test_fill_bodies_leaves_deliveries_whose_consumer_holds_them_to_be_read_when_sent(store):
    """A manual-ack consumer assigned a backlog on disk: its deliveries get no body at assignment
    (only the first READ_AHEAD of a queue's misses are read ahead, into the bounded cache); an
    auto-ack consumer's get theirs at once (their bodies are deleted after the batch)."""
    from raftmq.store.core.commands import OUT_DELIVER, OUT_TRANSFER
    from raftmq.store.core.model import Message
    from raftmq.store.disk.bodies import READ_AHEAD, body_to_send, fill_bodies

    n = 3 * READ_AHEAD
    b = Bodies(store, cache_bytes=1 << 20, write_behind_bytes=0)
    b.put([(i, body_of(i)) for i in range(n + 2)])  # all written (no write-behind room)
    b.cache.clear()
    msgs = {i: Message(i, "", "q", b"", 100, True, 0, 0) for i in range(n + 2)}
    outputs = [("c", OUT_DELIVER, 1, "manual", (9, i, False, msgs[i])) for i in range(n)]
    outputs.append(("c", OUT_DELIVER, 2, "auto", (8, n, False, msgs[n])))
    outputs.append(("c", OUT_TRANSFER, 3, "accept", (7, 6, n + 1, False, msgs[n + 1])))
    holds = {("c", 1, "manual"): True, ("c", 2, "auto"): False, ("c", 3, "accept"): True}
    asked = []

    def holds_of(conn, channel, tag):
        asked.append(tag)
        return holds[conn, channel, tag]

    fill_bodies(outputs, b, upcoming=lambda qid: [], holds=holds_of)
    assert asked == ["manual", "auto", "accept"]  # one question per run of one consumer's deliveries
    assert all(len(o[4]) == 4 for o in outputs[:n])  # no body: read when sent
    assert outputs[n][4][4] == body_of(n)  # auto-ack: its body now
    assert len(outputs[n + 1][4]) == 5  # a transfer to be accepted: none either
    assert b.cache.loaded == READ_AHEAD + 2  # the backlog's first READ_AHEAD read ahead, not all of it
    # Sent later: a miss reads the ids the front end sends next in one go.
    last = outputs[n - 1][4]
    following = [o[4][3].id for o in outputs[READ_AHEAD + 1:2 * READ_AHEAD]]
    loaded = b.cache.loaded
    assert body_to_send(b, msgs[READ_AHEAD], outputs[READ_AHEAD][4], 4, lambda: following) == body_of(READ_AHEAD)
    assert b.cache.loaded == loaded + READ_AHEAD and (2 * READ_AHEAD - 1) in b.cache
    assert body_to_send(b, last[3], last, 4) == body_of(n - 1)
    # A message gone meanwhile (its queue deleted): None, and the front end does not send it.
    b.drop([n - 1])
    b.checkpoint()
    b.checkpoint()  # (a cluster's deletes leave the disk at the checkpoint after next)
    assert body_to_send(b, last[3], last, 4) is None and b.stats.gone == 1


def test_request_and_answer_round_trip_and_refuse_garbage():
    assert decode_request(encode_request([3, 1])) == [3, 1]
    assert decode_answer(encode_answer([(1, b"a"), (2, b"")])) == [(1, b"a"), (2, b"")]
    for bad in (b"\xc1", encode_answer([]), b"\x92\x01\x91\xa1x"):
        with pytest.raises(FetchError):
            decode_request(bad)
    with pytest.raises(FetchError):
        decode_answer(encode_request([1]))


def test_plan_bounds_each_answer():
    needed = {i: 300 for i in range(10)} | {100: 5000}
    requests = plan(needed, answer_bytes=1000)
    assert [len(r) for r in requests] == [3, 3, 3, 1, 1]
    assert requests[-1] == [100]  # a body above the bound goes alone
    assert sorted(i for r in requests for i in r) == sorted(needed)


def test_follower_catches_up_from_two_members(tmp_path):
    """A follower that installed a snapshot lacking bodies gets them from the members, in bounded
    answers, identical byte for byte; what the first member lacks comes from the second."""
    stores = [BodyStore(str(tmp_path / n), map_size=1 << 26) for n in ("leader", "other", "follower")]
    try:
        leader, other, follower = (Bodies(s, cache_bytes=1 << 20) for s in stores)
        live = {i: body_of(i, 50 + i * 7) for i in range(1, 200)}
        leader.carry_out(BodyEffects(puts=[(i, b) for i, b in live.items() if i != 150]))
        leader.checkpoint()
        other.carry_out(BodyEffects(puts=[(150, live[150])]))
        follower.carry_out(BodyEffects(puts=[(i, live[i]) for i in range(1, 20)]))  # had these
        asked: list[int] = []

        def ask_leader(request: bytes) -> bytes:
            asked.append(len(decode_request(request)))
            return serve(leader, request, answer_bytes=2000)

        report = catch_up(follower, {i: len(b) for i, b in live.items()},
                          [ask_leader, lambda r: serve(other, r)], answer_bytes=2000)
        assert report.still_missing == [] and report.fetched == 180
        assert all(follower.get(i) == b for i, b in live.items())
        assert max(asked) < 180  # in several bounded requests
        assert leader.cache.hits + leader.cache.misses == 0  # serving did not use the leader's cache
    finally:
        for s in stores:
            s.close()


def test_a_member_that_does_not_answer_is_skipped(tmp_path):
    stores = [BodyStore(str(tmp_path / n), map_size=1 << 24) for n in ("a", "b")]
    try:
        a, b = (Bodies(s, cache_bytes=1 << 20) for s in stores)
        a.carry_out(BodyEffects(puts=[(i, b"x" * 100) for i in range(10)]))
        calls = []

        def down(request: bytes) -> bytes:
            calls.append(request)
            raise FetchError("member 127.0.0.1:1 did not answer")

        report = catch_up(b, {i: 100 for i in range(10)}, [down, lambda r: serve(a, r)], answer_bytes=300)
        assert report.still_missing == [] and report.fetched == 10
        assert len(calls) == 1 and len(report.errors) == 1  # given up after its first failure
    finally:
        for s in stores:
            s.close()


def test_catch_up_refuses_a_body_of_the_wrong_size(tmp_path):
    stores = [BodyStore(str(tmp_path / n), map_size=1 << 24) for n in ("a", "b")]
    try:
        a, b = (Bodies(s, cache_bytes=1 << 20) for s in stores)
        a.carry_out(BodyEffects(puts=[(7, b"seven")]))
        with pytest.raises(FetchError):
            catch_up(b, {7: 4}, [lambda r: serve(a, r)])
        report = catch_up(b, {8: 3}, [lambda r: serve(a, r)])
        assert report.still_missing == [8]
    finally:
        for s in stores:
            s.close()


def test_store_files_stay_in_their_directory(tmp_path):
    s = BodyStore(str(tmp_path / "only"), map_size=1 << 22)
    s.put_many([(1, b"x")])
    s.close()
    assert sorted(os.listdir(tmp_path)) == ["only"]
