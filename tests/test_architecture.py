"""The package's shape: no import cycle between mlmkit's modules, and the subpackages in one
order of layers, each importing only those below it."""

from __future__ import annotations

import ast
from pathlib import Path

from runs import ROOT

SRC = ROOT / "src"

# The layers, lowest first (the design's "Where the next capabilities live"): a subpackage
# may import only those before it, at the top of a file or inside a function. errors.py
# sits below them all; the package's __main__ and its __init__ ("mlmkit") on top.
LAYERS = [
    "mlmkit.errors",
    "mlmkit.config",
    "mlmkit.masking",
    "mlmkit.model",
    "mlmkit.data",
    "mlmkit.training",
    "mlmkit.finetune",
    "mlmkit.evaluation",
    "mlmkit.embed",
    "mlmkit.export",
    "mlmkit.cli",
    "mlmkit.pretrain",
    "mlmkit.__main__",
    "mlmkit",
]


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_lines(path: Path, modules: set[str], src: Path = SRC) -> list[tuple[str, int]]:
    """``(mlmkit module, line)`` of each import in ``path``, at the top or inside functions;
    a relative import counts as the absolute one it stands for."""
    package = module_name(path, src).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "mlmkit":
                continue
            for alias in node.names:  # `from mlmkit.data import streaming` names a module
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in modules else base, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "mlmkit"]
    return [(m, line) for m, line in found if m in modules]


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The mlmkit modules ``path`` imports, at the top or inside functions."""
    return {m for m, _ in import_lines(path, modules)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
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
    files = {
        module_name(p): p
        for p in SRC.rglob("*.py")
        if "metric_modules" not in p.parent.parent.parts[-1:]
    }
    modules = set(files)
    # a package's __init__ importing its own modules is no cycle for them
    graph = {
        m: {d for d in imports_of(p, modules) if d != m and not m.startswith(d + ".")}
        for m, p in files.items()
    }
    assert len(graph) > 30
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# ---- the subpackages' layers -----------------------------------------------------------------


def layer_of(module: str) -> str:
    """The subpackage or top module ``module`` belongs to: mlmkit.data.loader -> mlmkit.data."""
    return ".".join(module.split(".")[:2])


def layer_imports(src: Path = SRC) -> list[tuple[str, str, str]]:
    """``(importing layer, imported layer, "file:line")`` of every import of one layer by
    another under ``src``, the metric scripts (loaded by path) included."""
    files = {module_name(p, src): p for p in sorted(src.rglob("*.py"))}
    modules = set(files) | {m.rsplit(".", 1)[0] for m in files if "." in m}
    edges = {}  # a dict, in order: one edge per import statement and layer it reaches
    for m, path in files.items():
        for target, line in import_lines(path, modules, src):
            if layer_of(target) != layer_of(m):
                edges[layer_of(m), layer_of(target), f"{path.relative_to(src)}:{line}"] = None
    return list(edges)


def mutual_imports(edges: list[tuple[str, str, str]]) -> list[str]:
    """One line per pair of layers that import each other, with where each side does."""
    where: dict[tuple[str, str], list[str]] = {}
    for a, b, at in edges:
        where.setdefault((a, b), []).append(at)
    return [
        f"{a} <-> {b}: {a} imports {b} at {', '.join(where[a, b])}; "
        f"{b} imports {a} at {', '.join(where[b, a])}"
        for a, b in sorted(where)
        if a < b and (b, a) in where
    ]


def later_imports(edges: list[tuple[str, str, str]], order: list[str]) -> list[str]:
    """One line per import of a layer that comes later in ``order`` than the importer."""
    rank = {layer: i for i, layer in enumerate(order)}
    return [f"{a} imports the later {b} at {at}" for a, b, at in edges if rank[b] > rank[a]]


def test_every_layer_has_its_place_in_the_order():
    layers = {layer_of(module_name(p)) for p in SRC.rglob("*.py")}
    assert layers - set(LAYERS) == set(), "place the new subpackage in LAYERS"
    assert len(layers) >= 10


def test_no_two_subpackages_import_each_other():
    mutual = mutual_imports(layer_imports())
    assert not mutual, "\n".join(mutual)


def test_subpackages_import_only_earlier_layers():
    edges = layer_imports()
    assert len(edges) > 50
    later = later_imports(edges, LAYERS)
    assert not later, "\n".join(later)


def test_the_layer_checker_rejects_a_planted_pair(tmp_path):
    for name, text in {
        "__init__.py": "",
        "errors.py": "",
        "config/__init__.py": "",
        "config/schema.py": "from mlmkit.errors import ConfigError\n\n\n"
        "def metrics():\n    from mlmkit.evaluation.names import METRICS\n",
        "evaluation/__init__.py": "",
        "evaluation/names.py": "from ..config import schema\n",
    }.items():
        path = tmp_path / "mlmkit" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    edges = layer_imports(tmp_path)
    assert sorted(edges) == [
        ("mlmkit.config", "mlmkit.errors", "mlmkit/config/schema.py:1"),
        ("mlmkit.config", "mlmkit.evaluation", "mlmkit/config/schema.py:5"),
        ("mlmkit.evaluation", "mlmkit.config", "mlmkit/evaluation/names.py:1"),
    ]
    assert mutual_imports(edges) == [
        "mlmkit.config <-> mlmkit.evaluation: mlmkit.config imports mlmkit.evaluation at "
        "mlmkit/config/schema.py:5; mlmkit.evaluation imports mlmkit.config at "
        "mlmkit/evaluation/names.py:1"
    ]
    assert later_imports(edges, LAYERS) == [
        "mlmkit.config imports the later mlmkit.evaluation at mlmkit/config/schema.py:5"
    ]
    assert later_imports([("mlmkit.evaluation", "mlmkit.config", "x.py:1")], LAYERS) == []


# Folders whose scripts run with the folder first on sys.path (``python benchmarks/x.py``,
# ``python train.py``, pytest's rootdir insertion for tests/): a module there named like a
# package would be imported in that package's place by any library that imports it, or that
# probes for it as an optional dependency (transformers' ``is_kernels_available`` found
# benchmarks/kernels.py and imported it as the ``kernels`` package).
SCRIPT_DIRS = ("", "benchmarks", "examples", "examples/slurm", "tests")


def optional_packages_probed() -> set[str]:
    """The top-level names transformers, accelerate, datasets and huggingface_hub look up as
    optional packages (they import one where it is found)."""
    import importlib
    import inspect
    import re

    found = set()
    for name in (
        "transformers.utils.import_utils",
        "accelerate.utils.imports",
        "datasets.config",
        "huggingface_hub.utils._runtime",
    ):
        source = inspect.getsource(importlib.import_module(name))
        found |= set(
            re.findall(r"""(?:_is_package_available|find_spec)\(\s*["']([\w.-]+)["']""", source)
        )
    return {n.split(".")[0] for n in found if n and not n.startswith(".")}


def test_no_script_folder_module_takes_the_name_of_a_package():
    import importlib.machinery
    import sys

    folders = {str((ROOT / d).resolve()) for d in SCRIPT_DIRS}
    elsewhere = [
        p for p in sys.path if p not in ("", ".") and str(Path(p).resolve()) not in folders
    ]
    taken = (
        optional_packages_probed() | set(sys.stdlib_module_names) | set(sys.builtin_module_names)
    )
    clashes = []
    for folder in SCRIPT_DIRS:
        for path in sorted((ROOT / folder).glob("*.py")):
            name = path.stem
            if name == "__init__":  # the package's own, never imported by that name
                continue
            if name in taken or importlib.machinery.PathFinder.find_spec(name, elsewhere):
                clashes.append(f"{folder or '.'}/{path.name}")
    assert "kernels" in taken  # the probe reads what it should
    assert not clashes, f"rename these: they shadow a package of that name: {clashes}"
