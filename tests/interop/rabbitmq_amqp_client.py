"""rabbitmq-amqp-python-client's pytest suite (RabbitMQ 4's own AMQP 1.0 client) against raftmq.

Upstream runs ``pytest .`` against RabbitMQ 4.2 in Docker (.ci/ubuntu/gha-setup.sh): AMQP on
localhost:5672, amqps on 5671 with .ci/certs (server_localhost_*), the management plugin on 15672,
user guest/guest, the stream plugin and an OAuth 2 backend (HS256 key in advanced.config).  Here:
the same ports (HTTP management API, TLS with the suite's own certificates), guest as
administrator (raftmq's default), and ``amqp10_rabbitmq_compat`` on (the client refuses a broker
whose open does not say RabbitMQ 4).  No OAuth 2 backend and no streams.

Each test runs in its own pytest process (ids from ``pytest --collect-only``) under the runner's
timeout: some of the client's failures are reconnect loops that swallow pytest-timeout's
exception, and one such loop must not stop the tests after it.  The tests clean up after
themselves (upstream runs them in one process against one broker), so the broker is shared.
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from .harness import (
    Broker,
    HarnessError,
    Outcome,
    Run,
    SuiteResult,
    extract,
    run_bounded,
    venv_env,
    venv_python,
)

NAME, TITLE, MIRROR = "rmq", "rabbitmq-amqp-python-client suite", "rabbitmq+rabbitmq-amqp-python-client"
SETTINGS = ["amqp10_rabbitmq_compat = true"]
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def list_tests(tree: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([venv_python(), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    ids = [line.strip() for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    if not ids:
        raise HarnessError(f"could not collect rabbitmq-amqp-python-client's tests:\n{done.stdout[-2000:]}{done.stderr[-1000:]}")
    return ids


def _outcome(test_id: str, done: Run, junit: Path) -> Outcome:
    """The test's status from its JUnit XML (a test and its teardown error are one test here)."""
    if done.timed_out:
        return Outcome(test_id, "hung", done.seconds, done.output[-1500:])
    status, detail = "", ""
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if case.find("skipped") is not None:
                this, text = "skipped", case.find("skipped").get("message", "")
            elif bad is not None:
                this, text = "failed", f"{bad.get('message', '')}\n{bad.text or ''}"
            else:
                this, text = "passed", ""
            if not status or _RANK[this] > _RANK[status]:
                status, detail = this, text
    if not status:
        return Outcome(test_id, "failed", done.seconds, done.output[-1500:])
    return Outcome(test_id, status, done.seconds, detail[-1500:])


def run(work: Path, *, cluster: bool, timeout: float, only: str = "") -> SuiteResult:
    tree = work / "src"
    result = SuiteResult(NAME, TITLE, extract(MIRROR, tree))
    certs = tree / ".ci" / "certs"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = venv_env(PYTHONPATH=str(tree))
    with Broker(work / "broker", SETTINGS, cluster=cluster,
                tls=(certs / "server_localhost_certificate.pem", certs / "server_localhost_key.pem")):
        for i, test_id in enumerate(list_tests(tree, env)):
            if only and only not in test_id:
                continue
            junit = logs / f"{i:03d}.xml"
            done = run_bounded([venv_python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                                test_id], tree, env, timeout, logs / f"{i:03d}.log")
            result.outcomes.append(_outcome(test_id, done, junit))
            print(f"  {NAME}: {test_id}: {result.outcomes[-1].status} ({done.seconds:.1f}s)", flush=True)
    return result
