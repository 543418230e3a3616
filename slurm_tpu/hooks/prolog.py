"""Prolog (root, on each node at job start): lease the job's accelerators.

Exit status 0 unless the node really cannot serve the job (a device missing,
held by a live job, or gres.conf naming something unknown): then one line says
why and Slurm drains the node and requeues the job.
"""

from __future__ import annotations

import os
from typing import Mapping

from .context import HookError, job_from_env, load_hook_config, say


def leasable_names(config, known) -> list[str]:
    """GRES names whose devices this node leases (tpu; gpu with isolate_gpus)."""
    names = []
    if any(d.kind == "edgetpu" for d in known.values()):
        names.append(config.tpu_gres_name)
    if config.isolate_gpus and any(d.kind == "gpu" for d in known.values()):
        names.append(config.gpu_gres_name)
    return names


def run(environ: Mapping[str, str]) -> int:
    """The prolog; returns the exit status."""
    from ..locks import node_inventory
    from ..locks.ledger import Ledger
    from . import allocation, leasing

    config = load_hook_config()
    job = job_from_env(environ, config)
    with Ledger(config.state_dir) as ledger:
        ledger.sweep_temps()
        known = node_inventory.load(ledger.dir_fd)
        names = leasable_names(config, known)
        if not names:
            return 0  # nothing to lease on this node: no Slurm query at all
        index = allocation.gres_index(job.node, names, environ)
        if not index:
            return 0
        allocs = allocation.query_job_gres(job.job_id, job.node)
        if not allocs:
            return 0
        devices = allocation.resolve(job.job_id, allocs, index, known, config)
        if devices:
            leasing.acquire(ledger, job, devices, known, config)
    return 0


def main(environ: Mapping[str, str] | None = None) -> int:
    """Entry point for prolog/slurm-tpu-prolog."""
    environ = os.environ if environ is None else environ
    try:
        return run(environ)
    except HookError as exc:
        say(f"prolog: {exc}")
    except Exception as exc:  # SlurmTpuError, OSError...: one line, never a traceback
        say(f"prolog: job {environ.get('SLURM_JOB_ID', '?')}: {type(exc).__name__}: {exc}")
    return 1
