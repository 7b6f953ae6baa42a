"""The package's shape: no import cycle between mlmkit's modules."""

from __future__ import annotations

import ast
from pathlib import Path

from runs import ROOT

SRC = ROOT / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The mlmkit modules ``path`` imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlmkit"):
            for alias in node.names:  # `from mlmkit.data import streaming` names a module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mlmkit")}
    return {m for m in found if m in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_no_import_cycle_between_modules():
    # the metric scripts under metric_modules/<name>/ are loaded by path, not imported
    files = {module_name(p): p for p in SRC.rglob("*.py")
             if "metric_modules" not in p.parent.parent.parts[-1:]}
    modules = set(files)
    # a package's __init__ importing its own modules is no cycle for them
    graph = {m: {d for d in imports_of(p, modules) if d != m and not m.startswith(d + ".")}
             for m, p in files.items()}
    assert len(graph) > 30
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
