"""Building the hooks' thin client of the node agent from the shipped source (``python -m slurm_tpu.ops.hook_client``).

How it is built: slurm_tpu/hooks/agent_client.py (the agent builds it there too).
This module adds where the shipped source is (``prolog/slurm-tpu-hook-client.c``,
found by node_files), for scripts/setup.sh, LocalCluster and the tests.
"""

from __future__ import annotations

import sys

from ..hooks.agent_client import (  # noqa: F401 - this module's interface
    NATIVE_HOOKS,
    PROGRAM,
    SOURCE,
    build as _build,
    build_beside,
    compiler,
    link_native_entries,
)
from .node_files import node_file

# Where each hook that has a native entry is shipped (NODE_DIRS' prolog/ and epilog/).
HOOK_DIRS = {"slurm-tpu-prolog": "prolog", "slurm-tpu-epilog": "epilog", "slurm-tpu-task-prolog": "prolog"}


def build(directory: str | None = None, source: str | None = None) -> str | None:
    """Build the client into ``directory`` (default: beside its source, the shipped one by default)
    unless it is current; its path, or None (no compiler, or the build failed: said on stderr)."""
    return _build(directory, source or node_file("prolog", SOURCE))


def shipped_hook(name: str) -> str:
    """The shipped hook ``name`` (one of NATIVE_HOOKS)."""
    return node_file(HOOK_DIRS[name], name)


def build_native() -> dict[str, str]:
    """Build the client beside its shipped source, and each shipped hook's native entry beside the
    hook; {hook name: native entry}, {} when the client cannot be built (the hooks then run themselves)."""
    client = build()
    if client is None:
        return {}
    return dict(zip(NATIVE_HOOKS, link_native_entries(client, [shipped_hook(name) for name in NATIVE_HOOKS])))


def compiled() -> bytes | None:
    """The client built from the shipped source, as bytes (``slurm-tpu install`` installs and
    records it, so ``uninstall`` removes it); None without a compiler or when the build failed."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="slurm-tpu-hook-client-") as directory:
        path = build(directory)
        if path is None:
            return None
        with open(path, "rb") as handle:
            return handle.read()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = build(sys.argv[1])
    else:  # the shipped client, and the shipped hooks' native entries
        path = build()
        entries = build_native() if path else {}
        print("\n".join(entries.values()))
    print(path or "not built")
    sys.exit(0 if path else 1)
