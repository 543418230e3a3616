"""Building the hooks' thin client of the node agent from the shipped source (``python -m slurm_tpu.ops.hook_client``).

How it is built: slurm_tpu/hooks/agent_client.py (the agent builds it there too).
This module adds where the shipped source is (``prolog/slurm-tpu-hook-client.c``,
found by node_files), for scripts/setup.sh, LocalCluster and the tests.
"""

from __future__ import annotations

import sys

from ..hooks.agent_client import PROGRAM, SOURCE, build as _build, build_beside, compiler  # noqa: F401 - this module's interface
from .node_files import node_file


def build(directory: str | None = None, source: str | None = None) -> str | None:
    """Build the client into ``directory`` (default: beside its source, the shipped one by default)
    unless it is current; its path, or None (no compiler, or the build failed: said on stderr)."""
    return _build(directory, source or node_file("prolog", SOURCE))


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
    path = build(sys.argv[1] if len(sys.argv) > 1 else None)
    print(path or "not built")
    sys.exit(0 if path else 1)
