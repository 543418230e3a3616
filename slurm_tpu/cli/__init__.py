"""The ``slurm-tpu`` command: parse, call one library function, render, exit.

Exit codes (like diff(1)): 0 success; 1 a --check found a difference; 2 an error
(one line on stderr naming what, which and what to do) or a usage mistake.
"""

from __future__ import annotations

import sys

from .group import EXIT_DIFFERS, EXIT_ERROR, Obj, main  # noqa: F401  (the package's public names)

# Each command module registers its commands on ``main`` when imported.
from . import inventory  # noqa: F401  (detect, gres-conf, node-conf, udev-rules, boot)
from . import infer  # noqa: F401  (infer)
from . import serve  # noqa: F401  (serve)
from . import hooks  # noqa: F401  (leases, udev-event)
from . import ops  # noqa: F401  (health, watch, metrics, report)
from . import node  # noqa: F401  (install, uninstall, doctor)


def run() -> None:
    """Console-script entry point."""
    main(prog_name="slurm-tpu")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
