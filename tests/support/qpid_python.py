"""Apache Qpid's Python 0-10 client (qpid.messaging, qpid.connection), made importable for the tests.

The client is third-party code and is not committed: the tests take the ``qpid-python`` 1.36.0-1
sdist from the package index (the last release; Python 2 only), check its sha256, unpack the two
packages it needs (``qpid/``, ``mllib/``) into a temporary directory and apply
``tests/interop/qpid_python3.patch``: 2to3's mechanical output plus the hand edits Python 3 needs
(bytes on the wire, rich comparisons for ``Serial``, ``inspect.getargspec`` gone, ``sgmllib``
gone). The patch ports, it never changes what the client sends or expects of a broker.

Why not ``pip download``: pip runs the sdist's ``setup.py egg_info`` first, which is Python 2
(``raise E, msg``) and fails before the file is kept. So the file is fetched from the index's
simple API (PEP 503, the one pip uses), from ``PIP_INDEX_URL`` when set, and cached in
``$XDG_CACHE_HOME/raftmq-tests`` (``~/.cache``). ``RAFTMQ_QPID_PYTHON_SDIST`` may name a local copy.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

SDIST = "qpid-python-1.36.0-1.tar.gz"
SHA256 = "1a341981723a7980163e6d33530f29133433742f6f9b5b12b46d5d239548afee"
PATCH = Path(__file__).resolve().parents[1] / "interop" / "qpid_python3.patch"
PACKAGES = ("qpid", "mllib")


class Unavailable(RuntimeError):
    """The sdist could not be had (no index reachable, wrong checksum)."""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raftmq-tests"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _download(target: Path) -> None:
    index = (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/qpid-python/", timeout=60) as answer:
            page = answer.read().decode()
        link = next((href for href in re.findall(r'href="([^"]+)"', page) if SDIST in href), None)
        if link is None:
            raise Unavailable(f"{SDIST} is not listed by {index}/qpid-python/")
        link = urllib.parse.urljoin(f"{index}/qpid-python/", link.split("#", 1)[0])
        with urllib.request.urlopen(link, timeout=120) as answer:
            data = answer.read()
    except OSError as exc:
        raise Unavailable(f"cannot fetch {SDIST} from {index}: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != SHA256:
        raise Unavailable(f"{SDIST} from {index} does not have the expected sha256")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(target)


def sdist() -> Path:
    """The checked sdist: the local copy named by RAFTMQ_QPID_PYTHON_SDIST, the cache, or the index."""
    local = os.environ.get("RAFTMQ_QPID_PYTHON_SDIST")
    path = Path(local) if local else _cache_dir() / SDIST
    if not path.exists():
        if local:
            raise Unavailable(f"RAFTMQ_QPID_PYTHON_SDIST={local} does not exist")
        _download(path)
    if _sha256(path) != SHA256:
        raise Unavailable(f"{path} does not have the sha256 of {SDIST}")
    return path


def prepare(workdir: Path) -> Path:
    """Unpack qpid/ and mllib/ into ``workdir`` and apply the Python 3 patch; the directory to put
    on sys.path."""
    root = workdir / "qpid-python"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    prefix = SDIST[: -len(".tar.gz")] + "/"
    with tarfile.open(sdist()) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(prefix) and m.name[len(prefix):].split("/", 1)[0] in PACKAGES
                   and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(root, members=members, filter="data")
    # GNU patch where it is installed, else git (which applies a plain diff outside a repository).
    tool = (["patch", "-p1", "--quiet", "--batch", "-i", str(PATCH)] if shutil.which("patch")
            else ["git", "apply", "-p1", str(PATCH)])
    applied = subprocess.run(tool, cwd=root, capture_output=True, text=True)
    if applied.returncode != 0:
        raise RuntimeError(f"{PATCH.name} does not apply: {applied.stdout}{applied.stderr}")
    return root


def require(tmp_path_factory) -> None:
    """For a session-scoped fixture: make qpid importable, or skip when the sdist cannot be had --
    except under CI (``CI`` set), where a missing client must fail, not pass as skipped."""
    import pytest

    try:
        importable(tmp_path_factory.mktemp("qpid-python"))
    except Unavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


def importable(workdir: Path) -> None:
    """Make ``import qpid.messaging`` work in this process (once per test session)."""
    if "qpid.messaging" in sys.modules:
        return
    sys.path.insert(0, str(prepare(workdir)))
    import qpid.messaging  # noqa: F401  (fails here, not in a test, if the patch is wrong)
