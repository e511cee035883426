"""Frozen runs of queued messages (store/core/frozen.py, issue 18): deep in a queue, entries are held as
columns and thawed when reached; nothing a client or a replica can see changes."""

from __future__ import annotations

import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from raftmq.store.applier import StoredMachine
from raftmq.store.core import model
from raftmq.store.core.commands import ChannelOpen, Op, Publish, QueueDeclare, VhostAdd
from raftmq.store.core.frozen import FrozenRun
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.snapshot import digest, export_model, import_model, live_bodies
from tests.unit.store.test_machine import Driver, declare

NOW = 1_700_000_000_000_000


def frozen_runs(queue) -> int:
    return sum(1 for level in queue.ready._levels for item in level if item.__class__ is FrozenRun)


def filled(freeze_batch: int, count: int = 40, **args) -> Driver:
    d = Driver(StoredMachine())
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    declare(d, "deep", args=args)
    for i in range(count):
        d.publish("", "deep", b"m%d" % i, priority=i % 3)
    return d


def test_a_deep_queue_freezes_and_delivers_everything_in_order(freeze_batch):
    d = filled(freeze_batch)
    queue = d.machine.vhosts["/"].queues["deep"]
    if freeze_batch == 2:
        assert frozen_runs(queue) > 0
    assert sorted(live_bodies(d.machine)) == list(range(1, 41))
    got = [d.ok(Op.GET, "/", "deep", True)[0].body for _ in range(40)]
    assert got == [b"m%d" % i for i in range(40)]
    assert len(queue.ready) == 0 and d.machine.message_bytes == 0
    assert d.machine.own_bodies.bodies == {}  # every body released once


def test_a_snapshot_keeps_runs_frozen_and_the_digest_sees_through_them(freeze_batch):
    d = filled(freeze_batch)
    before = digest(d.machine)
    other = StoredMachine()
    import_model(other, export_model(d.machine))
    assert digest(other) == before
    queue = other.vhosts["/"].queues["deep"]
    assert frozen_runs(queue) == frozen_runs(d.machine.vhosts["/"].queues["deep"])
    other.own_bodies.put([(i, d.machine.own_bodies.get(i)) for i in live_bodies(other)])
    o = Driver(other)  # (its channel came with the snapshot)
    assert [o.ok(Op.GET, "/", "deep", True)[0].body for _ in range(40)] == [b"m%d" % i for i in range(40)]


def test_priorities_expiry_purge_and_delete_with_frozen_entries(freeze_batch):
    d = filled(freeze_batch, **{"x-max-priority": 2, "x-message-ttl": 1000})
    queue = d.machine.vhosts["/"].queues["deep"]
    first = d.ok(Op.GET, "/", "deep", True)[0]
    assert first.body == b"m2"  # highest priority first (2, 5, 8...)
    d.now += 2_000_000  # every remaining message expires; the frozen ones too
    assert d.ok(Op.GET, "/", "deep", True)[0] is None
    assert len(queue.ready) == 0 and d.machine.own_bodies.bodies == {}
    d2 = filled(freeze_batch)
    assert d2.ok(Op.QUEUE_PURGE, "/", "deep")[0] == 40
    d3 = filled(freeze_batch)
    assert d3.ok(Op.QUEUE_DELETE, "/", "deep", False, False)[0] == 40
    for dd in (d2, d3):
        assert dd.machine.message_bytes == 0 and dd.machine.own_bodies.bodies == {}


def test_a_queued_message_costs_a_fraction_of_its_objects_once_frozen(monkeypatch):
    """tracemalloc, 60,000 queued 4 KB messages in one queue, publish by publish (bodies are outside
    the model either way)."""
    def per_message(batch: int) -> float:
        monkeypatch.setattr(model, "FREEZE_BATCH", batch)
        machine = StoredMachine()
        machine.apply(NOW, [VhostAdd(None, None, "/"), ChannelOpen("c", 1, 1),
                            QueueDeclare("c", 2, 1, "/", "q", False, True, False, False, {})])
        body = b"x" * 4096
        tracemalloc.start()
        start = tracemalloc.get_traced_memory()[0]
        for first in range(0, 60_000, 50):
            machine.apply(NOW + first, [Publish("c", None, 1, "/", "", "q", False, b"\x10\x00\x02", body, True, 0,
                                                None) for _ in range(50)], replies=False)
        used = tracemalloc.get_traced_memory()[0] - start
        tracemalloc.stop()
        return used / 60_000

    objects, frozen = per_message(1 << 30), per_message(4096)
    # (60,000 in one queue: the newest ~16,000-20,000 stay objects, below the freezing threshold)
    assert objects > 250 and frozen < 0.45 * objects, (objects, frozen)


def test_a_run_in_a_snapshot_takes_a_few_bytes_a_message(freeze_batch):
    """Sequences and ids go up by one, sizes, flags and expiries are the same: such columns are
    written as [first, step, length] (publish times, which differ, as bytes)."""
    import msgpack

    from raftmq.store.core.model import Entry, Message

    entries = [Entry(100 + i, Message(500 + i, "ex", "rk", b"\x00\x00", 4096, True, 0, NOW + i * 7, 0, 0, 1),
                     None, 0, True) for i in range(1000)]
    run = FrozenRun.freeze(entries, 0)
    row = run.to_row()
    assert len(msgpack.packb(row, use_bin_type=True)) < 1000 * 10
    back = FrozenRun.from_row(msgpack.unpackb(msgpack.packb(row, use_bin_type=True), raw=False, use_list=False))
    assert [(e.seq, e.message.id, e.message.size, e.message.published_at, e.expires_at, e.durable)
            for e in back.thaw()] == [(e.seq, e.message.id, 4096, e.message.published_at, None, True)
                                      for e in entries]


@given(st.lists(st.integers(0, 255), min_size=1, max_size=40), st.sampled_from("qB"))
def test_a_column_is_written_as_a_progression_exactly_when_it_is_one(values, typecode):
    """The quick checks of ``_progression`` (last value first, constant columns by their bytes)
    decide as the plain definition does; a run written and read back has the same columns."""
    from array import array

    from raftmq.store.core.frozen import _progression

    column = array(typecode, values)
    step = values[1] - values[0] if len(values) > 1 else 0
    plain = step >= 0 and values == [values[0] + step * i for i in range(len(values))]
    assert _progression(column) == ([values[0], step, len(values)] if plain else None)


# ---------------------------------------------------------------- holders counted before freezing
# A ready list freezes only entries whose message nothing else holds (``live == 1``).  That count
# is only right once every holder is counted; the tests below each froze a message that another
# queue still held (FREEZE_BATCH 2: a list freezes from 9 entries on), on the code before the fix.


def _fanout_pair(d: Driver, durable: bool = False) -> None:
    d.apply(VhostAdd(None, None, "/"))
    d.ok(Op.CHANNEL_OPEN)
    declare(d, "q1", durable=durable)
    declare(d, "q2", durable=durable)
    d.ok(Op.EXCHANGE_DECLARE, "/", "fan", "fanout", False, durable, False, False, {})
    d.ok(Op.QUEUE_BIND, "/", "q1", "fan", "", {})
    d.ok(Op.QUEUE_BIND, "/", "q2", "fan", "", {})


def _depths(freeze_batch: int) -> range:
    """Messages queued before the shared one: every phase of the freezing cycle (a freeze every
    2 appends) when runs are of 2; one depth when the list never freezes."""
    return range(4, 14) if freeze_batch == 2 else range(10, 11)


def test_a_fanout_message_is_not_frozen_while_it_is_routed(freeze_batch):
    """A fanout message appended to its first queue as that queue's list freezes: its ``live`` is
    1 then (the publish's own hold; a queue's is counted after its append).  Frozen with it, it
    was thawed as a message of its own, and consuming the first queue deleted the body the second
    still held.  Now: the bodies kept are the live ones, and the second queue delivers its body."""
    for depth in _depths(freeze_batch):
        d = Driver(StoredMachine())
        _fanout_pair(d)
        for i in range(depth):
            d.publish("", "q1", b"x%d" % i)
        d.publish("fan", "", b"shared")
        got = [d.ok(Op.GET, "/", "q1", True)[0].body for _ in range(depth + 1)]
        assert got == [b"x%d" % i for i in range(depth)] + [b"shared"]
        assert set(d.machine.own_bodies.bodies) == set(live_bodies(d.machine)) != set(), depth
        assert d.ok(Op.GET, "/", "q2", True)[0].body == b"shared", depth
        assert d.machine.own_bodies.bodies == {} and d.machine.message_bytes == 0


def test_a_durable_message_frozen_in_its_queue_leaves_no_lmdb_record(freeze_batch, tmp_path):
    """A durable entry's ``refs`` is counted after its append too: frozen then, it was thawed with
    refs 0, went to -1 when acked, and its LMDB message record was never deleted.  Now every
    record goes with the last entry."""
    for depth in _depths(freeze_batch):
        path = str(tmp_path / f"lmdb{depth}")
        store = DurableStore(path)
        d = Driver(StoredMachine(store))
        d.apply(VhostAdd(None, None, "/"))
        d.ok(Op.CHANNEL_OPEN)
        declare(d, "q", durable=True)
        for i in range(depth):
            d.publish("", "q", b"x%d" % i, persistent=True)
        assert [d.ok(Op.GET, "/", "q", True)[0].body for _ in range(depth)] == [b"x%d" % i for i in range(depth)]
        store.close()
        again = DurableStore(path)
        assert again.load().messages == {}, depth
        again.close()


def test_a_restart_counts_every_queue_s_holders_before_it_freezes(freeze_batch, tmp_path):
    """A single node's restart reads entries queue by queue: a persistent fanout message deep in
    the first queue looked held by that queue alone until the second queue's entries were read,
    and was frozen.  Consuming the first queue then deleted its LMDB record (and body) while the
    second still held it: after another restart the second queue had lost a confirmed message."""
    for depth in _depths(freeze_batch):
        path = str(tmp_path / f"lmdb{depth}")
        store = DurableStore(path)
        d = Driver(StoredMachine(store))
        _fanout_pair(d, durable=True)
        for i in range(depth):
            d.publish("", "q1", b"x%d" % i, persistent=True)
        d.publish("fan", "", b"shared", persistent=True)
        for i in range(3):  # the shared entry is not the newest when q1 is read back
            d.publish("", "q1", b"y%d" % i, persistent=True)
        store.close()

        store = DurableStore(path)
        d2 = Driver(StoredMachine(store))
        d2.ok(Op.CHANNEL_OPEN)
        got = [d2.ok(Op.GET, "/", "q1", True)[0].body for _ in range(depth + 4)]
        assert b"shared" in got and d2.ok(Op.GET, "/", "q1", True)[0] is None
        held = d2.machine.vhosts["/"].queues["q2"].ready.peek().message  # q2's hold, the only one left
        assert (held.live, held.refs) == (1, 1), depth
        store.close()

        store = DurableStore(path)
        d3 = Driver(StoredMachine(store))
        d3.ok(Op.CHANNEL_OPEN)
        assert d3.ok(Op.GET, "/", "q2", True)[0].body == b"shared", depth
        store.close()


def test_a_run_among_the_newest_items_is_not_frozen_again(freeze_batch):
    """0-10 message.acquire (``remove_seq``) can take the entries appended since a level last
    froze, leaving a FrozenRun among the newest items the next freeze takes: ``FrozenRun.freeze``
    read its ``message`` (an AttributeError in apply, on every node).  Now that batch stays as it
    is, and the list still holds and delivers every entry in order."""
    from raftmq.store.core.model import Entry, Message, ReadyList

    def entry(seq: int) -> Entry:
        return Entry(seq, Message(seq, "", "k", b"\x00\x00", 1, False, 0, NOW, 0, 0, 1), None, 0, False)

    ready = ReadyList()
    seqs = list(range(1, 4 * freeze_batch + 5))
    for seq in seqs:
        ready.append(entry(seq))
    tail = ready._levels[0]
    while tail[-1].__class__ is not FrozenRun and freeze_batch == 2:
        seqs.remove(tail[-1].seq)
        assert ready.remove_seq(tail[-1].seq) is not None
    for seq in range(100, 100 + 2 * freeze_batch + 1):
        seqs.append(seq)
        ready.append(entry(seq))
    assert len(ready) == len(seqs)
    assert [e.seq for e in ready.drain()] == seqs
