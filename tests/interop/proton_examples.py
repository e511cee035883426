"""Qpid Proton's Python examples (python/examples in apache/qpid-proton) against raftmq.

Driven by upstream's own ``test_examples.py``, unmodified, one test method per process
(``python -m unittest test_examples.ExamplesTest.NAME``): it starts the example programs (a sender
and a receiver, a server and a client, ...) and compares their output with what it expects.  The
examples' README asks for a broker that "allows anonymous connections and accepts links to and
from a node named 'examples'", and supports transactions and selectors; they connect to
localhost:5672, which several of them hard-code.  So: SASL ANONYMOUS on (as guest), a durable
queue ``examples`` re-created before each test.

The examples are taken from the release tag of the python-qpid-proton installed in the harness's venv
(0.40.0 today, the newest on PyPI): the default branch's examples already use API newer than any
release (``tx_send.py``'s ``Disposition.TRANSACTIONAL_STATE``) and fail inside the client.

The 11 test methods that need a broker are run.  The other six (``*_direct*``) connect the
examples to each other on port 8888 and never reach a broker: not run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .harness import Broker, SuiteResult, extract, run_bounded, unittest_outcome, venv_env, venv_python

NAME, TITLE, MIRROR = "proton", "Proton Python examples", "apache+qpid-proton"
SETTINGS = ['amqp10_anonymous_user = "guest"']
BROKERED = ["test_helloworld", "test_helloworld_blocking", "test_helloworld_tornado", "test_simple_send_recv",
            "test_client_server", "test_sync_client_server", "test_client_server_tx", "test_sync_client_server_tx",
            "test_db_send_recv", "test_tx_send_tx_recv", "test_selected_recv"]
PEER_TO_PEER = ["test_helloworld_direct", "test_helloworld_direct_tornado", "test_client_server_direct",
                "test_sync_client_server_direct", "test_simple_send_direct_recv", "test_direct_send_simple_recv"]


def installed_version() -> str:
    """The version of python-qpid-proton in the harness's venv, as its release tag names it."""
    code = "import proton; print('.'.join(map(str, proton.VERSION)))"
    return subprocess.run([venv_python(), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def run(work: Path, *, cluster: bool, timeout: float, only: str = "") -> SuiteResult:
    tree = work / "src"
    result = SuiteResult(NAME, TITLE, extract(MIRROR, tree, tag=installed_version()),
                         note=f"not run (peer to peer, no broker): {', '.join(PEER_TO_PEER)}")
    examples = tree / "python" / "examples"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with Broker(work / "broker", SETTINGS, cluster=cluster) as broker:
        for test in BROKERED:
            if only and only not in test:
                continue
            broker.reset_queue("examples")
            done = run_bounded([venv_python(), "-m", "unittest", "-v", f"test_examples.ExamplesTest.{test}"],
                               examples, venv_env(), timeout, logs / f"{test}.log")
            result.outcomes.append(unittest_outcome(test, done))
            print(f"  {NAME}: {test}: {result.outcomes[-1].status} ({done.seconds:.1f}s)", flush=True)
    return result
