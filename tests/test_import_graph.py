"""No import cycles anywhere in slurm_tpu, and no import that runs up its layers, function-level imports included.

The layers (LAYERS, below: base, protocol, records, families, config, slurm, access,
energy, hooks, detect/render, runner, ops, cli, harness) say what may know what: a module
imports from its own layer and those below it, never from one above.

The graph is read from the source with ``ast`` (nothing is imported): every
``import``/``from ... import`` of a slurm_tpu module is an edge, classed by where
it sits: at module level, inside a function (runs on first call: a cycle there
still means two modules that cannot be understood, or loaded, apart), or under
``if TYPE_CHECKING:`` (annotations only, never run). Runtime edges, module- or
function-level, must form no cycle; type-checking edges are listed apart and
may point back (a type named in an annotation is not a dependency at run time).

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else
to ``pkg`` (whose ``__init__`` runs). Importing ``a.b.c`` also runs ``a.b``'s
``__init__``: an edge to each package on the way that is not already one of
the importer's own packages (those run before the importer itself).

The product also imports nothing from the test and demo harness (``harness/``, not
in the wheel): an installed node has no harness to import.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parent.parent / "slurm_tpu"
HARNESS = PACKAGE.parent / "harness"  # tests and demo only: never shipped, never imported by the product

MODULE, FUNCTION, TYPE_CHECKING_ONLY = "module", "function", "type-checking"


class Edge(NamedTuple):
    source: str
    target: str
    kind: str  # MODULE, FUNCTION or TYPE_CHECKING_ONLY
    where: str  # file:line, for the failure message


def modules_of(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``package`` (a package is its __init__)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module):
    """(node, kind) for every import statement, classed by where it sits."""

    def walk(node: ast.AST, kind: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for inner in child.body:
                    yield from walk(ast.Module(body=[inner], type_ignores=[]), TYPE_CHECKING_ONLY)
                for inner in child.orelse:
                    yield from walk(ast.Module(body=[inner], type_ignores=[]), kind)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, FUNCTION if kind == MODULE else kind)
            else:
                yield from walk(child, kind)

    yield from walk(tree, MODULE)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The slurm_tpu modules one import statement loads."""
    named: list[str] = []
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        for alias in node.names:
            submodule = f"{origin}.{alias.name}"
            named.append(submodule if submodule in known else origin)
    targets = []
    own_packages = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + (1 if is_package else 0) + 1)}
    for name in named:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            # The packages on the way run first, unless they are the importer's own (already
            # running); the module named is always an edge (``from . import name`` included).
            implicit_and_running = i < len(parts) and prefix in own_packages
            if prefix in known and prefix != module and not implicit_and_running and prefix not in targets:
                targets.append(prefix)
    return targets


def import_edges(package: Path) -> list[Edge]:
    """Every import of one of ``package``'s modules by another, with its kind and place."""
    modules = modules_of(package)
    known = set(modules)
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, kind in _imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", known):
                edges.append(Edge(module, target, kind, f"{path.relative_to(package.parent)}:{node.lineno}"))
    return edges


def find_cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges, in order) per strongly connected group of modules (Tarjan)."""
    graph: dict[str, list[Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
        graph.setdefault(edge.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:  # recursion depth is bounded by the package's size
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph[node]:
            if edge.target not in index:
                connect(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in on_stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or any(e.target == node for e in graph[node]):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_cycle_in(group, graph) for group in groups]


def _cycle_in(group: set[str], graph: dict[str, list[Edge]]) -> list[Edge]:
    """A shortest cycle through the group's first member (breadth-first, inside the group)."""
    start = min(group)
    came_by: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target not in group:
                    continue
                if edge.target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return path
                if edge.target not in came_by:
                    came_by[edge.target] = edge
                    following.append(edge.target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def describe(cycle: list[Edge]) -> str:
    """``a -> b (a.py:3, module) -> a (b.py:9, function)``."""
    return cycle[0].source + "".join(f" -> {e.target} ({e.where}, {e.kind})" for e in cycle)


def registry_edges(package: Path) -> list[Edge]:
    """The family registry's edges: ``families/__init__.py`` loads each name in its
    ``MODULES`` tuple with ``import_module``, which no import statement shows."""
    path = package / "families" / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets):
            names = ast.literal_eval(node.value)
            return [
                Edge(
                    f"{package.name}.families",
                    f"{package.name}.families.{name}",
                    MODULE,
                    f"{path.relative_to(package.parent)}:{node.lineno}",
                )
                for name in names
            ]
    raise AssertionError(f"{path} has no MODULES tuple: the registry moved; teach this test where")


def runtime(edges: list[Edge]) -> list[Edge]:
    return [edge for edge in edges if edge.kind != TYPE_CHECKING_ONLY]


def imports_of(package: Path, top: str) -> list[str]:
    """``file:line module`` for every import in ``package`` of the top-level package ``top`` (or a module
    of it): ``import top.x``, ``from top.x import y``, and ``import_module("top.x")`` with a literal name.
    Type-checking imports count too: the product must not name the harness at all."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif (
                isinstance(node, ast.Call)
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            ):
                names = [node.args[0].value]
            found += [
                f"{path.relative_to(package.parent)}:{node.lineno} {name}"
                for name in names
                if name == top or name.startswith(top + ".")
            ]
    return found


# ---- the package ---------------------------------------------------------------------------


def test_slurm_tpu_has_no_runtime_import_cycle():
    edges = import_edges(PACKAGE) + registry_edges(PACKAGE)
    assert Edge("slurm_tpu.families", "slurm_tpu.families.hailo", MODULE, "slurm_tpu/families/__init__.py:19") in edges
    # The graph is really there (a parse that found nothing would pass vacuously).
    assert Edge("slurm_tpu.hooks.epilog", "slurm_tpu.hooks.context", MODULE, "slurm_tpu/hooks/epilog.py:13") in edges
    assert any(edge.kind == FUNCTION for edge in edges) and any(edge.kind == TYPE_CHECKING_ONLY for edge in edges)
    cycles = find_cycles(runtime(edges))
    assert not cycles, "import cycles in slurm_tpu:\n" + "\n".join(describe(c) for c in cycles)


def test_slurm_tpu_imports_nothing_from_the_harness():
    # The check sees imports at all (the harness's own of slurm_tpu), so an empty answer means something.
    assert any(
        found.startswith("harness/localcluster/cluster.py:") and found.endswith(" slurm_tpu.errors")
        for found in imports_of(HARNESS, "slurm_tpu")
    )
    assert (HARNESS / "localcluster" / "__init__.py").is_file() and not (PACKAGE / "localcluster").exists()
    assert imports_of(PACKAGE, "harness") == []


# ---- the checker itself, on packages written for the purpose ----------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from .b import thing\n",
            "sub/__init__.py": "",
            "sub/c.py": "def late():\n    from .. import a\n",
            "b.py": "import os\nfrom .sub import c\nthing = 1\n",
        },
    )
    edges = import_edges(package)
    assert Edge("pkg.sub.c", "pkg.a", FUNCTION, "pkg/sub/c.py:2") in edges
    cycles = find_cycles(runtime(edges))
    assert [describe(c) for c in cycles] == [
        "pkg.a -> pkg.b (pkg/a.py:1, module) -> pkg.sub.c (pkg/b.py:2, module) -> pkg.a (pkg/sub/c.py:2, function)"
    ]
    # ``from .sub import c`` also runs pkg/sub/__init__ first: an edge of its own.
    assert Edge("pkg.b", "pkg.sub", MODULE, "pkg/b.py:2") in edges


def test_checker_leaves_type_checking_imports_out_of_runtime_cycles(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .b import B\nelse:\n    import json\n",
            "b.py": "from . import a\nclass B: ...\n",
        },
    )
    edges = import_edges(package)
    assert Edge("pkg.a", "pkg.b", TYPE_CHECKING_ONLY, "pkg/a.py:3") in edges
    assert find_cycles(runtime(edges)) == []
    assert len(find_cycles(edges)) == 1  # the same edges, all counted, do form one


def test_harness_check_finds_every_form_of_import(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "import harness\n",
            "a.py": "def f():\n    from harness.demo import layout\n",
            "b.py": "import importlib\nimportlib.import_module('harness.localcluster')\nimport harnessed\n",
            "c.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    import harness.modelgen as m\nfrom . import a\n",
        },
    )
    assert imports_of(package, "harness") == [
        "pkg/__init__.py:1 harness",
        "pkg/a.py:2 harness.demo",
        "pkg/b.py:2 harness.localcluster",
        "pkg/c.py:3 harness.modelgen",
    ]


def test_checker_counts_a_package_init_that_imports_back(tmp_path):
    # pkg/__init__ imports a module that imports a name from pkg itself: a cycle
    # that works only because of the order of lines in __init__.
    package = _package(
        tmp_path,
        {
            "__init__.py": "group = object()\nfrom . import cmd\n",
            "cmd.py": "from . import group\n",
        },
    )
    assert [describe(c) for c in find_cycles(runtime(import_edges(package)))] == [
        "pkg -> pkg.cmd (pkg/__init__.py:2, module) -> pkg (pkg/cmd.py:1, module)"
    ]


# ---- the layers -----------------------------------------------------------------------------

# The package's layers, lowest first: a module may import (at module or function level) from
# its own layer and the layers below it, never from one above. Each entry names a module or a
# package (all of its modules); the top package (``slurm_tpu/__init__``) is only itself.
# The root hooks' fast path (slurm_tpu/hooks/__init__.py FAST_PATH) runs across several of
# these layers; it has its own, stricter rule (tests/test_fast_path.py).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("slurm_tpu", "slurm_tpu.errors", "slurm_tpu.identity", "slurm_tpu.defaults")),
    ("protocol", ("slurm_tpu.protocol",)),
    ("records", ("slurm_tpu.hardware", "slurm_tpu.cpulist", "slurm_tpu.files", "slurm_tpu.promtext")),
    ("families", ("slurm_tpu.families",)),
    ("config", ("slurm_tpu.config",)),
    ("slurm", ("slurm_tpu.slurm",)),
    ("access", ("slurm_tpu.access",)),
    # A job's energy read from its devices (NVML, hwmon) and the agent's power sampler: used by the
    # hooks, using the formats (protocol), the state directory (access) and the settings below them.
    ("energy", ("slurm_tpu.energy",)),
    ("hooks", ("slurm_tpu.hooks",)),
    ("detect/render", ("slurm_tpu.detect", "slurm_tpu.render")),
    ("runner", ("slurm_tpu.runner",)),
    ("broker", ("slurm_tpu.broker",)),
    ("ops", ("slurm_tpu.ops",)),
    ("cli", ("slurm_tpu.cli",)),
)
# The test and demo harness (harness/: LocalCluster, the demo, the model generator) sits above all of
# these, outside the package: slurm_tpu never imports it (test_slurm_tpu_never_imports_the_harness).


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index of ``module``'s layer (the longest entry naming it), or None when no entry does."""
    best, best_length = None, -1
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            named = module == entry or ("." in entry and module.startswith(entry + "."))
            if named and len(entry) > best_length:
                best, best_length = index, len(entry)
    return best


def upward(edges: list[Edge], layers=LAYERS) -> list[Edge]:
    """The edges from a module to one in a higher layer."""
    return [e for e in edges if layer_of(e.target, layers) > layer_of(e.source, layers)]


def describe_edge(edge: Edge, layers=LAYERS) -> str:
    source, target = layers[layer_of(edge.source, layers)][0], layers[layer_of(edge.target, layers)][0]
    return f"{edge.where}: {edge.source} ({source}) imports {edge.target} ({target}), {edge.kind}-level"


# Upward edges that only annotations use (``if TYPE_CHECKING:``, never run), as (source, target):
# listed here one by one, so a new one is a decision, not an accident. None today.
TYPE_CHECKING_UPWARD: frozenset[tuple[str, str]] = frozenset()


def test_every_module_has_a_layer_and_every_layer_entry_a_module():
    modules = modules_of(PACKAGE)
    assert not [m for m in modules if layer_of(m) is None], (
        f"modules in no layer (add each to LAYERS above): {[m for m in modules if layer_of(m) is None]}"
    )
    named = [entry for _, entries in LAYERS for entry in entries]
    assert len(named) == len(set(named)), f"a module is named twice in LAYERS: {named}"
    stale = [entry for entry in named if entry not in modules]
    assert not stale, f"LAYERS names modules that do not exist (moved? renamed?): {stale}"


def test_slurm_tpu_imports_only_downward():
    edges = import_edges(PACKAGE) + registry_edges(PACKAGE)
    wrong = upward(runtime(edges))
    assert not wrong, (
        "imports that run upward (a lower layer must not know a higher one: move the code, "
        "or the import, down):\n" + "\n".join(describe_edge(e) for e in wrong)
    )
    annotations = {(e.source, e.target) for e in upward(edges) if e.kind == TYPE_CHECKING_ONLY}
    assert annotations == TYPE_CHECKING_UPWARD, (
        f"type-checking-only upward edges changed: new {sorted(annotations - TYPE_CHECKING_UPWARD)}, "
        f"gone {sorted(TYPE_CHECKING_UPWARD - annotations)}; list the new ones in TYPE_CHECKING_UPWARD"
    )


def test_checker_finds_upward_imports_at_any_level(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "import os\ndef late():\n    from .high import thing\n",
            "mid/__init__.py": "from ..low import late\n",
            "high.py": (
                "from . import low\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n    from .top import T\nthing = 1\n"
            ),
            "top.py": "from .mid import late\nclass T: ...\n",
        },
    )
    layers = (("base", ("pkg", "pkg.low")), ("middle", ("pkg.mid", "pkg.high")), ("top", ("pkg.top",)))
    edges = import_edges(package)
    assert [describe_edge(e, layers) for e in upward(runtime(edges), layers)] == [
        "pkg/low.py:3: pkg.low (base) imports pkg.high (middle), function-level"
    ]
    assert [(e.source, e.target) for e in upward(edges, layers) if e.kind == TYPE_CHECKING_ONLY] == [
        ("pkg.high", "pkg.top")
    ]
    assert layer_of("pkg.mid.deep", layers) == 1 and layer_of("pkg.other", layers) is None
