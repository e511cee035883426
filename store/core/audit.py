"""AuditNote: what a front end saw, recorded in every node's history at one place (issue 36).

A concern of the state machine: how the concerns meet is in store/core/machine.py.

Connections open no state in the log, logins and permission checks happen at a node's front end,
and administrative changes are checked by the admin API before their command exists -- none of
them passes through ``apply`` by itself.  The node proposes an ``AuditNote`` for each (node/audit.py,
rate-limited there for refusals), and applying it only numbers and records an event: the note's
kind, vhost, resource, detail, connection id and principal, at the batch's leader-stamped time.
So every node that keeps a history has the same event with the same sequence number, between the
same message events, and a node that keeps none still numbers it (``event_seq`` is replicated
state).  Nothing else changes: the note is deterministic in its command alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import events as EV
from .commands import AuditNote
from .errors import CommandError

if TYPE_CHECKING:
    from .machine import StateMachine


class AuditNotes:
    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def note(self, cmd: AuditNote) -> None:
        if cmd.kind not in EV.NOTE_KINDS:
            raise CommandError(540, f"NOT_IMPLEMENTED - audit note kind {cmd.kind!r}")
        m = self.m
        m.event_seq += 1
        principal = list(cmd.principal) if cmd.principal else None
        fields = [m.event_seq, m._now, cmd.kind, cmd.vhost, cmd.queue, None, cmd.exchange, "", 0, cmd.detail,
                  cmd.conn, principal]
        if m.chain_on:
            m._chain_pack(fields)  # chained like every event (store/core/events.py)
        if m.records_events:
            fields.insert(10, None)
            m._events.append(fields)
