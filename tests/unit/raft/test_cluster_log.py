"""ClusterLog's group commit: when a batch is proposed while another is in flight.

The replica is replaced by a recorder of proposals (this is the batching policy alone; the cluster
tests run it over real Raft), and committed entries are fed back the way the tick thread does.
"""

from __future__ import annotations

import asyncio

from raftmq.raft.cluster import ClusterLog
from raftmq.raft.replica import ENTRY
from raftmq.store.applier import Applier
from raftmq.store.core.commands import Ack, Op, Publish, decode_batch, encode_batch
from raftmq.store.core.machine import StateMachine


class RecordedProposals:
    is_leader = True
    leader_address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.batches: list[tuple[int, list]] = []  # (seq, commands)

    def propose(self, now: int, origin: str, seq: int, blob: bytes, callback) -> None:
        self.batches.append((seq, decode_batch(blob)))


def make_log(tmp_path, loop: asyncio.AbstractEventLoop, **options) -> tuple[ClusterLog, RecordedProposals]:
    log = ClusterLog(Applier(StateMachine()), lambda outputs: None, origin="n1.boot", self_address="127.0.0.1:1",
                     partners=[], data_dir=str(tmp_path), secret="s", **options)
    log._loop = loop
    log._schedule_drain = loop.call_soon_threadsafe  # (what start() sets with the tick thread)
    log.replica = recorder = RecordedProposals()
    return log, recorder


def publish(body: bytes) -> list:
    return Publish("n1.boot.1", None, 1, "/", "", "q", False, b"\x00\x00", body, False, 0, None)


def commit(log: ClusterLog, recorder: RecordedProposals, index: int, seq: int) -> None:
    blob = encode_batch(next(c for s, c in recorder.batches if s == seq))
    log._from_raft((ENTRY, index, 1, log.origin, seq, memoryview(blob)))
    log._wake()  # the end of the tick


def settle(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(asyncio.sleep(0))


def test_small_batches_wait_for_the_one_in_flight_and_large_ones_are_pipelined(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        # (urgent_in_flight=1: no second small batch in flight, see the urgent tests below)
        log, recorder = make_log(tmp_path, loop, pipeline_min_bytes=4096, max_in_flight=3, urgent_in_flight=1)
        log.submit(publish(b"a"))
        settle(loop)
        assert [len(c) for _, c in recorder.batches] == [1]
        # Small commands while that batch is in flight accumulate into the next one.
        for _ in range(5):
            log.submit(publish(b"b"))
            settle(loop)
        assert len(recorder.batches) == 1
        # Once the next batch carries pipeline_min_bytes it goes without waiting for the commit.
        log.submit(publish(b"c" * 4096))
        settle(loop)
        assert [len(c) for _, c in recorder.batches] == [1, 6]
        # Up to max_in_flight batches: a third large one goes, a fourth waits.
        log.submit(publish(b"d" * 4096))
        settle(loop)
        log.submit(publish(b"e" * 4096))
        settle(loop)
        assert len(recorder.batches) == 3
        # The first commit frees a slot: the waiting command goes at once.
        commit(log, recorder, 1, 1)
        settle(loop)
        assert len(recorder.batches) == 4 and recorder.batches[-1][1][0].body == b"e" * 4096
        # With nothing pending, a later small command goes alone after the others commit.
        for index, seq in ((2, 2), (3, 3), (4, 4)):
            commit(log, recorder, index, seq)
        settle(loop)
        log.submit(publish(b"f"))
        settle(loop)
        assert len(recorder.batches) == 5 and len(recorder.batches[-1][1]) == 1
    finally:
        loop.close()


def test_a_small_batch_goes_as_soon_as_the_one_in_flight_is_applied(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        log, recorder = make_log(tmp_path, loop, urgent_in_flight=1)
        log.submit(publish(b"a"))
        settle(loop)
        log.submit(publish(b"b"))
        log.submit(publish(b"c"))
        settle(loop)
        assert len(recorder.batches) == 1
        commit(log, recorder, 1, 1)
        settle(loop)
        assert [len(c) for _, c in recorder.batches] == [1, 2]
    finally:
        loop.close()


def ack(refs: list) -> list:
    return Ack("n1.boot.1", None, 1, refs)


def test_deferrable_commands_wait_for_company_and_any_other_command_ends_the_wait(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        log, recorder = make_log(tmp_path, loop, defer_seconds=5.0)
        log.submit(ack([[1, 1]]), deferrable=True)
        log.submit(ack([[1, 2]]), deferrable=True)
        settle(loop)
        assert recorder.batches == []  # only deferrable commands: they wait
        log.submit(publish(b"p"))
        settle(loop)
        # The publish goes at once and takes the acks along, in submission order.
        assert [[c.op for c in batch] for _, batch in recorder.batches] == [[Op.ACK, Op.ACK, Op.PUBLISH]]
        assert recorder.batches[0][1][1].refs == [[1, 2]]
    finally:
        loop.close()


def test_deferrable_commands_alone_go_after_the_delay(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        log, recorder = make_log(tmp_path, loop, defer_seconds=0.02)
        log.submit(ack([[1, 1]]), deferrable=True)
        settle(loop)
        assert recorder.batches == []
        loop.run_until_complete(asyncio.sleep(0.1))
        assert [len(batch) for _, batch in recorder.batches] == [1]
        # The wait is over with the batch: the next deferrable command waits again.
        commit(log, recorder, 1, 1)
        log.submit(ack([[1, 2]]), deferrable=True)
        settle(loop)
        assert len(recorder.batches) == 1
        loop.run_until_complete(asyncio.sleep(0.1))
        assert len(recorder.batches) == 2
    finally:
        loop.close()


def test_deferrable_commands_worth_a_batch_do_not_wait(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        log, recorder = make_log(tmp_path, loop, defer_seconds=5.0, pipeline_min_bytes=4096)
        log.submit(publish(b"a" * 1000), deferrable=True)
        settle(loop)
        assert recorder.batches == []  # a pipelining publisher's publish may wait for company
        for _ in range(3):
            log.submit(publish(b"b" * 1000), deferrable=True)
        settle(loop)
        # Four kilobytes pending: as big as a batch worth pipelining, so waiting gains nothing.
        assert [len(batch) for _, batch in recorder.batches] == [4]
    finally:
        loop.close()


def test_an_urgent_small_batch_does_not_wait_for_one_in_flight_but_a_third_does(tmp_path):
    """Issue 30: a lone client's publish waited a whole commit behind a batch it had no part in
    (another client's publish, a consumer's settlement).  Up to ``urgent_in_flight`` small batches
    with a command someone waits for are in flight; the next waits as before, and deferrable
    commands alone still wait for the one in flight."""
    loop = asyncio.new_event_loop()
    try:
        log, recorder = make_log(tmp_path, loop, urgent_in_flight=2, defer_seconds=5.0)
        log.submit(publish(b"a"))
        settle(loop)
        log.submit(publish(b"b"))
        settle(loop)
        assert [len(c) for _, c in recorder.batches] == [1, 1]  # the second went at once
        log.submit(publish(b"c"))
        log.submit(publish(b"d"))
        settle(loop)
        assert len(recorder.batches) == 2  # two in flight: these wait, together
        commit(log, recorder, 1, 1)
        settle(loop)
        assert [len(c) for _, c in recorder.batches] == [1, 1, 2]
        commit(log, recorder, 2, 2)
        commit(log, recorder, 3, 3)
        settle(loop)
        log.submit(publish(b"e"))
        settle(loop)
        log.submit(ack([[1, 1]]), deferrable=True)
        settle(loop)
        assert len(recorder.batches) == 4  # one in flight, and only a deferrable command pending
    finally:
        loop.close()


def test_a_follower_forwards_without_a_reply_and_proposes_again_at_a_leader_change(tmp_path):
    """On a follower that knows its leader a batch is proposed without a callback (pysyncobj's
    leader then sends no apply_command_response); a leader change proposes every batch in flight
    again, with the same id (applied once, store/sessions)."""
    loop = asyncio.new_event_loop()
    try:
        log, recorder = make_log(tmp_path, loop, urgent_in_flight=2)
        callbacks: list = []
        recorder.is_leader = False
        recorder.propose = lambda now, origin, seq, blob, callback: (
            recorder.batches.append((seq, decode_batch(blob))), callbacks.append(callback))
        log.submit(publish(b"a"))
        settle(loop)
        log.submit(publish(b"b"))
        settle(loop)
        assert callbacks == [None, None]
        commit(log, recorder, 1, 1)
        settle(loop)
        log._leader_changed()
        assert [seq for seq, _ in recorder.batches] == [1, 2, 2]  # only the one still in flight
        # With no leader known, the callback stays (pysyncobj reports the failure locally).
        recorder.leader_address = None
        log._leader_changed()
        assert callbacks[-1] is not None
    finally:
        loop.close()
