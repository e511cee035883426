"""The next message ids a queue will deliver, without taking them: what body read-ahead asks for.

``Bodies.read_ahead`` (store/disk/bodies.py) wants the ids of the next few messages a consumer of a
queue will be given, in that order, so that their bodies come from disk in one read before the
deliveries need them.  This walks a ``ReadyList`` (store/core/model.py) in its delivery order --
highest priority first; within a priority, requeued and fresh entries merged by sequence, as
``ReadyList.pop`` takes them -- reading only, outside apply.  It reads ReadyList's private
lists; when the model is reworked this belongs on ReadyList itself.
"""

from __future__ import annotations

import heapq
from itertools import islice

from .model import ReadyList


def next_ids(ready: ReadyList, n: int) -> list[int]:
    """Message ids of the next ``n`` entries ``ready.pop()`` would return, in that order."""
    out: list[int] = []
    for level in range(len(ready._levels) - 1, -1, -1):
        if len(out) >= n:
            break
        want = n - len(out)
        fresh = islice(ready.fresh_seq_ids(level), want)  # (seq, id), frozen runs not thawed
        returned = [(seq, entry.message.id) for seq, entry in
                    heapq.nsmallest(want, ready._returned[level], key=lambda item: item[0])]
        merged = heapq.merge(fresh, returned, key=lambda item: item[0])
        out.extend(msg_id for _, msg_id in islice(merged, want))
    return out
