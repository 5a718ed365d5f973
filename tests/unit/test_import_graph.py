"""The package direction rules of docs/architecture.md and no import cycle between our modules.

Every import statement counts, including those inside functions and under TYPE_CHECKING:
a lazy import hides a cycle from the interpreter, not from a reader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the packages of the distribution
SHIPPED = ("core", "wire", "engines", "accounting", "gateway", "loadgen")
# package -> the packages of ours it may import (docs/architecture.md, "Packages and their direction")
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "wire": frozenset(),
    "engines": frozenset({"core", "wire"}),  # the simulated engine asks wire whether a port is free
    # the accounting child: its meters are engines'; never the gateway (process.py gets the
    # gateway's config as plain values from gateway/apportioner_cli.py)
    "accounting": frozenset({"core", "engines"}),
    "gateway": frozenset({"core", "wire", "engines", "accounting"}),
    "loadgen": frozenset({"core", "wire"}),
    "wattgate_cli": frozenset(),  # the root command reaches the packages by name only
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module of ours that `name` (a module or a name inside one) lives in, if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name an import in `tree` reaches: modules, and `module.attr` for from-imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from p import a` reaches the module p.a if there is one, else p (resolve())
            yield from (f"{base}.{a.name}" for a in node.names)


def sources(root: Path, packages: tuple[str, ...], files: tuple[str, ...] = ()
            ) -> dict[str, Path]:
    """module name -> file, for every module of `packages` and each of `files`."""
    paths = [p for pkg in packages for p in (root / pkg).rglob("*.py")]
    return {module_name(p, root): p for p in [*paths, *(root / f for f in files)]}


def imports(modules: Mapping[str, Path]) -> dict[str, frozenset[str]]:
    """module -> every dotted name its import statements reach."""
    return {name: frozenset(imported_names(ast.parse(path.read_text(), str(path)), name,
                                           path.name == "__init__.py"))
            for name, path in modules.items()}


def import_graph(root: Path, packages: tuple[str, ...], files: tuple[str, ...] = ()
                 ) -> dict[str, frozenset[str]]:
    """module -> the modules of ours it imports (itself excluded)."""
    modules = sources(root, packages, files)
    graph: dict[str, frozenset[str]] = {}
    for name, names in imports(modules).items():
        reached = {resolve(n, modules) for n in names}
        graph[name] = frozenset(m for m in reached if m is not None and m != name)
    return graph


def cycles(graph: Mapping[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((e for e in edges if e not in index or e in on_stack), None)
            if nxt is not None and nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                continue
            if nxt is not None:
                low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


@cache
def shipped_graph() -> dict[str, frozenset[str]]:
    return import_graph(ROOT, SHIPPED, ("wattgate_cli.py",))


def package_edges() -> list[tuple[str, str]]:
    """(importer, imported) for every import that crosses from one of our packages to another."""
    return [(m, o) for m, out in shipped_graph().items() for o in sorted(out)
            if m.split(".")[0] != o.split(".")[0]]


def test_cycle_finder_finds_a_cycle_through_three_modules_and_no_other() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a", "d"}),
             "d": frozenset({"e"}), "e": frozenset()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]


def test_graph_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from p.b import X\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    graph = import_graph(tmp_path, ("p",))
    assert graph["p.a"] == {"p.b"} and graph["p.b"] == {"p.a"}
    assert cycles(graph) == [frozenset({"p.a", "p.b"})]


def test_packages_import_only_downwards() -> None:
    """core and wire -> nothing of ours, engines -> {core, wire}, accounting -> {core,
    engines}, gateway -> {core, wire, engines, accounting}, loadgen -> {core, wire}, the root
    command -> nothing (it names subcommand modules as strings)."""
    wrong = [(m, o) for m, o in package_edges()
             if o.split(".")[0] not in MAY_IMPORT[m.split(".")[0]]]
    assert wrong == []


def test_nothing_shipped_imports_tests_or_bench() -> None:
    reached = imports(sources(ROOT, SHIPPED, ("wattgate_cli.py",)))
    offenders = [(m, n) for m, names in reached.items() for n in sorted(names)
                 if n.split(".")[0] in ("tests", "bench")]
    assert offenders == []


def test_bench_imports_nothing_of_tests() -> None:
    reached = imports(sources(ROOT, ("bench",)))
    offenders = [(m, n) for m, names in reached.items() for n in sorted(names)
                 if n.split(".")[0] == "tests"]
    assert offenders == []


def test_gateway_holds_no_accounting_package() -> None:
    """The accounting child's code is the top-level `accounting` package: the package tree
    shows the two processes."""
    assert not list((ROOT / "gateway" / "accounting").rglob("*.py"))
    assert (ROOT / "accounting" / "process.py").is_file()


def test_every_package_is_shipped_and_ruled() -> None:
    """A new top-level package must be added to SHIPPED, MAY_IMPORT and pyproject's list."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert on_disk == set(SHIPPED) == included
    assert set(MAY_IMPORT) == {*SHIPPED, "wattgate_cli"}
    assert set(SHIPPED) <= set(pyproject["tool"]["mypy"]["files"])


def test_no_import_cycle() -> None:
    assert cycles(shipped_graph()) == []
