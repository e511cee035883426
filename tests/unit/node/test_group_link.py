"""The link between a node's processes (node/group_link.py, issue 34): commands travel as the Raft
log packs them (msgpack) and come out typed, nested ones too; other items are pickled; the order of
items holds across the two kinds of frame."""

from __future__ import annotations

import asyncio
import socket

from raftmq.node.group_link import GroupLink
from raftmq.node.groups import plain_replies, typed_replies
from raftmq.store.core.commands import (
    ERR,
    OK,
    OUT_REPLY,
    ROUTED,
    DeclaredQueue,
    MetaApply,
    Ok,
    Publish,
    QueueDeclare,
    Refused,
    TxCommit,
)


def test_commands_and_other_items_arrive_typed_and_in_order():
    publish = Publish("n1.b.1", 7, 1, "/", "", "q", False, b"\x80\x00", b"body", True, None, None, 0)
    declare = QueueDeclare("n1.b.1", 8, 1, "/", "q", False, True, False, False, {"x-queue-group": 2})
    nested = MetaApply(None, None, 3, declare, (5, 2))
    tx = TxCommit("n1.b.1", 9, 1, [publish, publish._replace(token=None)])
    sent = [("c", publish, True, 4), ("report",), ("c", nested, False, 0), ("c", tx, False, 0),
            ("o", [("n1.b.1", OUT_REPLY, 7, Ok(OK, ROUTED), 1)])]

    async def run() -> list:
        a, b = socket.socketpair()
        got: list = []
        done = asyncio.Event()

        def on_items(items: list) -> None:
            got.extend(items)
            if len(got) >= len(sent):
                done.set()

        loop = asyncio.get_running_loop()
        _t1, left = await loop.connect_accepted_socket(lambda: GroupLink(lambda items: None, lambda: None), a)
        _t2, _right = await loop.connect_accepted_socket(lambda: GroupLink(on_items, lambda: None), b)
        for item in sent:
            if item[0] == "c":
                left.send_command(*item[1:])
            else:
                left.send(item)
        await asyncio.wait_for(done.wait(), 5)
        _t1.close()
        _t2.close()
        return got

    got = asyncio.run(run())
    assert got == sent
    assert type(got[0][1]) is Publish and type(got[2][1].command) is QueueDeclare
    assert got[2][1].placed == (5, 2) and type(got[3][1].operations[1]) is Publish


def test_replies_cross_as_plain_tuples_and_come_back_typed():
    outputs = [("c1", OUT_REPLY, 1, Ok(OK, DeclaredQueue("q", 1, 0)), 1), ("c1", OUT_REPLY, 2, Refused(ERR, 404, "no"), 1),
               ("c1", 1, 3, "tag", (1, 2, False, None))]
    plain = plain_replies(outputs)
    assert type(plain[0][3]) is tuple and type(plain[1][3]) is tuple
    back = typed_replies(plain)
    assert back == outputs and type(back[0][3]) is Ok and type(back[1][3]) is Refused
