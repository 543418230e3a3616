"""The ``slurm-tpu`` command: parse, call one library function, render, exit.

Exit codes (like diff(1)): 0 success; 1 a --check found a difference; 2 an error
(one line on stderr naming what, which and what to do) or a usage mistake.
"""

from __future__ import annotations

# Each command module registers its commands on ``main`` when imported.
from . import (
    hooks,  # noqa: F401  (leases, udev-event)
    infer,  # noqa: F401  (infer)
    inventory,  # noqa: F401  (detect, gres-conf, node-conf, udev-rules)
    node,  # noqa: F401  (install, uninstall, doctor)
    ops,  # noqa: F401  (health, watch, metrics, report, accounting-collect, boot)
    serve,  # noqa: F401  (serve)
)
from .group import EXIT_DIFFERS, EXIT_ERROR, Obj, main  # noqa: F401  (the package's public names)


def run() -> None:
    """Console-script entry point."""
    main(prog_name="slurm-tpu")  # click exits with the command's status
