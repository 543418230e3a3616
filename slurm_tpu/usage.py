"""Per-job accelerator usage records: written by the runner, collected by the epilog.

The runner runs as the job's user; the epilog runs as root. They meet in a drop
directory ``<state_dir>/usage/`` (root-owned, mode 1733 like /tmp without
listing: anyone may create a file, nobody may list, rename or delete another's).
The task-prolog exports its path as ``SLURM_TPU_USAGE_DIR``.

The runner creates one file per device and process, ``<job>.<identity>.<pid>``,
exclusively and without following symlinks. The epilog reads only files of its
job that are regular, small and owned by the job's uid (opened with O_NOFOLLOW
relative to the directory), records them in the audit log and deletes them. The
figures are self-reported by the job, which is fine for accounting: a user can
only inflate their own numbers.

Stdlib only: the hooks import this.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import asdict, dataclass

USAGE_DIR_ENV = "SLURM_TPU_USAGE_DIR"
DIR_NAME = "usage"
MAX_BYTES = 4096
_NAME = re.compile(r"^(\d+)\.((?:usb|pci|platform)-[A-Za-z0-9:._-]+)\.(\d+)$")


@dataclass(frozen=True)
class UsageRecord:
    """What one process did on one device during a job."""

    job_id: int
    identity: str
    inferences: int
    seconds: float  # wall time spent in inference calls
    energy_j: float | None = None  # NVML energy counter delta (GPUs), when available


def write_usage(directory: str, record: UsageRecord) -> str | None:
    """Create this process's record file; None when the directory refuses it."""
    name = f"{record.job_id}.{record.identity}.{os.getpid()}"
    if not _NAME.match(name):
        return None
    data = json.dumps(asdict(record)).encode()
    try:
        # O_PATH: the 1733 directory grants the job write+search, not read.
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    return os.path.join(directory, name)


def _parse(raw: bytes, job_id: int, identity: str) -> UsageRecord | None:
    try:
        data = json.loads(raw)
        record = UsageRecord(job_id=job_id, identity=identity, inferences=int(data["inferences"]),
                             seconds=float(data["seconds"]),
                             energy_j=None if data.get("energy_j") is None else float(data["energy_j"]))
    except (ValueError, KeyError, TypeError):
        return None
    if record.inferences < 0 or not record.seconds >= 0:
        return None
    return record


def _read_one(dir_fd: int, name: str, job_id: int, identity: str, uid: int) -> UsageRecord | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None  # a symlink (ELOOP) or a race: nothing to read
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == uid and info.st_size <= MAX_BYTES:
            return _parse(os.read(fd, MAX_BYTES), job_id, identity)
        return None
    finally:
        os.close(fd)


def collect_usage(dir_fd: int, job_id: int, uid: int) -> list[UsageRecord]:
    """Read and delete the job's record files (root side). Bad files are just deleted."""
    records = []
    for name in sorted(os.listdir(dir_fd)):
        match = _NAME.match(name)
        if not match or int(match.group(1)) != job_id:
            continue
        record = _read_one(dir_fd, name, job_id, match.group(2), uid)
        if record is not None:
            records.append(record)
        try:
            os.unlink(name, dir_fd=dir_fd)  # never follows a link: removes the link itself
        except OSError:
            pass
    return records


def ensure_usage_dir(state_dir_fd: int) -> int:
    """Open (creating if needed) the drop directory, root-owned mode 1733; returns its fd."""
    try:
        os.mkdir(DIR_NAME, 0o1733, dir_fd=state_dir_fd)
    except FileExistsError:
        pass
    fd = os.open(DIR_NAME, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=state_dir_fd)
    info = os.fstat(fd)
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) != 0o1733:
        os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o1733)  # mkdir's mode is cut by the umask
    return fd
