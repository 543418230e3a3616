"""Which way ops commands talk to Slurm: scontrol (``commands.Slurm``) or pyslurm.

Measured on Slurm 25.11 (``bench/bench_slurm_backends.py``, 2 cores): importing
pyslurm costs more than the scontrol calls it replaces in a short-lived process
(the prolog's query 30 ms with scontrol vs 60 ms; one ``slurm-tpu health`` run
92 vs 112 ms), and less in a long-running one (20 node-state polls in the
watcher: 125 vs 73 ms). So ``auto`` uses
pyslurm for the watcher when it matches the running Slurm, and scontrol
elsewhere; ``pyslurm`` uses it everywhere in ops (and fails loudly when it does
not match); ``scontrol`` never. The hooks always use scontrol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..config import Config
from .commands import Slurm
from .jobdetail import GresAlloc
from .parse import NodeState

# Long-running uses, where pyslurm's import is paid once.
PYSLURM_PAYS = ("watch",)


class SlurmBackend(Protocol):
    """What ops need from Slurm, whichever way it is asked."""

    def node_state(self, node: str) -> NodeState: ...
    def drain(self, node: str, reason: str) -> None: ...  # commands.NodeStates, for both
    def resume(self, node: str) -> None: ...
    def jobs_with_gres(self, node: str) -> list[str]: ...
    def job_gres(self, job_id: int, node: str) -> list[GresAlloc] | None: ...
    def run_command(self, argv: Sequence[str], timeout: float | None = None) -> str: ...


def open_backend(config: Config, purpose: str) -> SlurmBackend:
    """The backend for ``purpose`` ("health", "watch"...) under ``config.slurm_backend``."""
    slurm = Slurm.for_config(config)
    if config.slurm_backend == "scontrol" or (config.slurm_backend == "auto" and purpose not in PYSLURM_PAYS):
        return slurm
    from .pyslurm_backend import PyslurmUnavailable, load

    try:
        return load(slurm)
    except PyslurmUnavailable:
        if config.slurm_backend == "pyslurm":
            raise
        return slurm  # auto: pyslurm absent or for another release; scontrol answers the same questions
