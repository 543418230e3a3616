"""Finding and ending every process of one LocalCluster, whatever state its jobs were in.

Killing the daemons a cluster started is not enough. A job step runs under a
``slurmstepd`` that slurmd forks off into a session of its own (Slurm 25.11:
parent init, its own session id), so signalling slurmd's process group misses
it, and slurmd's SIGTERM deliberately leaves steps running (a restarted slurmd
reattaches to them). A cluster stopped with a job still running therefore left
its slurmstepd and the job's processes behind, parented to init, with their
spool directory deleted under them.

A process is this cluster's when it names the cluster's base directory, which
nothing else on the machine uses (each cluster gets a fresh ``mkdtemp``
directory), in a way only the cluster's own processes do: a Slurm or munge
daemon with its cwd, an open file (a slurmstepd keeps slurmd's log open, fd 3)
or a command-line path under the base (slurmstepd overwrites its environment
with its process title, so its fds tell), or a job's process (``SLURM_JOB_ID``
set) submitted with ``SLURM_CONF`` under the base. Other clusters' and other
sessions' processes are never matched: their bases differ.

``SLURM_TPU_CLUSTER_REGISTRY`` names a file to which every cluster configured
in any process appends its base (tests/conftest.py sets it, and checks at the
end of the run that no process of any of those bases is left).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

REGISTRY_ENV = "SLURM_TPU_CLUSTER_REGISTRY"


def record(base: str, note: str = "") -> None:
    """Append ``base`` (and ``note``, e.g. the test that made it) to $SLURM_TPU_CLUSTER_REGISTRY, if set."""
    registry = os.environ.get(REGISTRY_ENV)
    if not registry:
        return
    line = f"{os.path.abspath(base)}\t{note}".replace("\n", " ") + "\n"
    # One short O_APPEND write: lines from several processes do not interleave.
    fd = os.open(registry, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def recorded(registry: str) -> dict[str, str]:
    """Bases recorded in ``registry`` -> the note of their first record."""
    bases: dict[str, str] = {}
    try:
        with open(registry, encoding="utf-8") as handle:
            for line in handle:
                base, _, note = line.rstrip("\n").partition("\t")
                if base:
                    bases.setdefault(base, note)
    except FileNotFoundError:
        pass
    return bases


def _ancestors() -> set[int]:
    """This process and its ancestors: whoever calls stop() is never its own leftover."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                data = handle.read()
            pid = int(data[data.rfind(b")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


# Programs whose processes are the cluster's daemons when they name a path under its base
# (Debian installs them as NAME-wlm behind alternatives links).
# slurmdbd and mariadbd: a cluster started with accounting (accounting_db.py) runs them with paths under its base.
DAEMONS = ("slurmstepd", "slurmd", "slurmctld", "munged", "sackd", "slurmdbd", "mariadbd")


def _read_words(pid: int, name: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return [w.decode(errors="replace") for w in handle.read().split(b"\0") if w]
    except OSError:
        return []


def _daemon_paths(pid: int) -> list[str]:
    """For a Slurm or munge daemon: its cwd, open files and command-line paths; else nothing."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe")).split(" ")[0]
    except OSError:
        return []
    if not any(exe == name or exe.startswith(name + "-") for name in DAEMONS):  # Debian: slurmd-wlm
        return []
    paths = []
    try:
        paths.append(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    for word in _read_words(pid, "cmdline"):  # munged --socket=/base/..., slurmd -f /base/...
        paths += [word, word.partition("=")[2]]
    return paths


def _job_conf(pid: int) -> str | None:
    """A job's process (any program, any user): the SLURM_CONF its job was submitted with."""
    env = dict(w.partition("=")[::2] for w in _read_words(pid, "environ"))
    return env.get("SLURM_CONF") if "SLURM_JOB_ID" in env else None


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = " ".join(handle.read().decode(errors="replace").replace("\0", " ").split())
    except OSError:
        command = ""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        ppid = int(data[data.rfind(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = -1
    return f"pid {pid} (parent {ppid}): {command[:160] or '?'}"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return True  # gone
    return data[data.rfind(b")") + 2 :][:1] in (b"Z", b"X")


def processes_of(bases: Iterable[str]) -> dict[int, tuple[str, str]]:
    """Live processes (not zombies, never this one or its ancestors) of clusters under ``bases``.

    A process is a cluster's when it is a Slurm or munge daemon naming a path
    under the base (a slurmstepd keeps slurmd's log open), or a job's process
    (``SLURM_JOB_ID`` set) whose ``SLURM_CONF`` lies under it. Not any process
    that merely names the directory: an admin's shell in the demo's directory,
    or one that sourced its env.sh, is not the cluster's to kill.
    Returns pid -> (base, description).
    """
    prefixes = {os.path.abspath(b).rstrip("/") + "/": os.path.abspath(b) for b in bases}
    if not prefixes:
        return {}
    skip = _ancestors()
    found: dict[int, tuple[str, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        conf = _job_conf(pid)
        for path in ([conf] if conf else []) + _daemon_paths(pid):
            base = next((b for p, b in prefixes.items() if path.startswith(p)), None)
            if base is not None:
                if not _is_zombie(pid):
                    found[pid] = (base, _describe(pid))
                break
    return found


def _reap(pids: Iterable[int]) -> None:
    """Reap those of ``pids`` that are our own exited children (else they stay zombies)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def end_processes_of(bases: Iterable[str], timeout: float = 20.0) -> dict[int, tuple[str, str]]:
    """SIGKILL every process of the clusters under ``bases`` until none is left or ``timeout`` passes.

    Looks again after each round: a dying slurmstepd's job may still fork. Returns
    what was killed (pid -> (base, description)); raises RuntimeError naming the
    processes that outlived ``timeout``.
    """
    bases = list(bases)
    killed: dict[int, tuple[str, str]] = {}
    deadline = time.monotonic() + timeout
    while True:
        alive = processes_of(bases)
        if not alive:
            return killed
        if time.monotonic() >= deadline:
            raise RuntimeError(
                "processes of a stopped cluster would not die: " + "; ".join(d for _, d in alive.values())
            )
        for pid, what in alive.items():
            killed.setdefault(pid, what)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
        _reap(alive)
