"""The files a node needs besides the package: hook scripts, systemd units, the slurm.conf snippet.

They live at the top of the repository, in a directory named for what runs or reads them
on a node (:data:`NODE_DIRS`); a wheel carries copies as ``slurm_tpu/node_files/<dir>/``
(setup.py). This module is the one place that knows both locations, and the programs this
installation of slurm-tpu runs as (the console script, its interpreter, the package's directory).
"""

from __future__ import annotations

import os
import pathlib
import sys

from ..errors import SlurmTpuError

NODE_DIRS = ("prolog", "epilog", "udev", "systemd", "slurm_conf", "hook_client", "enroot")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../slurm_tpu


def node_file(directory: str, name: str) -> str:
    """Path of a shipped file, e.g. ``node_file("prolog", "slurm-tpu-prolog")``: the wheel's copy, else
    the repository's (a checkout or an editable install)."""
    if directory not in NODE_DIRS:
        raise ValueError(f"{directory!r} is not one of {NODE_DIRS}")
    for base in (os.path.join(_PACKAGE, "node_files"), os.path.dirname(_PACKAGE)):
        candidate = os.path.join(base, directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise SlurmTpuError(
        f"slurm-tpu's {directory}/{name} is not installed with the package at {_PACKAGE}: "
        "reinstall it (pip install --force-reinstall slurm-tpu)"
    )


def read_node_file(directory: str, name: str) -> str:
    """The text of a shipped file."""
    return pathlib.Path(node_file(directory, name)).read_text(encoding="utf-8")


def package_root() -> str:
    """The directory ``slurm_tpu`` is imported from (site-packages, or a checkout)."""
    return os.path.dirname(_PACKAGE)


def interpreter() -> str:
    """The Python that runs this slurm-tpu: the one whose site-packages hold its dependencies."""
    return os.path.abspath(sys.executable)


def this_program() -> str:
    """The ``slurm-tpu`` console script beside this interpreter (else how we were started)."""
    candidate = os.path.join(os.path.dirname(interpreter()), "slurm-tpu")
    return candidate if os.path.exists(candidate) else os.path.abspath(sys.argv[0])
