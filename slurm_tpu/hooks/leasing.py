"""Taking, reclaiming and releasing leases together with device ownership.

Order matters for crash safety: a lease is claimed *before* the node is handed
to the job's user and dropped only *after* idle ownership is back, so a hook
killed at any point leaves a lease that covers every non-idle node; the next
prolog given the device reclaims a lease whose job is gone (:func:`holder_alive`).
How a lease ends (take away, revoke, check, give back; phases ``revoking`` and
``releasing``) is docs/security.md's "Revocation at job end" and :func:`end_lease`.
Every phase change is one :func:`_move`, under the state lock, as protocol/leases.py
TRANSITIONS allows.
"""

from __future__ import annotations

import os
import time

from ..access import ownership, processes, revoke
from ..access.ledger import HELD, KEPT, RELEASING, REVOKING, BadLease, Lease, Ledger
from ..access.processes import process_start_time
from ..protocol import audit
from ..protocol.hooks_snapshot import GASKET_WRITERS, USB_PORT
from ..protocol.leases import FREE, UNREADABLE, check_transition
from .context import HookError
from .probe import OFF as NO_PROBE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..protocol.inventory import KnownDevice
    from .context import JobContext
    from .probe import Probe
    from .settings import HookSettings

# How long a prolog waits for another job's lease to go (its epilog may be
# running right now) before declaring the device held by a live job.
LIVE_HOLDER_WAIT_S = 10.0
# How long an epilog waits for the job's last processes to close the device.
SURVIVOR_WAIT_S = 3.0
# How long a revoked USB stick may take to re-enumerate before its lease counts
# as stale (a real stick is back in about a second).
REENUMERATE_S = 10.0


def holder_alive(lease: Lease | BadLease) -> str | None:
    """Why the lease's job (or its revocation) still runs on this node, or None when it does not.

    Cheap and local, no Slurm query: the job is alive while one of its slurmstepd
    processes exists (every step, batch included, runs under one) or while the prolog
    that took the lease still runs (it runs before any slurmstepd). A revoked USB stick
    is busy until it is back; a lease being released while the process releasing it runs.
    """
    if isinstance(lease, BadLease) or lease.phase == KEPT:
        return None
    if lease.phase == RELEASING:
        if processes.process_alive(lease.releaser_pid, lease.releaser_start):
            return f"its release is running (pid {lease.releaser_pid}: the scan for processes holding it)"
        return None  # the hook releasing it died: the next one starts the release again
    if lease.phase == REVOKING:
        age = time.time() - lease.phase_since
        return f"it is re-enumerating after its revocation {age:.1f} s ago" if age < REENUMERATE_S else None
    if processes.process_alive(lease.prolog_pid, lease.prolog_start):
        return f"its prolog (pid {lease.prolog_pid}) is still running"
    steps = processes.job_step_pids(lease.job_id)
    return f"slurmstepd pid {steps[0]} still runs for it" if steps else None


def _set_owners(nodes: Iterable[str], identity: str, owner: tuple[int, int, int]) -> list[str]:
    """Give each node ``owner`` (uid, gid, mode); returns problems (DeviceError, OSError: each said, the rest done)."""
    problems = []
    for node in nodes:
        try:
            ownership.set_owner(node, identity, *owner)
        except Exception as exc:  # noqa: BLE001 - DeviceError, OSError: report, keep going
            problems.append(str(exc))
    return problems


def restore_idle(device: KnownDevice | None, settings: HookSettings) -> list[str]:
    """Give the device's current nodes back to the idle owner; returns problems."""
    return _set_owners(device.device_nodes, device.identity, ownership.owner_for(None, settings)) if device else []


def _move(ledger: Ledger, lease: Lease | BadLease, phase: str, releaser: tuple[int, int] | None = None) -> Lease:
    """Write the lease in ``phase`` (FREE: remove its file), under the state lock; the lease as written.

    The one writer of a lease's phase: ValueError unless protocol/leases.py TRANSITIONS lets the
    phase the lease was read in become ``phase``. ``releaser``: the releasing process's pid and
    start time. An unreadable lease is replaced by a readable one of nobody's (job -1).
    """
    assert ledger.held, "a lease's phase changes under the state lock"
    check_transition(lease.phase if isinstance(lease, Lease) else UNREADABLE, phase)
    if isinstance(lease, BadLease):  # the nodes it is revoked on stay known (see udev_event)
        lease = Lease(identity=lease.identity, job_id=-1, uid=-1, device_nodes=lease.device_nodes)
    if phase == FREE:
        ledger.drop(lease.identity)
        return lease
    lease.phase, lease.phase_since = phase, round(time.time(), 6)
    if releaser is not None:
        lease.releaser_pid, lease.releaser_start = releaser
    ledger.rewrite(lease)
    return lease


def _end(ledger: Ledger, lease: Lease | BadLease, event: str, **fields: object) -> None:
    """Free the device (the lease file goes, see :func:`_move`) and audit ``event`` for the lease."""
    lease = _move(ledger, lease, FREE)
    ledger.audit(event, identity=lease.identity, job_id=lease.job_id, uid=lease.uid, **fields)


def end_revocation(ledger: Ledger, lease: Lease, nodes: Iterable[str]) -> None:
    """Finish the release of a power-cycled USB stick (:func:`end_lease`) once it is back on ``nodes``
    with idle ownership (udev_event); job -1: an unreadable lease being reclaimed (:func:`_move`)."""
    assert lease.phase == REVOKING
    _end(ledger, lease, audit.RELEASE if lease.job_id >= 0 else audit.RECLAIM, nodes=list(nodes), revoked=True)


def _filesystems(nodes: Iterable[str], settings: HookSettings, identity: str) -> set[int]:
    """st_dev of every filesystem holding one of the device's nodes (see processes.scan_holders)."""
    found = set()
    for path in (*nodes, os.path.join(settings.slot_dir, identity), "/dev"):
        try:
            found.add(os.lstat(path).st_dev)
        except OSError:
            pass
    return found


def _owners(ledger: Ledger, lease: Lease | BadLease, holders: dict[int, str]) -> str:
    """Who the surviving ``holders`` are: ``uid U`` each, and for a uid other than the job's user the job of
    that uid the audit log last shows holding the device (where the fd came from: not the job just ended)."""
    named = []
    for uid in sorted({processes.process_uid(pid) for pid in holders}, key=lambda uid: (uid is None, uid or 0)):
        if uid is None:
            named.append("a holder that exited since")
            continue
        earlier = ledger.last_holder(lease.identity, uid) if uid != lease.uid else None
        named.append(f"uid {uid}" + (f", whose job {earlier[0]} held it before" if earlier else ""))
    return "; ".join(named)


class Withheld(str):
    """A problem that keeps the device out of use (lease ``kept``, node root 0600) without draining the node.

    The holder scan ran out of time (any local user can open more fds than it reads): a
    holder may hide in what was not read, but that user must not take the whole node out
    of service either. Only this device waits; the next scan decides (docs/security.md).
    """

    __slots__ = ()


def _unverified(found: processes.Scan) -> str:
    """The largest processes the scan could not check, for the admin: ``pid P (uid U, N fds)``."""
    biggest = sorted(found.unverified, key=lambda entry: -entry[2])[:3]
    named = ", ".join(f"pid {pid} (uid {uid}, {fds} fds)" for pid, uid, fds in biggest)
    more = len(found.unverified) - len(biggest)
    return named + (f" and {more} more" if more > 0 else "")


def _unrevocable_holders(
    ledger: Ledger,
    lease: Lease | BadLease,
    device: KnownDevice,
    present: list[str],
    settings: HookSettings,
    wait_s: float,
) -> str | None:
    """Why a device that cannot be revoked is not free yet (a :class:`Withheld` when unverified), or None.
    Called without the state lock, the lease in phase ``releasing``: it only reads /proc
    and sysfs and appends to the audit log, which needs no lock."""
    assert not ledger.held
    identity, job_id = lease.identity, lease.job_id
    rdevs = [state.rdev for state in map(ownership.node_state, present) if state is not None]
    filesystems = _filesystems(present, settings, identity)
    skip_root = lease.uid != 0  # a user's fd reaches a root process only if root software takes it
    first_uid = lease.uid if lease.uid > 0 else None

    def scan(only: list[int] | None = None) -> processes.Scan:
        return processes.scan_holders(rdevs, filesystems, settings.holder_scan_s, skip_root, first_uid, only)

    found = scan()
    deadline = time.monotonic() + wait_s
    while found.holders and time.monotonic() < deadline:
        time.sleep(0.1)  # the job's last processes may be exiting right now
        again = scan(sorted(found.holders))  # cheap: only those; all of them again once they let go
        found = again if again.holders else scan()
    if found.holders:  # named even when the rest could not be read: a real holder is caught
        pids = ",".join(str(p) for p in sorted(found.holders))
        how = "/".join(sorted(set(found.holders.values())))
        ledger.audit(audit.SURVIVOR, identity=identity, job_id=job_id, pids=pids, how=how)
        owners = _owners(ledger, lease, found.holders)
        return f"pid {pids} still holds {identity} ({how}) after job {job_id} ({owners}); kill it, then resume the node"
    if not found.complete:
        unverified = _unverified(found)
        ledger.audit(
            audit.SCAN_INCOMPLETE,
            identity=identity,
            job_id=job_id,
            scanned=found.scanned,
            total=found.total,
            unverified=unverified,
        )
        if settings.revocation(device.kind, device.bus) != GASKET_WRITERS:
            return Withheld(
                f"holder scan of {identity} after job {job_id} could not read every open file within "
                f"{settings.holder_scan_s:g} s ({len(found.unverified)} process(es) unchecked: {unverified}); "
                f"{identity} stays out of use (root 0600) until a scan completes"
            )
        # Gasket counts its writers itself (below): only a read-only holder could hide in
        # what was not read, the residual docs/security.md's coverage table names.
    writers = gasket_writers(device, present, settings)
    while writers and time.monotonic() < deadline:
        time.sleep(0.1)  # an exiting process's files are released at the end of its do_exit()
        writers = gasket_writers(device, present, settings)
    if writers is None:
        return (
            f"the apex driver shows no write_open_count for {identity} after job {job_id} (driver "
            f"unloaded? sysfs under {settings.sysfs_root}?), so nobody can tell whether a writer is left; "
            "check it, then resume the node"
        )
    if writers:
        ledger.audit(audit.SURVIVOR, identity=identity, job_id=job_id, writers=writers)
        return (
            f"the apex driver counts {writers} writable fd(s) on {identity} still open after job {job_id} "
            "that the scan of /proc did not find (in flight over a Unix socket, or moved between processes "
            "while the scan read them); close them (or reboot), then resume the node"
        )
    return None


def gasket_writers(device: KnownDevice, nodes: Iterable[str], settings: HookSettings) -> int | None:
    """Writable files the apex driver counts open on the device's nodes (0 for other families).

    The count includes an fd in flight over SCM_RIGHTS or kept by a mapping (access/revoke.py).
    None when a node's count cannot be read: the driver always shows it, so a missing or
    garbled one means nobody can say the card is free, and the callers keep it (fail closed).
    """
    if settings.revocation(device.kind, device.bus) != GASKET_WRITERS:
        return 0
    counts = [revoke.gasket_writers(settings.sysfs_root, node) for node in nodes]
    return None if None in counts else sum(count or 0 for count in counts)


class DeviceNotFree(HookError):
    """The prolog found a device with writers no lease accounts for; it is kept for the job that leaked it."""


def _refuse_if_written(ledger: Ledger, lease: Lease, device: KnownDevice, settings: HookSettings) -> None:
    """Before the device is handed over: raise DeviceNotFree if the apex driver counts writers on it
    (or shows no count: fail closed).

    The device is still root 0600, so a writer here was left by an earlier holder, never
    by this job: the lease becomes a kept lease of the last job the audit log shows holding
    the device, so the drain reason, ``slurm-tpu leases`` and ``leases --clear`` name that job.
    """
    writers = gasket_writers(device, device.device_nodes, settings)
    if writers == 0:
        return
    last = ledger.last_holder(device.identity)
    job_id, uid = last if last is not None else (-1, -1)
    kept = Lease(
        identity=device.identity,
        job_id=job_id,
        uid=uid,
        kind=device.kind,
        start=round(time.time(), 6),
        device_nodes=device.device_nodes,
        node=lease.node,
    )
    _move(ledger, kept, KEPT)  # written over the job's lease, held until now
    blame = f"last held by job {job_id}" if last is not None else "no job in the audit log held it"
    if writers is None:
        raise DeviceNotFree(
            f"job {lease.job_id}: the apex driver shows no write_open_count for {device.identity} "
            f"(driver unloaded? sysfs under {settings.sysfs_root}?), so nobody can tell whether a "
            f"writer is left ({blame}); the device stays root 0600: check it, then "
            "`slurm-tpu leases --clear` and resume the node"
        )
    ledger.audit(audit.SURVIVOR, identity=device.identity, job_id=job_id, writers=writers, by_job=lease.job_id)
    raise DeviceNotFree(
        f"job {lease.job_id}: the apex driver counts {writers} writable fd(s) on {device.identity} "
        f"before it was handed over ({blame}); the device stays root 0600 and leased to that job: "
        "close them (or reboot), then `slurm-tpu leases --clear` and resume the node"
    )


def end_lease(
    ledger: Ledger,
    lease: Lease | BadLease,
    settings: HookSettings,
    event: str,
    by_job: int | None = None,
    wait_s: float = 0.0,
    probe: Probe = NO_PROBE,
) -> list[str]:
    """Take the device away from the lease's job, revoke, check, give it back; returns problems.

    Under the state lock; a device that cannot be revoked is scanned for holders without it
    (phase ``releasing``). ``event`` names the audit record. A problem keeps the lease (phase
    ``kept``, the node root 0600) so nobody else gets a device that is not free.
    """
    assert ledger.held, "end_lease runs under the state lock"
    identity, job_id = lease.identity, lease.job_id
    device = settings.devices.get(identity)
    present = [n for n in (device.device_nodes if device else ()) if ownership.node_state(n)]
    if not present:
        if isinstance(lease, Lease) and lease.phase == REVOKING and event == audit.RELEASE:
            return []  # a second epilog run while the stick re-enumerates: udev finishes it
        _end(ledger, lease, event, by_job=by_job, vanished=True)
        vanished = f"{identity} vanished during job {job_id}; check the device and its cable, then resume the node"
        return [vanished] if event == audit.RELEASE else []
    problems = _set_owners(present, identity, ownership.ROOT_ONLY)  # nobody else opens it any more
    probe.mark("take_away")
    if problems:
        _move(ledger, lease, KEPT)
        return problems
    assert device is not None
    if _power_cycled(device, settings):
        # Phase first: the udev events of the disconnect must find it revoking; the
        # nodes it had tell udev_event the old device's events from the new one's.
        lease.device_nodes = tuple(present)
        lease = _move(ledger, lease, REVOKING)
        try:
            devnum = revoke.disconnect_usb(settings.sysfs_root, identity)
            probe.mark("revoke_usb")
        except revoke.RevokeError as exc:
            _move(ledger, lease, KEPT)
            ledger.audit(audit.REVOKE_FAILED, identity=identity, job_id=job_id, uid=lease.uid, error=str(exc))
            return [str(exc)]
        if devnum is not None:
            ledger.audit(audit.REVOKE, identity=identity, job_id=job_id, uid=lease.uid, devnum=devnum, by_job=by_job)
            return []  # every fd on it is dead; udev_event releases it once it is back
        # No usb_device in sysfs: nothing is left whose fds could work. Release now.
        problems = restore_idle(device, settings)
    else:
        # The scan (and the wait for the job's last processes) without the state lock: the lease
        # says who releases it, so a prolog for this device waits for it (holder_alive) instead of
        # reclaiming it meanwhile, and the node's other devices' hooks do not wait at all.
        me = os.getpid()
        lease = _move(ledger, lease, RELEASING, releaser=(me, process_start_time(me)))
        with ledger.unlocked():
            why = _unrevocable_holders(ledger, lease, device, present, settings, wait_s)
        probe.mark("holder_scan")
        if _held_as(ledger, lease, ("job_id", "phase", "phase_since", "releaser_pid")) is None:
            return []  # another hook took this process for gone and ended the lease itself
        problems = [why] if why is not None else restore_idle(device, settings)
    if problems:
        _move(ledger, lease, KEPT)
        return problems
    _end(ledger, lease, event, by_job=by_job)
    probe.mark("restore_idle")
    return []


def clear(ledger: Ledger, settings: HookSettings, identity: str | None = None) -> list[tuple[str, str]]:
    """End stale leases now (admin ``leases --clear``, health check): (identity, outcome) pairs.

    ``identity`` None clears every kept or unreadable lease; naming one clears any stale
    lease on it. A live job's lease is never touched. The outcome is ``cleared``,
    ``revoking`` (udev restores idle ownership when the stick is back) or the problem.
    """
    outcomes = []
    with ledger.locked():
        # Each lease read when its turn comes, not listed ahead: end_lease lets the lock go while it
        # scans, so a lease read before that may have been ended, and its device leased again, since.
        for name in ledger.names():
            if identity is not None and name != identity:
                continue
            lease = ledger.read(name)
            if lease is None:
                continue
            if identity is None and isinstance(lease, Lease) and lease.phase != KEPT:
                continue
            why = holder_alive(lease)
            if why is not None:
                outcomes.append((lease.identity, f"job {lease.job_id} is not over ({why}); left alone"))
                continue
            problems = end_lease(ledger, lease, settings, audit.CLEAR)
            after = ledger.read(lease.identity)
            revoking = isinstance(after, Lease) and after.phase == REVOKING
            outcomes.append((lease.identity, "; ".join(problems) or ("revoking" if revoking else "cleared")))
    return outcomes


def acquire(
    ledger: Ledger,
    job: JobContext,
    devices: list[KnownDevice],
    settings: HookSettings,
    wait_s: float = LIVE_HOLDER_WAIT_S,
    prolog_process: tuple[int, int] | None = None,
    probe: Probe = NO_PROBE,
) -> list[Lease]:
    """Lease every device for the job and hand its nodes to the job's user.

    All or nothing: on failure the leases taken here are rolled back and HookError says
    which device is held by whom (or is missing). ``prolog_process``: (pid, start time) of
    the process Slurm started for this prolog, which the leases record (:func:`holder_alive`);
    this process by default, the hook client's in the node agent's worker (which outlives it).
    """
    assert job.uid is not None
    allocation = tuple(d.identity for d in devices)
    me, my_start = prolog_process or (os.getpid(), process_start_time(os.getpid()))
    if my_start <= 0:
        raise HookError(f"job {job.job_id}: its prolog process (pid {me}) is gone; nothing was leased")
    taken: list[Lease] = []
    try:
        for device in devices:
            lease = Lease(
                identity=device.identity,
                job_id=job.job_id,
                uid=job.uid,
                kind=device.kind,
                user=job.user,
                start=round(time.time(), 6),
                device_nodes=device.device_nodes,
                allocation=allocation,
                node=job.node,
                prolog_pid=me,
                prolog_start=my_start,
            )
            _claim(ledger, lease, device, settings, wait_s)
            probe.mark("claim")
            # One block from here to the chown: nothing of the device changes unless the lease is
            # still this prolog's (a release may have taken its process for gone while it waited).
            with ledger.locked():
                if _held_as(ledger, lease) is None:
                    raise HookError(
                        f"job {job.job_id}: {device.identity}'s lease was ended while its prolog ran "
                        f"(its prolog process, pid {me}, was gone); the device stays with its new holder"
                    )
                device = _current_nodes(ledger, device, lease)
                _refuse_if_written(ledger, lease, device, settings)  # before it counts as this job's
                probe.mark("writers_check")
                taken.append(lease)
                for node in device.device_nodes:
                    ownership.set_owner(node, device.identity, *ownership.owner_for(lease, settings))
                if not device.device_nodes:
                    raise HookError(
                        f"job {job.job_id}: {device.identity} has no device node (unplugged?); "
                        "replug it or drain the node"
                    )
            probe.mark("chown")
            ledger.audit(
                audit.ACQUIRE, identity=device.identity, job_id=job.job_id, uid=job.uid, nodes=list(device.device_nodes)
            )
            probe.mark("audit")
    except BaseException as exc:
        roll_back(ledger, taken, settings)
        if isinstance(exc, Exception) and not isinstance(exc, HookError):
            raise HookError(f"job {job.job_id}: {exc}") from exc
        raise
    return taken


def roll_back(ledger: Ledger, leases: list[Lease], settings: HookSettings) -> None:
    """Undo :func:`acquire` for ``leases``: idle ownership back, then the lease files go; a lease
    another hook ended meanwhile (the prolog's process was gone) is no longer this prolog's to undo."""
    with ledger.locked():
        for lease in leases:
            current = _held_as(ledger, lease)
            if current is not None:
                restore_idle(settings.devices.get(lease.identity), settings)
                _end(ledger, current, audit.ROLLBACK)


# What makes a lease still the one read earlier (same job, same prolog process; its phase may have
# moved on): a list of leases can be stale, as :func:`end_lease` lets the lock go while it scans for
# holders, and meanwhile another hook may end a lease of the list and a new job take it.
_SAME_LEASE = ("job_id", "prolog_pid", "prolog_start")


def _held_as(ledger: Ledger, lease: Lease, fields: tuple[str, ...] = _SAME_LEASE) -> Lease | None:
    """The ledger's lease on ``lease``'s device if it agrees with ``lease`` on ``fields``, else None."""
    assert ledger.held, "read under the state lock"
    held = ledger.read(lease.identity)
    if isinstance(held, Lease) and all(getattr(held, name) == getattr(lease, name) for name in fields):
        return held
    return None


def _current_nodes(ledger: Ledger, device: KnownDevice, lease: Lease) -> KnownDevice:
    """The device with its nodes as the inventory has them now (read again only when a node is gone):
    a USB stick revoked at the previous job's end may have re-enumerated while this prolog waited."""
    if device.device_nodes and all(ownership.node_state(n) for n in device.device_nodes):
        return device
    from ..access import node_inventory

    fresh = node_inventory.load(ledger.dir_fd).get(device.identity)
    if fresh is None or fresh.device_nodes == device.device_nodes:
        return device
    lease.device_nodes = fresh.device_nodes
    assert ledger.held
    ledger.rewrite(lease)  # its nodes, not its phase (still held): no transition
    return fresh


def _claim(ledger: Ledger, lease: Lease, device: KnownDevice, settings: HookSettings, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        with ledger.locked():
            if ledger.claim(lease):
                return
            holder = ledger.read(lease.identity)
            if holder is None:
                continue  # released between our claim and read: try again
            # The same job again (a requeued job keeps its id, and its first prolog may have died): close the
            # old lease in the audit and retake it, as one whose job is gone.
            same_job = isinstance(holder, Lease) and holder.job_id == lease.job_id and holder.phase == HELD
            why = None if same_job else holder_alive(holder)
            if why is None:
                _reclaim_or_fail(ledger, holder, settings, lease.job_id)
                continue
        releasing = isinstance(holder, Lease) and holder.phase == RELEASING
        # A release in progress is waited for to its end (its scan and wait are time-boxed).
        if time.monotonic() >= deadline and not releasing:
            if isinstance(holder, Lease) and holder.phase == REVOKING:
                raise HookError(
                    f"job {lease.job_id}: {device.identity} did not come back after its port was "
                    f"power-cycled at the end of job {holder.job_id}; replug it (or set "
                    "devices.revoke: false if its hub cannot switch port power), then resume the node"
                )
            raise HookError(
                f"job {lease.job_id}: {device.identity} is held by live job {holder.job_id} "
                f"(uid {holder.uid}: {why}); Slurm allocated it twice or the ledger is wrong: "
                "check `slurm-tpu leases` on this node"
            )
        # The common waits (a stick coming back, a release's scan): look often, a look is cheap.
        time.sleep(0.005 if isinstance(holder, Lease) and holder.phase in (RELEASING, REVOKING) else 0.1)


def _reclaim_or_fail(ledger: Ledger, holder: Lease | BadLease, settings: HookSettings, job_id: int) -> None:
    """End a stale lease whose job is gone (:func:`end_lease`), or raise DeviceNotFree."""
    problems = end_lease(ledger, holder, settings, audit.RECLAIM, by_job=job_id)
    if problems:
        hint = f"; resume the node once `slurm-tpu leases --clear {holder.identity}` clears it"
        then = hint if isinstance(problems[0], Withheld) else ""
        raise DeviceNotFree(
            f"job {job_id}: {holder.identity} still has a stale lease of ended job {holder.job_id}: {problems[0]}{then}"
        )


def _power_cycled(device: KnownDevice, settings: HookSettings) -> bool:
    """Whether the device is revoked by a power-cycle of its USB port (else scanned for holders)."""
    return settings.revoke and settings.revocation(device.kind, device.bus) == USB_PORT


def _scanned_unlocked(lease: Lease, settings: HookSettings) -> bool:
    """Whether ending ``lease`` scans for holders without the state lock (a known device that cannot be revoked)."""
    device = settings.devices.get(lease.identity)
    return device is not None and not _power_cycled(device, settings)


def release(
    ledger: Ledger, job_id: int, settings: HookSettings, wait_s: float = SURVIVOR_WAIT_S, probe: Probe = NO_PROBE
) -> list[str]:
    """End the job's leases (see :func:`end_lease`); returns problems, which drain the node unless :class:`Withheld`.
    A device still held keeps its lease (phase ``kept``, root 0600) until the next prolog,
    the health check or ``slurm-tpu leases --clear`` gives it back once the holder is gone."""
    problems: list[str] = []
    with ledger.locked():
        # Those scanned without the lock (a known device that cannot be revoked) last: a Prolog that comes
        # meanwhile for another of the job's devices finds it released, instead of reclaiming it itself.
        leases = sorted(ledger.of_job(job_id), key=lambda lease: _scanned_unlocked(lease, settings))
        for lease in leases:
            current = _held_as(ledger, lease)  # the scan of the one before ran without the lock
            if current is not None:
                problems.extend(end_lease(ledger, current, settings, audit.RELEASE, wait_s=wait_s, probe=probe))
    return problems
