"""The one place that runs Slurm programs: absolute paths, argument lists, timeouts."""

from __future__ import annotations

import os
import shutil
import subprocess

from ..errors import SlurmCommandError

# Debian installs daemons in /usr/sbin, which is not on every PATH (udev, cron).
_SEARCH_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")


def find_program(name: str, explicit: str | None = None) -> str:
    """The absolute path of a Slurm program, or a SlurmCommandError saying where we looked."""
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return os.path.abspath(explicit)
        raise SlurmCommandError(f"{explicit} is not an executable file: check the path", explicit)
    found = shutil.which(name)
    if found:
        return os.path.abspath(found)
    for directory in _SEARCH_DIRS:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise SlurmCommandError(
        f"{name} not found (looked in PATH and {', '.join(_SEARCH_DIRS)}): install Slurm's {name}",
        name,
    )


def run(argv: list[str], timeout: float = 10.0) -> str:
    """Run a Slurm command (argv[0] absolute), returning stdout; raise on failure."""
    command = " ".join(argv)
    try:
        completed = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(f"{command} did not finish in {timeout:g} s", command) from exc
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {argv[0]}: {exc.strerror}", command) from exc
    if completed.returncode != 0:
        detail = (completed.stderr or completed.stdout).strip().splitlines()
        if completed.returncode < 0:
            status = f"killed by signal {-completed.returncode}"
        else:
            status = f"exit status {completed.returncode}"
        last = detail[-1] if detail else status
        raise SlurmCommandError(f"{command} failed: {last}", command, completed.stderr)
    return completed.stdout


def slurmd_hardware(slurmd: str | None = None) -> dict[str, str]:
    """This node's CPU and memory facts from ``slurmd -C``."""
    from .parse import parse_slurmd_c

    return parse_slurmd_c(run([find_program("slurmd", slurmd), "-C"]))
