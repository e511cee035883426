"""Transactions across queue groups (issue 34): a two-phase commit through the groups' logs.

A transaction (0-9-1 tx.commit, a 1.0 discharge, a 0-10 tx.commit) whose operations touch queues
of one group is one ``TxCommit`` in that group's log, applied at once as with one group (store/core/delivery.py
``tx_commit``): nothing here runs.  When its operations touch several groups, the router
(node/groups.py) splits them by group and sends one ``TxBegin`` to the metadata group, which
*coordinates*; every step is a command in some group's log, so every replica of every group sees
the same protocol and a leader change anywhere loses nothing (docs/design.md, "Transactions across
groups"):

1. ``TxBegin`` (metadata group): the transaction gets an id (``tx_next``) and each part a
   sequence number for its group (``tx_part_seq``); the record waits in ``tx_coord``.
2. ``TxPrepare`` (each participant, applied once and in order by its ``seq``): the participant
   checks its part can commit -- the channel is open here, every acknowledged delivery is held by
   that channel here (a 1.0 or 0-10 settlement: every transfer id this group numbered still has
   its delivery on its session) -- and if so *holds* it: the deliveries to acknowledge leave the
   channel (nothing else can requeue or redeliver them), the publishes (with their bodies) wait in
   the record.  Either way it records its vote in ``tx_held``.
3. ``TxVote`` (metadata group): the coordinator records each vote; the first refusal decides
   abort, the last acceptance commit.  The decision is replicated state of the metadata group.
4. ``TxFinish`` (each participant that voted, once: it acts only on a record not yet finished):
   commit applies the held publishes and acknowledgements; abort returns the held deliveries to
   their queues (the client's channel is closed by the refusal anyway) and drops the publishes.
   The record keeps the publishes' outcomes.
5. ``TxEnded`` (metadata group): the coordinator collects each participant's outcomes; once all
   finished it answers the client (commit: the publishes' outcomes, as one group would; abort: the
   refusal) and forgets the transaction; ``TxForget`` then drops the participants' records.

The forwarder (node/tx_forward.py, on the node leading the metadata group) moves each step on:
it reads the coordinator's records and the participants' (reported by their workers) and sends
whatever the next step is; everything is idempotent, so it resends after a second and a new
leader of the metadata group picks up where the old one stopped.  Apply uses no clock.

**0-10 sessions** (session 21): a tx.commit is a session command, to every group (a session is a
replica in each, node/groups.py); for one across groups its inner command is the ``TxBegin``,
which the metadata group alone executes (``begin_session``): the record keeps the session's key and
the command id, the participants prepare on the session found by its key (``is_session_key``), and
the answer is a ``GroupPending`` now and a ``GroupEcho`` from ``TxEnded``.  A resume of the
session waits for its transactions to end (``attach_waits``), an aborted commit leaves the
barrier, a committed one stays in ``tx_decided`` until known-completed, so that a resumed client
is told its commit completed exactly when it did (docs/design.md "Transactions across groups").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import events as EV
from . import ranges as rs
from .commands import (
    ERR,
    OK,
    OUT_REPLY,
    OUT_TX_STEP,
    REJECTED,
    ROUTED,
    SETTLE_ACCEPT,
    SETTLE_REJECT,
    SETTLE_RELEASE,
    SETTLE_RELEASE_REDELIVERED,
    UNROUTABLE,
    GroupEcho,
    GroupPending,
    MessageSettle,
    Ok,
    Op,
    Refused,
    SessionAttach,
    SessionCommand,
    TxBegin,
    TxEnded,
    TxFinish,
    TxForget,
    TxPrepare,
    TxVote,
)
from .errors import CommandError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .machine import StateMachine
    from .model import ChannelState, Entry, Queue, Session

UNDECIDED, COMMIT, ABORT = 0, 1, 2
_SETTLES = (Op.ACK, Op.NACK)


@dataclass(slots=True)
class TxCoord:
    """The metadata group's record of one transaction across groups."""

    conn: str
    channel: int
    reply_token: int | None
    total: int  # the transaction's publishes (the client's outcomes list)
    parts: dict[int, list]  # group -> [seq, operations, index]
    votes: dict[int, tuple[int, str]] = field(default_factory=dict)  # group -> (code, text)
    decision: int = UNDECIDED
    error: tuple[int, str] = (0, "")  # the first refusal (abort)
    finished: dict[int, list] = field(default_factory=dict)  # group -> [[index, outcome]]
    # A 0-10 session's tx.commit (SESSION_COMMAND around the TxBegin): the session's key and the
    # command's id; the answers owed to attaches that resumed the session meanwhile (conn, token, channel).
    session: str | None = None
    command_id: int = -1
    waiters: list = field(default_factory=list)

    def __setstate__(self, state: tuple) -> None:
        """Unpickled (a snapshot: ``(None, {slot: value})``, object's default for slots): one
        written before session 21 lacks the last three fields, which keep their defaults."""
        self.session, self.command_id, self.waiters = None, -1, []
        for name, value in state[1].items():
            object.__setattr__(self, name, value)


@dataclass(slots=True)
class TxHeld:
    """A participant's record of its part of one transaction: its vote, and until the decision
    what it holds (the publishes, the deliveries taken out of the channel to acknowledge)."""

    seq: int
    code: int  # 0: prepared; else the refusal's reply code
    text: str
    conn: str
    channel: int
    publishes: list = field(default_factory=list)  # [index, command] (Publish, or another op, index -1)
    settles: list = field(default_factory=list)  # [op, requeue, unsent, queue, entry]
    finished: bool = False
    outcomes: list = field(default_factory=list)  # [[index, outcome]] once finished


def merge_outcome(a: int, b: int) -> int:
    """Two groups' outcomes of one publish, as node/groups.py ``merge`` joins a publish's."""
    for outcome in (REJECTED, ROUTED):
        if a == outcome or b == outcome:
            return outcome
    return UNROUTABLE


class TxGroups:
    """The machine's part in transactions across groups (state on the machine, as ``Groups``)."""

    def __init__(self, machine: StateMachine) -> None:
        self.m = machine
        self.persisted: tuple | None = None

    def handlers(self) -> dict[int, Callable[[Any], object]]:
        return {Op.TX_BEGIN: self.begin, Op.TX_PREPARE: self.prepare, Op.TX_VOTE: self.vote,
                Op.TX_FINISH: self.finish, Op.TX_ENDED: self.ended, Op.TX_FORGET: self.forget}

    # ------------------------------------------------------------------ the coordinator

    def begin(self, cmd: TxBegin) -> None:
        self._begin(cmd.conn, cmd.channel, cmd.reply_token, cmd)

    def _begin(self, conn: str, channel: int, reply_token: int | None, cmd: TxBegin) -> TxCoord:
        m = self.m
        m.tx_next += 1
        parts: dict[int, list] = {}
        for group, operations, index in cmd.parts:
            seq = m.tx_part_seq.get(group, 0) + 1
            m.tx_part_seq[group] = seq
            parts[group] = [seq, list(operations), list(index)]
        rec = m.tx_coord[m.tx_next] = TxCoord(conn, channel, reply_token, cmd.total, parts)
        m._out.append((None, OUT_TX_STEP, m.tx_next))
        return rec

    def begin_session(self, session: Session, cmd: SessionCommand) -> Any:
        """A 0-10 tx.commit across groups (``SESSION_COMMAND`` around a ``TxBegin``; the metadata
        group, once per command id: the barrier already took it).  The session's other groups keep
        the id in their barriers and execute nothing.  The answer is owed until the decision is
        applied everywhere: ``GroupPending`` now, the outcome as a ``GroupEcho`` from ``ended``
        (the front end's join completes the command then, 0-10 tx.commit: "the commit will not be
        completed until all preceding commands which it affects have been completed")."""
        rec = self._begin(cmd.conn, cmd.channel, cmd.token, cmd.inner)
        rec.session, rec.command_id = session.key, cmd.command_id
        return GroupPending(None, 1)

    def attach_waits(self, session: Session, cmd: SessionAttach) -> bool:
        """A resume of ``session`` while a transaction of it across groups is deciding: its answer
        waits for the transaction's end (``ended``); True if it must."""
        for rec in self.m.tx_coord.values():
            if rec.session == session.key:
                rec.waiters.append([cmd.conn, cmd.token, cmd.channel])
                return True
        return False

    def vote(self, cmd: TxVote) -> None:
        rec = self.m.tx_coord.get(cmd.txid)
        if rec is None or cmd.group not in rec.parts or cmd.group in rec.votes:
            return  # a duplicate (the forwarder resends until it sees the vote here)
        rec.votes[cmd.group] = (cmd.code, cmd.text)
        self.m._out.append((None, OUT_TX_STEP, cmd.txid))
        rec.parts[cmd.group][1] = []  # the prepare is applied there: the operations are not resent
        if rec.decision == UNDECIDED:
            if cmd.code:
                rec.decision, rec.error = ABORT, (cmd.code, cmd.text)
            elif len(rec.votes) == len(rec.parts):
                rec.decision = COMMIT

    def ended(self, cmd: TxEnded) -> None:
        m = self.m
        rec = m.tx_coord.get(cmd.txid)
        if rec is None or rec.decision == UNDECIDED or cmd.group not in rec.votes or cmd.group in rec.finished:
            return
        rec.finished[cmd.group] = [list(pair) for pair in cmd.outcomes]
        m._out.append((None, OUT_TX_STEP, cmd.txid))
        if len(rec.finished) < len(rec.parts):
            return
        del m.tx_coord[cmd.txid]
        if rec.decision == COMMIT:
            outcomes = [UNROUTABLE] * rec.total
            for pairs in rec.finished.values():
                for index, outcome in pairs:
                    if 0 <= index < rec.total:
                        outcomes[index] = merge_outcome(outcomes[index], outcome)
            result: Any = Ok(OK, outcomes)
        else:
            result = Refused(ERR, *rec.error)
        if rec.session is not None:
            self._session_ended(rec, result)
        elif rec.reply_token is not None:
            # On every replica, whoever proposed the batch: the client's node answers it.
            m._out.append((rec.conn, OUT_REPLY, rec.reply_token, result, rec.channel))

    def _session_ended(self, rec: TxCoord, result: Any) -> None:
        """A 0-10 session's transaction ended: its tx.commit's answer (an echo of the pending one
        ``begin_session`` gave), and the resumes that waited for it.  An aborted commit leaves the
        metadata group's barrier, so that a resume after the client lost the refusal is not told the
        commit completed (the client then replays it, and its lost buffer fails it: nothing was
        committed).  A committed one is remembered in ``tx_decided``: every resume reports it
        complete even where another group's barrier entry for it was lost with a leader (that group
        executes nothing for it, and the joined answer is otherwise the barriers' intersection:
        the client would replay the commit as lost and report it aborted although it committed)."""
        m = self.m
        session = m.sessions.get(rec.session) if rec.session is not None else None
        if session is not None:
            if result[0] != OK:
                rs.remove(session.completed, rec.command_id, rec.command_id)
            else:
                rs.add(m.tx_decided.setdefault(session.key, []), rec.command_id, rec.command_id)
        if rec.reply_token is not None:
            m._out.append((rec.conn, OUT_REPLY, rec.reply_token, Ok(OK, GroupEcho(result)), rec.channel))
        if not rec.waiters:
            return
        later = next((r for r in m.tx_coord.values() if r.session == rec.session), None)
        if later is not None:  # another transaction of the session is still deciding: wait for it too
            later.waiters.extend(rec.waiters)
            return
        value = m.session_commands.attached(session, True) if session is not None else None
        for conn, token, channel in rec.waiters:
            m._out.append((conn, OUT_REPLY, token, Ok(OK, GroupEcho(Ok(OK, value))), channel))

    # ------------------------------------------------------------------ a participant

    def prepare(self, cmd: TxPrepare) -> None:
        m = self.m
        if cmd.seq != m.tx_prep_applied + 1:
            return  # a duplicate or a gap (the forwarder resends from the one applied)
        m.tx_prep_applied = cmd.seq
        m._out.append((None, OUT_TX_STEP, cmd.txid))
        session = m.sessions.get(cmd.reply_conn) if is_session_key(cmd.reply_conn) else None
        conn = next((sub.conn for sub in cmd.operations if sub.conn), cmd.reply_conn) if session else cmd.reply_conn
        rec = TxHeld(cmd.seq, 0, "", conn, cmd.channel)
        m.tx_held[cmd.txid] = rec
        if session is not None:
            ch: ChannelState | None = session.channel  # (attached or not: a session outlives its connection)
        elif is_session_key(cmd.reply_conn):
            rec.code, rec.text = 504, "the transaction's session has ended"
            return
        else:
            ch = m.channels.get(cmd.reply_conn, {}).get(cmd.channel)
        if ch is None:
            rec.code, rec.text = 504, f"channel {cmd.channel} is not open"
            return
        transfers: list = []  # [(op, requeue, unsent), channel, [(transfer id, (qid, seq))]] of the settlements
        for sub in cmd.operations:
            if sub.op in _SETTLES:
                for qid, seq in sub.refs:
                    if (qid, seq) not in ch.unacked:
                        rec.code, rec.text = 406, (f"unknown delivery ({qid}, {seq}): "
                                                   "its queue was deleted or the delivery settled")
                        return
            elif sub.op == Op.MESSAGE_SETTLE:
                refusal = _settled_transfers(m, ch if session is not None else None, sub, transfers)
                if refusal is not None:
                    rec.code, rec.text = refusal
                    return
        # Prepared: hold the part.  The deliveries leave the channel now (a channel close or
        # recover cannot requeue them under the transaction); the publishes wait with their bodies.
        for how, owner, ids in transfers:
            for transfer_id, _ref in ids:
                owner.session.transfers.pop(transfer_id, None)
            op, requeue, unsent = how
            for queue, entry in m.delivery.take_unacked(owner, [ref for _id, ref in ids]):
                rec.settles.append([int(op), requeue, unsent, queue, entry])
        index = iter(cmd.positions)
        for sub in cmd.operations:
            if sub.op == Op.MESSAGE_SETTLE:
                continue  # (held above)
            if sub.op in _SETTLES:
                requeue = bool(sub.requeue) if sub.op == Op.NACK else False
                unsent = bool(sub.unsent) if sub.op == Op.NACK else False
                for queue, entry in m.delivery.take_unacked(ch, [tuple(ref) for ref in sub.refs]):
                    rec.settles.append([int(sub.op), requeue, unsent, queue, entry])
            elif sub.op == Op.PUBLISH:
                rec.publishes.append([next(index, -1), sub])
            else:
                rec.publishes.append([-1, sub])

    def finish(self, cmd: TxFinish) -> None:
        m = self.m
        rec = m.tx_held.get(cmd.txid)
        if rec is None or rec.finished:
            return
        rec.finished = True
        m._out.append((None, OUT_TX_STEP, cmd.txid))
        publishes, settles = rec.publishes, rec.settles
        rec.publishes, rec.settles = [], []
        delivery = m.delivery
        if cmd.commit and not rec.code:
            handlers = m._handlers
            forwarding, m.forwarding = m.forwarding, True  # the channel may have closed since: lend one
            try:
                for index, sub in publishes:
                    try:
                        result = handlers[sub.op](sub)
                    except CommandError:
                        result = UNROUTABLE  # as tx_commit: an operation that became invalid is skipped
                    if index >= 0:
                        rec.outcomes.append([index, result])
            finally:
                m.forwarding = forwarding
            for op, requeue, unsent, queue, entry in settles:
                if not self._alive(queue):
                    delivery.release_message(entry)
                elif op == Op.ACK:
                    m.stats["acked"] += 1
                    m.count_ack(queue.qid)
                    m.event(EV.ACKED, queue, entry.message, "", "", rec.conn)
                    delivery.drop(queue, entry)
                else:
                    if unsent and entry.delivery_count > 0:
                        entry.delivery_count -= 1
                    if requeue:
                        delivery.return_to_ready(queue, entry)
                    else:
                        m.expiry.dead_letter(queue, entry.message, "rejected", rec.conn)
                        delivery.drop(queue, entry)
        else:
            # Abort: the held deliveries go back to their queues, as the channel's close (which the
            # client's refusal brings) would return them; the publishes never happened.
            for _op, _requeue, _unsent, queue, entry in settles:
                delivery.return_to_ready(queue, entry)

    def forget(self, cmd: TxForget) -> None:
        rec = self.m.tx_held.get(cmd.txid)
        if rec is not None and rec.finished:
            del self.m.tx_held[cmd.txid]

    def _alive(self, queue: Queue) -> bool:
        vhost = self.m.vhosts.get(queue.vhost)
        return vhost is not None and vhost.queues.get(queue.name) is queue

    # ------------------------------------------------------------------ reports, digest, mirror

    def fingerprint(self) -> tuple:
        m = self.m
        return (m.tx_next, m.tx_prep_applied, tuple((t, r.decision, len(r.votes), len(r.finished))
                                                    for t, r in m.tx_coord.items()),
                tuple((t, r.finished) for t, r in m.tx_held.items()))

    def persist(self, recorder: Any) -> None:
        """A single node: the transaction state to the mirror when a batch changed it."""
        key = self.fingerprint()
        if key != self.persisted:
            self.persisted = key
            recorder.put_tx(persisted_state(self.m))


def is_session_key(party: str) -> bool:
    """Whether a ``TxPrepare``'s ``reply_conn`` names a 0-10 session (store/core/sessions.py
    ``session_key``: vhost, principal and name joined by NUL, which no connection id holds) rather
    than a connection: a session's transaction is prepared on the session wherever it is attached
    now, or detached (a connection id would be stale after a resume)."""
    return "\x00" in party


def _settle_as(how: int) -> tuple[Op, bool, bool] | None:
    """A 0-10 / 1.0 settlement held by a transaction as a held 0-9-1 one, ``(op, requeue, unsent)``,
    finished as sessions.py ``message_settle`` would: accept an ack, reject a dead-lettering nack,
    release a requeue (without set-redelivered: the delivery not counted)."""
    return {SETTLE_ACCEPT: (Op.ACK, False, False), SETTLE_REJECT: (Op.NACK, False, False),
            SETTLE_RELEASE: (Op.NACK, True, True), SETTLE_RELEASE_REDELIVERED: (Op.NACK, True, False)}.get(how)


def _settled_transfers(m: StateMachine, session_channel: ChannelState | None, sub: MessageSettle,
                       out: list) -> tuple[int, str] | None:
    """Check a transaction's ``MessageSettle`` (a 0-10 accept; a 1.0 retirement, on the link's core
    session) in a participant, and add ``[how, channel, [(transfer id, ref)]]`` to ``out`` (``how``
    as ``_settle_as`` gives it); or return the refusal.  A transfer id this group does not know is
    skipped, as one group's ``message_settle`` does (settled already, or another group's: the router
    sent each group its own ids); one it numbered whose delivery is gone from the session (its queue
    deleted) refuses the part: a transaction across groups commits whole or not at all
    (docs/design.md, stricter than one group)."""
    ch = session_channel if session_channel is not None else m.channels.get(sub.conn, {}).get(sub.channel)
    if ch is None or ch.session is None:
        return 504, f"session {sub.channel} is not attached"
    ids = []
    for transfer_id in rs.ids(sub.ranges):
        item = ch.session.transfers.get(transfer_id)
        if item is None:
            continue
        ref = (item[0], item[1])
        if ref not in ch.unacked:
            return 406, (f"unknown transfer {transfer_id}: its queue was deleted or the message settled")
        ids.append((transfer_id, ref))
    how = _settle_as(sub.how)
    if how is None:
        return 406, f"unknown settlement {sub.how}"
    out.append([how, ch, ids])
    return None


def participant_report(m: StateMachine) -> tuple[int, dict[int, tuple[int, str, bool, list]]]:
    """What the forwarder needs of a participant: the last prepare applied and each record's vote,
    whether it finished and its outcomes."""
    return m.tx_prep_applied, {txid: (r.code, r.text, r.finished, r.outcomes) for txid, r in m.tx_held.items()}


def _plain(command: Any) -> tuple:
    """A command as plain values: its op an int (a command decoded from the log holds an int, one
    applied where it was made the ``Op``), so that every replica's digest reads it alike."""
    return (*command[:-1], int(command[-1]))


def digest_items(m: StateMachine) -> tuple:
    """The transaction state as the replicas' digest sees it (store/disk/snapshot.py)."""
    return (m.tx_next, sorted(m.tx_part_seq.items()), m.tx_prep_applied, sorted(m.tx_decided.items()),
            [(t, r.conn, r.channel, r.reply_token, r.total,
              sorted((g, p[0], [_plain(c) for c in p[1]], list(p[2])) for g, p in r.parts.items()),
              sorted(r.votes.items()), r.decision, r.error, sorted(r.finished.items()), r.session, r.command_id,
              r.waiters)
             for t, r in m.tx_coord.items()],
            [(t, r.seq, r.code, r.text, r.conn, r.channel, [(i, _plain(c)) for i, c in r.publishes],
              [(op, rq, un, q.qid, e.seq, e.message.id) for op, rq, un, q, e in r.settles], r.finished, r.outcomes)
             for t, r in m.tx_held.items()])


def persisted_state(m: StateMachine) -> list:
    """A single node's transaction state for its LMDB mirror: the coordinator's records and the
    participant's, the held publishes with their bodies, the held deliveries as (qid, seq) (their
    entries stay in the mirror's queue tables; restore takes them out of the queue again)."""
    return [m.tx_next, sorted(m.tx_part_seq.items()), m.tx_prep_applied,
            [[t, r.conn, r.channel, r.reply_token, r.total,
              [[g, p[0], [list(c) for c in p[1]], p[2]] for g, p in r.parts.items()],
              [[g, c, x] for g, (c, x) in r.votes.items()], r.decision, list(r.error),
              [[g, o] for g, o in r.finished.items()], r.session, r.command_id, r.waiters]
             for t, r in m.tx_coord.items()],
            [[t, r.seq, r.code, r.text, r.conn, r.channel, [[i, list(c)] for i, c in r.publishes],
              [[op, rq, un, q.qid, e.seq] for op, rq, un, q, e in r.settles], r.finished, r.outcomes]
             for t, r in m.tx_held.items()]]


def restore_state(m: StateMachine, state: list) -> None:
    """``persisted_state`` back into a machine restored from the mirror."""
    from .commands import _typed_v2

    tx_next, part_seq, prep_applied, coord, held = state
    m.tx_next, m.tx_prep_applied = tx_next, prep_applied
    m.tx_part_seq = {int(g): s for g, s in part_seq}
    for t, conn, channel, reply_token, total, parts, votes, decision, error, finished, *session in coord:
        m.tx_coord[t] = TxCoord(conn, channel, reply_token, total,
                                {g: [seq, [_typed_v2(c) for c in ops], list(index)] for g, seq, ops, index in parts},
                                {g: (c, x) for g, c, x in votes}, decision, (error[0], error[1]),
                                {g: o for g, o in finished}, *session)  # (session, command_id, waiters: since s21)
    for t, seq, code, text, conn, channel, publishes, settles, done, outcomes in held:
        rec = TxHeld(seq, code, text, conn, channel, [[i, _typed_v2(c)] for i, c in publishes], [], done, outcomes)
        for op, requeue, unsent, qid, entry_seq in settles:
            queue = m.queues_by_id.get(qid)
            entry: Entry | None = queue.ready.remove_seq(entry_seq) if queue is not None else None
            if queue is not None and entry is not None:
                queue.ready_bytes -= entry.message.size
                rec.settles.append([op, requeue, unsent, queue, entry])
            # (an entry the mirror no longer has -- a transient message -- went with the restart)
        m.tx_held[t] = rec
