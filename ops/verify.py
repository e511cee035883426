"""``raftmq verify --data-dir DIR``: check a stopped node's files and print what is damaged (issue 29).

One checker per store found in the data directory; each returns ``store.integrity.Damage`` items
and ``verify`` prints one line per item.  Layouts differ: a single node has ``state/`` (the LMDB
state), a cluster node ``raft/journal/`` and ``raft/snapshot.lmdb``; both may have ``bodies/`` and
``events/`` (the audit history, when it is on).  Only what exists is checked.

Exit status: 0 clean, 1 damage found (or a checker could not finish: what cannot be proved intact
is not called clean), 2 usage errors -- no such directory, nothing raftmq in it, or the node is
running.

**A running node is refused**: its files change under the check (a torn read looks like damage),
and LMDB's own lock would be bypassed.  It is recognised by LMDB's lock (a process that has an
environment open holds a POSIX read lock on byte 0 of ``lock.mdb``: a write lock cannot be taken)
and by ``status.json``'s pid (node/status.py) naming a live process.  ``--force`` checks anyway,
with a warning that what it prints may be wrong.

**Each checker runs in a forked child**: LMDB trusts its B-tree pages (no page checksums) and a
damaged page can crash the reading process; a child that dies is reported as damage of that store
("the checker died of signal 11 ...") and the other stores are still checked.
"""

from __future__ import annotations

import errno
import faulthandler
import fcntl
import importlib
import json
import os
import pickle
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from raftmq.integrity import Damage

EXIT_CLEAN, EXIT_DAMAGED, EXIT_USAGE = 0, 1, 2

Check = Callable[[str], list[Damage]]


def _checker(module: str, name: str) -> Check:
    """A store's checker, imported when it runs (in the forked child: see run_isolated)."""
    def check(path: str) -> list[Damage]:
        return getattr(importlib.import_module(module), name)(path)

    check.__qualname__ = f"{module}.{name}"
    return check


@dataclass(frozen=True)
class Target:
    """One store to check: its name, where it is, and its checker."""

    store: str
    path: str
    check: Check
    provider: str  # the checker's dotted name


def targets(data_dir: str) -> list[Target]:
    """The stores found in ``data_dir`` (single node or cluster node), each with its checker, and
    those of its queue groups (issue 34: ``groups/g<N>``, each worker's own stores, named
    ``g<N>/state`` etc.)."""
    found: list[Target] = []

    def add(base: str, prefix: str, store: str, sub: str, marker: str | None, module: str, name: str) -> None:
        path = os.path.join(base, sub)
        if not os.path.exists(os.path.join(path, marker) if marker else path):
            return
        found.append(Target(prefix + store, path, _checker(module, name), f"{module}.{name}"))

    groups_dir = os.path.join(data_dir, "groups")
    groups = sorted((int(n[1:]) for n in os.listdir(groups_dir) if re.fullmatch(r"g[1-9][0-9]*", n))
                    if os.path.isdir(groups_dir) else [])
    for base, prefix in [(data_dir, "")] + [(os.path.join(groups_dir, f"g{g}"), f"g{g}/") for g in groups]:
        add(base, prefix, "state", "state", "data.mdb", "raftmq.store.disk.durable", "verify_state")
        add(base, prefix, "events", "events", "data.mdb", "raftmq.store.disk.history", "verify_history")
        add(base, prefix, "journal", os.path.join("raft", "journal"), None, "raftmq.raft.journal", "verify_journal")
        add(base, prefix, "snapshot", os.path.join("raft", "snapshot.lmdb"), None, "raftmq.store.disk.snapshot",
            "verify_snapshot")
        add(base, prefix, "bodies", "bodies", "data.mdb", "raftmq.store.disk.body_store", "verify_body_store")
    return found


def lmdb_lock_held(env_dir: str) -> bool:
    """True when some process has the LMDB environment in ``env_dir`` open (see the module
    docstring).  Call it before this process opens that environment: POSIX locks are per process."""
    lock_path = os.path.join(env_dir, "lock.mdb")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
        return False
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"raftmq" in fh.read()  # a reused pid of another program is not the node
    except OSError:
        return True


def running_reasons(data_dir: str) -> list[str]:
    """Why the node of ``data_dir`` seems to be running (empty: it does not)."""
    reasons = []
    for sub in ("state", "events", "bodies"):
        if lmdb_lock_held(os.path.join(data_dir, sub)):
            reasons.append(f"the LMDB lock of {os.path.join(data_dir, sub)} is held by a running process")
    try:
        with open(os.path.join(data_dir, "status.json")) as fh:
            pid = json.load(fh).get("pid")
    except (OSError, ValueError, AttributeError):
        pid = None
    if isinstance(pid, int) and pid != os.getpid() and _pid_alive(pid):
        reasons.append(f"status.json names pid {pid}, which is running")
    return reasons


def in_child(fn: Callable, arg: str) -> tuple[str, object]:
    """``fn(arg)`` in a forked child: ("ok", result), ("error", text), ("signal", number) or
    ("no answer", wait status)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run it, send back (kind, value), never return
        code = 0
        try:
            os.close(read_fd)
            faulthandler.disable()  # a crash is the parent's to report, as damage, in one line
            try:
                result = ("ok", fn(arg))
            except BaseException as exc:  # noqa: BLE001 - reported by the parent
                result = ("error", f"{exc.__class__.__name__}: {exc}")
            with os.fdopen(write_fd, "wb") as fh:
                fh.write(pickle.dumps(result))
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "signal", os.WTERMSIG(status)
    try:
        return pickle.loads(data)  # noqa: S301 - from our own child process
    except Exception:  # noqa: BLE001
        return "no answer", status


def run_isolated(check: Check, target: Target) -> list[Damage]:
    """``check(target.path)`` in a forked child; its death or failure is reported as damage."""
    kind, value = in_child(check, target.path)
    if kind == "ok":
        return list(value)
    if kind == "signal":
        what = f"the checker died of signal {value} reading it: its structure is damaged"
    elif kind == "error":
        what = f"could not be checked to the end: {value}"
    else:
        what = f"the checker exited (wait status {value}) without an answer"
    return [Damage(target.store, target.path, "-", what)]


@dataclass
class Report:
    damages: list[Damage]
    checked: list[str]


def verify(data_dir: str) -> Report:
    report = Report([], [])
    for target in targets(data_dir):
        report.damages.extend(run_isolated(target.check, target))
        report.checked.append(target.store)
    return report


def _notes(data_dir: str) -> list[str]:
    """What was read unchecked (written before checksums): said, not counted as damage."""
    notes = []
    history = os.path.join(data_dir, "events")
    if os.path.exists(os.path.join(history, "data.mdb")):
        from raftmq.store.disk.history import may_hold_unchecked, scan_history

        unchecked = scan_history(history)[1] if may_hold_unchecked(history) else 0
        if unchecked:
            notes.append(f"note: events: {unchecked} record(s) written before checksums: their structure "
                         f"was checked, their bytes cannot be")
    state = os.path.join(data_dir, "state")
    if os.path.exists(os.path.join(state, "data.mdb")):
        import lmdb

        from raftmq.store.disk.durable import FIRST_CHECKED_FORMAT, StateDamaged, read_format

        env = lmdb.open(state, readonly=True, lock=False, max_dbs=16, map_size=0)
        try:
            meta = env.open_db(b"meta", create=False)
            with env.begin() as txn:
                found = read_format(txn, meta, state)
            if found < FIRST_CHECKED_FORMAT:
                notes.append(f"note: state: format {found}, written before checksums: its records' structure "
                             f"was checked; the node adds checksums at its next start")
        except (lmdb.Error, StateDamaged):
            pass
        finally:
            env.close()
    return notes


def main(data_dir: str, force: bool = False, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    if not os.path.isdir(data_dir):
        print(f"raftmq verify: {data_dir} is not a directory", file=err)
        return EXIT_USAGE
    if not targets(data_dir):
        print(f"raftmq verify: {data_dir} holds no raftmq store (state/, raft/, bodies/, events/)", file=err)
        return EXIT_USAGE
    reasons = running_reasons(data_dir)
    if reasons:
        if not force:
            print(f"raftmq verify: the node of {data_dir} seems to be running ({'; '.join(reasons)}): stop it "
                  f"first (a running node's files change under the check), or pass --force", file=err)
            return EXIT_USAGE
        print(f"raftmq verify: WARNING: checking a running node's files ({'; '.join(reasons)}): what is "
              f"printed may be damage or may be a write in progress", file=err)
    report = verify(data_dir)
    for damage in report.damages:
        print(damage, file=out)
    kind, notes = in_child(_notes, data_dir)
    for line in notes if kind == "ok" else ():
        print(line, file=out)
    stores = ", ".join(report.checked) or "nothing"
    if report.damages:
        print(f"DAMAGED: {len(report.damages)} problem(s) found (checked: {stores})", file=out)
        return EXIT_DAMAGED
    print(f"clean (checked: {stores})", file=out)
    return EXIT_CLEAN
