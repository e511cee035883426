"""Writes the generated protocol modules from the spec tables: ``python -m raftmq.protocol.codegen``.

One generator per protocol (``amqp091/_generate.py``, ...), each a ``render()`` returning the source of
one module and a ``TARGET`` path relative to this package.  The generated modules are checked in (the way
pamqp ships its generated classes) so that type checkers and editors see real class statements;
``--check`` (and the unit test ``tests/unit/protocol/test_codegen.py``) fails when a checked-in file
differs from what its generator writes, so nobody edits them by hand.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from .amqp010 import _generate as gen010
from .amqp091 import _generate as gen091
from .amqp10 import _generate as gen10

PACKAGE_DIR = Path(__file__).resolve().parent


def generators() -> list[ModuleType]:
    """The generator modules, each with ``TARGET`` and ``render()``."""
    return [gen091, gen010, gen10]


def rendered() -> dict[Path, Callable[[], str]]:
    """Target path -> function returning the source that belongs there."""
    return {PACKAGE_DIR / g.TARGET: g.render for g in generators()}


def stale() -> list[Path]:
    """The generated files whose content differs from what their generator writes now."""
    out = []
    for path, render in rendered().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != render():
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = parser.parse_args(argv)
    if args.check:
        paths = stale()
        for path in paths:
            print(f"out of date: {path}", file=sys.stderr)
        return 1 if paths else 0
    for path, render in rendered().items():
        source = render()
        if not path.exists() or path.read_text(encoding="utf-8") != source:
            path.write_text(source, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
