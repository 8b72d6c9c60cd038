"""The package's modules import each other without a cycle: every import counts, at the top of a
module, inside a function or under TYPE_CHECKING (issue 13: a structure that shows the architecture)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of `package` (a folder under `root`)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        files[name.removesuffix(".__init__")] = path
    return files


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file (`from a import b` counts as
    the module a.b when there is one, else as a)."""
    files = module_files(root, package)
    graph = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, here)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps |= {full} if full in files else ({base} if base in files else set())
        graph[name] = deps - {name}
    return graph


def _absolute(node: ast.ImportFrom, here: str) -> str:
    if not node.level:
        return node.module or ""
    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
    return ".".join([*parts, *([node.module] if node.module else [])])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One closed path (first module repeated last) through each strongly connected group of modules."""
    found = []
    for group in _components(graph):
        start = min(group)
        found.append([start, *_path(graph, group, start), start])
    return found


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Groups of two or more modules that reach each other (Kosaraju: two depth-first passes)."""
    order: list[str] = []
    seen: set[str] = set()
    for v in sorted(graph):
        _visit(v, lambda u: sorted(graph[u]), seen, order)
    reverse: dict[str, set[str]] = {v: set() for v in graph}
    for v, deps in graph.items():
        for w in deps:
            reverse[w].add(v)
    groups, seen = [], set()
    for v in reversed(order):
        if v not in seen:
            group: list[str] = []
            _visit(v, lambda u: sorted(reverse[u]), seen, group)
            if len(group) > 1:
                groups.append(set(group))
    return groups


def _visit(v: str, nexts: Callable[[str], list[str]], seen: set[str], out: list[str]) -> None:
    """Depth-first from `v` (iteratively), appending each module to `out` once all it reaches is done."""
    if v in seen:
        return
    seen.add(v)
    stack = [(v, iter(nexts(v)))]
    while stack:
        u, it = stack[-1]
        w = next((w for w in it if w not in seen), None)
        if w is None:
            stack.pop()
            out.append(u)
        else:
            seen.add(w)
            stack.append((w, iter(nexts(w))))


def _path(graph: dict[str, set[str]], group: set[str], start: str) -> list[str]:
    """The modules of a shortest path inside `group` from `start` back to it, `start` left out."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        ahead = []
        for u in frontier:
            if start in graph[u]:
                path = [u]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[-2::-1]
            for w in sorted(graph[u] & group):
                if w not in parent and w != start:
                    parent[w] = u
                    ahead.append(w)
        frontier = ahead
    raise ValueError(f"{start} is on no cycle")


def test_the_package_has_no_import_cycle() -> None:
    found = cycles(import_graph(ROOT, "edgefl"))
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_subpackages_form_no_cycle_either() -> None:
    """Layers, not just modules: no subpackage (sim, devices, methods, executors, ...) or top-level
    module reaches back into itself through another one."""
    graph = import_graph(ROOT, "edgefl")
    top = {name: ".".join(name.split(".")[:2]) for name in graph}
    layers = {top[a]: set() for a in graph}
    for a, deps in graph.items():
        layers[top[a]] |= {top[b] for b in deps if b in top and top[b] != top[a]}
    found = cycles(layers)
    assert not found, "cycles between subpackages: " + "; ".join(" -> ".join(c) for c in found)


def test_the_schema_is_a_leaf_and_the_executors_do_not_import_the_experiment() -> None:
    graph = import_graph(ROOT, "edgefl")
    # the registries' packages import it, never the reverse: it reaches only the registry helper
    # (which loads plugins' knob sections) and the error type
    assert _reach(graph, "edgefl.config") == {"edgefl.registry", "edgefl.errors"}
    for name in (n for n in graph if n.startswith("edgefl.executors")):
        reached = _reach(graph, name)
        assert not {m for m in reached if m.startswith("edgefl.experiment")}, name


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_a_cycle_is_found_and_named(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n")  # inside a function
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
                              "def g(): ...\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # imports into the cycle, not part of it
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    (pkg / "c.py").write_text("def g(): ...\n")
    assert cycles(import_graph(tmp_path, "pkg")) == []
