"""Where Slurm's programs are: one answer for the hooks, health, the watcher, the demo and tests.

A node may carry two Slurm installations (Debian's 22.05 in /usr, a site build in
/opt/slurm-25.11), and client and daemons must be the same release (a 22.05 scontrol gets
"Unspecified error" from a 25.11 slurmctld). So every Slurm program comes from the
directories :func:`find` chooses, first answer wins (docs/admin-guide.md, "Which Slurm"):
``SLURM_TPU_SLURM_BIN``/``_SBIN``; the config's ``slurm.bin_dir``/``sbin_dir`` (given one
of bin/sbin, the other is its sibling when that exists); the slurmd or slurmstepd this
process runs under (the hooks and the HealthCheckProgram: slurmd gives them no PATH); the
running slurmd or slurmctld that reads the same slurm.conf; ``PATH`` (never for the root
hooks); :data:`USUAL_DIRS`. Only root-owned daemons count: a user's process named
``slurmd`` must never choose what root runs. Cheap (``os`` only): the prolog imports it on every job.
"""

from __future__ import annotations

import os

from ..errors import SlurmCommandError

BIN_ENV = "SLURM_TPU_SLURM_BIN"
SBIN_ENV = "SLURM_TPU_SLURM_SBIN"
USUAL_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")
SYSTEM_DIRS = ("/bin", "/sbin")  # an admin's own commands (systemctl...) when PATH does not say
DAEMONS = ("slurmd", "slurmstepd", "slurmctld")
DEBIAN_CONF = "/etc/slurm/slurm.conf"  # Debian's compiled-in slurm.conf; a source build's is <prefix>/etc/slurm.conf
TESTED_RELEASES = ("22.05", "25.11")  # what the test suite runs against; `slurm-tpu doctor` names others


class Installation:
    """The directories Slurm programs are taken from, and how they were chosen."""

    __slots__ = ("dirs", "found_by", "daemon")

    def __init__(self, dirs: tuple[str, ...], found_by: str, daemon: str | None = None):
        self.dirs = dirs  # searched in order for any program
        self.found_by = found_by  # for messages: "SLURM_TPU_SLURM_BIN", "slurmd pid 42", ...
        self.daemon = daemon  # the running daemon's executable, when that is how it was found

    @property
    def bin_dir(self) -> str:
        return self.dirs[0]

    @property
    def sbin_dir(self) -> str:
        return self.dirs[1] if len(self.dirs) > 1 else self.dirs[0]

    def program(self, name: str) -> str:
        """The absolute path of Slurm program ``name``; SlurmCommandError saying where we looked."""
        found = _first_executable(name, self.dirs)
        if found is None:
            raise SlurmCommandError(
                f"{name} not found in {', '.join(self.dirs)} (Slurm taken from "
                f"{self.found_by}): install Slurm's {name}, or name its directories in "
                f"slurm.bin_dir/sbin_dir ({BIN_ENV}/_SBIN)",
                name,
            )
        return found

    def command(self, name: str, environ=None) -> str:
        """The absolute path of an admin's command (``systemctl``, ``slurmd``, a script of theirs).

        A name with a slash is that file. A bare name is looked up in Slurm's directories
        first (so ``slurmd`` is this installation's, never an older one earlier on PATH),
        then on ``PATH``, then in the system directories.
        """
        if "/" in name:
            path = os.path.abspath(name)
            if not _is_executable(path):
                raise SlurmCommandError(f"{name} is not an executable file: check the path", name)
            return path
        environ = os.environ if environ is None else environ
        dirs = [
            *self.dirs,
            *(d for d in environ.get("PATH", "").split(":") if d.startswith("/")),
            *USUAL_DIRS,
            *SYSTEM_DIRS,
        ]
        found = _first_executable(name, dirs)
        if found is None:
            raise SlurmCommandError(
                f"{name} not found in Slurm's directories ({', '.join(self.dirs)}), PATH "
                f"or {', '.join(USUAL_DIRS + SYSTEM_DIRS)}: install it or give its full path",
                name,
            )
        return found

    def __repr__(self) -> str:
        return f"Installation({self.dirs!r}, found_by={self.found_by!r})"


def _is_executable(path: str) -> bool:
    return os.access(path, os.X_OK) and not os.path.isdir(path)


def _first_executable(name: str, dirs) -> str | None:
    """``<dir>/<name>`` for the first of ``dirs`` that has it executable (the one search order)."""
    return next((f"{directory}/{name}" for directory in dirs if _is_executable(f"{directory}/{name}")), None)


def _pair(bin_dir: str | None, sbin_dir: str | None) -> tuple[str, ...]:
    """(bin, sbin), the missing one being the other's sibling when it exists."""

    def sibling(given: str, name: str) -> str:
        path = os.path.join(os.path.dirname(given.rstrip("/")), name)
        return path if os.path.isdir(path) else given

    if not (bin_dir or sbin_dir):
        raise ValueError("an installation needs its bin or its sbin directory")
    bin_dir = bin_dir or sibling(sbin_dir or "", "bin")
    sbin_dir = sbin_dir or sibling(bin_dir, "sbin")
    return (bin_dir, sbin_dir) if bin_dir != sbin_dir else (bin_dir,)


def _exe(pid: int, root_only: bool = True) -> str | None:
    """The executable of a (root-owned) process (None if not root's or unreadable)."""
    try:
        if root_only and os.stat(f"/proc/{pid}").st_uid != 0:
            return None
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    exe = exe.removesuffix(" (deleted)")  # upgraded in place: the directory is still the one it came from
    return exe if exe.startswith("/") else None


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """(comm, parent pid) from /proc/PID/stat; None for a zombie (it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read(512).decode("utf-8", "replace")
    except OSError:
        return None
    start, end = data.find("("), data.rfind(")")
    rest = data[end + 2 :].split(" ")
    if start < 0 or end < 0 or len(rest) < 2 or not rest[1].isdigit() or rest[0] in ("Z", "X"):
        return None
    return data[start + 1 : end], int(rest[1])


def ancestor_daemon(levels: int = 4) -> tuple[int, str] | None:
    """(pid, executable) of the root slurmd/slurmstepd this process runs under, if any."""
    pid = os.getppid()
    for _ in range(levels):
        if pid <= 1:
            return None
        fields = _stat_fields(pid)
        if fields is None:
            return None
        comm, parent = fields
        if comm in DAEMONS:
            exe = _exe(pid)
            return (pid, exe) if exe else None
        pid = parent
    return None


def daemon_config(argv: list[str], environ, default: str = DEBIAN_CONF) -> str:
    """The slurm.conf a daemon reads: ``-f FILE``, else ``$SLURM_CONF``, else its compiled-in default."""
    for i, arg in enumerate(argv):
        if arg == "-f" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("-f") and len(arg) > 2:
            return arg[2:]
    return environ.get("SLURM_CONF") or default


def _nul_separated(path: str) -> list[str]:
    with open(path, "rb") as handle:
        return [os.fsdecode(part) for part in handle.read().split(b"\0") if part]


def compiled_conf(sbin_dir: str) -> str:
    """The slurm.conf Slurm's daemons in ``sbin_dir`` read by default (Debian's for /usr, else <prefix>/etc)."""
    prefix = os.path.dirname(sbin_dir.rstrip("/"))
    return DEBIAN_CONF if prefix in ("/usr", "/", "") else f"{prefix}/etc/slurm.conf"


def _daemon_conf(pid: int, exe: str) -> str:
    default = compiled_conf(os.path.dirname(exe))
    try:
        argv = _nul_separated(f"/proc/{pid}/cmdline")
        environ = dict(item.partition("=")[::2] for item in _nul_separated(f"/proc/{pid}/environ"))
    except OSError:
        return default
    return daemon_config(argv, environ, default)


def running_daemons(names: tuple[str, ...] = DAEMONS, root_only: bool = True) -> list[tuple[int, str, str, str]]:
    """(pid, name, executable, slurm.conf) of every running (root-owned) Slurm daemon named in ``names``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields is None or fields[0] not in names:
            continue
        exe = _exe(int(entry), root_only)
        if exe:
            found.append((int(entry), fields[0], exe, _daemon_conf(int(entry), exe)))
    return found


def slurm_conf(environ=None) -> str:
    """The slurm.conf this node uses: ``$SLURM_CONF``, else the one the running slurmd/slurmctld
    (root's) reads when they all read one, else Debian's default."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_CONF"):
        return environ["SLURM_CONF"]
    confs = {conf for _, _, _, conf in running_daemons(("slurmd", "slurmctld"))}
    return confs.pop() if len(confs) == 1 else DEBIAN_CONF


def is_tested_release(version: str) -> bool:
    """Whether ``version`` (``25.11.7``) is a release the test suite runs against."""
    return ".".join(version.split(".")[:2]) in TESTED_RELEASES


def daemon_for_conf(slurm_conf: str | None) -> tuple[int, str] | None:
    """(pid, executable) of a running slurmd/slurmctld reading ``slurm_conf`` (None: the default);
    None when there is none, or several from different installations (no guessing)."""
    matches = []
    for pid, _, exe, conf in running_daemons(("slurmd", "slurmctld")):
        if (slurm_conf is None and conf in (DEBIAN_CONF, compiled_conf(os.path.dirname(exe)))) or (
            slurm_conf is not None and os.path.realpath(conf) == os.path.realpath(slurm_conf)
        ):
            matches.append((pid, exe))
    if len({os.path.dirname(exe) for _, exe in matches}) != 1:
        return None
    return matches[0]


def find(
    environ=None,
    bin_dir: str | None = None,
    sbin_dir: str | None = None,
    use_path: bool = True,
    use_daemons: bool = True,
) -> Installation:
    """The Slurm installation to use (see the module docstring for the order).

    ``bin_dir``/``sbin_dir`` are the config's ``slurm.*`` keys; ``use_path`` is False for the
    root hooks, ``use_daemons`` for whoever starts daemons (a local cluster). Not cached: a
    long-lived process (the agent's workers, the watcher) may outlive a Slurm upgrade.
    """
    environ = os.environ if environ is None else environ
    for given, where in (
        ((environ.get(BIN_ENV) or None, environ.get(SBIN_ENV) or None), f"{BIN_ENV}/{SBIN_ENV}"),
        ((bin_dir, sbin_dir), "config slurm.bin_dir/slurm.sbin_dir"),
    ):
        for directory in given:
            if directory and not os.path.isabs(directory):
                raise SlurmCommandError(f"{where}: {directory!r} is not an absolute directory", directory)
        if given[0] or given[1]:
            return Installation(_pair(*given), where)
    if use_daemons:
        daemon, how = ancestor_daemon(), "parent"
        if daemon is None:
            daemon, how = daemon_for_conf(environ.get("SLURM_CONF") or None), "running"
        if daemon is not None:
            pid, exe = daemon
            found_by = f"{how} {os.path.basename(exe)} pid {pid} ({exe})"
            return Installation(_pair(None, os.path.dirname(exe)), found_by, exe)
    for directory in (environ.get("PATH", "") if use_path else "").split(":"):
        if directory.startswith("/") and os.access(f"{directory}/scontrol", os.X_OK):
            return Installation(_pair(directory, None), f"PATH ({directory})")
    return Installation(USUAL_DIRS, "default directories")


def from_prefix(prefix: str) -> Installation:
    """``<prefix>/bin`` and ``<prefix>/sbin`` (a source build's ``--prefix``; /usr for Debian's)."""
    if not os.path.isabs(prefix):
        raise SlurmCommandError(f"Slurm prefix {prefix!r} is not an absolute directory", prefix)
    return Installation(_pair(f"{prefix.rstrip('/')}/bin", f"{prefix.rstrip('/')}/sbin"), f"prefix {prefix}")


def environment(install: Installation) -> dict[str, str]:
    """Variables that make child processes (slurm-tpu itself included) use ``install``."""
    return {BIN_ENV: install.bin_dir, SBIN_ENV: install.sbin_dir}


def version_of(program: str, environ=None) -> str | None:
    """``25.11.7`` from ``slurmd -V`` / ``scontrol -V`` (None if it cannot say; a client wants a
    slurm.conf even for -V: pass the environment naming it)."""
    from .spawn import run

    environ = os.environ if environ is None else environ
    try:
        out = run([program, "-V"], dict(environ), timeout=10)
    except SlurmCommandError:
        # A client of another release than the slurm.conf's daemons dies before it prints its
        # version when that slurm.conf names a PluginDir (it loads the other release's auth
        # plugin first): ask it again with a slurm.conf of its own that names nothing.
        import tempfile

        with tempfile.NamedTemporaryFile("w", prefix="slurm-tpu-version-", suffix=".conf") as conf:
            conf.write("ClusterName=version\nSlurmctldHost=localhost\n")
            conf.flush()
            try:
                out = run([program, "-V"], {**environ, "SLURM_CONF": conf.name}, 10)
            except SlurmCommandError:
                return None
    words = out.split()
    return words[-1] if words and words[-1][:1].isdigit() else None


def version_mismatch(installation: Installation, program: str, environ=None) -> str | None:
    """One line naming both versions when ``program`` (a client) and the daemons (the one the
    installation was found from, else the running one for our slurm.conf) differ, else None."""
    environ = os.environ if environ is None else environ
    daemon = installation.daemon
    if daemon is None:
        found = daemon_for_conf(environ.get("SLURM_CONF") or None)
        daemon = found[1] if found else None
    if daemon is None:
        return None
    client_version, daemon_version = version_of(program, environ), version_of(daemon, environ)
    if not client_version or not daemon_version or client_version == daemon_version:
        return None
    return (
        f"Slurm client {os.path.basename(program)} {client_version} ({program}) cannot talk to the "
        f"daemons' Slurm {daemon_version} ({daemon}): point slurm-tpu at the daemons' Slurm with "
        f"slurm.bin_dir (config) or {BIN_ENV}"
    )
