"""Taking, reclaiming and releasing leases together with device ownership.

Order matters for crash safety: a lease is claimed *before* the node is handed
to the job's user and dropped only *after* idle ownership is back, so a hook
killed at any point leaves a lease that covers every non-idle node. A lease whose
job no longer runs on this node is then reclaimed by the next prolog that Slurm
gives the device to (see :func:`holder_alive`).
"""

from __future__ import annotations

# Annotations only: typing costs the hooks milliseconds per job at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable

    from ..locks.node_inventory import KnownDevice
    from .context import JobContext
    from .settings import HookSettings

import os
import time

from ..locks import ownership, processes
from ..locks.ledger import BadLease, Lease, Ledger, process_start_time
from .context import HookError

# How long a prolog waits for another job's lease to go (its epilog may be
# running right now) before declaring the device held by a live job.
LIVE_HOLDER_WAIT_S = 10.0
# How long an epilog waits for the job's last processes to close the device.
SURVIVOR_WAIT_S = 3.0


def holder_alive(lease: Lease | BadLease) -> str | None:
    """Why the lease's job still runs on this node, or None when it does not.

    Cheap and local, no Slurm query: the job is alive while one of its
    ``slurmstepd: [job.step]`` processes exists (every step, batch included, runs
    under one) or while the prolog that took the lease still runs (it runs before
    any slurmstepd). A job Slurm has finished has neither; its epilog may still
    be running, and it releases the lease under the same lock as a reclaim.
    """
    if isinstance(lease, BadLease):
        return None
    if processes.process_alive(lease.prolog_pid, lease.prolog_start):
        return f"its prolog (pid {lease.prolog_pid}) is still running"
    steps = processes.job_step_pids(lease.job_id)
    if steps:
        return f"slurmstepd pid {steps[0]} still runs for it"
    return None


def _rdevs(nodes: Iterable[str]) -> list[int]:
    rdevs = []
    for node in nodes:
        state = ownership.node_state(node)
        if state is not None:
            rdevs.append(state.rdev)
    return rdevs


def restore_idle(device: KnownDevice | None, settings: HookSettings) -> list[str]:
    """Give the device's current nodes back to the idle owner; returns problems."""
    if device is None:
        return []
    problems = []
    for node in device.device_nodes:
        try:
            ownership.set_owner(node, device.identity, settings.idle_uid, settings.idle_gid, settings.idle_mode)
        except Exception as exc:  # DeviceError, OSError: report, keep going
            problems.append(str(exc))
    return problems


def reclaim(ledger: Ledger, lease: Lease | BadLease, settings: HookSettings, by_job: int | None) -> None:
    """Drop a lease whose job is gone: idle ownership first, then the file."""
    problems = restore_idle(settings.devices.get(lease.identity), settings)
    ledger.drop(lease.identity)
    ledger.audit("reclaim", identity=lease.identity, job_id=lease.job_id, uid=lease.uid, by_job=by_job,
                 problems=problems or None)


def acquire(ledger: Ledger, job: JobContext, devices: list[KnownDevice], settings: HookSettings,
            wait_s: float = LIVE_HOLDER_WAIT_S) -> list[Lease]:
    """Lease every device for the job and hand its nodes to the job's user.

    All or nothing: on failure the leases taken here are rolled back and
    HookError says which device is held by whom (or is missing).
    """
    assert job.uid is not None
    allocation = tuple(d.identity for d in devices)
    me, my_start = os.getpid(), process_start_time(os.getpid())
    taken: list[Lease] = []
    try:
        for device in devices:
            lease = Lease(identity=device.identity, job_id=job.job_id, uid=job.uid, kind=device.kind,
                          user=job.user, start=round(time.time(), 6), device_nodes=device.device_nodes,
                          allocation=allocation, node=job.node, prolog_pid=me, prolog_start=my_start)
            _claim(ledger, lease, device, settings, wait_s)
            taken.append(lease)
            ledger.lock()
            try:
                for node in device.device_nodes:
                    ownership.set_owner(node, device.identity, job.uid, -1, settings.lease_mode)
                if not device.device_nodes:
                    raise HookError(f"job {job.job_id}: {device.identity} has no device node (unplugged?); "
                                    "replug it or drain the node")
            finally:
                ledger.unlock()
            ledger.audit("acquire", identity=device.identity, job_id=job.job_id, uid=job.uid,
                         nodes=list(device.device_nodes))
    except BaseException as exc:
        roll_back(ledger, job, taken, settings)
        if isinstance(exc, Exception) and not isinstance(exc, HookError):
            raise HookError(f"job {job.job_id}: {exc}") from exc
        raise
    return taken


def roll_back(ledger: Ledger, job: JobContext, leases: list[Lease], settings: HookSettings) -> None:
    """Undo :func:`acquire` for ``leases``: idle ownership back, then the lease files go."""
    ledger.lock()
    try:
        for lease in leases:
            restore_idle(settings.devices.get(lease.identity), settings)
            ledger.drop(lease.identity)
            ledger.audit("rollback", identity=lease.identity, job_id=job.job_id, uid=job.uid)
    finally:
        ledger.unlock()


def _claim(ledger: Ledger, lease: Lease, device: KnownDevice, settings: HookSettings, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        ledger.lock()
        try:
            if ledger.claim(lease):
                return
            holder = ledger.read(lease.identity)
            if holder is None:
                continue  # released between our claim and read: try again
            if isinstance(holder, Lease) and holder.job_id == lease.job_id:
                # The same job again (a requeued job keeps its id, and its first
                # prolog may have died): close the old lease in the audit, retake it.
                reclaim(ledger, holder, settings, by_job=lease.job_id)
                continue
            why = holder_alive(holder)
            if why is None:
                users = processes.holders(_rdevs(device.device_nodes))
                if users:
                    pid = next(iter(users))
                    raise HookError(f"job {lease.job_id}: {device.identity} still has a stale lease of ended "
                                    f"job {holder.job_id} and pid {pid} keeps it open; kill it, then resume "
                                    "the node")
                reclaim(ledger, holder, settings, by_job=lease.job_id)
                continue
        finally:
            ledger.unlock()
        if time.monotonic() >= deadline:
            raise HookError(f"job {lease.job_id}: {device.identity} is held by live job {holder.job_id} "
                            f"(uid {holder.uid}: {why}); Slurm allocated it twice or the ledger is wrong: "
                            "check `slurm-tpu leases` on this node")
        time.sleep(0.1)


def release(ledger: Ledger, job_id: int, settings: HookSettings, wait_s: float = SURVIVOR_WAIT_S) -> list[str]:
    """Release the job's leases; returns problems that should drain the node.

    A device still open by a process keeps its lease (the node gets drained,
    and the next prolog reclaims it once the process is gone); a device that
    vanished loses its lease (nothing is left to protect).
    """
    problems: list[str] = []
    deadline = time.monotonic() + wait_s
    ledger.lock()
    try:
        leases = ledger.of_job(job_id)
        # Usage records are collected by the epilog before this, outside the lock (hooks/jobusage.py).
        for lease in leases:
            device = settings.devices.get(lease.identity)
            present = [n for n in (device.device_nodes if device else ()) if ownership.node_state(n)]
            if not present:
                ledger.drop(lease.identity)
                ledger.audit("release", identity=lease.identity, job_id=job_id, uid=lease.uid, vanished=True)
                problems.append(f"{lease.identity} vanished during job {job_id}; check the device and "
                                "its cable, then resume the node")
                continue
            users = processes.holders(_rdevs(present), uid=lease.uid)
            while users and time.monotonic() < deadline:
                ledger.unlock()
                time.sleep(0.1)
                ledger.lock()
                users = processes.holders(_rdevs(present), uid=lease.uid)
            if users:
                pids = ",".join(str(p) for p in sorted(users))
                ledger.audit("survivor", identity=lease.identity, job_id=job_id, uid=lease.uid, pids=pids)
                problems.append(f"pid {pids} of job {job_id} still holds {lease.identity}; kill it, then "
                                "resume the node")
                continue
            failed = restore_idle(device, settings)
            if failed:
                problems.extend(failed)
                continue
            ledger.drop(lease.identity)
            ledger.audit("release", identity=lease.identity, job_id=job_id, uid=lease.uid)
    finally:
        ledger.unlock()
    return problems
