"""store/ready_peek.next_ids: the ids read-ahead asks for are exactly what the queue delivers next."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.store.core.model import Entry, Message, ReadyList
from raftmq.store.core.ready_peek import next_ids

ACTIONS = st.lists(st.tuples(st.sampled_from(["append", "pop", "requeue"]), st.integers(0, 3)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(max_priority=st.integers(0, 3), actions=ACTIONS, n=st.integers(0, 40))
def test_next_ids_is_the_pop_order(max_priority, actions, n):
    """Appends (any priority), pops and requeues of popped entries in any order: the first ``n``
    ids ``next_ids`` gives are the ids the next ``n`` pops return, and the list is left unchanged."""
    ready = ReadyList(max_priority)
    taken: list[Entry] = []
    seq = 0
    for action, priority in actions:
        if action == "append":
            seq += 1
            message = Message(seq * 10, "", "q", b"", b"", False, priority, 0)
            ready.append(Entry(seq, message, None, min(priority, max_priority), False))
        elif action == "pop":
            entry = ready.pop()
            if entry is not None:
                taken.append(entry)
        elif taken:
            ready.requeue(taken.pop(priority % len(taken)))
    before = len(ready)
    peeked = next_ids(ready, n)
    assert len(ready) == before
    clone = copy.deepcopy(ready)
    popped = []
    for _ in range(n):
        entry = clone.pop()
        if entry is None:
            break
        popped.append(entry.message.id)
    assert peeked == popped
