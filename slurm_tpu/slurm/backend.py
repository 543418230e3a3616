"""Which way ops commands talk to Slurm: scontrol (``commands.Slurm``) or pyslurm.

Measured on Slurm 25.11 (``bench/bench_slurm_backends.py``): importing pyslurm costs more
than the scontrol calls it replaces in a short-lived process (one ``slurm-tpu health``:
92 ms with scontrol vs 112) and less in a long-running one (20 node-state polls in the
watcher: 125 vs 73 ms). So ``auto`` uses pyslurm for the watcher when it matches the
running Slurm, scontrol elsewhere; ``pyslurm`` everywhere in ops (failing loudly when it
does not match); ``scontrol`` never. The hooks always use scontrol.

pyslurm is used only when it imports, when its libslurm, pyslurm itself and the daemons
have the same major.minor (Slurm's structs change between releases), and when a slurm.conf
is there (without one libslurm's init exits the process, so pyslurm's auto-init is off).
Every pyslurm error becomes a SlurmCommandError; nothing falls back to scontrol silently.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Callable, Protocol

from ..config import Config
from ..errors import SlurmCommandError, SlurmTpuError
from . import installation
from .commands import NodeStates, Slurm
from .jobdetail import GresAlloc, expand_hostlist
from .parse import NodeState

PYSLURM_PAYS = ("watch",)  # long-running uses, where pyslurm's import is paid once


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
    try:
        return load(slurm)
    except PyslurmUnavailable:
        if config.slurm_backend == "pyslurm":
            raise
        return slurm  # auto: pyslurm absent or for another release; scontrol answers the same questions


class PyslurmUnavailable(SlurmTpuError):
    """pyslurm cannot be used against this Slurm (the message says why and what to do)."""


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def _slurm_conf(slurm: Slurm) -> str:
    """The slurm.conf libslurm would read: $SLURM_CONF, else the daemons' compiled-in default."""
    conf = slurm.environ.get("SLURM_CONF") or installation.compiled_conf(slurm.install.sbin_dir)
    if not os.path.isfile(conf):
        raise PyslurmUnavailable(
            f"pyslurm needs a slurm.conf and {conf} does not exist: set SLURM_CONF "
            "(libslurm would exit the process without one)"
        )
    return conf


def _daemon_version(slurm: Slurm) -> str:
    for daemon in ("slurmd", "slurmctld"):
        try:
            version = installation.version_of(slurm.program(daemon))
        except SlurmCommandError:
            continue
        if version:
            return version
    raise PyslurmUnavailable(
        f"cannot tell the daemons' Slurm release (no slurmd or slurmctld in {', '.join(slurm.install.dirs)})"
    )


def load(slurm: Slurm) -> PySlurm:
    """pyslurm, initialised for this Slurm; PyslurmUnavailable when it does not match."""
    conf = _slurm_conf(slurm)
    daemons = _daemon_version(slurm)
    import sys

    previous = os.environ.get("PYSLURM_DISABLE_AUTO_INIT")
    os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"
    flags = sys.getdlopenflags()  # pyslurm sets RTLD_GLOBAL|RTLD_DEEPBIND for the whole process
    try:
        import pyslurm
    except ImportError as exc:
        raise PyslurmUnavailable(
            f"pyslurm is not installed ({exc}); for Slurm {daemons}: "
            f"pip install 'pyslurm=={'.'.join(_major_minor(daemons))}.*'"
        ) from exc
    finally:
        sys.setdlopenflags(flags)
        if previous is None:
            os.environ.pop("PYSLURM_DISABLE_AUTO_INIT", None)
        else:
            os.environ["PYSLURM_DISABLE_AUTO_INIT"] = previous
    library = ".".join(str(part) for part in pyslurm.slurm_api_version())
    versions = {"pyslurm": pyslurm.__version__, "its libslurm": library, "the daemons": daemons}
    if len({_major_minor(v) for v in versions.values()}) != 1:
        raise PyslurmUnavailable(
            "pyslurm does not match this Slurm ("
            + ", ".join(f"{k} {v}" for k, v in versions.items())
            + "): install the pyslurm release of the daemons' Slurm, or set slurm.backend: scontrol"
        )
    pyslurm.slurm_init(conf)
    return PySlurm(pyslurm, library, slurm)


class PySlurm(NodeStates):
    """Node state, drain/resume and a job's per-node GRES through pyslurm (same interface as Slurm);
    programs (an admin's restart commands) are run by the scontrol gateway it was loaded for."""

    name = "pyslurm"

    def __init__(self, module: Any, version: str, commands: Slurm):
        self.pyslurm, self.version, self.commands = module, version, commands

    def _call(self, what: str, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return function(*args)
        except Exception as exc:
            raise SlurmCommandError(f"pyslurm {what} failed: {exc}", "pyslurm") from exc

    def node_state(self, node: str) -> NodeState:
        """State, reason (without Slurm's [user@time]) and configured GRES of ``node``."""
        info = self._call(f"Node.load({node!r})", self.pyslurm.Node.load, node)
        gres = ",".join(f"{name}:{count}" for name, count in (info.configured_gres or {}).items())
        return {"state": info.state or "", "reason": info.reason or "", "gres": gres or "(null)"}

    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        changes = self.pyslurm.Node(state=state, **({"reason": reason} if reason is not None else {}))
        self._call(f"{state.lower()} of {node}", self.pyslurm.Node(node).modify, changes)

    def run_command(self, argv: Sequence[str], timeout: float | None = None) -> str:
        """An admin's command, run by the scontrol gateway (pyslurm cannot run one)."""
        return self.commands.run_command(argv, timeout)

    def jobs_with_gres(self, node: str) -> list[str]:
        jobs = self._call("Jobs.load()", self.pyslurm.Jobs.load)
        return [
            str(job.id)
            for job in jobs.values()
            if job.state in ("RUNNING", "COMPLETING")
            and job.gres_per_node
            and node in expand_hostlist(job.allocated_nodes or "")
        ]

    def job_gres(self, job_id: int, node: str) -> list[GresAlloc] | None:
        """``Job.load(id).get_resource_layout_per_node()`` for ``node`` as GresAlloc items (None: not there)."""
        job = self._call(f"Job.load({job_id})", self.pyslurm.Job.load, job_id)
        layout = self._call(f"resource layout of job {job_id}", job.get_resource_layout_per_node)
        entry = (layout or {}).get(node)
        if entry is None:
            return None
        allocs = []
        for key, value in (entry.get("gres") or {}).items():
            name, _, kind = key.partition(":")
            if isinstance(value, dict):
                indexes = value.get("indexes") or ""
                indices = tuple(int(i) for i in expand_hostlist(f"[{indexes}]")) if indexes else ()
                allocs.append(GresAlloc(name, kind or None, int(value.get("count", len(indices))), indices))
            else:
                allocs.append(GresAlloc(name, kind or None, int(value), ()))
        return allocs
