"""The job's usage box: a private tmpfs per job for the runner's usage records.

``<state_dir>/job-usage/`` (root's, 0755) holds only mount points named by job id. The prolog
mounts a tmpfs on the job's (owner the job's uid, 0700, size and inodes bounded: protocol/usage.py);
the epilog reads one record per leased device from it and unmounts it lazily (a process still
inside cannot hold the epilog up). Nothing a user writes lands on the ledger's filesystem.
The box never fails a job: if it cannot be made (no CAP_SYS_ADMIN in a container...), the job
runs without usage accounting and the audit log says why.
"""

from __future__ import annotations

import os

from ..access import statedir
from ..protocol.audit import USAGE_UNAVAILABLE

BOX_DIR = "job-usage"
# <sys/mount.h>
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


def _libc():
    import ctypes  # only on jobs with leases: ~2 ms

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _mount_box(target: str, uid: int) -> None:
    from ..protocol.usage import BOX_BYTES, BOX_INODES

    ctypes, libc = _libc()
    options = f"size={BOX_BYTES},nr_inodes={BOX_INODES},mode=0700,uid={uid},gid=0".encode()
    if libc.mount(b"slurm-tpu-usage", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def _open_parent(state_fd: int, create: bool) -> int | None:
    try:
        return statedir.open_dir(BOX_DIR, create=create, parent_fd=state_fd)
    except statedir.StateDirError:
        return None


def _discard(parent_fd: int, name: str) -> None:
    target = f"/proc/self/fd/{parent_fd}/{name}"
    try:
        os.lstat(target)
    except OSError:
        return
    _libc()[1].umount2(target.encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW)  # no error if nothing is mounted
    try:
        os.rmdir(name, dir_fd=parent_fd)
    except OSError:
        pass  # not empty: not a box we made (left for the admin, never followed)


def prepare(ledger, job_id: int, uid: int) -> str | None:
    """Mount the job's usage box; its path, or None when there is none (the job runs unmetered).
    Also removes boxes of jobs that no longer hold a lease here (an epilog that
    never ran). Never raises for an OSError: the box must not fail the prolog."""
    parent = _open_parent(ledger.dir_fd, create=True)
    if parent is None:
        ledger.audit(USAGE_UNAVAILABLE, job_id=job_id, uid=uid, reason=f"{BOX_DIR} is unusable")
        return None
    name = str(job_id)
    try:
        # List before reading the leases: a box listed here was made after its job's
        # lease was taken (and is removed before it is dropped), so it is seen leased.
        entries = os.listdir(parent)
        leased = {lease.job_id for lease in ledger.all()}
        for entry in entries:
            if entry == name or (entry.isdigit() and int(entry) not in leased):
                _discard(parent, entry)  # ours: left by an earlier run of this job id (requeue)
        os.mkdir(name, 0o700, dir_fd=parent)
        try:
            _mount_box(f"/proc/self/fd/{parent}/{name}", uid)
        except OSError:
            os.rmdir(name, dir_fd=parent)
            raise
        return f"{ledger.state_dir}/{BOX_DIR}/{name}"
    except OSError as exc:
        ledger.audit(USAGE_UNAVAILABLE, job_id=job_id, uid=uid, reason=exc.strerror or str(exc))
        return None
    finally:
        os.close(parent)


def _open_box(parent: int, job_id: int, uid: int) -> int | None:
    """The job's own mounted box (a directory fd), or None when there is none or it is not the job's."""
    try:
        box = os.open(str(job_id), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return None
    info = os.fstat(box)
    if info.st_uid != uid or info.st_dev == os.fstat(parent).st_dev:
        os.close(box)
        return None  # not the job's own mounted box
    return box


def _records(parent: int, job_id: int, uid: int, identities, rejected=None) -> dict:
    """identity -> UsageRecord, from the job's own box under ``parent`` (closed here).

    Reads only ``<identity>.json`` for ``identities`` (at most one small file per device,
    whatever the job left). A record that is not acceptable is left out, after
    ``rejected(identity, why)`` when given: the job's own file, it loses only its own accounting.
    """
    from ..protocol import FormatError
    from ..protocol.usage import read_record

    try:
        box = _open_box(parent, job_id, uid)
    finally:
        os.close(parent)
    if box is None:
        return {}
    records = {}
    try:
        for identity in identities:
            try:
                record = read_record(box, identity, uid)
            except FormatError as exc:
                if rejected is not None:
                    rejected(identity, str(exc))
                continue
            if record is not None:
                records[identity] = record
    finally:
        os.close(box)
    return records


def peek(state_dir: str, job_id: int, uid: int, identities) -> dict:
    """identity -> UsageRecord: a running job's records as they are now (for metrics), read as
    :func:`collect` reads them; a record that is not acceptable is left out (the epilog audits it)."""
    try:
        state = statedir.open_dir(state_dir)
    except statedir.StateDirError:
        return {}
    try:
        parent = _open_parent(state, create=False)
    finally:
        os.close(state)
    return {} if parent is None else _records(parent, job_id, uid, identities)


def collect(ledger, job_id: int, uid: int, identities) -> list:
    """Audit the job's usage record for each of its devices; the records accepted (UsageRecord).
    Needs no lock: the audit append is atomic."""
    from ..protocol import audit

    parent = _open_parent(ledger.dir_fd, create=False)
    if parent is None:
        return []

    def rejected(identity: str, why: str) -> None:
        ledger.audit(audit.USAGE_REJECTED, identity=identity, job_id=job_id, uid=uid, reason=why)

    records = _records(parent, job_id, uid, identities, rejected)
    for identity, record in records.items():
        ledger.audit(
            audit.USAGE,
            identity=identity,
            job_id=job_id,
            uid=uid,
            inferences=record.inferences,
            seconds=record.seconds,
        )
    return list(records.values())


def open_spool(path: str, create: bool = False) -> int:
    """The accounting spool ``path`` (config ``accounting_spool``), as a directory descriptor the caller closes.

    Root's and root-only (0700), in a directory root owns and no one else can write; a symlink
    at either is refused, never followed (StateDirError). ``create`` (the collector's first run)
    makes it 0700, and missing parents 0755; without it a spool that is missing, or that others
    could read, is refused (the epilog then spools nothing).
    """
    parent = statedir.open_dir(os.path.dirname(path) or "/", create=create)
    try:  # the figures are the admin's, not the users'
        return statedir.open_dir(statedir.check_name(os.path.basename(path)), create, parent, mode=0o700)
    finally:
        os.close(parent)


def spool(
    ledger,
    job_id: int,
    uid: int,
    node: str,
    devices: int,
    records,
    path: str,
    shares: int = 0,
    shard_figures: dict | None = None,
    energy: list | None = None,
) -> bool:
    """Leave the job's figures on this node for the accounting collector, in the spool ``path``
    (config ``accounting_spool``, persistent: entries outlive a reboot); whether an entry was written.
    ``shares``: the TPU shares the job held here (0: none), with the broker's figures of it
    (``shard_figures``, protocol/broker_wire.py FIGURES; None: the broker gave none, they count 0), and
    its devices' energy figures here (``energy``, protocol/energy.py DeviceEnergy; None: none taken).

    Only where a collector runs (its first run makes the root-only spool); written atomically,
    0600, never through a symlink. Never raises for an OSError: a full disk costs the job's
    AdminComment (protocol/job_record.py), never the job or the node."""
    from ..protocol.job_record import encode_spool, shard_figures as shard_entry, totals

    try:
        spool_fd = open_spool(path)
    except statedir.StateDirError:
        return False  # no collector here (or an unsafe spool: never written through)
    entry = totals(job_id, node, devices, records, energy)
    if shares:
        entry.shards = shard_entry(shares, shard_figures)
    try:
        statedir.write_atomic(spool_fd, str(job_id), encode_spool(entry), 0o600)
        os.fsync(spool_fd)  # the rename too is on disk: the entry outlives a crash, not only a clean reboot
        return True
    except (OSError, statedir.StateDirError) as exc:
        ledger.audit(
            USAGE_UNAVAILABLE, job_id=job_id, uid=uid, reason=f"{path}: {getattr(exc, 'strerror', None) or exc}"
        )
        return False
    finally:
        os.close(spool_fd)


def discard(ledger, job_id: int) -> None:
    """Unmount and remove the job's usage box, if it has one."""
    parent = _open_parent(ledger.dir_fd, create=False)
    if parent is None:
        return
    try:
        _discard(parent, str(job_id))
    finally:
        os.close(parent)
