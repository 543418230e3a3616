"""Task-prolog (the job's user, before every task): export the job's devices.

Prints ``export NAME=value`` lines (slurmstepd applies them to the task) from
the job's leases on this node, in allocation order. When the job holds no Edge
TPU the variables are unset, so values copied from the submitting shell can't
mislead the runner. Never fails a task: problems go to stderr.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, TextIO

from .. import jobenv
from .context import job_from_env, load_hook_config, say


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables for this task ({} when the job has no leased device here)."""
    from ..locks import node_inventory
    from ..locks.ledger import Ledger

    config = load_hook_config()
    job = job_from_env(environ, config, need_uid=False)
    if not os.path.isdir(config.state_dir):
        return {}
    with Ledger(config.state_dir, create=False) as ledger:
        leases = ledger.of_job(job.job_id)
        if not leases:
            return {}
        known = node_inventory.load(ledger.dir_fd)
    tpus, gpus = [], []
    for lease in leases:
        if lease.kind == "gpu":
            gpus.append(lease.identity)
            continue
        device = known.get(lease.identity)
        node = device.primary_node if device else (lease.device_nodes[0] if lease.device_nodes else None)
        kind, path = jobenv.libedgetpu_path(lease.identity, node)
        tpus.append(jobenv.EdgeTpuHandle(lease.identity, kind, path))
    return jobenv.format_environment(tpus, gpus)


def main(environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> int:
    """Entry point for prolog/slurm-tpu-task-prolog."""
    environ = os.environ if environ is None else environ
    out = sys.stdout if out is None else out
    try:
        variables = environment(environ)
    except Exception as exc:
        say(f"task-prolog: job {environ.get('SLURM_JOB_ID', '?')}: {exc}")
        variables = {}
    for name in (jobenv.DEVICES, jobenv.EDGETPU_PATHS, jobenv.GPUS):
        if name in variables:
            out.write(f"export {name}={variables[name]}\n")
        else:
            out.write(f"unset {name}\n")
    out.flush()
    return 0
