"""The import graph of our packages: no cycles, and eviction policies on the standard library.

Every import counts, at module level, inside a function or under ``TYPE_CHECKING``: grimp
(import-linter's engine) reads them all. ``make lint`` checks the contracts in
pyproject.toml's ``[tool.importlinter]``; this checks what they cannot say: no cycle
between any two modules (a package's ``__init__`` and its own modules included, across
the top-level packages too), and no import by ``spoke.policy`` outside the standard library.
"""

from __future__ import annotations

import sys

import grimp
import pytest

PACKAGES = ("protocol", "service", "hub", "spoke", "loadtest")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module, and modules that
    import themselves (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        imported = graph.find_modules_directly_imported_by(module)
        for other in imported:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == module:
                    break
            if len(component) > 1 or module in imported:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def describe(graph: grimp.ImportGraph, component: list[str]) -> str:
    """A cycle's imports, one a line, with where each is made."""
    members = set(component)
    lines = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            details = graph.get_import_details(importer=importer, imported=imported)
            where = ", ".join(f"line {d['line_number']}" for d in details)
            lines.append(f"  {importer} -> {imported} ({where})")
    return "\n".join(lines)


def test_no_module_imports_one_that_imports_it_back(graph: grimp.ImportGraph) -> None:
    found = cycles(graph)
    report = "\n".join(describe(graph, component) for component in found)
    assert not found, f"{len(found)} import cycle(s):\n{report}"


def test_the_cycle_finder_finds_cycles() -> None:
    """The check above can fail: a cycle through a function-level import is found."""
    fake = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        fake.add_module(module)
    fake.add_import(importer="pkg.a", imported="pkg.b", line_number=3, line_contents="")
    fake.add_import(importer="pkg.b", imported="pkg.a", line_number=9, line_contents="")
    fake.add_import(importer="pkg.c", imported="pkg.a", line_number=1, line_contents="")
    assert cycles(fake) == [["pkg.a", "pkg.b"]]
    assert describe(fake, ["pkg.a", "pkg.b"]) == (
        "  pkg.a -> pkg.b (line 3)\n  pkg.b -> pkg.a (line 9)")


def test_eviction_policies_import_only_the_standard_library(graph: grimp.ImportGraph) -> None:
    policy = {"spoke.policy", *graph.find_descendants("spoke.policy")}
    outside = sorted(
        f"{importer} -> {imported}"
        for importer in policy
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported not in policy and imported.split(".")[0] not in sys.stdlib_module_names
    )
    assert not outside, outside
