"""No import circle under gateway/.

Modules that import each other, directly or around a loop, cannot be read, tested or replaced one at a
time: a door and its stream translator, a package and its implementations, each sit one above the other.
The graph is read from the source (no import runs): every ``import`` and ``from ... import`` naming a
gateway module counts, type-only ones under ``if TYPE_CHECKING:`` and ones inside functions included,
since two modules that need each other's names know each other either way. A package's ``__init__``
is the package. The request path sits on top and calls down into the shared services (runtime.py),
which know it only through small protocols (request/drain.py's ``Open``, the doors' ``Answering``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"


def module_files(package: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's gateway imports, each named by the module (or package) that owns the name."""

    def owner(name: str) -> str:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    top = min(files, key=len)  # the package itself
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against this module's package
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target.split(".")[0] == top and (found := owner(target)) and found != name:
                    graph[name].add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of more than one module (Tarjan's, iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.add(member)
                    if member == node:
                        break
                if len(part) > 1:
                    found.append(part)
    return found


def ties(graph: dict[str, set[str]], part: set[str]) -> str:
    return "; ".join(f"{a} -> {b}" for a in sorted(part) for b in sorted(graph[a] & part))


def test_no_import_circle_under_gateway() -> None:
    graph = import_graph(module_files(PACKAGE))
    found = circles(graph)
    assert not found, "import circle(s): " + " | ".join(ties(graph, part) for part in found)


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        ({"a": "from pkg import b", "b": "from pkg.c import x", "c": "import pkg.a"}, [{"a", "b", "c"}]),
        ({"a": "from pkg import b", "b": "if TYPE_CHECKING:\n    from pkg.a import A"}, [{"a", "b"}]),
        ({"a": "def f():\n    from . import b", "b": "from .a import f"}, [{"a", "b"}]),
        ({"a": "from pkg import b", "b": "from pkg import c", "c": "import os"}, []),
    ],
    ids=[
        "a loop of three",
        "type-only imports count",
        "relative and function-local imports count",
        "a chain",
    ],
)
def test_the_walk_finds_a_circle_of_any_kind_of_import(
    tmp_path: Path, sources: dict[str, str], expected: list[set[str]]
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in sources.items():
        (package / f"{name}.py").write_text(source + "\n")
    graph = import_graph(module_files(package))
    assert [{m.removeprefix("pkg.") for m in part} for part in circles(graph)] == expected
