"""``python -m tests.interop [SUITE ...] [--cluster]``: run AMQP 1.0 client suites against raftmq.

Suites: proton (Proton's Python examples), rhea (rhea's examples), cli (cli-proton-python's
suite), rmq (rabbitmq-amqp-python-client's suite); all four by default.  Prints one row per suite
(passed / failed / hung / skipped by the suite) and every test that did not pass; writes the
same as JSON to WORK/results.json.  Exit status: 0 when every test that ran passed or was
skipped by its suite, 1 otherwise, 2 when the harness itself could not run.  See
tests/interop/README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import cli_proton_python, harness, proton_examples, rabbitmq_amqp_client, rhea_examples

SUITES = {m.NAME: m for m in (proton_examples, rhea_examples, cli_proton_python, rabbitmq_amqp_client)}
# Per-test limits (seconds): each is many times what a passing test takes here (under 5 s).
TIMEOUTS = {"proton": 40.0, "rhea": 30.0, "cli": 20.0, "rmq": 45.0}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.interop", description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"any of {', '.join(SUITES)} (default: all)")
    parser.add_argument("--cluster", action="store_true", help="a 3-node cluster (clients use node 1) instead of one node")
    parser.add_argument("--work", default="/tmp/raftmq-interop", help="upstream trees, broker data and logs")
    parser.add_argument("--timeout", type=float, default=0, help="per-test limit in seconds (default: per suite)")
    parser.add_argument("--setup-only", action="store_true", help="install the interop venv and npm packages, run nothing")
    parser.add_argument("-k", "--only", default="", help="run only the tests whose name contains this")
    args = parser.parse_args(argv)
    names = args.suites or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}: choose from {', '.join(SUITES)}")
    if args.setup_only or not os.environ.get(harness.NETNS_ENV):
        try:  # before the network namespace, which has no route to the package registries
            harness.ensure_tools()
        except harness.HarnessError as e:
            print(f"interop: {e}", file=sys.stderr)
            return 2
        if args.setup_only:
            return 0
    try:
        harness.enter_private_netns(argv)  # re-executes itself once (root); returns inside
    except harness.HarnessError as e:
        print(f"interop: {e}", file=sys.stderr)
        return 2
    work = Path(args.work)
    results = []
    for name in names:
        module = SUITES[name]
        print(f"interop: {module.TITLE} ({'3-node cluster' if args.cluster else 'one node'})", flush=True)
        started = time.monotonic()
        try:
            results.append(module.run(work / name, cluster=args.cluster, timeout=args.timeout or TIMEOUTS[name],
                                      only=args.only))
        except harness.HarnessError as e:
            print(f"interop: {name}: {e}", file=sys.stderr)
            return 2
        print(f"interop: {module.TITLE}: {time.monotonic() - started:.0f} s", flush=True)
    harness.print_table(results)
    harness.write_json(results, work / "results.json")
    print(f"\nlogs: {work}/<suite>/logs, broker logs: {work}/<suite>/broker; JSON: {work / 'results.json'}")
    return 0 if all(r.count("failed") + r.count("hung") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
