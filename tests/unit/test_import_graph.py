"""The import graph of the source tree: no cycles, and the layering of issue 33 as data.

Every module of protocol/, store/, raft/, node/, ops/, spark/, client/ and the top-level raftmq/*.py
is parsed with ``ast`` (nothing is imported, so the test needs no optional dependency and runs in a
fraction of a second); relative imports and ``raftmq.x`` imports are resolved to the tree's files.

Which imports are edges, and why:

- **Cycles** count every import that runs: at module level (including inside ``try`` or an ordinary
  ``if``) and inside a function body.  A function-local import that closes a cycle hides the cycle,
  it does not remove it (the two modules still need each other, only the order of loading changed),
  so it counts.  Imports under ``if TYPE_CHECKING:`` do not count: they never run, and they are the
  sanctioned way for a module to name another's types in annotations only (issue 33: "No import
  cycles between modules" is about the modules that load each other).
- **Layering rules** count every import, ``TYPE_CHECKING`` ones included: a rule says what a layer
  may know of, and an annotation naming ``raftmq.store`` inside raft/ is the log knowing the store.

A rule that today's tree still breaks is marked ``xfail(strict=True)`` with the reason: strict, so
that it turns red the day the tree is fixed and the mark must go.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The top-level folders and the package they install as (pyproject's package-dir).
FOLDERS = ("protocol", "store", "raft", "node", "ops", "spark", "client")


class Kind(Enum):
    """Where an import statement sits, which decides what it counts for (module docstring)."""

    MODULE = "module level"
    FUNCTION = "function-local"
    TYPE_CHECKING = "if TYPE_CHECKING"


@dataclass(frozen=True)
class Import:
    """One imported name as written, resolved: ``target`` is a module of the tree or an external one."""

    source: str  # importing module, dotted (raftmq.node.broker)
    target: str  # imported module, dotted; for the tree, the deepest module that exists
    line: int
    kind: Kind
    internal: bool  # target is a module of the tree


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the tree (generated protobuf code included)."""
    files: dict[str, Path] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(("raftmq", *parts))] = path
    for path in sorted((ROOT / "raftmq").glob("*.py")):
        name = "raftmq" if path.stem == "__init__" else f"raftmq.{path.stem}"
        files[name] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, Kind]]:
    """Every import statement of a module with where it sits; TYPE_CHECKING wins over FUNCTION."""

    def walk(node: ast.AST, kind: Kind) -> Iterator[tuple[ast.Import | ast.ImportFrom, Kind]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, kind
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, Kind.FUNCTION if kind is Kind.MODULE else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), Kind.TYPE_CHECKING)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, Kind.MODULE)


def _resolve(name: str, modules: dict[str, Path]) -> tuple[str, bool]:
    """The deepest module of the tree that ``name`` names (``raftmq.x.Class`` -> ``raftmq.x``)."""
    if name == "raftmq" or name.startswith("raftmq."):
        parts = name.split(".")
        while parts:
            candidate = ".".join(parts)
            if candidate in modules:
                return candidate, True
            parts.pop()
    return name, False


@cache
def imports() -> tuple[Import, ...]:
    """Every import of the tree, resolved."""
    modules = _module_files()
    found: list[Import] = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        for stmt, kind in _statements(tree):
            if isinstance(stmt, ast.Import):
                names = [alias.name for alias in stmt.names]
            else:
                if stmt.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (stmt.level - 1)]
                    base = ".".join(base_parts + ([stmt.module] if stmt.module else []))
                else:
                    base = stmt.module or ""
                # `from pkg import sub` imports the module pkg.sub when there is one, else a name of pkg.
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                         for alias in stmt.names]
            for name in names:
                target, internal = _resolve(name, modules)
                if target != module:
                    found.append(Import(module, target, stmt.lineno, kind, internal))
    return tuple(found)


def _graph() -> dict[str, dict[str, Import]]:
    """module -> {imported module -> first import that makes the edge}, internal edges that run."""
    graph: dict[str, dict[str, Import]] = {}
    for imp in imports():
        if imp.internal and imp.kind is not Kind.TYPE_CHECKING:
            graph.setdefault(imp.source, {}).setdefault(imp.target, imp)
    return graph


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components of more than one module, i.e. the cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def _describe(component: list[str], graph: dict[str, dict[str, Import]]) -> str:
    """One shortest cycle through the component's first module, each edge with its file and line."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in parents:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child in members and child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    path = [start]
    while True:
        path.append(parents[path[-1]])
        if path[-1] == start:
            break
    path.reverse()
    steps = []
    for source, target in zip(path, path[1:], strict=False):
        imp = graph[source][target]
        steps.append(f"  {_file(source)}:{imp.line} ({imp.kind.value}) imports {target}")
    extra = f"\n  (the cycle's component: {', '.join(component)})" if len(component) > len(path) - 1 else ""
    return " -> ".join(path) + "\n" + "\n".join(steps) + extra


def _file(module: str) -> str:
    return str(_module_files()[module].relative_to(ROOT))


def cycles() -> list[str]:
    """Every import cycle, described; empty when there is none."""
    graph = _graph()
    return [_describe(component, graph) for component in _strongly_connected(graph)]


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


@dataclass(frozen=True)
class Layer:
    """A layering rule of issue 33: the modules under ``modules`` import nothing under ``forbidden``
    (modules of the tree or outside it, by dotted prefix), annotations included."""

    name: str
    modules: tuple[str, ...]
    forbidden: tuple[str, ...]
    broken_today: str | None = None  # why it still fails: the test is a strict xfail until fixed

    def violations(self) -> list[Import]:
        return [imp for imp in imports() if _under(imp.source, self.modules) and _under(imp.target, self.forbidden)]


LAYERS = (
    Layer("raft/ is a log: it knows nothing of the store, the node or ops",
          ("raftmq.raft",), ("raftmq.store", "raftmq.node", "raftmq.ops")),
    Layer("store/core is pure: no storage, no log, no node, no I/O, clock, thread or randomness",
          ("raftmq.store.core",),
          ("lmdb", "raftmq.store.disk", "raftmq.raft", "raftmq.node", "raftmq.ops",
           "os", "threading", "socket", "time", "asyncio", "random")),
    Layer("protocol/ is wire formats only: no store, log, node or ops",
          ("raftmq.protocol",), ("raftmq.store", "raftmq.raft", "raftmq.node", "raftmq.ops"),
          broken_today="protocol/*/neutral.py register their property codecs with store/core/message.py "
                       "and use store/core/values.py; protocol/amqp10/filter_view.py uses "
                       "store/core/filters/view.py"),
)


# ---------------------------------------------------------------------------- the tree


def test_the_graph_covers_the_tree():
    """Guards the other tests against passing on an empty graph: every folder is parsed, and
    relative, ``raftmq.x``, ``from pkg import module`` and TYPE_CHECKING imports resolve to the
    modules they name (edges of today's tree, chosen to be stable)."""
    modules = _module_files()
    for folder in FOLDERS:
        assert any(name.startswith(f"raftmq.{folder}.") for name in modules), folder
    edges = {(imp.source, imp.target, imp.kind) for imp in imports() if imp.internal}
    assert len(edges) > 500
    assert ("raftmq.node.amqp10.links", "raftmq.node.amqp10.session", Kind.MODULE) in edges  # from .session
    assert ("raftmq.node.broker", "raftmq.store.core.commands", Kind.MODULE) in edges  # raftmq.store.core.x
    assert ("raftmq.node.amqp10.links", "raftmq.store.core.ranges", Kind.MODULE) in edges  # from pkg import mod
    assert ("raftmq.node.status", "raftmq.node.broker", Kind.TYPE_CHECKING) in edges


def test_no_import_cycles():
    """Issue 33: "No import cycles between modules".  Counts module-level and function-local imports,
    not ``if TYPE_CHECKING`` ones (module docstring); names each cycle with the file and line of every
    import in it."""
    found = cycles()
    assert not found, "import cycles:\n\n" + "\n\n".join(found)


@pytest.mark.parametrize("layer", [
    pytest.param(layer, id=layer.modules[0].removeprefix("raftmq."),
                 marks=[pytest.mark.xfail(strict=True, reason=layer.broken_today)] if layer.broken_today else [])
    for layer in LAYERS])
def test_layering(layer: Layer):
    """Issue 33 "How we will check it": raft/ imports nothing from store/, node/ or ops/; store/'s core
    imports no lmdb (nor storage, the log, the node, or the modules of I/O, clocks, threads and
    randomness: the state machine is pure); and the brief's rule that protocol/ knows only wire
    formats.  Every import counts, TYPE_CHECKING and function-local ones too."""
    found = sorted({(_file(imp.source), imp.line, imp.kind.value, imp.target) for imp in layer.violations()})
    assert not found, f"{layer.name}:\n" + "\n".join(f"  {f}:{line} ({kind}) imports {target}"
                                                        for f, line, kind, target in found)


# ---------------------------------------------------------------------------- the tools themselves


def _kinds(source: str) -> list[tuple[str, Kind]]:
    tree = ast.parse(source)
    return [(ast.unparse(stmt), kind) for stmt, kind in _statements(tree)]


def test_import_kinds_are_classified_by_where_they_sit():
    """The classification the cycle test relies on: TYPE_CHECKING (plain or ``typing.``, its else
    branch runs), function and method bodies, and module level inside try/if/class."""
    source = """
import a
from typing import TYPE_CHECKING
import typing
try:
    import b
except ImportError:
    b = None
if TYPE_CHECKING:
    import c
    def f():
        import d
else:
    import e
if typing.TYPE_CHECKING:
    import g
class K:
    import h
    def m(self):
        import i
async def co():
    import j
"""
    assert _kinds(source) == [
        ("import a", Kind.MODULE), ("from typing import TYPE_CHECKING", Kind.MODULE), ("import typing", Kind.MODULE),
        ("import b", Kind.MODULE), ("import c", Kind.TYPE_CHECKING), ("import d", Kind.TYPE_CHECKING),
        ("import e", Kind.MODULE), ("import g", Kind.TYPE_CHECKING), ("import h", Kind.MODULE),
        ("import i", Kind.FUNCTION), ("import j", Kind.FUNCTION)]


def test_a_cycle_is_found_and_named():
    """The cycle finder on a made-up graph: a three-module ring (closed by a function-local import)
    beside an acyclic tail is reported once, as its shortest cycle with each import's kind."""
    def edge(source: str, target: str, kind: Kind = Kind.MODULE) -> Import:
        return Import(source, target, 1, kind, True)

    graph = {"raftmq.node.broker": {"raftmq.node.status": edge("raftmq.node.broker", "raftmq.node.status")},
             "raftmq.node.status": {"raftmq.node.peer": edge("raftmq.node.status", "raftmq.node.peer")},
             "raftmq.node.peer": {"raftmq.node.broker": edge("raftmq.node.peer", "raftmq.node.broker", Kind.FUNCTION),
                                  "raftmq.node.auth": edge("raftmq.node.peer", "raftmq.node.auth")}}
    components = _strongly_connected(graph)
    assert components == [["raftmq.node.broker", "raftmq.node.peer", "raftmq.node.status"]]
    description = _describe(components[0], graph)
    assert description.startswith(
        "raftmq.node.broker -> raftmq.node.status -> raftmq.node.peer -> raftmq.node.broker\n")
    assert "node/peer.py:1 (function-local) imports raftmq.node.broker" in description
    assert _strongly_connected({"raftmq.node.peer": graph["raftmq.node.peer"]}) == []


if __name__ == "__main__":  # pragma: no cover - a developer's view: python tests/unit/test_import_graph.py
    for description in cycles():
        print(description, end="\n\n")
