"""Prolog (root, on each node at job start): lease the job's accelerators.

Exit status 0 unless the node cannot serve the job (a device missing, held by a live job or
not free, gres.conf naming something unknown): then one line says why, the node is drained
with it as the reason (hooks/context.py HookRun), and Slurm requeues (and holds) the job.
"""

from __future__ import annotations

import os

from .context import HookError, HookRun, job_from_env


def run(hook: HookRun, prolog_process: tuple[int, int] | None = None) -> int:
    """The prolog; returns the exit status. ``prolog_process``: see leasing.acquire."""
    from ..access.ledger import Ledger
    from ..protocol import envfile
    from . import allocation, jobusage, leasing, settings as hook_settings

    hook.probe.mark("imports")
    settings = hook.settings = hook_settings.load(hook.environ, hook.node)
    hook.probe.mark("settings")
    job = hook.job = job_from_env(hook.environ, settings.node)
    if not settings.leasable_names():
        return 0  # nothing to lease on this node: no Slurm query at all
    allocs = allocation.query_job_gres(hook)
    hook.probe.mark("slurm_query")
    devices = allocation.resolve(job.job_id, allocs or [], settings)
    if not devices:
        return 0
    for device in devices:
        entries = settings.values.get(device.identity, {})
        for variable in settings.variables:
            if variable.kind == device.kind and variable.name not in entries:
                raise HookError(
                    f"job {job.job_id}: {device.identity} has no device node for its "
                    f"{variable.name} entry (unplugged?); replug it or drain the node"
                )
    with Ledger(settings.state_dir) as ledger:
        ledger.sweep_temps()
        hook.probe.mark("ledger_open")
        # A device not free fails the prolog: HookRun drains the node with the reason (naming the job that
        # left it held), and Slurm requeues and holds this job.
        leases = leasing.acquire(ledger, job, devices, settings, prolog_process=prolog_process, probe=hook.probe)
        hook.probe.mark("acquire")
        # Everything after the lease is rolled back with it: a prolog that fails here must not leave
        # the devices with the job's user (the env file fails only on a full or broken state filesystem).
        try:
            usage_dir = jobusage.prepare(ledger, job.job_id, job.uid)  # type: ignore[arg-type]  # need_uid: an int
            hook.probe.mark("usage_box")
            ledger.write_job_env(job.job_id, envfile.render(leases, settings, usage_dir))
            hook.probe.mark("env_file")
        except BaseException as exc:
            jobusage.discard(ledger, job.job_id)
            leasing.roll_back(ledger, leases, settings)
            if not isinstance(exc, Exception):
                raise
            raise HookError(
                f"job {job.job_id}: cannot write its environment file in {settings.state_dir}/jobs "
                f"({exc}); its devices were given back: free space there (df {settings.state_dir}), "
                "then resume the node"
            ) from exc
    return 0


def main(environ=None, prolog_process: tuple[int, int] | None = None, detail_source=None, probe=None) -> int:
    """Entry point for prolog/slurm-tpu-prolog, and the node agent's worker (which gives its hook
    client as the ``prolog_process``, see leasing.acquire, and its resident scontrol as the
    ``detail_source``, see ``Slurm.detail_source``). ``probe``: see HookRun."""
    hook = HookRun("prolog", os.environ if environ is None else environ, probe, detail_source)
    return hook.main(run, prolog_process)
