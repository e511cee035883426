"""rhea's examples (examples/ in amqp/rhea) against raftmq.

Driven by upstream's own ``examples/test_examples.js`` (mocha, as its ``npm run run-examples``),
unmodified, one ``it`` of its "brokered examples" group per mocha process (``--grep``); the
"direct examples" group connects examples to each other and never reaches a broker: not run.
The examples use localhost:5672 and the node ``examples`` (selector, queue browser, send and
receive) or the topic address ``topic://PRICE.STOCK.NYSE.RHT`` (pub-sub, ActiveMQ/Artemis
convention); they connect without credentials, i.e. SASL ANONYMOUS.  So: ANONYMOUS on (as guest),
a durable queue ``examples`` re-created before each test, rhea 3 from the npm registry (the
integration tests' copy) and minimist/mocha (rhea's devDependencies) on NODE_PATH.

Mocha's own per-test timeout is set to the runner's (its default of 2 s is for a fast machine);
a test that exceeds it, or a mocha that does not exit, is "hung".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .harness import NPM, RHEA_NPM, Broker, Outcome, SuiteResult, extract, run_bounded

NAME, TITLE, MIRROR = "rhea", "rhea examples", "amqp+rhea"
SETTINGS = ['amqp10_anonymous_user = "guest"']
BROKERED = ["helloworld", "send and receive", "client/server", "selector", "pub-sub", "queue browser"]


def _outcome(name: str, done) -> Outcome:
    if done.timed_out or "Timeout of" in done.output:
        return Outcome(name, "hung", done.seconds, done.output[-1500:])
    if done.returncode == 0 and re.search(r"^\s*1 passing", done.output, re.M):
        return Outcome(name, "passed", done.seconds)
    if done.returncode == 0 and re.search(r"^\s*1 pending", done.output, re.M):
        return Outcome(name, "skipped", done.seconds, done.output[-400:])
    return Outcome(name, "failed", done.seconds, done.output[-1500:])


def run(work: Path, *, cluster: bool, timeout: float, only: str = "") -> SuiteResult:
    tree = work / "src"
    result = SuiteResult(NAME, TITLE, extract(MIRROR, tree), note="not run (no broker): the 'direct examples' group")
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    mocha = NPM / "node_modules" / "mocha" / "bin" / "mocha"
    env = dict(os.environ, NODE_PATH=f"{RHEA_NPM / 'node_modules'}{os.pathsep}{NPM / 'node_modules'}")
    with Broker(work / "broker", SETTINGS, cluster=cluster) as broker:
        for test in BROKERED:
            if only and only not in test:
                continue
            broker.reset_queue("examples")
            cmd = ["node", str(mocha), "--exit", "--timeout", str(int(timeout * 1000)),
                   "--grep", f"^brokered examples {re.escape(test)}$", "examples/test_examples.js"]
            done = run_bounded(cmd, tree, env, timeout + 15, logs / f"{test.replace('/', '_')}.log")
            result.outcomes.append(_outcome(test, done))
            print(f"  {NAME}: {test}: {result.outcomes[-1].status} ({done.seconds:.1f}s)", flush=True)
    return result
