"""Where a node's queue groups keep their stores (issue 34): ``<data>/groups/g<N>``, the data
directory of queue group N's worker (node/config.py ``Config.for_group``); a history snapshot keeps
each queue group's history in ``<snapshot>/groups/g<N>``.  For the operations tools that read them
(raftmq snapshot, raftmq audit verify, the admin service's snapshot)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import lmdb

from raftmq.store.disk import history as EV

_GROUP = re.compile(r"g[1-9][0-9]*")


_LONE = re.compile(r"(?:^|/)groups/g([1-9][0-9]*)(?:/events)?/*$")


def lone_group(path: str) -> int:
    """The group of a lone queue group's history named by its place (``.../groups/g<N>`` of a
    snapshot, ``.../groups/g<N>/events`` of a data directory); 0 for any other path."""
    found = _LONE.search(str(path).replace(os.sep, "/"))
    return int(found.group(1)) if found else 0


def queue_group_histories(base: str) -> list[tuple[int, str]]:
    """(group, history directory) of the queue groups under ``base`` (a node's data directory, whose
    groups keep ``groups/g<N>/events``, or a history snapshot, ``groups/g<N>`` itself) that keep a
    history, in group order."""
    groups = os.path.join(base, "groups")
    if not os.path.isdir(groups):
        return []
    found = []
    for name in os.listdir(groups):
        if _GROUP.fullmatch(name):
            events = history_dir(os.path.join(groups, name))
            if events is not None:
                found.append((int(name[1:]), events))
    return sorted(found)


def history_dir(path: str) -> str | None:
    """The history a directory holds: its ``events`` (a data directory's, or a queue group's
    directory in one), else the directory itself (a history or its snapshot); None if neither is."""
    for events in (os.path.join(path, "events"), path):
        if os.path.exists(os.path.join(events, "data.mdb")):
            return events
    return None


_OPENING: dict[str, threading.Lock] = {}


@contextmanager
def open_group_history(path: str) -> Iterator[lmdb.Environment]:
    """A queue group's history opened read-only in the main process (its worker writes it; LMDB's
    reader lock), one reader at a time per history: one process may not open an LMDB environment
    twice at once, and the HTTP API's pages (a queue's events, the audit chain) read from worker
    threads."""
    with _OPENING.setdefault(path, threading.Lock()):
        env = EV.open_history(path)
        try:
            yield env
        finally:
            env.close()
