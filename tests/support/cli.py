"""Run the ``raftmq`` command line as a user would (a subprocess of this interpreter)."""

from __future__ import annotations

import subprocess
import sys


def raftmq(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True, text=True, timeout=timeout)
