"""cli-proton-python's test suite (tests/test_integration.py in rh-messaging/cli-proton-python).

The suite tests the package's own sender/receiver/connector clients against a broker.  Upstream CI
(.github/workflows, .travis.yml) runs it as ``cd tests; python test_integration.py`` against
ActiveMQ Artemis on localhost:5672 with tests/.broker-00.xml: security disabled (anonymous
clients) and an anycast queue ``examples``.  So: SASL ANONYMOUS on (as guest), a durable queue
``examples`` re-created before each test (upstream relies on each test's tearDown draining it; a
hung or failed test would otherwise leave messages for the next).

Each test runs alone (unittest's runner on ``test_integration.CLASS.TEST`` from tests/, the
package's tree on PYTHONPATH as ``pip install .`` would give) under the runner's timeout.

Upstream CI also runs a qpid-dispatch router on 5673 (tests/.qdrouterd.conf): nothing listens on
5673 here.  ``CommandLineTests.test_send_receive_on_release`` sends through that router (it checks
that the router releases messages back to the sender) and ``test_timeout_sender`` expects the
sender to time out against it; the P2P tests connect the clients to each other on 8888.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .harness import (
    Broker,
    HarnessError,
    SuiteResult,
    extract,
    run_bounded,
    unittest_outcome,
    venv_env,
    venv_python,
)

NAME, TITLE, MIRROR = "cli", "cli-proton-python suite", "rh-messaging+cli-proton-python"
SETTINGS = ['amqp10_anonymous_user = "guest"']
ROUTER = "needs upstream CI's qpid-dispatch router on 5673, which no broker replaces"
# Tests that talk to that router, not to the broker: the sender to 5673 waits for link credit the
# router never gives until --timeout ends it (with nothing there it reconnects for ever); on_release
# checks that the router hands released messages back to the sender.
NEEDS_ROUTER = {"CommandLineTests.test_send_receive_on_release": ROUTER,
                "ControlOptionsTests.test_timeout_sender": ROUTER,
                "TxControlOptionsTests.test_timeout_sender": ROUTER}
_LIST = ("import json, unittest\n"
         "def ids(s):\n"
         "    for t in s:\n"
         "        yield from (ids(t) if isinstance(t, unittest.TestSuite) else [t.id()])\n"
         "print(json.dumps(list(ids(unittest.defaultTestLoader.loadTestsFromName('test_integration')))))\n")
# One test by id, with sys.argv left empty: the suite's option parsers read sys.argv (it is run as
# ``python test_integration.py``, with no arguments), so ``python -m unittest ID`` would feed them ID.
_ONE = ("import sys, unittest\n"
        "test_id = sys.argv.pop(1)\n"
        "result = unittest.TextTestRunner(verbosity=2).run(unittest.defaultTestLoader.loadTestsFromName(test_id))\n"
        "sys.exit(not result.wasSuccessful())\n")


def list_tests(tests_dir: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([venv_python(), "-c", _LIST], cwd=tests_dir, env=env, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise HarnessError(f"could not list cli-proton-python's tests: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(work: Path, *, cluster: bool, timeout: float, only: str = "") -> SuiteResult:
    tree = work / "src"
    result = SuiteResult(NAME, TITLE, extract(MIRROR, tree),
                         note=f"{len(NEEDS_ROUTER)} tests need a qpid-dispatch router on 5673 (upstream CI "
                              "has one; Debian does not package it): marked [known]")
    tests_dir = tree / "tests"
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = venv_env(PYTHONPATH=str(tree))
    with Broker(work / "broker", SETTINGS, cluster=cluster) as broker:
        for test_id in list_tests(tests_dir, env):
            name = test_id.removeprefix("test_integration.")
            if only and only not in name:
                continue
            broker.reset_queue("examples")
            done = run_bounded([venv_python(), "-c", _ONE, test_id], tests_dir, env, timeout,
                               logs / f"{name}.log")
            result.outcomes.append(unittest_outcome(name, done))
            if result.outcomes[-1].status in ("failed", "hung"):
                result.outcomes[-1].known = NEEDS_ROUTER.get(name, "")
            print(f"  {NAME}: {name}: {result.outcomes[-1].status} ({done.seconds:.1f}s)", flush=True)
    return result
