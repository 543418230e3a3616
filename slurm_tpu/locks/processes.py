"""What /proc says about jobs and devices, without asking Slurm.

Two questions, both answered by scanning /proc (milliseconds on a compute node):

* Which processes hold a device open? (epilog: a survivor means the device is
  not free; prolog: a stale lease whose device is still open is not reclaimed.)
* Does a job still run on this node? Slurm runs every step of a job under a
  ``slurmstepd: [<job>.<step>]`` process on each of its nodes (batch, extern and
  srun steps alike), and runs the prolog before any of them: so a job is alive
  here while one of its slurmstepds or the prolog that took its lease exists.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing itself costs the hooks milliseconds per job
if TYPE_CHECKING:
    from typing import Iterable


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def holders(rdevs: Iterable[int], uid: int | None = None) -> dict[int, int]:
    """pid -> rdev for processes with one of the character devices ``rdevs`` open.

    ``uid`` limits the scan to that user's processes: with the node at mode 0600
    only they (or root, which Slurm never runs a job's tasks as unless the job is
    root's) can have opened it after the lease began; this keeps the epilog from
    walking every daemon's descriptors on every job.
    """
    wanted = set(rdevs)
    found: dict[int, int] = {}
    if not wanted:
        return found
    me = os.getpid()
    for pid in _pids():
        if pid == me:
            continue
        if uid is not None:
            try:
                owner = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                continue
            if owner != uid:
                continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if info.st_rdev in wanted and (info.st_mode & 0o170000) == 0o020000:
                found[pid] = info.st_rdev
                break
    return found


def job_step_pids(job_id: int) -> list[int]:
    """PIDs of this node's ``slurmstepd: [<job_id>.*]`` processes."""
    prefix = f"slurmstepd: [{job_id}.".encode()
    pids = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                head = handle.read(64)
        except OSError:
            continue
        if head.startswith(prefix):
            pids.append(pid)
    return pids


def process_alive(pid: int, start_time: int) -> bool:
    """True when ``pid`` runs and is the same process (same start time) as recorded."""
    from .ledger import process_start_time

    return pid > 0 and start_time > 0 and process_start_time(pid) == start_time
