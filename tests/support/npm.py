"""npm packages for the tests that drive a Node.js client (rhea, amqplib): installed once into a
cache shared by every run (``RAFTMQ_NPM_CACHE``, default ~/.cache/raftmq-test-npm), the test
skipped where node, npm or the registry is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def npm_cache() -> Path:
    return Path(os.environ.get("RAFTMQ_NPM_CACHE", Path.home() / ".cache" / "raftmq-test-npm"))


def npm_package(name: str, version: str) -> Path:
    """The cache directory holding ``name@version`` (its node_modules is the NODE_PATH), installed
    now if it is not there yet; skips the calling test when that cannot be done."""
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip(f"node and npm are needed for the {name} tests")
    cache = npm_cache()
    if not (cache / "node_modules" / name / "package.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["npm", "install", "--prefix", str(cache), "--no-audit", "--no-fund",
                                 f"{name}@{version}"], capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            pytest.skip(f"npm could not install {name}: {result.stderr[-500:]}")
    return cache
