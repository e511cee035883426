"""``raftmq verify`` (ops/verify.py): one line per Damage, exit 0 clean / 1 damaged / 2 usage, refuses a
running node (LMDB lock, status.json pid), runs each checker in a child so a crash is reported as damage,
and checks a cluster node's journal, snapshot and bodies with their own checkers."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raftmq.integrity import Damage
from raftmq.ops import verify as V
from raftmq.store.core.effects import PUT, PUT_WITH_BODY
from raftmq.store.disk.durable import DurableStore
from raftmq.store.disk.event_writer import EventStore
from tests.support.cli import raftmq
from tests.unit.store.test_event_writer import Driver

FIXTURE_2 = Path(__file__).parents[1] / "store" / "fixtures" / "state-format-2.lmdb"


def _single_node_dir(base: Path) -> Path:
    """A single node's data directory: state (a queue, one persistent message) and a history."""
    data = base / "data"
    store = DurableStore(str(data / "state"))
    store.commit([(PUT, "vhosts", b"/", b""),
                  (PUT_WITH_BODY, "messages", (1).to_bytes(8, "big"), ["", "q", b"\x00\x00", None, 0, 7], 3, 1)],
                 (2, 2), 1, body_of={1: b"verify-me-body"}.get)
    store.close()
    history = EventStore(str(data / "events"), "body")
    d = Driver(history)
    d.declare("vq")
    d.publish("vq", b"history-body-for-verify")
    assert history.flush()
    history.close()
    return data


def _run(data: Path, force: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = V.main(str(data), force=force, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _flip(path: Path, pattern: bytes) -> None:
    raw = bytearray(path.read_bytes())
    at = raw.find(pattern)
    assert at >= 0
    raw[at + 2] ^= 0x04
    path.write_bytes(bytes(raw))


def test_a_clean_single_node_is_clean(tmp_path):
    """Exit 0, the stores checked named, no damage line."""
    data = _single_node_dir(tmp_path)
    code, out, err = _run(data)
    assert code == V.EXIT_CLEAN, (out, err)
    assert out.splitlines()[-1] == "clean (checked: state, events)"  # (no bodies/ here)
    assert "DAMAGED" not in out and err == ""


def test_damage_in_the_state_and_the_history_is_printed_one_line_each(tmp_path):
    """A flipped body byte in each store: exit 1, one Damage line per damaged record, named."""
    data = _single_node_dir(tmp_path)
    _flip(data / "state" / "data.mdb", b"verify-me-body")
    _flip(data / "events" / "data.mdb", b"history-body-for-verify")
    code, out, _ = _run(data)
    assert code == V.EXIT_DAMAGED
    lines = out.splitlines()
    assert f"state: {data / 'state'} at messages/message 1: checksum mismatch" in lines
    assert [line for line in lines if line.startswith(f"events: {data / 'events'} at messages/message ")
            and line.endswith("checksum mismatch")]
    assert lines[-1] == "DAMAGED: 2 problem(s) found (checked: state, events)"


def test_usage_errors_exit_2(tmp_path):
    """No directory, or a directory with no raftmq store in it; the CLI without --data-dir."""
    assert _run(tmp_path / "missing")[0] == V.EXIT_USAGE
    (tmp_path / "empty").mkdir()
    code, _, err = _run(tmp_path / "empty")
    assert code == V.EXIT_USAGE and "holds no raftmq store" in err
    assert raftmq("verify").returncode == 2


def test_the_command_line_runs_it(tmp_path):
    data = _single_node_dir(tmp_path)
    done = raftmq("verify", "--data-dir", str(data))
    assert done.returncode == 0 and "clean (checked: state, events)" in done.stdout, done.stderr
    _flip(data / "state" / "data.mdb", b"verify-me-body")
    done = raftmq("verify", "--data-dir", str(data))
    assert done.returncode == 1 and "messages/message 1: checksum mismatch" in done.stdout


@pytest.fixture
def lock_holder(tmp_path):
    """A separate process with the state's LMDB environment open, as a running node has."""
    procs = []

    def start(env_dir: Path) -> subprocess.Popen:
        code = ("import lmdb, sys, time; e = lmdb.open(sys.argv[1], max_dbs=16); print('ready', flush=True); "
                "time.sleep(60)")
        proc = subprocess.Popen([sys.executable, "-c", code, str(env_dir), "raftmq-lock-holder"],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_running_node_is_refused_unless_forced(tmp_path, lock_holder):
    """The LMDB lock held by another process: exit 2 with the reason; --force checks with a warning."""
    data = _single_node_dir(tmp_path)
    assert V.running_reasons(str(data)) == []
    holder = lock_holder(data / "state")
    assert V.lmdb_lock_held(str(data / "state")) and not V.lmdb_lock_held(str(data / "events"))
    code, out, err = _run(data)
    assert code == V.EXIT_USAGE and out == ""
    assert "seems to be running" in err and "LMDB lock of" in err
    code, out, err = _run(data, force=True)
    assert code == V.EXIT_CLEAN and "WARNING" in err
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    assert V.running_reasons(str(data)) == []


def test_status_json_naming_a_live_raftmq_process_is_refused(tmp_path, lock_holder):
    """status.json's pid (node/status.py) is a second sign: a live process with raftmq in its command
    line; a dead pid is not."""
    data = _single_node_dir(tmp_path)
    other = tmp_path / "other-env"
    holder = lock_holder(other)  # holds a lock elsewhere: only its pid matters here
    (data / "status.json").write_text(json.dumps({"pid": holder.pid}))
    assert V.running_reasons(str(data)) == [f"status.json names pid {holder.pid}, which is running"]
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    assert V.running_reasons(str(data)) == []


def test_a_checker_that_crashes_or_fails_is_reported_as_damage(tmp_path):
    """A checker killed by a signal (LMDB reading a damaged page can do that) or raising: the store is
    reported, the verify process goes on."""
    target = V.Target("state", str(tmp_path), None, "x.y")

    def crash(_path: str) -> list[Damage]:
        os.kill(os.getpid(), signal.SIGSEGV)
        return []

    def fail(_path: str) -> list[Damage]:
        raise RuntimeError("page 7 unreadable")

    (crashed,) = V.run_isolated(crash, target)
    assert crashed.store == "state" and f"signal {int(signal.SIGSEGV)}" in crashed.what
    (failed,) = V.run_isolated(fail, target)
    assert failed.what == "could not be checked to the end: RuntimeError: page 7 unreadable"
    found = [Damage("state", "p", "k", "checksum mismatch")]
    assert V.run_isolated(lambda _p: found, target) == found


def test_a_cluster_nodes_stores_are_found_and_checked(tmp_path):
    """Cluster layout (raft/journal, raft/snapshot.lmdb): each found and checked by its own checker;
    an empty snapshot file is damage, an empty journal directory is not."""
    data = tmp_path / "data"
    (data / "raft" / "journal").mkdir(parents=True)
    (data / "raft" / "snapshot.lmdb").write_bytes(b"")
    stores = {t.store: t.provider for t in V.targets(str(data))}
    assert stores == {"journal": "raftmq.raft.journal.verify_journal",
                      "snapshot": "raftmq.store.disk.snapshot.verify_snapshot"}
    code, out, _ = _run(data)
    assert code == V.EXIT_DAMAGED
    assert out.splitlines()[-1] == "DAMAGED: 1 problem(s) found (checked: journal, snapshot)"
    assert out.startswith("snapshot: ")


def test_an_older_state_is_noted_not_damaged(tmp_path):
    """A format 2 store (no checksums yet): its structure is checked, and a note says so."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE_2, data / "state")
    code, out, _ = _run(data)
    assert code == V.EXIT_CLEAN
    assert "note: state: format 2, written before checksums" in out


def test_an_older_history_is_noted_not_damaged(tmp_path):
    """A history written before checksums (format 1 fixture): clean, with a note of how many records
    could only be checked for structure; a history with checksums gets no note."""
    data = tmp_path / "data"
    shutil.copytree(FIXTURE_2.parent / "history-format-1.lmdb", data / "events")
    code, out, _ = _run(data)
    assert code == V.EXIT_CLEAN and out.splitlines()[-1] == "clean (checked: events)"
    assert "note: events: 49 record(s) written before checksums" in out
    assert "note:" not in _run(_single_node_dir(tmp_path / "new"))[1]
