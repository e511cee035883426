"""Format versions of what a node writes and reads back: commands in the log, snapshots, the LMDB store.

A rolling upgrade runs old and new nodes side by side, and a node restarts on its own old journal: a
command or a snapshot must never be read with a meaning it was not written with.  Each format has a
number here; a change of fields or meaning bumps it (and the reader keeps reading the older ones, or
the release notes say it cannot).  A node that meets a *newer* format than it knows stops at once
with ``FormatTooNew`` -- it cannot apply what it does not understand, and carrying on past one entry
would make its state diverge from the others'.

Version 1 is the format of everything written before formats were numbered: a record without a
version is read as version 1.
"""

from __future__ import annotations

COMMAND_FORMAT = 2  # the commands of a batch (store/core/commands.py, encode_batch); 2: typed, op last
SNAPSHOT_FORMAT = 4  # the model pickled into a snapshot (store/disk/snapshot.py); 2: Message.format; 3: no bodies; 4: checksums
STORE_FORMAT = 3  # the tables of the single-node LMDB store (store/disk/durable.py); 2: message records' format; 3: checksums
HISTORY_FORMAT = 2  # the audit history (store/disk/history.py); 1: no format key; 2: checksums

EXIT_FORMAT_TOO_NEW = 78  # EX_CONFIG: the node's software is older than its data


class FormatTooNew(Exception):
    """Data written by a newer raftmq than this one."""

    def __init__(self, what: str, found: int, known: int) -> None:
        super().__init__(f"{what} has format version {found}, newer than the {known} this raftmq "
                         f"knows: upgrade this node before it rejoins")
        self.what, self.found, self.known = what, found, known


def check(what: str, found: int, known: int) -> None:
    if found > known:
        raise FormatTooNew(what, found, known)
