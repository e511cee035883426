"""What a member answers the others about itself, and how the asker treats stale answers
(ops/http/members.py, issue 35).  The cluster path over real Raft ports is
tests/cluster/test_http_members.py; here the two halves alone, on a real state machine.

- The handler (pysyncobj's tick thread in a node) never builds a view: the first request after a
  quiet spell is answered "nothing yet" and makes the loop build one; later requests get the view
  the loop built, with its age; with nobody asking for WANTED_FOR seconds the loop stops building.
- A request asking for a digest makes the loop add this node's state digest (node/status.py).
- The asker asks again when the answer is stale, and gives up with ConnectionError when a member
  never has a view.
"""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest

from raftmq.ops.http import members
from raftmq.store.core.machine import StateMachine


def _broker() -> SimpleNamespace:
    config = SimpleNamespace(node_id="n1", host="127.0.0.1", port=5672, secret=lambda: "s")
    log = SimpleNamespace(raft_status=lambda: None, is_leader=True)
    return SimpleNamespace(config=config, log=log, endpoints={}, machine=StateMachine(), members={},
                           bodies=SimpleNamespace(peek=lambda ids: {}))


def _settle(loop: asyncio.AbstractEventLoop, seconds: float = 0.05) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


def test_the_handler_answers_what_the_loop_built_and_the_loop_stops_when_nobody_asks(monkeypatch):
    monkeypatch.setattr(members, "REFRESH", 0.02)
    loop = asyncio.new_event_loop()
    try:
        views = members.MemberViews(_broker())
        views._loop = loop  # (start() registers the handler on a cluster's Raft port)
        assert json.loads(views._answer(b'{"digest": false}')) == {"age": None, "view": None}
        _settle(loop)
        answer = json.loads(views._answer(b'{"digest": false}'))
        assert answer["view"]["node"] == "raftmq@n1" and answer["view"]["connections"] == []
        assert answer["view"]["raft"]["role"] == "single" and 0 <= answer["age"] < 1.0
        assert "digest" not in answer["view"]
        views._asked = time.monotonic() - members.WANTED_FOR - 1  # nobody asked for a while
        _settle(loop)
        assert views._blob is None and not views._building
    finally:
        loop.close()


def test_a_digest_request_makes_the_loop_add_the_state_digest():
    loop = asyncio.new_event_loop()
    try:
        views = members.MemberViews(_broker())
        views._loop = loop
        views._answer(b'{"digest": true}')
        _settle(loop)
        view = json.loads(views._answer(b'{"digest": true}'))["view"]
        made = view["digest"]
        assert len(made["digest"]) == 64 and made["applied_index"] == 0 and made["age"] >= 0
    finally:
        loop.close()


def test_the_asker_asks_again_when_the_answer_is_stale(monkeypatch):
    monkeypatch.setattr(members, "ASK_AGAIN_AFTER", 0.01)
    answers = iter([b'{"age": null, "view": null}', b'{"age": 12.5, "view": {"node": "old"}}',
                    b'{"age": 0.2, "view": {"node": "fresh"}}'])
    monkeypatch.setattr(members, "ask", lambda secret, address, name, timeout: lambda request: next(answers))
    view = members.MemberViews(_broker())._ask("127.0.0.1:1", digest=False)
    assert view == {"node": "fresh", "age": 0.2}


def test_a_member_that_never_has_a_view_is_not_answered(monkeypatch):
    monkeypatch.setattr(members, "ASK_AGAIN_AFTER", 0.01)
    monkeypatch.setattr(members, "ASK_TIMEOUT", 0.05)
    monkeypatch.setattr(members, "ask", lambda *args: lambda request: b'{"age": null, "view": null}')
    with pytest.raises(ConnectionError):
        members.MemberViews(_broker())._ask("127.0.0.1:1", digest=False)
