"""No import circle under gateway/.

Modules that import each other, directly or around a loop, cannot be read, tested or replaced one at a
time: a door and its stream translator, a package and its implementations, each sit one above the other.
The graph is read from the source (no import runs): every ``import`` and ``from ... import`` naming a
gateway module counts, type-only ones under ``if TYPE_CHECKING:`` and ones inside functions included,
since two modules that need each other's names know each other either way. A package's ``__init__``
is the package. The request path sits on top and calls down into the shared services (runtime/),
which know it only through small protocols (runtime/drain.py's ``Open``, the doors' ``Answering``).

Nor does any import climb: gateway/README.md's floors put every package and top-level module on one
floor, top to bottom, and a module imports only what sits on a floor below its own (``UPWARD`` names the
few imports that may climb, and why).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
README = PACKAGE / "README.md"
MAX_LINES = 400
# The imports that may climb a floor: (the importing package or module, the module imported) -> why.
UPWARD = {
    ("gateway.policy", "gateway.measure.backend_stats"): "the decision (decide, evaluate, affinity) reads "
    "each backend's BackendView, and measure/ reads the compiled policy below it",
    ("gateway.policy", "gateway.measure.live"): "gateway check --live, asked for by gateway check",
    ("gateway.policy", "gateway.money.costs"): "the decision and the loader's price check use the one "
    "cost arithmetic, which prices a compiled backend",
}


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


def floors_in_readme(text: str) -> list[list[str]]:
    """The units on each floor, top first: the fenced block under the README's floors heading."""
    section = text.split("## Floors", 1)[1]
    block = re.search(r"^```\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block, "gateway/README.md has no floors block"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def unit_of(module: str) -> str:
    """The package or top-level module a module belongs to (``gateway.measure.stats``: gateway.measure)."""
    return ".".join(module.split(".")[:2])


def climbs(graph: dict[str, set[str]], floors: list[list[str]], top: str) -> list[str]:
    """Every import from a unit to one on its own floor or above, as ``a -> b``; UPWARD's are let through."""
    floor_of = {f"{top}.{name}": depth for depth, names in enumerate(floors) for name in names}
    found = []
    for module, imported in sorted(graph.items()):
        here = unit_of(module)
        for target in sorted(imported):
            there = unit_of(target)
            if here == there or top in (here, there) or (here, target) in UPWARD:
                continue
            if floor_of[there] <= floor_of[here]:
                found.append(f"{module} -> {target}")
    return found


def test_every_package_and_top_level_module_has_one_floor() -> None:
    floors = floors_in_readme(README.read_text(encoding="utf-8"))
    named = [name for names in floors for name in names]
    units = {unit_of(module) for module in module_files(PACKAGE)} - {"gateway"}
    assert sorted({n for n in named if named.count(n) > 1}) == [], "a unit is on two floors"
    assert sorted(units - {f"gateway.{n}" for n in named}) == [], "units on no floor of gateway/README.md"
    assert sorted({f"gateway.{n}" for n in named} - units) == [], "the floors name units that do not exist"


def test_no_import_climbs_a_floor() -> None:
    graph = import_graph(module_files(PACKAGE))
    floors = floors_in_readme(README.read_text(encoding="utf-8"))
    found = climbs(graph, floors, "gateway")
    assert not found, "imports from a floor up to one above it (or beside it): " + "; ".join(found)


def test_every_allowed_climb_is_still_taken() -> None:
    """An allowance no import uses any more is dropped, so the list says what the house really does."""
    graph = import_graph(module_files(PACKAGE))
    taken = {(unit_of(m), t) for m, imported in graph.items() for t in imported}
    assert sorted(set(UPWARD) - taken) == []


def test_no_module_is_over_400_lines() -> None:
    """A module that grows past 400 lines is split by concern: one that long holds more than one."""
    lengths = {path: len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")}
    over = sorted(f"{path.relative_to(PACKAGE)}: {n}" for path, n in lengths.items() if n > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def test_at_most_three_units_import_upward() -> None:
    assert len({(source, unit_of(target)) for source, target in UPWARD}) <= 3


@pytest.mark.parametrize(
    ("floors", "expected"),
    [
        ([["a"], ["b"], ["c"]], []),
        ([["c"], ["b"], ["a"]], ["pkg.a -> pkg.b", "pkg.a -> pkg.c.x", "pkg.b -> pkg.c.x"]),
        ([["a", "b"], ["c"]], ["pkg.a -> pkg.b"]),
    ],
    ids=["each import goes down", "imports that climb", "floor-mates may not import each other"],
)
def test_the_floors_find_an_import_that_climbs(
    tmp_path: Path, floors: list[list[str]], expected: list[str]
) -> None:
    package = tmp_path / "pkg"
    (package / "c").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n\ndef f():\n    from pkg.c.x import g\n")
    (package / "b.py").write_text("if TYPE_CHECKING:\n    from pkg.c.x import X\n")
    (package / "c" / "__init__.py").write_text("")
    (package / "c" / "x.py").write_text("import os\n")
    graph = import_graph(module_files(package))
    assert climbs(graph, floors, "pkg") == expected
