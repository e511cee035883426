"""Every Python package of the source tree is listed in pyproject.toml, so that a non-editable install
(the Docker image, a wheel) contains it: the editable install of `make test` finds unlisted
subpackages by path and would not notice (node/core was missing from the list once)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, directory in setuptools["package-dir"].items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join([package, *relative.parts]))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
