"""Celery end to end: a real worker process consuming from the broker under test, tasks sent with .delay().

The worker is ``celery -A <tasks module> worker --pool=solo --concurrency=1`` in a subprocess, with the
broker URL of the session's ``broker`` fixture (py-amqp transport: basic.consume with manual acks and
prefetch, reference 1.8.3.3 / 1.8.3.1) and the ``rpc://`` result backend, which sends each result as a
message to a reply queue of the caller (an auto-delete queue with x-expires). Each test module run uses
its own task queue, so stale messages from an earlier run cannot reach this worker. The worker is ended
by PID (SIGTERM, then SIGKILL after a short grace period) when the module is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import uniq

celery = pytest.importorskip("celery")

RESULT_TIMEOUT = 20.0  # seconds a test waits for one task's result
READY_TIMEOUT = 30.0  # seconds for the worker process to connect and report ready

TASKS_MODULE = textwrap.dedent('''\
    """Tasks for tests/integration/test_celery.py (written to a temporary directory by the test)."""
    import os

    from celery import Celery

    app = Celery("raftmq_celery_tasks", broker=os.environ["RAFTMQ_CELERY_BROKER"], backend="rpc://")
    app.conf.update(
        task_default_queue=os.environ["RAFTMQ_CELERY_QUEUE"],
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=3,
        result_expires=60,
    )


    @app.task(name="raftmq.add")
    def add(x, y):
        return x + y


    @app.task(name="raftmq.fail")
    def fail(message):
        raise ValueError(message)


    @app.task(name="raftmq.echo")
    def echo(payload):
        return payload
''')


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no worker log)"


class Worker:
    """The celery worker subprocess (its own process group, ended by PID)."""

    def __init__(self, workdir: Path, broker_url: str, queue: str) -> None:
        self.workdir = workdir
        self.log_path = workdir / "worker.log"
        self.env = dict(os.environ, RAFTMQ_CELERY_BROKER=broker_url, RAFTMQ_CELERY_QUEUE=queue,
                        PYTHONUNBUFFERED="1", PYTHONPATH=str(workdir))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        celery_bin = Path(sys.executable).with_name("celery")  # the venv's console script
        launcher = [str(celery_bin)] if celery_bin.exists() else [sys.executable, "-m", "celery"]
        cmd = [*launcher, "-A", "raftmq_celery_tasks", "worker", "--pool=solo", "--concurrency=1", "--loglevel=INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", f"{uniq('w')}@%h"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery worker exited with {self.proc.returncode}\n{tail(self.log_path)}")
            if b" ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"celery worker not ready within {READY_TIMEOUT}s\n{tail(self.log_path)}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGTERM asks for a warm shutdown; celery takes several seconds over it even when idle (with
        # RabbitMQ as with raftmq), so it gets a short grace period and then SIGKILL -- by PID.
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def celery_env(broker, tmp_path_factory) -> Iterator[tuple]:
    """The worker, plus the tasks module imported in this process (same broker, same queue) as the caller."""
    workdir = tmp_path_factory.mktemp("celery")
    (workdir / "raftmq_celery_tasks.py").write_text(TASKS_MODULE)
    queue = uniq("celery")
    worker = Worker(workdir, broker.url, queue)
    worker.start()
    old = {k: os.environ.get(k) for k in ("RAFTMQ_CELERY_BROKER", "RAFTMQ_CELERY_QUEUE")}
    os.environ.update(RAFTMQ_CELERY_BROKER=broker.url, RAFTMQ_CELERY_QUEUE=queue)
    sys.path.insert(0, str(workdir))
    try:
        import raftmq_celery_tasks as tasks  # written above: it only exists at run time
        try:
            yield tasks, worker
        finally:
            tasks.app.close()  # the caller's pooled broker connections
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("raftmq_celery_tasks", None)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        worker.stop()


def check_worker(worker: Worker) -> str:
    return f"worker log tail:\n{tail(worker.log_path)}"


def test_delay_returns_the_result(celery_env):
    """add.delay(2, 3): the task message goes to the worker's queue, the worker runs it and the result
    comes back through the rpc:// backend's reply queue."""
    tasks, worker = celery_env
    result = tasks.add.delay(2, 3)
    try:
        assert result.get(timeout=RESULT_TIMEOUT) == 5
    except Exception as e:  # noqa: BLE001 - add the worker's log to whatever went wrong
        pytest.fail(f"{e!r}\n{check_worker(worker)}")
    assert result.successful()


def test_task_exception_comes_back_to_the_caller(celery_env):
    """A task that raises: the failure travels back as the result; get() re-raises it."""
    tasks, worker = celery_env
    result = tasks.fail.delay("boom from the worker")
    with pytest.raises(ValueError, match="boom from the worker"):
        result.get(timeout=RESULT_TIMEOUT, propagate=True)
    assert result.state == "FAILURE", check_worker(worker)


def test_many_tasks_each_answered_once(celery_env):
    """30 tasks sent at once all complete, each with its own result (matched by task id through the
    rpc:// reply queue); the worker's queue is empty afterwards."""
    tasks, worker = celery_env
    payloads = [{"i": i, "text": "é" * (i % 5), "blob": "x" * (i * 100)} for i in range(30)]
    results = [tasks.echo.delay(p) for p in payloads]
    deadline = time.monotonic() + RESULT_TIMEOUT
    got = []
    for res in results:
        got.append(res.get(timeout=max(0.1, deadline - time.monotonic())))
    assert got == payloads, check_worker(worker)
    with tasks.app.connection_for_write() as conn:
        _name, count, _consumers = conn.default_channel.queue_declare(
            os.environ["RAFTMQ_CELERY_QUEUE"], passive=True)
    assert count == 0
