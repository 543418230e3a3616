"""Epilog (root, on each node at job end): audit usage, verify, restore idle ownership, drop leases.

Idempotent: a second run, or a run for a job with no lease, changes nothing.
When a process survives holding a device, or a device vanished during the job,
the node is drained with a reason starting ``slurm-tpu:`` (one scontrol call,
only in that case; a device the holder scan could not verify is kept, no drain). TPU shares: hooks/shards.py.
"""

from __future__ import annotations

import os

from .context import HookRun, audit_or_say, job_from_env, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def run(hook: HookRun, answer: Callable[[], None] | None = None) -> int:
    """The epilog's work. ``answer``: the node agent's early answer (see below); None in a hook process."""
    from ..access.ledger import Ledger
    from ..protocol.broker_wire import grant_path
    from ..protocol.leases import HELD
    from . import jobusage, leasing, settings as hook_settings

    hook.probe.mark("imports")
    settings = hook.settings = hook_settings.load(hook.environ, hook.node, create=False)
    hook.probe.mark("settings")
    job = hook.job = job_from_env(hook.environ, settings.node, need_uid=False)
    if not os.path.lexists(settings.state_dir):
        return 0  # never leased anything on this node
    problems: list[str] = []
    with Ledger(settings.state_dir) as ledger:
        ledger.remove_job_env(job.job_id)
        leases = ledger.of_job(job.job_id)
        hook.probe.mark("ledger_read")
        # TPU shares: looked for where the node shares devices, or a grant is left from when it did
        # (one stat; hooks/shards.py is imported only then).
        grant = None
        if settings.shards is not None or os.path.lexists(grant_path(settings.state_dir, job.job_id)):
            from . import shards

            grant = shards.read_grant(ledger, job.job_id)
            if grant is None:
                shards.remove_grant(ledger, job.job_id)  # an unreadable one: nothing to account
        # Energy: the Prolog's start file and what the devices read now give one figure per device
        # (energy/figures.py), an ``energy`` audit event each and the node's total in the spool entry; a
        # problem costs only the figure. A start file (one lstat) is all a GPU job leaves where GPUs are not leased.
        started = _has_energy_start(settings.state_dir, job.job_id)
        if started and not settings.energy_enabled:
            _energy_discard(ledger, job.job_id)  # turned off since the Prolog: no figure, no file left behind
        metered = settings.energy_enabled and started
        if not leases and grant is None and not metered:
            return 0
        # The end: its time and the devices' readings before the node agent answers Slurm (below), so the
        # node's next job's start can never precede this job's end; the figures are computed after.
        taken = _energy_take(hook, ledger) if metered else None
        records: list = []
        if leases:
            # The node agent (``answer``) answers Slurm here and releases after, off the path of the
            # node's next job (docs/architecture.md): safe because the state lock is taken first and
            # held until the release ends, and a release that fails still drains the node below.
            with ledger.locked(when=answer is not None):
                if answer is not None:
                    answer()
                    hook.probe.mark("answered")
                # Usage before the release (outside the lock in a hook process: it reads only the job's own box).
                records = jobusage.collect(ledger, job.job_id, leases[0].uid, [lease.identity for lease in leases])
                jobusage.discard(ledger, job.job_id)
                hook.probe.mark("usage_box")
                problems = leasing.release(ledger, job.job_id, settings, probe=hook.probe)
            hook.probe.mark("release")
        figures = None
        if grant is not None:
            # The broker's figures (root's, never the job's), then the grant goes.
            figures, notice = shards.close_job(ledger, job.job_id)
            hook.probe.mark("broker_close")
            if notice is not None:
                say(f"epilog: {notice}", error=False)
        # The job's uid: its lease's, its grant's, else Slurm's (-1: unknown, as the audit readers take it).
        uid = leases[0].uid if leases else grant[1] if grant is not None else job.uid if job.uid is not None else -1
        energy = None
        if taken is not None:
            energy = _energy_end(hook, ledger, uid, records, figures, taken)
            hook.probe.mark("energy_end")
        elif settings.energy_enabled:
            # Only leases still held: one a first run of this Epilog already ended had its events then.
            held = [lease.identity for lease in leases if lease.phase == HELD]
            energy = _energy_missing(hook, ledger, uid, held, grant is not None)
        # For Slurm's own job record (AdminComment), applied later by the accounting collector. After the
        # lock (it needs none): the spool's disk flush never holds up the node's next Prolog.
        jobusage.spool(
            ledger,
            job.job_id,
            uid,
            settings.node,
            len(leases),
            records,
            settings.accounting_spool,
            shares=grant[3] if grant is not None else 0,
            shard_figures=figures,
            energy=energy,
        )
        hook.probe.mark("spool")
    for notice in problems:
        if isinstance(notice, leasing.Withheld):  # the device waits, the node serves on
            say(f"epilog: slurm-tpu: {notice}; the node stays in service")
    problems = [p for p in problems if not isinstance(p, leasing.Withheld)]
    if not problems:
        return 0
    reason = "slurm-tpu: " + "; ".join(problems)
    say(f"epilog: {reason}")
    # Our own reason is more useful than Slurm's generic "Epilog error".
    return 0 if hook.drain(job.node, reason) else 1


def _has_energy_start(state_dir: str, job_id: int) -> bool:
    """Whether the job may have an energy start file here (one lstat; energy/figures.py is imported only then)."""
    from ..protocol.energy import DIR

    return os.path.lexists(os.path.join(state_dir, DIR, str(job_id)))


def _energy_discard(ledger, job_id: int) -> None:
    """Remove the job's energy start and poll files unread. Never raises."""
    try:
        from ..energy import figures

        figures.discard_start(ledger.dir_fd, job_id)
    except Exception as exc:  # noqa: BLE001 - a file left costs nothing but its bytes
        say(f"epilog: job {job_id}: cannot remove its energy start file: {exc}", error=False)


class _Taken:
    """The job's energy files and its end readings, taken before the node agent answers Slurm."""

    __slots__ = ("start", "poll", "why", "end_ns", "boot", "readings")

    def __init__(self, start, poll, why: str, end_ns: int = 0, boot: str = "", readings=None):
        self.start, self.poll, self.why, self.end_ns, self.boot, self.readings = (
            start,
            poll,
            why,
            end_ns,
            boot,
            readings,
        )


def _energy_take(hook: HookRun, ledger) -> _Taken:
    """The job's start and poll files (then removed), the end's time and boot, and the devices' end
    readings (NVML, hwmon: in a child with a deadline, energy/guard.py). Never raises."""
    settings, job = hook.settings, hook.job
    try:
        from ..energy import figures as energy

        start, poll, why = energy.take_start(ledger.dir_fd, job.job_id)
        if start is None:
            return _Taken(None, None, why)
        end_ns, boot = energy.clock_ns(), energy.boot_id()
        readings = {} if boot != start.boot else energy.end_readings(start, settings.nvml_library, settings.sysfs_root)
        hook.probe.mark("energy_read")
        return _Taken(start, poll, why, end_ns, boot, readings)
    except Exception as exc:  # noqa: BLE001 - energy never fails a job or drains a node
        return _Taken(None, None, f"epilog: {exc}")


def _energy_end(hook: HookRun, ledger, uid: int, records: list, broker: dict | None, taken: _Taken) -> list | None:
    """The job's figure on each device of its start file (``taken``: read before the answer), each audited
    as an ``energy`` event; None when there is none. ``records``: the job's usage records (its self-reported
    busy time); ``broker``: the TPU broker's figures of a shard job (its busy time, root's). Never raises."""
    from ..protocol import audit

    job, settings = hook.job, hook.settings
    try:
        from ..energy import figures as energy

        start = taken.start
        if start is None:
            if taken.why:
                ledger.audit(audit.ENERGY_UNAVAILABLE, job_id=job.job_id, uid=uid, reason=taken.why[:1000])
            return None
        reported = {record.identity: record.seconds for record in records}
        busy = energy.busy_times(start, reported, (broker or {}).get("busy_ms"))
        found = energy.device_figures(
            start,
            settings.nvml_library,
            taken.poll,
            busy,
            end_ns=taken.end_ns,
            boot=taken.boot,
            sysfs_root=settings.sysfs_root,
            readings=taken.readings,
            poll_s=settings.energy_poll_s,
            poll_problem=taken.why,
        )
    except Exception as exc:  # noqa: BLE001 - energy never fails a job or drains a node
        audit_or_say(
            ledger, "epilog", audit.ENERGY_UNAVAILABLE, job_id=job.job_id, uid=uid, reason=f"epilog: {exc}"[:1000]
        )
        return None
    _audit_figures(ledger, job.job_id, uid, found)
    return found


def _energy_missing(hook: HookRun, ledger, uid: int, leased: list[str], shared: bool) -> list | None:
    """``unavailable`` figures, audited, for the devices the job held here (its leases, and the node's shared
    TPUs when it had a grant) when it has no start file: the node rebooted (the state directory is a tmpfs)
    or the Prolog could not write it. None when none of them has an energy source. Never raises."""
    from ..protocol.energy import UNAVAILABLE, DeviceEnergy

    settings = hook.settings
    identities = [*leased]
    if shared and settings.shards is not None:
        identities += [i for i in settings.shards.devices if i not in identities]
    note = (
        "no start reading: the job's energy start file is missing (the node rebooted, or its Prolog could not write it)"
    )
    found = []
    for identity in identities:
        device = settings.devices.get(identity)
        if device is not None and identity in settings.energy_sources:
            found.append(DeviceEnergy(identity, device.kind, None, UNAVAILABLE, 0.0, note))
    if not found:
        return None
    _audit_figures(ledger, hook.job.job_id, uid, found)
    return found


def _audit_figures(ledger, job_id: int, uid: int, found: list) -> None:
    from ..protocol import audit

    for figure in found:
        audit_or_say(
            ledger,
            "epilog",
            audit.ENERGY,
            identity=figure.identity,
            job_id=job_id,
            uid=uid,
            joules=None if figure.joules is None else round(figure.joules, 6),
            method=figure.method,
            seconds=round(figure.seconds, 3),
            note=figure.note,
        )


def main(environ=None, answer: Callable[[], None] | None = None, probe=None) -> int:
    """Entry point for epilog/slurm-tpu-epilog; the node agent's worker passes ``answer`` (see run).
    ``probe``: see HookRun."""
    hook = HookRun("epilog", os.environ if environ is None else environ, probe)
    return hook.main(run, answer)
