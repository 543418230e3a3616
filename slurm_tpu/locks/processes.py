"""What /proc says about jobs and devices, without asking Slurm.

Two questions, both answered by scanning /proc:

* Which processes hold a device, by an open fd or by a mapping whose fd is
  closed (``/proc/PID/map_files``)? Every uid is scanned: a job's fd can be
  handed to anybody's process. The scan is time-boxed: a user who opens a
  million decoy fds makes it *incomplete*, which the caller treats as "could
  not check" (drain), never as "free".
* Does a job still run on this node? Slurm runs every step of a job under a
  ``slurmstepd: [<job>.<step>]`` process on each of its nodes (batch, extern and
  srun steps alike), and runs the prolog before any of them. A process is taken
  for a step only if it *is* Slurm's slurmstepd — uid 0 and ``/proc/PID/exe``
  the slurmstepd installed beside the running slurmd — never because of its
  command line, which any user can set (``exec -a 'slurmstepd: [63.batch]'``).
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # typing itself costs the hooks milliseconds per job
if TYPE_CHECKING:
    from typing import Iterable

_S_IFMT, _S_IFCHR = 0o170000, 0o020000
_CHECK_EVERY = 256  # fds/mappings between two looks at the clock


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


class Scan:
    """The outcome of one holder scan.

    ``holders``: pid -> how it holds the device (``fd`` or ``mmap``).
    ``complete``: False when the time box ran out first (``scanned`` of ``total``
    processes looked at): then an empty ``holders`` proves nothing.
    """

    __slots__ = ("holders", "complete", "scanned", "total")

    def __init__(self) -> None:
        self.holders: dict[int, str] = {}
        self.complete, self.scanned, self.total = True, 0, 0


def _maps_candidates(pid: int, filesystems: set[int]) -> list[str]:
    """``start-end`` of the process's file mappings that lie on one of ``filesystems``.

    /proc/PID/maps names each mapping's file by the device of the filesystem that
    holds its inode: only mappings on a filesystem holding one of the device's
    nodes can be a mapping of the device (only root can mknod a device node).
    """
    try:
        with open(f"/proc/{pid}/maps", "rb") as handle:
            data = handle.read()
    except OSError:
        return []
    found = []
    for line in data.split(b"\n"):
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[4] == b"0":
            continue
        major, _, minor = fields[3].partition(b":")
        try:
            dev = os.makedev(int(major, 16), int(minor, 16))
        except ValueError:
            continue
        if dev in filesystems:
            found.append(fields[0].decode())
    return found


def scan_holders(rdevs: Iterable[int], filesystems: Iterable[int], budget_s: float,
                 skip_root: bool = False) -> Scan:
    """Every process (any uid) with one of the char devices ``rdevs`` open or mapped.

    ``filesystems``: st_dev of the filesystems that hold the device's nodes (see
    :func:`_maps_candidates`). Stops after ``budget_s`` seconds with
    ``complete=False``. ``skip_root`` leaves out root's processes (for a user's
    job: root daemons such as nvidia-persistenced keep GPUs open all the time,
    and no user can make a root process hold an fd it does not accept).
    """
    result = Scan()
    wanted = set(rdevs)
    if not wanted:
        return result
    file_systems = set(filesystems)
    deadline = time.monotonic() + budget_s
    me = os.getpid()
    pids = _pids()
    result.total = len(pids)
    for pid in pids:
        if time.monotonic() >= deadline:
            result.complete = False
            return result
        result.scanned += 1
        if pid == me:
            continue
        if skip_root:
            try:
                if os.stat(f"/proc/{pid}").st_uid == 0:
                    continue
            except OSError:
                continue
        how = _holds(pid, wanted, file_systems, deadline)
        if how is None:
            result.complete = False
            return result
        if how:
            result.holders[pid] = how
    return result


def _holds(pid: int, wanted: set[int], filesystems: set[int], deadline: float) -> str | None:
    """'fd', 'mmap' or '' for one process; None when the deadline passed mid-way."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = [f"{fd_dir}/{fd}" for fd in os.listdir(fd_dir)]
    except OSError:
        return ""  # gone, or a kernel thread
    found = _any_device(fds, wanted, deadline)
    if found is None:
        return None
    if found:
        return "fd"
    mapped = [f"/proc/{pid}/map_files/{span}" for span in _maps_candidates(pid, filesystems)]
    found = _any_device(mapped, wanted, deadline)
    return None if found is None else ("mmap" if found else "")


def _any_device(paths: list[str], wanted: set[int], deadline: float) -> bool | None:
    """Whether one of ``paths`` (magic links in /proc) is a char device in ``wanted``; None past the deadline."""
    for count, path in enumerate(paths):
        if count % _CHECK_EVERY == _CHECK_EVERY - 1 and time.monotonic() >= deadline:
            return None
        try:
            info = os.stat(path)
        except OSError:
            continue
        if info.st_rdev in wanted and (info.st_mode & _S_IFMT) == _S_IFCHR:
            return True
    return False


# ---- job steps ---------------------------------------------------------------------

_STEPD: set[tuple[int, int]] | None = None


def _exe_key(pid: int | str) -> tuple[int, int] | None:
    try:
        info = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _stepd_beside(exe: str) -> tuple[int, int] | None:
    try:
        info = os.stat(os.path.join(os.path.dirname(exe), "slurmstepd"))
    except OSError:
        return None
    return info.st_dev, info.st_ino


def slurmstepd_files() -> set[tuple[int, int]]:
    """(st_dev, st_ino) of the slurmstepd beside each running slurmd (root's).

    slurmd starts steps from the slurmstepd in its own sbin directory, so the
    file is found from the daemon, wherever Slurm is installed (/usr/sbin,
    /opt/slurm-25.11/sbin...). Cached for the life of the process.
    """
    global _STEPD
    if _STEPD is not None:
        return _STEPD
    from ..slurm.installation import running_daemons  # the one scan for Slurm's daemons

    found = {key for _, _, exe, _ in running_daemons(("slurmd",)) if (key := _stepd_beside(exe)) is not None}
    _STEPD = found
    return found


def is_slurmstepd(pid: int) -> bool:
    """True when ``pid`` is a root process running Slurm's slurmstepd executable."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != 0:
            return False
    except OSError:
        return False
    known = slurmstepd_files()
    if not known:
        # No slurmd runs (restarting?): its steps outlive it. Fall back to the
        # executable's name; uid 0 is what a user cannot forge.
        try:
            return os.path.basename(os.readlink(f"/proc/{pid}/exe")).split(" ")[0] == "slurmstepd"
        except OSError:
            return False
    key = _exe_key(pid)
    return key is not None and key in known


def job_step_pids(job_id: int) -> list[int]:
    """PIDs of this node's slurmstepd processes for ``job_id`` (title ``slurmstepd: [<job>.*]``)."""
    prefix = f"slurmstepd: [{job_id}.".encode()
    pids = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                head = handle.read(64)
        except OSError:
            continue
        # The title only picks candidates; what the process *is* decides.
        if head.startswith(prefix) and is_slurmstepd(pid):
            pids.append(pid)
    return pids


def process_alive(pid: int, start_time: int) -> bool:
    """True when ``pid`` runs and is the same process (same start time) as recorded."""
    from .ledger import process_start_time

    return pid > 0 and start_time > 0 and process_start_time(pid) == start_time
