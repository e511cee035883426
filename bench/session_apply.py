"""Apply cost of an AMQP 0-10 session's traffic with one group (issue 34, session 20: sessions in queue
groups must leave one group's cost as it was).

In process, no sockets, no Raft, no store: a 0-10 session (``SESSION_ATTACH``) with one subscription
of unlimited credit on a queue; each batch is 200 ``SESSION_COMMAND(PUBLISH)`` (with tokens, as the
front end requests them), each delivered to the subscription at apply (a transfer numbered by the
session), then one ``SESSION_COMMAND(MESSAGE_SETTLE accept)`` of the 200 transfers and one
``SESSION_KNOWN_COMPLETED``.  Batches are decoded from their log encoding, applied and their
outputs given bodies, as bench/apply_deliver.py does for 0-9-1.  Prints CPU µs per message (median
and best of rounds).

Runs against any checkout since the store split; to compare old and new in alternating rounds::

    for i in 1 2 3; do for w in /work/main .; do (cd $w && .venv/bin/python bench/session_apply.py); done; done
"""

from __future__ import annotations

import argparse
import statistics
import time

from raftmq.store.core.commands import (
    ChannelOpen,
    MessageFlow,
    MessageSettle,
    MessageSubscribe,
    Publish,
    QueueDeclare,
    SessionAttach,
    SessionCommand,
    SessionKnownCompleted,
    VhostAdd,
    decode_batch,
    encode_batch,
)
from raftmq.store.core.machine import StateMachine
from raftmq.store.disk.bodies import DictBodies, fill_bodies

NOW = 1_700_000_000_000_000
CONN = "n1.boot.1"
BATCH = 200
UNLIMITED = 0xFFFFFFFF


def machine(group: int = 0, groups: int = 1) -> StateMachine:
    """One group's machine: with ``groups`` > 1, group ``group`` of them, the queue placed in group 1
    (a stub elsewhere) -- what each group applies of the session is then its part alone."""
    m = StateMachine()
    m.group = group
    setup: list = [VhostAdd(None, None, "/"), ChannelOpen(CONN, None, 2)]
    arguments: dict = {}
    if groups > 1:
        from raftmq.store.core.commands import GroupsSet

        m.forwarding = group != 0  # (as a forwarded GroupsSet: no metadata outbox in the queue groups)
        m.apply(NOW, [GroupsSet(None, None, groups)])
        m.forwarding = False
        arguments = {"x-queue-group": 1}
    m.apply(NOW, setup + [QueueDeclare(CONN, None, 2, "/", "q", False, True, False, False, arguments),
                          SessionAttach(CONN, 1, 1, "/", "guest", b"bench", False)])
    inner = [MessageSubscribe(None, None, None, "/", "q", "d", False, False, {}),
             MessageFlow(None, None, None, "d", 0, UNLIMITED), MessageFlow(None, None, None, "d", 1, UNLIMITED)]
    m.apply(NOW, [SessionCommand(CONN, 2 + i, 1, i, cmd) for i, cmd in enumerate(inner)])
    return m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batches", type=int, default=25, help="batches of 200 publishes per round")
    parser.add_argument("--groups", type=int, default=1,
                        help="with more than one (this branch only): every group's machine applies every "
                             "session command, the queue in group 1; CPU summed over the groups")
    args = parser.parse_args()
    props = b"\x10\x00\x02"
    machines = [machine(g, args.groups) for g in range(args.groups)] if args.groups > 1 else [machine()]
    owner = machines[1 if args.groups > 1 else 0]
    bodies = DictBodies()
    session = owner.sessions[next(iter(owner.sessions))]
    command_id, token = 3, 10
    times = []
    for _r in range(args.rounds):
        blobs = []
        for _b in range(args.batches):
            batch: list = []
            for _i in range(BATCH):
                batch.append(SessionCommand(CONN, token, 1, command_id, Publish(
                    None, None, None, "/", "", "q", False, props, b"x" * 256, True, 0, None, 2)))
                command_id += 1
                token += 1
            blobs.append(encode_batch(batch))
        started = time.process_time()
        for blob in blobs:
            for m in machines:
                effects = m.apply(NOW, decode_batch(blob), replies=True)
                bodies.put(effects.body_puts)
                fill_bodies(effects.outputs, bodies)
                bodies.drop(effects.body_deletes)
            ranges = [[lo, hi] for lo, hi in _ranges(sorted(session.transfers))]
            settle = encode_batch([SessionCommand(CONN, token, 1, command_id, MessageSettle(None, None, None, ranges, 0)),
                                   SessionKnownCompleted(CONN, None, 1, [[command_id - BATCH, command_id]])])
            command_id += 1
            token += 1
            for m in machines:
                effects = m.apply(NOW, decode_batch(settle), replies=True)
                bodies.drop(effects.body_deletes)
        times.append((time.process_time() - started) / (len(blobs) * BATCH) * 1e6)
        assert not session.transfers and len(owner.vhosts["/"].queues["q"].ready) == 0
    print(f"0-10 session publish+transfer+accept apply, {args.groups} group(s), µs/message: "
          f"{statistics.median(times):.2f} (best {min(times):.2f})")


def _ranges(ids: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in ids:
        if out and out[-1][1] + 1 == i:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


if __name__ == "__main__":
    main()
