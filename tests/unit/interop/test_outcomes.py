"""The interop harness's verdicts (tests/interop): how each runner turns what an upstream test run
printed into passed / failed / hung / skipped.  Pure parsing, no broker: the verdicts are the
harness's whole output, and a wrong one (a crash read as a pass, a timeout as a failure) would
mislead whoever reads the table."""

from __future__ import annotations

from pathlib import Path

from tests.interop import rabbitmq_amqp_client, rhea_examples
from tests.interop.harness import Run, reason, unittest_outcome


def test_unittest_verdicts() -> None:
    """unittest's summary of a one-test run: OK, OK (skipped=1), FAILED; no summary at the timeout."""
    ok = Run(0, "test_x ... ok\n\n----\nRan 1 test in 0.1s\n\nOK\n", 0.1)
    skipped = Run(0, "test_x ... skipped 'known issue'\n\n----\nRan 1 test in 0.0s\n\nOK (skipped=1)\n", 0.1)
    failed = Run(1, "FAIL: test_x\nTraceback\nAssertionError: 2 != 1\n\n----\nRan 1 test in 0.2s\n\nFAILED (failures=1)\n", 0.2)
    hung = Run(None, "test_x ... ", 20.0)
    none_ran = Run(0, "----\nRan 0 tests in 0.0s\n\nOK\n", 0.1)  # a wrong id is not a pass
    assert unittest_outcome("x", ok).status == "passed"
    assert unittest_outcome("x", skipped).status == "skipped"
    assert unittest_outcome("x", failed).status == "failed"
    assert reason(unittest_outcome("x", failed).detail) == "AssertionError: 2 != 1"
    assert unittest_outcome("x", hung).status == "hung"
    assert unittest_outcome("x", none_ran).status == "failed"


def test_mocha_verdicts() -> None:
    """mocha's spec reporter: "1 passing", "1 pending", a failure, and its own timeout counted as hung."""
    verdict = rhea_examples._outcome
    assert verdict("t", Run(0, "  brokered examples\n    ok helloworld\n\n  1 passing (1s)\n", 1)).status == "passed"
    assert verdict("t", Run(0, "  0 passing\n  1 pending\n", 1)).status == "skipped"
    assert verdict("t", Run(1, "  0 passing\n  1 failing\n  AssertionError: 'a' == 'b'\n", 1)).status == "failed"
    assert verdict("t", Run(1, "  1 failing\n  Error: Timeout of 30000ms exceeded.\n", 30)).status == "hung"
    assert verdict("t", Run(None, "", 45)).status == "hung"


def test_pytest_junit_verdicts(tmp_path: Path) -> None:
    """A test that passed but whose teardown errored is one failed test; a crash without XML fails."""
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_x" time="0.5"/>'
                     '<testcase classname="tests.test_a" name="test_x" time="0.1"><error message="teardown">'
                     'boom</error></testcase></testsuite></testsuites>')
    verdict = rabbitmq_amqp_client._outcome
    assert verdict("tests/test_a.py::test_x", Run(1, "", 1), junit).status == "failed"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_a" name="test_x" time="0.5">'
                     '<skipped message="no streams"/></testcase></testsuite></testsuites>')
    assert verdict("tests/test_a.py::test_x", Run(0, "", 1), junit).status == "skipped"
    assert verdict("tests/test_a.py::test_x", Run(-11, "Fatal Python error", 1), tmp_path / "none.xml").status == "failed"
    assert rabbitmq_amqp_client.crashed(Run(-11, "", 1)) and not rabbitmq_amqp_client.crashed(Run(1, "", 1))
