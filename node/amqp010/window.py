"""Window-mode credit that session.completed gives back (0-10 message.set-flow-mode, L6097ff).

"Window based flow control is identical to credit based flow control, however message transfer
completion implicitly grants a single unit of message credit, and the size of the message in byte
credits for each completed message transfer. Completion of the transfer command with
session.completed is the only way credit is implicitly updated".

session.completed is a control, not logged: the session's front end remembers the transfers it
wrote on window-mode destinations and, when the client's completed covers them, submits
``SESSION_WINDOW_CREDIT`` for them once (clients repeat their completed ranges: qpid.messaging sends
its whole executed set every time). After a failover the new node knows only the transfers it
replays: one completed while the old node was dying may give its credit twice or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WindowCredit:
    owed: dict[int, tuple[str, int]] = field(default_factory=dict)  # transfer id -> (destination, bytes)
    grants: dict[str, tuple[int, int]] = field(default_factory=dict)  # completed, not yet submitted
    # The message credit the client last gave each destination (message.flow, unit message): the
    # window, in window mode.  Only a hint for batching (``ample``): the core keeps the credit.
    windows: dict[str, int] = field(default_factory=dict)

    def sent(self, transfer_id: int, destination: str, size: int) -> None:
        self.owed[transfer_id] = (destination, size)

    def flow(self, destination: str, messages: int) -> None:
        self.windows[destination] = messages

    def ample(self, destination: str) -> bool:
        """Whether ``destination`` still has at least half its window of message credit, counting
        the transfers the client has not completed: then nobody waits for the credit coming back,
        and its command may wait a little for company (raft/cluster.py, deferrable)."""
        window = self.windows.get(destination, 0)
        if window < 4:
            return False
        outstanding = sum(1 for d, _ in self.owed.values() if d == destination)
        return outstanding < window // 2

    def completed(self, ranges) -> bool:
        """Forget the transfers ``ranges`` covers and add what they give back to the grants (one
        command per destination and read batch, not per transfer); True if there is any."""
        for transfer_id in [i for i in self.owed if any(lo <= i <= hi for lo, hi in ranges)]:
            destination, size = self.owed.pop(transfer_id)
            messages, total = self.grants.get(destination, (0, 0))
            self.grants[destination] = (messages + 1, total + size)
        return bool(self.grants)

    def take_grants(self) -> dict[str, tuple[int, int]]:
        """Per destination, the (messages, bytes) to give back now."""
        grants, self.grants = self.grants, {}
        return grants

    def cancelled(self, destination: str) -> None:
        """The subscription is gone, or stopped (message.stop zeroes its credit): the transfers
        sent to it so far give nothing back."""
        for transfer_id in [i for i, (d, _) in self.owed.items() if d == destination]:
            del self.owed[transfer_id]
        self.grants.pop(destination, None)
        self.windows.pop(destination, None)
