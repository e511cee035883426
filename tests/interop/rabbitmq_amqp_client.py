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
themselves (upstream runs them in one process against one broker), so the broker is shared; after a
test that hung or crashed (and so did not clean up: test_disconnection_reconnection_async leaves
thousands of messages in the queue the synchronous variant counts) the broker is started afresh.
A test whose client process crashed (a segfault in the client's vendored proton) is run once more.
The suite's TLS certificates expired on 2026-03-31: expired ones are replaced (fresh_certificates).
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


def fresh_certificates(certs: Path) -> bool:
    """Replace the suite's test certificates when they have expired (or expire within a day).

    Its .ci/certs were made by tls-gen on 2025-02-27 with a validity of about 13 months, so from
    2026-03-31 on its TLS tests fail against any broker ("certificate verify failed").  Same file
    names, same subjects and SAN (localhost), a new CA; the tests read ca_certificate.pem and
    client_localhost_{certificate,key}.pem, the broker uses server_localhost_*.  Returns True when
    the certificates were replaced.
    """
    server = certs / "server_localhost_certificate.pem"
    if subprocess.run(["openssl", "x509", "-checkend", "86400", "-noout", "-in", str(server)],
                      capture_output=True).returncode == 0:
        return False

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=certs, capture_output=True, check=True, timeout=60)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=raftmq interop test CA",
        "-keyout", "ca_key.pem", "-out", "ca_certificate.pem")
    (certs / "san.ext").write_text("subjectAltName=DNS:localhost\n")
    for who in ("server", "client"):
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=localhost/O={who}",
            "-keyout", f"{who}_localhost_key.pem", "-out", f"{who}.csr")
        ssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca_certificate.pem", "-CAkey", "ca_key.pem",
            "-CAcreateserial", "-days", "825", "-extfile", "san.ext", "-out", f"{who}_localhost_certificate.pem")
    return True


def crashed(done: Run) -> bool:
    """The client process died of a signal (its vendored proton segfaults now and then when an
    object is freed on another thread than the one using it: ``_wrapper.py __del__``)."""
    return not done.timed_out and (done.returncode < 0 or "Fatal Python error" in done.output)


def run(work: Path, *, cluster: bool, timeout: float, only: str = "") -> SuiteResult:
    tree = work / "src"
    result = SuiteResult(NAME, TITLE, extract(MIRROR, tree))
    certs = tree / ".ci" / "certs"
    notes = []
    if fresh_certificates(certs):
        notes.append("the suite's .ci/certs had expired: new ones made (same names and subjects)")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = venv_env(PYTHONPATH=str(tree))
    with Broker(work / "broker", SETTINGS, cluster=cluster,
                tls=(certs / "server_localhost_certificate.pem", certs / "server_localhost_key.pem")) as broker:
        for i, test_id in enumerate(list_tests(tree, env)):
            if only and only not in test_id:
                continue
            junit = logs / f"{i:03d}.xml"
            cmd = [venv_python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", test_id]
            done = run_bounded(cmd, tree, env, timeout, logs / f"{i:03d}.log")
            known = ""
            if crashed(done):  # once more, on a fresh broker: the crash is the client's, not a verdict
                broker.fresh()
                junit.unlink(missing_ok=True)
                done = run_bounded(cmd, tree, env, timeout, logs / f"{i:03d}-retry.log")
                known = "the client crashed (segfault) on the first run; this is the retry" + \
                        (", which crashed too" if crashed(done) else "")
                notes.append(f"{test_id}: client crashed, run again")
            result.outcomes.append(_outcome(test_id, done, junit))
            result.outcomes[-1].known = known if result.outcomes[-1].status in ("failed", "hung") else ""
            print(f"  {NAME}: {test_id}: {result.outcomes[-1].status} ({done.seconds:.1f}s)", flush=True)
            if done.timed_out or crashed(done):
                broker.fresh()
    result.note = "; ".join(notes)
    return result
