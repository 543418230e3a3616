"""Prolog (root, on each node at job start): lease the job's accelerators.

A job holding TPU shares here (the node's shard GRES, ``HookSettings.shards``) gets its grant and its
broker endpoint (hooks/shards.py); a broker that is down costs one line (stderr and the audit log), never
the job.

Exit status 0 unless the node cannot serve the job (a device missing, held by a live job or
not free, gres.conf naming something unknown): then one line says why, the node is drained
with it as the reason (hooks/context.py HookRun), and Slurm requeues (and holds) the job.
"""

from __future__ import annotations

import os

from .context import HookError, HookRun, job_from_env, say


def run(hook: HookRun, prolog_process: tuple[int, int] | None = None) -> int:
    """The prolog; returns the exit status. ``prolog_process``: see leasing.acquire."""
    from ..access.ledger import Ledger
    from ..protocol import envfile
    from . import allocation, jobusage, leasing, settings as hook_settings

    hook.probe.mark("imports")
    settings = hook.settings = hook_settings.load(hook.environ, hook.node)
    hook.probe.mark("settings")
    job = hook.job = job_from_env(hook.environ, settings.node)
    shared = settings.shards  # the node's shared TPUs, or None
    if not settings.leasable_names() and shared is None:
        return 0  # nothing to lease or share on this node: no Slurm query at all
    allocs = allocation.query_job_gres(hook) or []
    hook.probe.mark("slurm_query")
    devices = allocation.resolve(job.job_id, allocs, settings)
    shares = 0
    if shared is not None:
        from . import shards

        shares = shards.shares_of(allocs, shared.gres_name)
    if not devices and not shares:
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
        leases = []
        if devices:
            leases = leasing.acquire(ledger, job, devices, settings, prolog_process=prolog_process, probe=hook.probe)
            hook.probe.mark("acquire")
        # Everything after the lease is rolled back with it: a prolog that fails here must not leave
        # the devices with the job's user (the env file fails only on a full or broken state filesystem).
        granted = False
        try:
            # A job with only shares gets no usage box: its figures come from the broker, not from the job.
            usage_dir = jobusage.prepare(ledger, job.job_id, job.uid) if leases else None  # type: ignore[arg-type]
            hook.probe.mark("usage_box")
            broker = None
            if shares:
                from ..protocol.broker_wire import endpoint_path

                granted = True
                notice = shards.open_job(ledger, job.job_id, job.uid, _job_gid(hook.environ, job.uid), shares)  # type: ignore[arg-type]
                hook.probe.mark("broker_open")
                if notice is not None:
                    say(f"prolog: {notice}")  # the job starts anyway: never a drain for the broker
                broker = (endpoint_path(settings.state_dir, job.job_id), shares)
            ledger.write_job_env(job.job_id, envfile.render(leases, settings, usage_dir, broker))
            hook.probe.mark("env_file")
        except BaseException as exc:
            if leases:
                jobusage.discard(ledger, job.job_id)
                leasing.roll_back(ledger, leases, settings)
            if granted:
                shards.remove_grant(ledger, job.job_id)  # a broker that opened it forgets it at its next look
            if not isinstance(exc, Exception):
                raise
            given_back = "; its devices were given back" if leases else ""
            raise HookError(
                f"job {job.job_id}: cannot write its environment file or TPU share grant in "
                f"{settings.state_dir} ({exc}){given_back}: free space there (df {settings.state_dir}), "
                "then resume the node"
            ) from exc
    return 0


def _job_gid(environ, uid: int) -> int:
    """The job's primary group: SLURM_JOB_GID (slurmd sets it for the prolog), else the user's from passwd."""
    text = environ.get("SLURM_JOB_GID", "")
    if text.isdigit() and len(text) <= 10:
        return int(text)
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def main(environ=None, prolog_process: tuple[int, int] | None = None, detail_source=None, probe=None) -> int:
    """Entry point for prolog/slurm-tpu-prolog, and the node agent's worker (which gives its hook
    client as the ``prolog_process``, see leasing.acquire, and its resident scontrol as the
    ``detail_source``, see ``Slurm.detail_source``). ``probe``: see HookRun."""
    hook = HookRun("prolog", os.environ if environ is None else environ, probe, detail_source)
    return hook.main(run, prolog_process)
