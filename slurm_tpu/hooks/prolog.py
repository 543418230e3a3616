"""Prolog (root, on each node at job start): lease the job's accelerators.

Exit status 0 unless the node really cannot serve the job (a device missing,
held by a live job, or gres.conf naming something unknown): then one line says
why and Slurm drains the node and requeues (and holds) the job.
"""

from __future__ import annotations

import os

from .context import HookError, job_from_env, node_from_env, run_guarded


def run(environ) -> int:
    """The prolog; returns the exit status."""
    from ..locks.ledger import Ledger
    from . import allocation, envfile, leasing, settings as hook_settings

    node = node_from_env(environ)
    settings = hook_settings.load(environ, node)
    job = job_from_env(environ, settings.node)
    names = settings.leasable_names()
    if not names:
        return 0  # nothing to lease on this node: no Slurm query at all
    allocs = allocation.query_job_gres(job.job_id, job.node, settings, environ)
    if not allocs:
        return 0
    devices = allocation.resolve(job.job_id, allocs, settings)
    if not devices:
        return 0
    for device in devices:
        if device.kind == "edgetpu" and device.identity not in settings.tpu_paths:
            raise HookError(f"job {job.job_id}: {device.identity} has no device node for libedgetpu "
                            "(unplugged?); replug it or drain the node")
    with Ledger(settings.state_dir) as ledger:
        ledger.sweep_temps()
        leases = leasing.acquire(ledger, job, devices, settings)
        envfile.write(ledger, job.job_id, leases, settings)
    return 0


def main(environ=None) -> int:
    """Entry point for prolog/slurm-tpu-prolog."""
    return run_guarded("prolog", run, os.environ if environ is None else environ)
