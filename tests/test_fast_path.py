"""The root hooks' fast path keeps to its imports, checked from the source (no root, no cluster).

slurm_tpu/hooks/__init__.py declares the fast path (FAST_PATH: every module a root
hook loads per job or device event) and what those modules may import at module
level (FAST_PATH_STDLIB, and each other). Here every ``import`` statement that runs
when such a module is loaded (module level, ``try``/``if`` blocks included; not
inside a function, not under ``if TYPE_CHECKING:``) is read with ``ast`` and held to
that rule, and so are the hooks' Python entry scripts. A failure names the file and
line. tests/test_hooks_import_budget.py measures the same thing for real, with
``-X importtime`` under slurmd; this one runs everywhere, in a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

from slurm_tpu import defaults
from slurm_tpu.hooks import FAST_PATH, FAST_PATH_STDLIB
from slurm_tpu.ops.hook_entries import ENTRIES, shipped_path
from test_hooks_import_budget import FORBIDDEN
from test_import_graph import MODULE, PACKAGE, _imports, _targets, modules_of

REPO = PACKAGE.parent
# The Python programs root runs for each job or event (what slurm.conf's sh hooks and udev run),
# and the node agent's: one template makes them all (slurm_tpu/ops/hook_entries.py).
ENTRY_SCRIPTS = [Path(shipped_path(entry, str(REPO))) for entry in ENTRIES]
# What an entry script may import besides FAST_PATH_STDLIB: ``site``, only when slurm_tpu is not
# beside it (an installed package found in site-packages).
ENTRY_STDLIB = FAST_PATH_STDLIB | {"site"}


def module_level_violations(
    path: Path, module: str, is_package: bool, known: set[str], fast_path: set[str], stdlib: frozenset[str], shown: Path
) -> list[str]:
    """One line per module-level import in ``path`` that leaves the fast path: ``file:line: what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = next(iter(fast_path)).split(".")[0]
    found = []
    for node, kind in _imports(tree):
        if kind != MODULE:
            continue
        where = f"{path.relative_to(shown)}:{node.lineno}"
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] != package
        ):
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] != package]
        else:
            names = []
        for name in names:
            if name.split(".")[0] not in stdlib:
                found.append(
                    f"{where}: {module} imports {name} at module level (allowed: "
                    f"{', '.join(sorted(stdlib))}); import it inside the function that needs it"
                )
        for target in _targets(node, module, is_package, known):
            if target not in fast_path:
                found.append(
                    f"{where}: {module} imports {target} at module level, which is not on the fast "
                    "path; import it inside the function that needs it (or add it to FAST_PATH in "
                    "slurm_tpu/hooks/__init__.py if every hook needs it, and keep it to the rule)"
                )
    return found


def violations(package: Path, fast_path: tuple[str, ...], stdlib: frozenset[str]) -> list[str]:
    modules = modules_of(package)
    found = []
    for module in fast_path:
        path = modules[module]
        found += module_level_violations(
            path, module, path.name == "__init__.py", set(modules), set(fast_path), stdlib, package.parent
        )
    return found


# ---- the package and its entry scripts -------------------------------------------------------


def test_the_fast_path_is_declared_and_exists():
    modules = modules_of(PACKAGE)
    assert len(FAST_PATH) == len(set(FAST_PATH)), "a module is listed twice in FAST_PATH"
    assert not [m for m in FAST_PATH if m not in modules], "FAST_PATH names modules that do not exist"
    # What the hooks measure themselves by: what the fast path may never import, even lazily by accident.
    assert not FAST_PATH_STDLIB & set(FORBIDDEN)
    # A hook's work is on it: each entry script's module, and the modules every hook opens.
    assert {
        "slurm_tpu.hooks.prolog",
        "slurm_tpu.hooks.epilog",
        "slurm_tpu.hooks.udev_event",
        "slurm_tpu.access.ledger",
        "slurm_tpu.protocol.hooks_snapshot",
    } <= set(FAST_PATH)


def test_fast_path_modules_import_only_the_stdlib_set_and_each_other():
    found = violations(PACKAGE, FAST_PATH, FAST_PATH_STDLIB)
    assert not found, "the hooks' fast path imports too much at module level:\n" + "\n".join(found)


def test_the_entry_scripts_import_only_the_stdlib_set_and_the_fast_path():
    known = set(modules_of(PACKAGE))
    found = []
    for path in ENTRY_SCRIPTS:
        found += module_level_violations(path, "__main__", False, known, set(FAST_PATH), ENTRY_STDLIB, REPO)
    assert not found, "\n".join(found)


def test_the_sh_task_prologs_defaults_are_the_packages():
    # prolog/slurm-tpu-task-prolog finds the state directory without Python: the same defaults.
    text = (REPO / "prolog" / "slurm-tpu-task-prolog").read_text(encoding="utf-8")
    assert f"\nstate_dir={defaults.STATE_DIR}\n" in text
    assert f"\nconfig=${{{defaults.CONFIG_ENV}:-{defaults.CONFIG_PATH}}}\n" in text


# ---- the checker itself, on a package written for the purpose ------------------------------


def test_checker_names_module_and_line(tmp_path):
    files = {
        "__init__.py": "",
        "fast.py": (
            "from __future__ import annotations\nimport os, json\nfrom . import slow\n"
            "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from typing import Any\n    from . import slow\n"
            "try:\n    import re\nexcept ImportError:\n    pass\n"
            "def late():\n    import subprocess\n    from . import slow\n"
            "class Box:\n    import enum\n"
        ),
        "also.py": "import os.path\nfrom pkg import fast\nfrom . import fast as again\n",
        "slow.py": "import json\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text, encoding="utf-8")
    found = violations(tmp_path / "pkg", ("pkg", "pkg.fast", "pkg.also"), frozenset({"__future__", "os"}))
    # Function-level imports (late()) and annotation-only ones are the slow path's own business.
    assert [line.split(" at module level")[0] for line in found] == [
        "pkg/fast.py:2: pkg.fast imports json",
        "pkg/fast.py:3: pkg.fast imports pkg.slow",
        "pkg/fast.py:9: pkg.fast imports re",  # a try block runs at import too
        "pkg/fast.py:16: pkg.fast imports enum",  # so does a class body
    ]
