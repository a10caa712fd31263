"""The import structure of ``src/topklab``: no import circles and no upward imports.

Every module's source is read as an AST (no module is imported), so imports inside functions and
under ``if TYPE_CHECKING:`` count like the ones at the top. Each ``topklab.*`` import is mapped to the
module it names and that module to its package (``topklab.engine.loop`` -> ``engine``; the top-level
modules ``topklab.cli`` and ``topklab.config`` are packages of their own, ``topklab/__init__.py`` is
``topklab``). The checks:

- every package stands in :data:`LAYERS`, and every name there is a package;
- a package imports only packages of lower layers (an import within a package is free; one to the
  same layer or a higher one fails);
- no circle among modules and none among packages.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from helpers import ROOT

SRC = ROOT / "src"
ROOT_PACKAGE = "topklab"

# Layers of src/topklab, lowest first: a package may import packages of lower layers only.
LAYERS = (
    ("compat", "utils"),  # the floor: torchvision shim, errors, io, seeds, device
    ("topklab",),  # topklab/__init__.py: runs the torchvision shim
    ("config", "smoothing"),  # configs/ and overrides (groups, parsing, sweeps, composition, recipe);
    # the hinge functions φ and SReLU's slopes, shared by operators and losses
    ("operators",),  # differentiable top-k / sorting operators
    ("losses",),  # individual and aggregate losses (use operators)
    ("models", "loggers", "sparsification"),  # networks; run loggers; sparse-feature selectors
    ("data",),  # datasets and loaders (embedding extraction uses models)
    ("tasks", "report"),  # what a model is trained for; result envelopes and tables
    ("engine",),  # build objects from a config, the training loop, the run record
    ("synthetic", "protocol"),  # experiments built on the engine
    ("launch",),  # Hydra's job callback, failure records, GPU pinning, resolver
    ("cli",),  # the checks train.py runs before Hydra starts
)


def module_files() -> dict[str, tuple[Path, bool]]:
    """``{module name: (file, is a package's __init__)}`` for every module under src/topklab."""
    modules = {}
    for path in sorted((SRC / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every dotted name an import statement anywhere in ``tree`` may name: ``import a.b`` -> a.b;
    ``from a import b`` -> a and a.b (b may be a submodule); relative imports made absolute."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def import_graph() -> dict[str, set[str]]:
    """``{module: the topklab modules it imports}``."""
    modules = module_files()
    graph = {}
    for module, (path, is_package) in modules.items():
        targets = set()
        for name in imported_names(ast.parse(path.read_text(), str(path)), module, is_package):
            parts = name.split(".")
            if parts[0] != ROOT_PACKAGE:
                continue
            while parts and ".".join(parts) not in modules:  # a name imported from a module -> the module
                parts.pop()
            if parts:
                targets.add(".".join(parts))
        graph[module] = {t for t in targets if t != module}
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_PACKAGE


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
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
                        found.append(sorted(component))
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages = defaultdict(set)
    for module, targets in graph.items():
        packages[package_of(module)].update(package_of(t) for t in targets if package_of(t) != package_of(module))
    return dict(packages)


GRAPH = import_graph()
LAYER = {package: level for level, names in enumerate(LAYERS) for package in names}


def test_every_package_has_one_layer():
    declared = [package for names in LAYERS for package in names]
    assert len(declared) == len(set(declared)), "a package stands in two layers"
    packages = {package_of(m) for m in GRAPH}
    assert packages - set(declared) == set(), "add these packages to LAYERS"
    assert set(declared) - packages == set(), "LAYERS names packages that do not exist"


def test_no_upward_imports():
    upward = sorted(
        f"{m} ({package_of(m)}, layer {LAYER[package_of(m)]}) imports {t} "
        f"({package_of(t)}, layer {LAYER[package_of(t)]})"
        for m, targets in GRAPH.items()
        for t in targets
        if package_of(t) != package_of(m) and LAYER[package_of(t)] >= LAYER[package_of(m)]
    )
    assert upward == [], "imports from a layer to the same or a higher one:\n" + "\n".join(upward)


def test_no_module_circles():
    assert circles(GRAPH) == []


def test_no_package_circles():
    assert circles(package_graph(GRAPH)) == []


def test_the_checks_see_imports_inside_functions_and_circles():
    tree = ast.parse("def f():\n    from topklab.engine.loop import Engine\n    from . import gpu\n")
    assert imported_names(tree, "topklab.launch.callback", False) >= {"topklab.engine.loop", "topklab.launch.gpu"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_package_imports_no_benchmark():
    """benchmarks/ lies beside the package, outside its wheel: nothing in src/topklab may import it."""
    importing = sorted(
        module
        for module, (path, is_package) in module_files().items()
        if any(
            name == "benchmarks" or name.startswith("benchmarks.")
            for name in imported_names(ast.parse(path.read_text()), module, is_package)
        )
    )
    assert importing == []
