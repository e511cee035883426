"""node/group_bodies.py: which of a queue group's held deliveries cross the link with their bodies,
the carry credit, and the main process's reads of the rest (issue 34; docs/design.md "Bodies across
the link").

Checked here without processes (tests/integration/test_groups_bodies.py runs the real thing): a
worker carries bodies in its memory while the connection's credit lasts and writes the others'
bodies to its store before they leave as references; non-held deliveries are not touched; credit
comes back only for connections that hold little or are gone; the main process tags references,
reads their bodies verified from the store (read ahead, taken once), and drops a gone or damaged one
unsent, asking the worker to repair a damaged one.
"""

from __future__ import annotations

from raftmq.node.group_bodies import CREDIT, REPAIR, Carrier, GroupBodies, carry_bytes
from raftmq.store.core.commands import OUT_DELIVER, OUT_REPLY, OUT_TRANSFER
from raftmq.store.core.model import Message
from raftmq.store.disk.bodies import Bodies, tag_id, untag_id
from raftmq.store.disk.body_store import BodyStore
from tests.unit.store.test_body_store_integrity import KEY, flip_value


def message(msg_id: int, size: int = 100) -> Message:
    return Message(msg_id, "", "q", b"", size, False, 0, 0)


def deliver(conn: str, msg_id: int, body: bytes | None = None) -> tuple:
    item = (7, msg_id, False, message(msg_id))
    return (conn, OUT_DELIVER, 1, "ctag", item if body is None else (*item, body))


def transfer(conn: str, msg_id: int) -> tuple:
    return (conn, OUT_TRANSFER, 1, "dest", (msg_id, 7, msg_id, False, message(msg_id)))


def body(msg_id: int) -> bytes:
    return bytes([msg_id % 256]) * 100


def test_tags_name_a_group_and_an_id_and_never_a_positive_id():
    for group in (1, 2, 255):
        for msg_id in (0, 1, 12345, 1 << 40):
            tagged = tag_id(group, msg_id)
            assert tagged < 0 and untag_id(tagged) == (group, msg_id)


def test_a_worker_carries_within_the_credit_and_spills_the_rest_before_they_leave(tmp_path):
    """Five held deliveries of 100-byte bodies still waiting in write-behind, credit 250: two carry
    their bodies, three leave as references whose bodies are written to the store first (with the
    older pending ones); a delivery that already has its body and a reply are not touched; a 1.0/0-10
    transfer is treated as a delivery; credit handed back lets the next one carry."""
    bodies = Bodies(BodyStore(str(tmp_path / "b"), map_size=1 << 28), 1 << 20)
    bodies.put([(i, body(i)) for i in range(1, 10)])
    carrier = Carrier(bodies, limit=250)
    outputs = [deliver("A", i) for i in range(1, 6)] + [deliver("A", 6, b"given"), ("A", OUT_REPLY, 3, None, 1),
                                                       transfer("B", 7)]
    refs, carried = carrier.prepare(outputs)
    assert refs == [2, 3, 4]
    assert carried == {"A": 200, "B": 100}
    assert outputs[0][4][4] == body(1) and outputs[1][4][4] == body(2)
    assert all(len(outputs[i][4]) == 4 for i in refs)
    assert outputs[5][4][4] == b"given" and len(outputs[7][4]) == 6 and outputs[7][4][5] == body(7)
    # the references' bodies (and the older pending ones) are in the store now, no longer pending
    assert bodies.store.get_many(range(1, 10)) == {i: body(i) for i in range(1, 6)}
    assert bodies.pending_body(3) is None and bodies.pending_body(6) == body(6)
    assert carrier.spilled == 5 and carrier.referenced == 3 and carrier.carried == 3
    carrier.returned({"A": 200, "B": 100})
    assert carrier.used == {}
    more = [deliver("A", 8)]
    assert carrier.prepare(more) == ([], {"A": 100})
    carrier.returned({"A": 100})
    # within the credit a body only on disk is read by the worker and carried; a gone one leaves
    # as a reference and gives its credit back
    bodies.drop([8, 9])
    disk = [deliver("A", 4), deliver("A", 9)]
    assert carrier.prepare(disk) == ([1], {"A": 100})
    assert disk[0][4][4] == body(4) and len(disk[1][4]) == 4
    assert carrier.used == {"A": 100}
    bodies.store.close()


class Endpoint:
    def __init__(self, held: int) -> None:
        self.held = held

    def held_bytes(self) -> int:
        return self.held


def test_credit_comes_back_for_connections_that_hold_little_or_are_gone():
    endpoints = {"A": Endpoint(0), "B": Endpoint(1 << 20)}
    sent: list[tuple[int, tuple]] = []
    host = GroupBodies({}, endpoints.get, lambda g, item: sent.append((g, item)), carry=carry_bytes(1 << 20))
    assert host.return_below == 1 << 20  # (the connection's write_buffer_high: not paused)
    endpoints["B"].held = 1 << 20
    host.received(1, [], [], {"A": 100, "B": 200, "C": 300})
    assert host.settle() is True  # B is stalled: held back, look again
    assert sent == [(1, (CREDIT, {"A": 100, "C": 300}))]
    sent.clear()
    endpoints["B"].held = 0
    assert host.settle() is False
    assert sent == [(1, (CREDIT, {"B": 200}))]


def test_the_main_process_reads_references_from_the_store_verified_once_each(tmp_path):
    """References get tagged ids; their bodies are read from the group's store (the next ones of the
    same group read ahead, each taken when sent); a gone message is dropped unsent (counted); a
    damaged body is refused (counted) and the worker is asked to repair it."""
    path = tmp_path / "g1bodies"
    store = BodyStore(str(path), map_size=1 << 28)
    store.commit([(i, body(i)) for i in range(1, 11)], ())
    flip_value(store, store.segments_db, KEY.pack(store._segments[0].key), -3)  # id 10's last byte
    store.close()
    sent: list[tuple[int, tuple]] = []
    host = GroupBodies({1: (str(path), None)}, {}.get, lambda g, item: sent.append((g, item)))
    outputs = [deliver("A", i) for i in (1, 2, 3, 10, 11)]
    host.received(1, outputs, [0, 1, 2, 3, 4], {})
    tagged = [out[4][3].id for out in outputs]
    assert tagged == [tag_id(1, i) for i in (1, 2, 3, 10, 11)]

    assert host.for_send(tagged[0], lambda: tagged[1:3], 7) == body(1)
    assert host.held_bytes == 200  # 2 and 3 read ahead
    assert host.for_send(tagged[1], None, 7) == body(2)
    assert host.for_send(tagged[2], None, 7) == body(3)
    assert host.held_bytes == 0  # taken when sent
    assert host.for_send(tagged[4], None, 7) is None and host.gone == 1
    assert host.for_send(tagged[3], None, 7) is None and host.refused == 1
    assert sent == [(1, (REPAIR, [10]))]
    assert host.for_send(tag_id(2, 1), None, 7) is None  # a group without a store: nothing
    host.close()


def test_a_damaged_body_is_replaced_by_a_members_copy_before_it_is_sent(tmp_path):
    """In a cluster the main process asks the group's members for an intact copy while the delivery
    waits (as one group's read does), checked against the checksum the worker's verified header
    records; the body goes out intact and the worker is told to replace its own copy."""
    path = tmp_path / "g1bodies"
    store = BodyStore(str(path), map_size=1 << 28)
    store.commit([(i, body(i)) for i in range(1, 11)], ())
    written_crc = store.expected_crc(10)
    flip_value(store, store.segments_db, KEY.pack(store._segments[0].key), -3)
    store.close()
    asked = []

    def members(ids, expected):  # the members' answer, as body_fetch.fetch_intact returns it
        asked.append((ids, expected(ids[0])))
        return {i: body(i) for i in ids}

    sent: list[tuple[int, tuple]] = []
    host = GroupBodies({1: (str(path), None)}, {}.get, lambda g, item: sent.append((g, item)), repairers={1: members})
    assert host.for_send(tag_id(1, 10), None, 7) == body(10)
    assert asked == [([10], written_crc)]
    assert host.repaired == 1 and host.refused == 0
    assert sent == [(1, (REPAIR, [10]))]
    host.close()
