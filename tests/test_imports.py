"""The import graph of anarchon_core, anarchon_celery, anarchon_dramatiq: no cycle, no private use.

The graph is read from the source with ``ast``: an edge for each import of
one of our modules, wherever it stands (its top level, ``if``/``try``
blocks, class bodies, and functions: an import inside a function runs when
the function does, and a cycle through it is a cycle all the same). Only
imports under ``if TYPE_CHECKING:`` are left out: they never run. Importing
``package.module`` is an edge to that module only, not to the package's
``__init__`` (which the package's own modules may import from freely).

A module uses only the public names of another: no ``from .x import _y``;
no ``x._y`` where ``x`` is a module or an object imported from another of
our modules (``Store._refusal`` read by the scheduler, say); and no
``obj._y`` on any object but ``self`` or ``cls`` when nothing in the module
itself defines ``_y`` (``scheduler._clock`` read by the metrics, say): a
private attribute that a module reads, it also defines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("anarchon_core", "anarchon_celery", "anarchon_dramatiq")

#: Cycles tolerated for a while (each to be broken, then removed from here): none.
KNOWN_CYCLES: set[frozenset[str]] = set()
#: Private names used across modules, tolerated in the same way (user, name used): none.
KNOWN_PRIVATE: set[tuple[str, str]] = set()


def modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def running_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` but those under ``if TYPE_CHECKING:`` (their ``else`` runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from running_nodes(other)
            continue
        yield child
        yield from running_nodes(child)


def runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that may run, at import time or when a function is called."""
    for node in running_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The module ``node`` imports from, made absolute."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``node``, in module ``name``, imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = _base(name, path, node)
    targets = set()
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in known:
            targets.add(submodule)
        elif base in known:
            targets.add(base)
    return targets


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    found = modules(root, packages)
    known = set(found)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        edges: set[str] = set()
        for node in runtime_imports(_parse(path)):
            edges |= imported(name, path, node, known)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of more than one module."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


#: Names that look private and are public APIs of the standard library
#: (``namedtuple``'s methods, ``os._exit``, ``sys._getframe``).
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"}


def _private(name: str) -> bool:
    if name in PUBLIC_UNDERSCORED:
        return False
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _defined(tree: ast.Module) -> set[str]:
    """Every name the module defines or binds: functions, classes, attributes, variables."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


@dataclass(frozen=True)
class PrivateUse:
    """Module ``user`` uses ``name`` (``module._name``, ``module.Object._attr``) at ``line``."""

    user: str
    name: str
    line: int

    def __str__(self) -> str:
        return f"{self.user}:{self.line} uses {self.name}"


def private_uses(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[PrivateUse]:
    """Where a module imports another's private name, reads a private attribute of a
    module or object it imported from another of our modules, or reads a private
    attribute of an object (not ``self`` or ``cls``) that the module does not define."""
    found = modules(root, packages)
    known = set(found)
    uses: list[PrivateUse] = []
    for name, path in found.items():
        tree = _parse(path)
        #: Local names bound by imports of our modules -> what they name ("module" or
        #: "module.Object"), for reading ``local._attr`` below.
        bound: dict[str, str] = {}
        for node in runtime_imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.asname:
                        bound[alias.asname] = alias.name
                continue
            base = _base(name, path, node)
            if base not in known and not any(m.startswith(f"{base}.") for m in known):
                continue  # not one of ours
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:  # a submodule (a private one of its own package is fine)
                    bound[alias.asname or alias.name] = target
                    continue
                if base != name and _private(alias.name):
                    uses.append(PrivateUse(name, target, node.lineno))
                bound[alias.asname or alias.name] = target
        for node in running_nodes(tree):
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
            ):
                owner = bound[node.value.id]
                home = owner if owner in known else owner.rpartition(".")[0]
                if home != name:
                    uses.append(PrivateUse(name, f"{owner}.{node.attr}", node.lineno))
                continue
            if (
                isinstance(node, ast.Attribute)
                and _private(node.attr)
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and node.attr not in _defined(tree)
            ):
                uses.append(PrivateUse(name, f"{ast.unparse(node.value)}.{node.attr}", node.lineno))
    return uses


def reexports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Per module, the names it only re-exports (``from .x import name as name``): kept
    importable from there for users, never imported from there by our own code."""
    found = modules(root, packages)
    result: dict[str, set[str]] = {}
    for name, path in found.items():
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.asname == alias.name:
                        result.setdefault(name, set()).add(alias.name)
    return result


def reexport_uses(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[PrivateUse]:
    """Where a module imports a name from a module that only re-exports it."""
    found = modules(root, packages)
    shims = reexports(root, packages)
    uses: list[PrivateUse] = []
    for name, path in found.items():
        for node in runtime_imports(_parse(path)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _base(name, path, node)
            for alias in node.names:
                if alias.name in shims.get(base, set()) and base != name:
                    uses.append(PrivateUse(name, f"{base}.{alias.name}", node.lineno))
    return uses


# -- the checks --------------------------------------------------------------


def test_the_graph_sees_the_imports() -> None:
    graph = import_graph()
    assert "anarchon_core.scheduler" in graph["anarchon_core"]
    assert "anarchon_celery.settings" in graph["anarchon_celery.tracking"]
    assert "anarchon_core.handoff" in graph["anarchon_dramatiq.middleware"]
    # An import inside a function counts (cli.py imports the dashboard when asked to serve it).
    assert "anarchon_core.dashboard" in graph["anarchon_core.cli"]
    # One under TYPE_CHECKING does not (it never runs).
    assert "anarchon_core.scheduler" not in graph["anarchon_core.metrics"]


def test_no_import_cycle() -> None:
    found = [c for c in cycles(import_graph()) if frozenset(c) not in KNOWN_CYCLES]
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_known_cycles_still_exist() -> None:
    """A known cycle that is gone is removed from KNOWN_CYCLES, so that it cannot come back."""
    present = {frozenset(c) for c in cycles(import_graph())}
    assert present >= KNOWN_CYCLES, f"gone, remove them: {KNOWN_CYCLES - present}"


def test_names_is_a_leaf() -> None:
    """The name checks import nothing of ours but errors.py, which imports nothing of ours."""
    graph = import_graph()
    assert graph["anarchon_core.names"] <= {"anarchon_core.errors"}
    assert graph["anarchon_core.errors"] == set()


def test_no_module_uses_the_private_names_of_another() -> None:
    found = [u for u in private_uses() if (u.user, u.name) not in KNOWN_PRIVATE]
    assert found == [], "private names used across modules: " + "; ".join(map(str, found))


def test_the_known_private_uses_still_exist() -> None:
    present = {(u.user, u.name) for u in private_uses()}
    assert present >= KNOWN_PRIVATE, f"gone, remove them: {KNOWN_PRIVATE - present}"


def test_our_code_imports_each_name_from_where_it_is_defined() -> None:
    found = reexport_uses()
    assert found == [], "names imported from a re-export: " + "; ".join(map(str, found))


# -- the checks check --------------------------------------------------------


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def _package(root: Path, files: dict[str, str]) -> tuple[str, ...]:
    for where, text in files.items():
        path = root / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return ("pkg",)


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    packages = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import B\n",
            "pkg/b.py": "B = 1\n\ndef late() -> None:\n    from .a import A  # noqa\n",
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .a import A\n"
                "else:\n    import pkg.b\n"
            ),
        },
    )
    graph = import_graph(tmp_path, packages)
    assert graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.c"] == {"pkg.b"}  # the TYPE_CHECKING branch never runs
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


@pytest.mark.parametrize(
    ("source", "name"),
    [
        ("from .a import _hidden\n", "pkg.a._hidden"),
        ("def f() -> None:\n    from pkg.a import _hidden\n", "pkg.a._hidden"),
        ("from . import a\nx = a._hidden\n", "pkg.a._hidden"),
        ("import pkg.a as a\nx = a._hidden\n", "pkg.a._hidden"),
        ("from .a import Thing\nx = Thing._refusal\n", "pkg.a.Thing._refusal"),
        ("def f(scheduler: object) -> None:\n    scheduler._clock.time()\n", "scheduler._clock"),
    ],
)
def test_a_private_name_used_across_modules_is_found(
    tmp_path: Path, source: str, name: str
) -> None:
    packages = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "_hidden = 1\n\nclass Thing:\n    _refusal = 2\n\nx = Thing._refusal\n",
            "pkg/b.py": source,
        },
    )
    assert [(u.user, u.name) for u in private_uses(tmp_path, packages)] == [("pkg.b", name)]


def test_an_import_from_a_re_export_is_found(tmp_path: Path) -> None:
    packages = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "VALUE = 1\n",
            "pkg/b.py": "from .a import VALUE as VALUE  # importable here as before\n",
            "pkg/c.py": "from .b import VALUE\nfrom .a import VALUE as OTHER\n",
        },
    )
    assert [(u.user, u.name) for u in reexport_uses(tmp_path, packages)] == [
        ("pkg.c", "pkg.b.VALUE")
    ]


def test_public_names_self_and_dunders_are_not_private_uses(tmp_path: Path) -> None:
    packages = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/_impl.py": "VALUE = 1\n",
            "pkg/a.py": "class Thing:\n    def f(self) -> int:\n        return self._x\n",
            "pkg/b.py": (
                "from . import _impl\nfrom .a import Thing\n"
                "y = Thing.__name__\nz = Thing.f\nv = _impl.VALUE\n"
                "class Own:\n    _seen = 0\n\n"
                "def f(other: Own, point: tuple[int, int]) -> object:\n"
                "    return other._seen, point._replace  # defined here; a namedtuple method\n"
            ),
        },
    )
    assert private_uses(tmp_path, packages) == []
