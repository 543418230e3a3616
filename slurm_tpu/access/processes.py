"""What /proc says about jobs and devices, without asking Slurm.

* Which processes hold a device, by an open fd or by a mapping whose fd is closed?
  Every uid is scanned (a job's fd can be handed to anybody's process), time-boxed:
  a box that runs out makes the scan *incomplete*, which the caller treats as "could
  not check" (the device is kept back), never as "free" (:func:`scan_holders`).
* Does a job still run on this node? Slurm runs every step of a job under a
  ``slurmstepd: [<job>.<step>]`` process. A process is taken for a step only if it
  *is* Slurm's slurmstepd (uid 0, ``/proc/PID/exe`` the one beside the running
  slurmd), never because of its command line, which any user can set.
"""

from __future__ import annotations

import os
import struct
import time

TYPE_CHECKING = False  # typing itself costs the hooks milliseconds per job
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Callable

_S_IFMT, _S_IFCHR = 0o170000, 0o020000
_CHECK_EVERY = 256  # fds/mappings between two looks at the clock
# An fd table with at least this many fds, or of a process with more threads than this, is
# compared (kcmp) with the tables already seen before it is read. Below both, reading it costs
# less than loading kcmp (ctypes, some 4 ms); above either, a user could multiply the scan's
# work by sharing one table among many tasks.
_DEDUPE_FDS, _DEDUPE_THREADS = 64, 8
# Tables with at least this many fds are read last (the ended job's user's first, then the
# smallest): a flood of decoys can then only leave its own processes unverified.
_HEAVY_FDS = 1024
_Heavy = tuple[bool, int, int, int, str]  # a table put off: (not first_uid's, fds, pid, uid, fd_dir)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


class Scan:
    """The outcome of one holder scan.
    ``holders``: pid -> how it holds the device (``fd`` or ``mmap``). ``complete``: False when
    the time box ran out first (``scanned`` of ``total`` processes fully looked at): then an
    empty ``holders`` proves nothing, and ``unverified`` lists (pid, uid, fds) of the
    processes whose fd tables were not read."""

    __slots__ = ("holders", "complete", "scanned", "total", "unverified")

    def __init__(self) -> None:
        self.holders: dict[int, str] = {}
        self.complete, self.scanned, self.total = True, 0, 0
        self.unverified: list[tuple[int, int, int]] = []


# ---- kcmp: do two tasks share one fd table? ------------------------------------------

# kcmp(2) numbers per architecture (arch/*/syscall tables; the generic table,
# include/uapi/asm-generic/unistd.h, serves arm64, riscv and loongarch).
_KCMP_NR = {
    "x86_64": 312,
    **dict.fromkeys(("i386", "i486", "i586", "i686"), 349),
    **dict.fromkeys(("aarch64", "arm64", "riscv64", "loongarch64"), 272),
    **dict.fromkeys(("ppc64", "ppc64le", "ppc"), 354),
    "s390x": 343,
}
KCMP_FILES = 2  # include/uapi/linux/kcmp.h
_kcmp_fn: Callable[[int, int, int], int] | bool | None = False  # False: not looked up yet


def _kcmp() -> Callable[[int, int, int], int] | None:
    """kcmp(pid1, pid2, type) through libc's syscall(), or None where it cannot be had.

    Loaded the first time a scan meets a process with many threads or a large fd table
    (ctypes costs the hook a few ms to import). kcmp (kernel/kcmp.c, kcmp_ptr) answers 0
    when both tasks point to the same object, else 1 or 2 by an order of the (obfuscated)
    kernel pointers that is the same for every call: a total order, so the tables already
    seen can be kept sorted and searched by halves. No CONFIG_KCMP (ENOSYS) or an unknown
    architecture: no dedupe, every table is read (correct, slower).
    """
    global _kcmp_fn
    if _kcmp_fn is not False:
        return _kcmp_fn  # type: ignore[return-value]  # not False: the function or None
    _kcmp_fn = None
    number = _KCMP_NR.get(os.uname().machine)
    if number is None:
        return None
    try:
        import ctypes

        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (ImportError, OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = (ctypes.c_long,) * 6

    def kcmp(pid1: int, pid2: int, kind: int) -> int:
        return syscall(number, pid1, pid2, kind, 0, 0)

    if kcmp(os.getpid(), os.getpid(), KCMP_FILES) != 0:  # ENOSYS, seccomp...
        return None
    _kcmp_fn = kcmp
    return kcmp


class _Seen:
    """Kernel objects (fd tables) already seen, one task standing for each, sorted in kcmp's order.
    A task that cannot be compared counts as unseen: its object is read, never skipped unread."""

    __slots__ = ("kind", "tasks")

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.tasks: list[int] = []

    def add(self, tid: int) -> bool:
        """True when ``tid``'s object was seen before; else it is remembered (when it can be)."""
        kcmp = _kcmp()
        if kcmp is None or kcmp(tid, tid, self.kind) != 0:
            return False  # gone, or not comparable (a task root may not inspect): read it, remember nothing
        tasks = self.tasks
        low, high = 0, len(tasks)
        while low < high:
            middle = (low + high) // 2
            order = kcmp(tid, tasks[middle], self.kind)
            if order == 0:
                return True
            if order == 1:
                high = middle
            elif order == 2:
                low = middle + 1
            else:  # that task is gone: forget it, search again
                del tasks[middle]
                low, high = 0, len(tasks)
        tasks.insert(low, tid)
        return False


# ---- the scan ---------------------------------------------------------------------------


_AT_FDCWD, _AT_STATX_DONT_SYNC, _STATX_TYPE = -100, 0x4000, 0x0001
# struct statx (include/uapi/linux/stat.h): stx_mode (u16) at 0x1c, stx_rdev_major and _minor (u32) at 0x80.
_STX_MODE_RDEV = struct.Struct("=28xH98xII")


class _Devices:
    """The char devices a scan looks for, and the look at /proc magic links that tells whether one names one.

    The look is statx(2) with AT_STATX_DONT_SYNC: what the kernel already knows of
    the file, never a request to the file's own filesystem. A plain stat() of
    /proc/PID/fd/N asks it (FUSE: a GETATTR to the server), and waits, as root, for as
    long as that server does not answer, unkillably once the server has read the request:
    where users may mount FUSE for others (``user_allow_other``), one fd on a stalled server
    would hold every release on the node. A device node's type and numbers are its inode's
    own, never refreshed from anywhere. It costs about 3% more per fd than os.stat
    (bench/bench_holder_scan.py). Without statx in libc (glibc < 2.28) the look is stat().
    """

    __slots__ = ("rdevs", "_statx", "_buffer")

    def __init__(self, rdevs: set[int]) -> None:
        self.rdevs = rdevs
        import ctypes  # already loaded by any hook that scans (hooks/jobusage.py)

        self._buffer = ctypes.create_string_buffer(256)  # struct statx
        # No argtypes and no errno kept: ctypes passes ints and bytes as they are, the fastest call it has.
        self._statx = getattr(ctypes.CDLL(None), "statx", None)

    def any_named(self, links: list[str], deadline: float, dir_fd: int = _AT_FDCWD) -> bool | None:
        """Whether one of ``links`` (relative to ``dir_fd``) leads to a char device in :attr:`rdevs`; None
        once ``deadline`` passes (the clock is read before every :data:`_CHECK_EVERY` links)."""
        for start in range(0, len(links), _CHECK_EVERY):
            if time.monotonic() >= deadline:
                return None
            if self._any(links[start : start + _CHECK_EVERY], dir_fd):
                return True
        return False

    def _any(self, links: list[str], dir_fd: int) -> bool:
        rdevs, statx, buffer = self.rdevs, self._statx, self._buffer
        if statx is None:
            return self._any_stat(links, dir_fd)
        unpack, makedev = _STX_MODE_RDEV.unpack_from, os.makedev
        for link in links:
            if statx(dir_fd, link.encode(), _AT_STATX_DONT_SYNC, _STATX_TYPE, buffer) != 0:
                continue  # gone (closed meanwhile)
            mode, major, minor = unpack(buffer)
            if (mode & _S_IFMT) == _S_IFCHR and makedev(major, minor) in rdevs:
                return True
        return False

    def _any_stat(self, links: Iterable[str], dir_fd: int) -> bool:
        for link in links:
            try:
                info = os.stat(link, dir_fd=None if dir_fd == _AT_FDCWD else dir_fd)
            except OSError:
                continue
            if info.st_rdev in self.rdevs and (info.st_mode & _S_IFMT) == _S_IFCHR:
                return True
        return False


def _maps_candidates(maps_path: str, filesystems: set[int]) -> list[str] | None:
    """``start-end`` of the mappings in ``maps_path`` whose file lies on one of ``filesystems``.

    Only a mapping on a filesystem holding one of the device's nodes can map the device
    (only root can mknod a device node). None when the file cannot be read or is empty (no
    address space: a zombie, a kernel thread). The filesystems are looked for as text, at
    C speed, so a process with many unrelated mappings costs one read.
    """
    try:
        with open(maps_path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if not data:
        return None
    found = []
    for dev in filesystems:
        # The kernel prints "%02x:%02x" (major, minor) between the offset and the inode.
        needle = b" %02x:%02x " % (os.major(dev), os.minor(dev))
        at = data.find(needle)
        while at >= 0:
            start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
            fields = data[start : end if end >= 0 else len(data)].split(None, 5)
            if len(fields) >= 5 and fields[4] != b"0":  # inode 0: not a file
                found.append(fields[0].decode())
            at = data.find(needle, at + len(needle))
    return found


def _fd_count(fd_dir: str) -> int:
    """Open fds in the table (st_size of /proc/PID/fd, Linux >= 6.2: fs/proc/fd.c proc_fd_getattr); 0 when unknown."""
    try:
        return os.stat(fd_dir).st_size
    except OSError:
        return 0


def scan_holders(
    rdevs: Iterable[int],
    filesystems: Iterable[int],
    budget_s: float,
    skip_root: bool = False,
    first_uid: int | None = None,
    only: Iterable[int] | None = None,
) -> Scan:
    """Every process (any uid) with one of the char devices ``rdevs`` open or mapped.

    ``filesystems``: st_dev of the filesystems that hold the device's nodes. Stops after
    ``budget_s`` seconds with ``complete=False``. ``skip_root`` leaves out root's processes
    (for a user's job: root daemons such as nvidia-persistenced keep GPUs open, and no user
    can make a root process hold an fd it does not accept). ``first_uid``: whose large fd
    tables are read first (the ended job's user). ``only``: look at these pids alone.

    Where a process keeps what it holds. Fds: in the fd table of each of its threads,
    /proc/PID/task/TID/fd (a thread that called unshare(CLONE_FILES) has its own, and
    /proc/PID/fd shows nothing once the leader exited alone with SYS_exit, kernel/exit.c
    do_exit). Mappings: in the one address space of the group, read through a live
    thread (/proc/TID/maps and /proc/TID/map_files, fs/proc/base.c proc_pid_lookup).
    Each fd table is read once however many tasks share it (:func:`_kcmp`).

    Cost: one stat per fd, about 3 us (docs/security.md). Large tables (a flood of decoys)
    are read after everything else, so a flood can leave only large tables unverified.
    """
    result = Scan()
    rdevs = set(rdevs)
    if not rdevs:
        return result
    wanted = _Devices(rdevs)
    file_systems = set(filesystems)
    deadline = time.monotonic() + budget_s
    me = os.getpid()
    pids = _pids() if only is None else list(only)
    result.total = len(pids)
    tables, heavy = _Seen(KCMP_FILES), []
    pending: dict[int, int] = {}  # pid -> heavy tables of it still to read
    for index, pid in enumerate(pids):
        if time.monotonic() >= deadline:  # the rest unverified (gone ones, and root's where skipped, aside)
            result.complete = False
            for rest in pids[index:]:
                rest_uid = process_uid(rest)
                if rest_uid is not None and not (skip_root and rest_uid == 0):
                    result.unverified.append((rest, rest_uid, _fd_count(f"/proc/{rest}/fd")))
            break
        if pid == me:
            result.scanned += 1
            continue
        uid = process_uid(pid)
        if uid is None or (skip_root and uid == 0):
            result.scanned += 1
            continue
        try:
            tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            result.scanned += 1
            continue  # gone
        how = _mapped(pid, tids, wanted, file_systems, deadline)
        cut = how is None  # past the deadline: its fd tables are not read either
        for tid in [] if cut else tids:
            fd_dir = f"/proc/{pid}/task/{tid}/fd"
            count = _fd_count(fd_dir)
            if (len(tids) > _DEDUPE_THREADS or count >= _DEDUPE_FDS) and tables.add(tid):
                continue  # a table read (or queued) already
            if count >= _HEAVY_FDS:
                heavy.append((uid != first_uid, count, pid, uid, fd_dir))
                pending[pid] = pending.get(pid, 0) + 1
            else:  # read even when a mapping was found: a task sharing this table is named by it
                found = _table_holds(fd_dir, wanted, deadline)
                if found is None:
                    cut = True
                    break
                if found:
                    how = how or "fd"
        if how:
            result.holders[pid] = how
        if cut:
            result.complete = False
            result.unverified.append((pid, uid, _fd_count(f"/proc/{pid}/fd")))
        elif pid not in pending:
            result.scanned += 1
    _read_heavy_tables(result, sorted(heavy), pending, wanted, deadline)
    return result


def _read_heavy_tables(
    result: Scan, heavy: list[_Heavy], pending: dict[int, int], wanted: _Devices, deadline: float
) -> None:
    """The large fd tables :func:`scan_holders` put off, in ``heavy``'s order, into ``result``: a process
    counts as scanned once all of its ``pending`` tables are read; once the box runs out, each process
    whose table is left is unverified."""
    for index, (_, _count, pid, _owner, fd_dir) in enumerate(heavy):
        found = _table_holds(fd_dir, wanted, deadline)
        if found is None:
            result.complete = False
            seen = {p for p, _, _ in result.unverified}
            for _, rest_count, rest_pid, rest_uid, _ in heavy[index:]:
                if rest_pid not in seen:
                    seen.add(rest_pid)
                    result.unverified.append((rest_pid, rest_uid, rest_count))
            return
        if found:
            result.holders.setdefault(pid, "fd")
        pending[pid] -= 1
        if not pending[pid]:
            result.scanned += 1


def process_uid(pid: int) -> int | None:
    """The uid that owns /proc/PID (its effective uid), None when the process is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _mapped(pid: int, tids: list[int], wanted: _Devices, filesystems: set[int], deadline: float) -> str | None:
    """'mmap' when the thread group maps one of ``wanted``, else ''; None past the deadline (read
    through the first thread that still has the address space: a zombie leader has none)."""
    for tid in tids:
        spans = _maps_candidates(f"/proc/{pid}/task/{tid}/maps", filesystems)
        if spans is None:
            continue
        found = wanted.any_named([f"/proc/{tid}/map_files/{span}" for span in spans], deadline)
        return None if found is None else ("mmap" if found else "")
    return ""


def _table_holds(fd_dir: str, wanted: _Devices, deadline: float) -> bool | None:
    """Whether the fd table at ``fd_dir`` has one of ``wanted`` open; None past the deadline (the
    directory is opened once, then each fd is a look relative to it)."""
    try:
        dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False  # gone, or a kernel thread
    try:
        return wanted.any_named(os.listdir(dir_fd), deadline, dir_fd)
    except OSError:
        return False
    finally:
        os.close(dir_fd)


# ---- job steps ---------------------------------------------------------------------


def _file_key(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file ``path`` leads to, None if there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def slurmstepd_files() -> set[tuple[int, int]]:
    """(st_dev, st_ino) of the slurmstepd beside each running slurmd (root's).
    slurmd starts steps from the slurmstepd in its own sbin directory, wherever Slurm is
    installed. Not cached: Slurm may be upgraded under a long-lived process (the node
    agent's workers), and a stale answer would hide a live job's steps."""
    from ..slurm.installation import running_daemons  # the one scan for Slurm's daemons

    beside = (os.path.join(os.path.dirname(exe), "slurmstepd") for _, _, exe, _ in running_daemons(("slurmd",)))
    return {key for path in beside if (key := _file_key(path)) is not None}


def is_slurmstepd(pid: int, known: set[tuple[int, int]] | None = None) -> bool:
    """True when ``pid`` is a root process running Slurm's slurmstepd executable.

    ``known``: :func:`slurmstepd_files`, when the caller asks about several processes at once.
    """
    if process_uid(pid) != 0:
        return False
    known = slurmstepd_files() if known is None else known
    if not known:
        # No slurmd runs (restarting?): its steps outlive it. Fall back to the
        # executable's name; uid 0 is what a user cannot forge.
        try:
            return os.path.basename(os.readlink(f"/proc/{pid}/exe")).split(" ")[0] == "slurmstepd"
        except OSError:
            return False
    return _file_key(f"/proc/{pid}/exe") in known  # None (no such file) is in no set of keys


def job_step_pids(job_id: int) -> list[int]:
    """PIDs of this node's slurmstepd processes for ``job_id`` (title ``slurmstepd: [<job>.*]``)."""
    prefix = f"slurmstepd: [{job_id}.".encode()
    pids: list[int] = []
    known: set[tuple[int, int]] | None = None  # looked up at the first candidate: most scans find none
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                head = handle.read(64)
        except OSError:
            continue
        # The title only picks candidates; what the process *is* decides.
        if head.startswith(prefix):
            known = slurmstepd_files() if known is None else known
            if is_slurmstepd(pid, known):
                pids.append(pid)
    return pids


def process_alive(pid: int, start_time: int) -> bool:
    """True when ``pid`` runs and is the same process (same start time) as recorded."""
    return pid > 0 and start_time > 0 and process_start_time(pid) == start_time


def _stat_field(pid: int, field: int) -> int:
    """Field ``field`` (1-based, as proc(5) numbers them; 3 or later) of /proc/<pid>/stat, 0 if the
    process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return 0
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[field - 3])
    except (IndexError, ValueError):
        return 0


def process_start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), 0 if the process is gone."""
    return _stat_field(pid, 22)


# ---- which job a process belongs to (the TPU broker's peer check) -----------------------

_MAX_ANCESTORS = 256  # a parent chain longer than this is cut (pid_max bounds it anyway)


def _cgroup_mounts(mounts_path: str = "/proc/self/mounts") -> tuple[str | None, dict[str, str]]:
    """(cgroup v2 mount point or None, v1 hierarchy name -> mount point) of this mount namespace.

    A v1 hierarchy is named as /proc/PID/cgroup names it: its controllers joined by ``,``
    in the kernel's order, or ``name=<name>`` for a named one (systemd's)."""
    unified, hierarchies = None, {}
    try:
        with open(mounts_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point, kind, options = fields[1], fields[2], fields[3].split(",")
        if kind == "cgroup2" and unified is None:
            unified = point
        elif kind == "cgroup":
            names = [o for o in options if o not in ("rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec")]
            names = [o for o in names if not o.startswith(("release_agent=", "clone_children", "xattr", "noprefix"))]
            if names:
                hierarchies[",".join(names)] = point
    return unified, hierarchies


def cgroup_job_ids(pid: int, mounts_path: str = "/proc/self/mounts") -> set[int]:
    """Job ids whose Slurm cgroup holds ``pid``: a ``job_<J>`` component of one of its cgroup paths
    (``/proc/PID/cgroup``; cgroup/v2 ``.../slurmstepd.scope/job_<J>/...``, cgroup/v1
    ``/slurm/uid_<U>/job_<J>/...``) whose directory in the cgroup filesystem is root's.

    The name alone proves nothing: a user with a delegated cgroup subtree (systemd's user
    manager gives one) can make a ``job_5`` directory of their own and move into it. That
    directory is the user's; Slurm's job cgroups are made by slurmstepd, as root. No symlink is
    followed (cgroupfs has none; the last component is looked at with lstat)."""
    try:
        with open(f"/proc/{int(pid)}/cgroup", encoding="utf-8", errors="replace") as handle:
            lines = handle.read(1 << 16).splitlines()
    except OSError:
        return set()
    unified, hierarchies = _cgroup_mounts(mounts_path)
    found: set[int] = set()
    for line in lines:
        number, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        mount = unified if number == "0" and names == "" else hierarchies.get(names)
        if mount is None or not path.startswith("/"):
            continue  # a hierarchy not mounted here, or a path relative to another cgroup namespace
        parts = path.split("/")
        for index, part in enumerate(parts):
            if not part.startswith("job_") or not part[4:].isdigit() or ".." in parts[: index + 1]:
                continue
            directory = mount.rstrip("/") + "/".join(parts[: index + 1])
            try:
                info = os.lstat(directory)
            except OSError:
                continue
            if info.st_uid == 0 and (info.st_mode & _S_IFMT) == 0o040000:
                found.add(int(part[4:]))
    return found


def parent_pid(pid: int) -> int:
    """Field 4 of /proc/<pid>/stat, 0 when the process is gone."""
    return _stat_field(pid, 4)


def pid_in_job(pid: int, job_id: int, known: set[tuple[int, int]] | None = None) -> bool:
    """Whether process ``pid`` belongs to job ``job_id`` on this node.

    Its cgroup first (:func:`cgroup_job_ids`: every task of a job, daemonised ones included,
    stays in the job's cgroup), else its parent chain: a process descended from the job's
    ``slurmstepd: [<job>.<step>]`` (one that *is* Slurm's slurmstepd, :func:`is_slurmstepd`;
    ``known``: :func:`slurmstepd_files`, looked up when a candidate is met)."""
    if job_id in cgroup_job_ids(pid):
        return True
    prefix = f"slurmstepd: [{int(job_id)}.".encode()
    current, seen = pid, 0
    while current > 1 and seen < _MAX_ANCESTORS:
        seen += 1
        current = parent_pid(current)
        if current <= 1:
            return False
        try:
            with open(f"/proc/{current}/cmdline", "rb") as handle:
                head = handle.read(64)
        except OSError:
            return False
        if head.startswith(prefix):
            known = slurmstepd_files() if known is None else known
            return is_slurmstepd(current, known)
        if head.startswith(b"slurmstepd: ["):
            return False  # another job's step: its descendants are that job's, not this one's
    return False
