"""Every protocol's message property codec registered with the core, as a node registers them
(node/core/formats.py): unit tests drive the state machine without a node.

And the suite's split over pytest-xdist workers (``make test`` runs ``-n 2 --dist loadgroup``: the
CI machine's two cores, most tests waiting on broker processes, elections and fsyncs): every test
goes to a group named after its file, so a module's fixtures (a node, a cluster, a Spark session)
start once; tests that need something one machine has only one of share a group and so run one
after another: network namespaces and iptables (tests/chaos, the namespaced node of
test_login_hardening.py) and the Spark JVM (tests/spark, one session for all its files)."""

from __future__ import annotations

from pathlib import Path

import pytest

import raftmq.node.core.formats  # noqa: F401

_HERE = Path(__file__).parent
SERIAL_GROUPS = {
    "chaos": "netns",
    "integration/test_login_hardening.py": "netns",
    "spark": "spark",
}


def xdist_group_of(path: Path) -> str:
    """The xdist group of a test file: a shared one for what must not run at once, else the file."""
    relative = path.relative_to(_HERE).as_posix()
    for prefix, group in SERIAL_GROUPS.items():
        if relative == prefix or relative.startswith(prefix + "/"):
            return group
    return relative


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's xdist group (see the module docstring); an explicit xdist_group marker wins."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            try:
                group = xdist_group_of(Path(str(item.path)))
            except ValueError:  # a test outside tests/ (none today)
                continue
            item.add_marker(pytest.mark.xdist_group(group))
