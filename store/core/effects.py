"""What applying a batch asks the node to do: the state machine's only way to act on the world.

``StateMachine.apply`` changes the in-memory model and returns an ``Effects`` value; it performs no
I/O, reads no clock and draws no random number (the proposer stamped the batch's time).  The node
carries the effects out: the outputs go to the connections they name, the single-node log commits
the persistence operations to LMDB (and holds the outputs until an fsync when they promised
durability), the audit writer appends the events.  A cluster node records no persistence (its
durable state is the Raft journal and snapshots) and no events unless it keeps a history, so it
never builds what it would throw away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .commands import Output

# Persistence operations, in order: (PUT, table, key, value), (DELETE, table, key) and
# (DELETE_PREFIX, table, prefix) for every key starting with ``prefix`` (a queue's entries).
# (PUT_WITH_BODY, table, key, record, body index, message id): a record whose body the node fills
# in at commit (the model holds no bodies, issue 18), packed then.
PUT, DELETE, DELETE_PREFIX, PUT_WITH_BODY = 0, 1, 2, 3


@dataclass(slots=True)
class Effects:
    """The effects of one applied batch."""

    outputs: list[Output] = field(default_factory=list)  # (conn, OUT_*, ...) records: store/core/commands.py
    persistence: list[tuple] = field(default_factory=list)  # LMDB operations, single node only
    sync_needed: bool = False  # a persistence operation promised durability (a confirm waits on it)
    events: list[list] = field(default_factory=list)  # audit events (store/disk/history.py), if recorded
    index: int | None = None  # the Raft index of the batch (None for a single node)
    # The event chain's step (store/core/events.py), with ``events``: (previous head, head) for
    # the history's chain table.
    chain: tuple[bytes, bytes] | None = None
    # Message bodies (store/disk/bodies.py), in apply order.  Puts: (message id, body bytes, or the id
    # of the message whose body a dead-letter copy shares), for messages a queue or hold kept.
    # Deletes: ids whose last holder went.  The node stores the puts before it sends the
    # outputs (deliveries read them) and drops the deleted ones after.
    body_puts: list[tuple[int, bytes | int]] = field(default_factory=list)
    body_deletes: list[int] = field(default_factory=list)
