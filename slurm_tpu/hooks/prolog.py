"""Prolog (root, on each node at job start): lease the job's accelerators.

A job holding TPU shares here (the node's shard GRES, ``HookSettings.shards``) gets its grant and its
broker endpoint (hooks/shards.py); a broker that is down costs one line (stderr and the audit log), never
the job.

Energy (config ``energy.enabled``): the start readings of every device the job holds here, leased, shared
or (GPUs, not leased by default) only allocated, go to ``<state_dir>/energy/<job>`` (energy/figures.py) for
the Epilog; a problem there costs the job's figure (one audit line), never the job.

Exit status 0 unless the node cannot serve the job (a device missing, held by a live job or
not free, gres.conf naming something unknown): then one line says why, the node is drained
with it as the reason (hooks/context.py HookRun), and Slurm requeues (and holds) the job.
"""

from __future__ import annotations

import os

from .context import HookError, HookRun, audit_or_say, job_from_env, say


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
    metered = settings.energy_gres()  # GRES whose devices are read for energy, not leased (GPUs); [] when off
    if not settings.leasable_names() and shared is None and not metered:
        return 0  # nothing to lease, share or meter on this node: no Slurm query at all
    energy_problem = ""
    try:
        allocs = allocation.query_job_gres(hook, metered) or []
    except allocation.MeteredQueryError as exc:  # asked only for the GPUs read for energy: the job runs
        allocs, energy_problem = exc.allocs, f"its GPUs' energy is not read: {exc}"
    hook.probe.mark("slurm_query")
    devices = allocation.resolve(job.job_id, allocs, settings)
    shares = 0
    if shared is not None:
        from . import shards

        shares = shards.shares_of(allocs, shared.gres_name)
    others = allocation.metered_devices(allocs, settings, metered) if metered else []
    if not devices and not shares:
        if others or energy_problem:  # a GPU job where GPUs are not leased: its start readings only
            _energy_only(hook, others, energy_problem)
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
        if settings.energy_enabled:
            _energy_start(hook, ledger, [*devices, *others], shares, energy_problem)
    return 0


def _energy_only(hook: HookRun, devices: list, problem: str) -> None:
    """The energy start of a job that holds nothing leased or shared here (its GPUs, read for energy), or
    the one line saying why its GPUs are not read (``problem``). Never raises: a state directory that
    cannot be opened costs the figure (one line on stderr), never the job."""
    from ..access.ledger import Ledger

    try:
        with Ledger(hook.settings.state_dir) as ledger:
            _energy_start(hook, ledger, devices, 0, problem)
    except Exception as exc:  # noqa: BLE001 - energy never fails a job
        reason = "; ".join(p for p in (problem, f"cannot open the state directory: {exc}") if p)
        say(f"prolog: job {hook.job.job_id}: energy-unavailable: {reason}"[:1000], error=False)


def _energy_start(hook: HookRun, ledger, devices: list, shares: int, problem: str = "") -> None:
    """Write the job's energy start file: the start reading of each device it holds here (``devices``,
    leased or only allocated, and the node's shared TPUs when it holds ``shares``). Never raises: a
    problem (``problem``: one met before) is one ``energy-unavailable`` audit line (stderr when even that
    cannot be written), and the device's figure says why at the end."""
    from ..protocol.audit import ENERGY_UNAVAILABLE
    from ..protocol.energy import StartDevice

    settings, job = hook.settings, hook.job
    sources = settings.energy_sources
    held = [StartDevice(d.identity, d.kind, sources[d.identity], None, None) for d in devices if d.identity in sources]
    if shares and settings.shards is not None:
        # The broker runs a shard job on any of the node's shared TPUs: its part of each is its shares
        # over the node's (with one shared TPU: its shares over the device's).
        total = settings.shards.total
        for identity in settings.shards.devices:
            device = settings.devices.get(identity)
            if device is not None and identity in sources:
                held.append(StartDevice(identity, device.kind, sources[identity], None, (min(shares, total), total)))
    problems: list[str] = [problem] if problem else []
    if held:
        try:
            from ..energy import figures

            uid = -1 if job.uid is None else job.uid
            start, found = figures.start_readings(job.job_id, held, settings.nvml_library, uid=uid)
            problems += found
            figures.write_start(ledger.dir_fd, start)
        except Exception as exc:  # noqa: BLE001 - energy never fails a job (a full state filesystem, a bad library)
            problems.append(f"cannot write the start file: {exc}")
        hook.probe.mark("energy_start")
    if problems:
        audit_or_say(
            ledger, "prolog", ENERGY_UNAVAILABLE, job_id=job.job_id, uid=job.uid, reason="; ".join(problems)[:1000]
        )


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
