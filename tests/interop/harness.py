"""Shared machinery of the interop runners: tools, upstream trees, a broker, bounded runs, results.

Why a separate harness (tests/interop/README.md): the issue asks for the client libraries' own
example programs and test suites, run unmodified as a user would run them, against raftmq.  Those
programs hard-code ``localhost:5672`` (Proton's helloworld.py, server_tx.py, the cli-proton-python
and rabbitmq-amqp-python-client suites, which also want the management API on 15672), so the
runner re-executes itself in a private network namespace (``unshare --net``, root only): there the
broker owns the standard ports and nothing else on the machine is disturbed.  Without root it runs
on the host and needs those ports free.

Everything the suites need besides the project's own venv goes to a cache outside the repository
(``~/.cache/raftmq-interop``: a venv with python-qpid-proton 0.40, tornado, pytest and the
rabbitmq-amqp-python-client's test dependencies; mocha and minimist from npm), never into the
project's venv.  Upstream code comes from the local mirrors with ``git archive``, unmodified.
Every program runs in its own process group under a timeout and the whole group is killed after
it: a hung example cannot outlive its test or hold the next one's queue.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pika

from raftmq.ops.local.node import RaftmqNode

MIRRORS = Path(os.environ.get("RAFTMQ_INTEROP_MIRRORS", "/work/.mirror"))
CACHE = Path(os.environ.get("RAFTMQ_INTEROP_CACHE", Path.home() / ".cache" / "raftmq-interop"))
VENV = CACHE / "venv"
NPM = CACHE / "npm"
# rhea itself: the same cache the integration tests use (tests/integration/test_amqp10_rhea.py).
RHEA_NPM = Path(os.environ.get("RAFTMQ_NPM_CACHE", Path.home() / ".cache" / "raftmq-test-npm"))

# python-qpid-proton as in the project's venv (0.40); tornado for Proton's *_tornado examples;
# the rest is rabbitmq-amqp-python-client's test group (its pyproject.toml) and pytest-timeout.
PY_PACKAGES = ["python-qpid-proton==0.40.0", "tornado", "pytest", "pytest-timeout", "pytest-asyncio",
               "pyjwt", "pika", "requests", "typing-extensions", "packaging"]
NPM_PACKAGES = ["mocha@9", "minimist@1"]  # rhea's devDependencies the examples and their test need

AMQP_PORT, HTTP_PORT, TLS_PORT = 5672, 15672, 5671
NETNS_ENV = "RAFTMQ_INTEROP_IN_NETNS"
STATUSES = ("passed", "failed", "hung", "skipped")


class HarnessError(RuntimeError):
    """The harness itself could not run (tools, mirrors, ports): not a test outcome."""


# ---------------------------------------------------------------------------------------- results
@dataclass
class Outcome:
    name: str
    status: str  # one of STATUSES
    seconds: float
    detail: str = ""  # the last lines a failed or hung test printed
    known: str = ""  # a cause the runner knows is outside raftmq (printed instead of the last words)


@dataclass
class SuiteResult:
    suite: str
    title: str
    commit: str
    outcomes: list[Outcome] = field(default_factory=list)
    note: str = ""

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)


def print_table(results: list[SuiteResult], out=sys.stdout) -> None:
    """The summary: one row per suite, then every test that did not pass, with its last words."""
    head = f"{'suite':34} {'passed':>6} {'failed':>6} {'hung':>5} {'skipped':>7} {'total':>5}  upstream commit"
    print("\n" + head, file=out)
    print("-" * len(head), file=out)
    for r in results:
        print(f"{r.title:34} {r.count('passed'):6} {r.count('failed'):6} {r.count('hung'):5} "
              f"{r.count('skipped'):7} {len(r.outcomes):5}  {r.commit[:12]}", file=out)
    for r in results:
        bad = [o for o in r.outcomes if o.status in ("failed", "hung")]
        if r.note:
            print(f"\n{r.title}: {r.note}", file=out)
        if not bad:
            continue
        print(f"\n{r.title}: not passed", file=out)
        for o in bad:
            why = f"[known: {o.known}]" if o.known else reason(o.detail)
            if o.status == "hung" and not o.known:
                why = f"no verdict within the limit; last output: {why}"
            print(f"  {o.status:6} {o.name}  ({o.seconds:.1f}s)  {why}", file=out)


_REASON = re.compile(r"(Error|Exception|assert|Timeout|refused|not-found|not-implemented|amqp:)", re.I)


def reason(detail: str) -> str:
    """One line saying why: the last line naming an error or assertion, else the last line."""
    lines = [line.strip() for line in detail.splitlines() if line.strip() and not line.strip().startswith("at ")]
    pytest_e = [line[1:].strip() for line in lines if line.startswith("E ")]  # pytest's error lines
    named = [line for line in lines if _REASON.search(line) and not line.startswith(("File ", "Traceback"))]
    return (pytest_e[-1:] or named or lines or [""])[-1][:240]


def write_json(results: list[SuiteResult], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in results], indent=1))


# ------------------------------------------------------------------------------------------ tools
def _run(cmd: list[str], timeout: float, **kw) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if done.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def ensure_tools() -> None:
    """Create the interop venv and node_modules on first use (a stamp names what is installed)."""
    stamp = VENV / ".raftmq-interop"
    wanted = "\n".join(PY_PACKAGES)
    if not stamp.exists() or stamp.read_text() != wanted:
        print(f"interop: installing {', '.join(PY_PACKAGES)} into {VENV}", flush=True)
        if not (VENV / "bin" / "python").exists():
            _run([sys.executable, "-m", "venv", str(VENV)], 300)
        _run([str(VENV / "bin" / "pip"), "install", "-q", *PY_PACKAGES], 900)
        stamp.write_text(wanted)
    if not shutil.which("node") or not shutil.which("npm"):
        raise HarnessError("node and npm are needed for rhea's examples (apt-get install nodejs npm)")
    if not (NPM / "node_modules" / "mocha" / "package.json").exists():
        print(f"interop: npm install {' '.join(NPM_PACKAGES)} into {NPM}", flush=True)
        NPM.mkdir(parents=True, exist_ok=True)
        _run(["npm", "install", "--prefix", str(NPM), "--no-audit", "--no-fund", *NPM_PACKAGES], 600)
    if not (RHEA_NPM / "node_modules" / "rhea" / "package.json").exists():
        print(f"interop: npm install rhea@3 into {RHEA_NPM}", flush=True)
        RHEA_NPM.mkdir(parents=True, exist_ok=True)
        _run(["npm", "install", "--prefix", str(RHEA_NPM), "--no-audit", "--no-fund", "rhea@3"], 600)


def venv_env(**extra: str) -> dict[str, str]:
    """The environment of an upstream program: the interop venv first on PATH (``python``,
    ``python3`` and the ``#!/usr/bin/env python`` scripts find proton there)."""
    env = dict(os.environ)
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(var, None)
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def venv_python() -> str:
    return str(VENV / "bin" / "python")


# ------------------------------------------------------------------------------------- upstream
def extract(mirror: str, dest: Path, tag: str | None = None) -> str:
    """Unpack the mirror's HEAD commit (its default branch), or ``tag``, into a fresh ``dest``; return
    the commit."""
    git_dir = MIRRORS / mirror / "repo"
    if not git_dir.exists():
        raise HarnessError(f"no mirror at {git_dir} (set RAFTMQ_INTEROP_MIRRORS)")
    # Resolve the symbolic HEAD first: some mirrors also have a branch literally named "HEAD".
    ref = f"refs/tags/{tag}" if tag else subprocess.run(
        ["git", f"--git-dir={git_dir}", "symbolic-ref", "-q", "HEAD"], capture_output=True, text=True
    ).stdout.strip() or "HEAD"
    commit = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", f"--git-dir={git_dir}", "archive", commit], stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as tf:
            tf.extractall(dest, filter="tar")
    return commit


# ----------------------------------------------------------------------------------- processes
@dataclass
class Run:
    returncode: int | None  # None: killed at the timeout
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_bounded(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float, log: Path) -> Run:
    """Run ``cmd`` in a new process group with stdout+stderr to ``log``; SIGKILL the whole group at
    ``timeout`` and, in any case, once the command has returned (its stray children with it)."""
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created: the command and its children
        except ProcessLookupError:
            pass
        if rc is None:
            proc.wait(timeout=10)
    return Run(rc, log.read_text(errors="replace"), time.monotonic() - started)


_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests? in", re.M)


def unittest_outcome(name: str, run: Run) -> Outcome:
    """One test run alone with ``python -m unittest -v ID``: its status from unittest's summary."""
    if run.timed_out:
        return Outcome(name, "hung", run.seconds, run.output[-1500:])
    ran = _UNITTEST_RAN.search(run.output)
    tail = run.output[run.output.rfind("\nRan "):] if ran else ""
    if run.returncode == 0 and ran and int(ran.group(1)) == 1:
        status = "skipped" if "skipped=1" in tail else "passed"
        return Outcome(name, status, run.seconds, "" if status == "passed" else run.output[-400:])
    body = run.output[:ran.start()] if ran else run.output  # the traceback, without the summary
    return Outcome(name, "failed", run.seconds, body[-1500:])


# ---------------------------------------------------------------------------------------- broker
def enter_private_netns(argv: list[str]) -> None:
    """Re-execute this runner in a new network namespace with only loopback (root), so that the
    broker can take the standard ports the upstream programs hard-code."""
    if os.environ.get(NETNS_ENV):
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        env = dict(os.environ, **{NETNS_ENV: "1"})
        os.execvpe("unshare", ["unshare", "--net", "--", sys.executable, "-m", "tests.interop", *argv], env)
    busy = [p for p in (AMQP_PORT, HTTP_PORT, TLS_PORT) if not _port_free(p)]
    if busy:
        raise HarnessError(f"not root (no private network namespace) and ports {busy} are in use on the host")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Broker:
    """A fresh raftmq (one node, or a 3-node cluster with node 1 on the standard ports) for one suite.

    ``settings``: TOML lines for every node (what the suite's documentation says its broker has).
    Clients always reach node 1 on 5672 (HTTP 15672, TLS 5671 when configured); in a cluster that
    node may be a follower, as a user's first node would be.
    """

    def __init__(self, work: Path, settings: list[str], *, cluster: bool = False, tls: tuple[Path, Path] | None = None):
        self.work = work
        self.cluster = cluster
        self.nodes: list[RaftmqNode] = []
        lines = list(settings)
        extra = ["--http-port", str(HTTP_PORT)]
        if tls:
            extra += ["--tls-port", str(TLS_PORT), "--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        if cluster:
            members = [("n1", AMQP_PORT, 4401), ("n2", 5682, 4402), ("n3", 5692, 4403)]
            lines.append('cluster_secret = "interop-secret-not-for-production"')
            for node_id, amqp, raft in members:
                lines += ["[[cluster]]", f'node_id = "{node_id}"', f'raft = "127.0.0.1:{raft}"',
                          f'amqp = "127.0.0.1:{amqp}"']
        config = work / "raftmq.toml"
        config.write_text("\n".join(lines) + "\n")
        if cluster:
            for i, (node_id, amqp, _raft) in enumerate(members):
                self.nodes.append(RaftmqNode(work / node_id, amqp, node_id=node_id, config=config,
                                             extra_args=extra if i == 0 else [], start_timeout=60))
        else:
            self.nodes.append(RaftmqNode(work / "n1", AMQP_PORT, config=config, extra_args=extra))

    def __enter__(self) -> Broker:
        self.start()
        return self

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            deadline = time.monotonic() + 60
            while True:  # a cluster answers AMQP before it has a leader: wait until a declare works
                try:
                    self.reset_queue("interop-ready")
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def fresh(self) -> None:
        """Stop, wipe the data directories, start again: after a test that hung or crashed, whose
        leftovers (a queue it never deleted, messages it never consumed) would fail the next one."""
        self.stop()
        for node in self.nodes:
            shutil.rmtree(node.data_dir, ignore_errors=True)
        self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        for node in self.nodes:
            node.terminate()

    def alive(self) -> bool:
        return all(node.is_alive() for node in self.nodes)

    def reset_queue(self, name: str) -> None:
        """Delete and re-declare the durable queue ``name`` (0-9-1), so that no test sees messages a
        previous one left behind (a hung test's queue, a failed test's undrained message)."""
        params = pika.ConnectionParameters("127.0.0.1", AMQP_PORT, credentials=pika.PlainCredentials("guest", "guest"),
                                           connection_attempts=3, retry_delay=0.5, socket_timeout=10,
                                           blocked_connection_timeout=10)
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.queue_delete(name)
            ch.queue_declare(name, durable=True)
        finally:
            conn.close()

    def log_paths(self) -> list[Path]:
        return [node.log_path for node in self.nodes]
