"""The project's test and demo harness: never installed, never imported by slurm_tpu.

- :mod:`harness.localcluster`: real Slurm clusters on one machine (munge, slurmctld,
  slurmd, slurmdbd) over umockdev-described nodes, with the emulated kernel parts
  the hooks act on (USB core, apex driver);
- :mod:`harness.demo`: ``./demo.sh``'s cluster, experiment and timeline;
- :mod:`harness.modelgen`: the generated models and images the runner's tests and
  the demo classify.

It lives at the top of the checkout beside ``slurm_tpu/`` and is left out of the
wheel and the sdist (pyproject.toml): a node installs the product only. A Python
started in the checkout's root finds it (``-m`` puts the working directory first on
sys.path); a process the harness starts elsewhere runs through :func:`module_command`.
"""

from __future__ import annotations

import os

# The checkout's root: the directory holding harness/ (and slurm_tpu/, tests/, demo/).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_command(python: str, module: str, *args: str) -> list[str]:
    """argv running ``python -m module args``, finding the harness from any working directory.

    ``env`` puts the checkout first on PYTHONPATH (before what the caller's
    environment had there): slurmd runs a HealthCheckProgram, and the watcher its
    restart commands, in directories of their own, where ``-m`` alone would find no
    ``harness``. The checkout's ``slurm_tpu`` comes first for that process too, as it
    does for every Python the tests start in the checkout's root.
    """
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return ["env", f"PYTHONPATH={path}", python, "-m", module, *args]
