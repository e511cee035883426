"""The forwarder's part in transactions across groups (issue 34): what to send next.

The two-phase commit (store/core/tx_groups.py) moves by commands in the groups' logs; this module
decides, from the coordinator's records (the metadata group's machine on this node) and each
participant's report (``participant_report``: its last prepare applied and its records), which
command each group needs next:

- a part not prepared yet: ``TxPrepare`` to its group (applied once, by its sequence number);
- a vote the coordinator has not recorded: ``TxVote`` to the metadata group;
- a decision a voter has not applied: ``TxFinish`` to it;
- an applied decision the coordinator has not collected: ``TxEnded`` to the metadata group;
- a finished record the coordinator has collected (or forgotten with its transaction):
  ``TxForget`` to its group, with its next prepare or within a second.

Every command is idempotent where it lands, so sending one twice is harmless: ``TxForwarder``
remembers what it sent so as not to flood the logs, and forgets it once a second (``clear``) so
that a proposal lost with a leader change is sent again.  No I/O here (node/group_host.py sends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftmq.store.core.commands import TxEnded, TxFinish, TxForget, TxPrepare, TxVote
from raftmq.store.core.groups import META_GROUP
from raftmq.store.core.tx_groups import COMMIT, UNDECIDED

if TYPE_CHECKING:
    from raftmq.store.core.machine import StateMachine

# A participant's report: (last prepare applied, {txid: (code, text, finished, outcomes)}).
Report = tuple[int, dict[int, tuple[int, str, bool, list]]]


class TxForwarder:
    def __init__(self) -> None:
        self.sent: set[tuple[int, int, int]] = set()  # (op, participant group, txid) sent since the last clear

    def clear(self) -> None:
        self.sent.clear()

    def sends(self, coord: StateMachine, reports: dict[int, Report], forget: bool = False,
              released: int | None = None) -> list[tuple[int, Any]]:
        """``(group, command)`` pairs to send now (each once until ``clear``).  A ``TxForget``
        rides along with a prepare for the same group (one log batch for both: a client committing
        in a loop pays no batch of its own for it), or goes when ``forget`` (the node's resend loop,
        once a second): a finished record only waits a little longer in memory.  ``released``:
        the last transaction id of the metadata group's last released batch (GroupReport)."""
        out: list[tuple[int, Any]] = []
        preparing: set[int] = set()
        sent = self.sent

        def send(target: int, command: Any, txid: int, part: int) -> bool:
            key = (int(command.op), part, txid)  # (a vote and an end go to the metadata group per part)
            if key in sent:
                return False
            sent.add(key)
            out.append((target, command))
            return True

        for txid, rec in coord.tx_coord.items():
            if released is not None and txid > released:
                continue  # (its TxBegin not durable yet: a power loss would give the id again)
            for group, (seq, operations, index) in rec.parts.items():
                report = reports.get(group)
                if report is None:
                    continue
                applied, held = report
                mine = held.get(txid)
                if group not in rec.votes:
                    if applied < seq:
                        # (a 0-10 session's transaction: prepared on the session, by its key)
                        party = rec.session if rec.session is not None else rec.conn
                        prepare = TxPrepare(None, None, txid, seq, party, rec.channel, operations, index)
                        if send(group, prepare, txid, group):
                            preparing.add(group)
                    elif mine is not None:
                        send(META_GROUP, TxVote(None, None, txid, group, mine[0], mine[1]), txid, group)
                elif rec.decision != UNDECIDED and group not in rec.finished and mine is not None:
                    if mine[2]:
                        send(META_GROUP, TxEnded(None, None, txid, group, mine[3]), txid, group)
                    else:
                        code, text = rec.error
                        send(group, TxFinish(None, None, txid, rec.decision == COMMIT, code, text), txid, group)
        for group, (_applied, held) in reports.items():
            if not forget and group not in preparing:
                continue
            for txid, (_code, _text, finished, _outcomes) in held.items():
                if not finished:
                    continue
                rec = coord.tx_coord.get(txid)
                if (group in rec.finished) if rec is not None else txid <= coord.tx_next:
                    send(group, TxForget(None, None, txid), txid, group)
        return out
