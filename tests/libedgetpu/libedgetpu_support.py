"""Helpers for the tests of the real libedgetpu (``from libedgetpu_support import ...``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import REPO

HERE = Path(__file__).resolve().parent


def in_testbed(
    description: Path | str,
    argv: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 120,
    user: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` inside a umockdev testbed of ``description`` (real libudev, libusb, sysfs),
    as ``user`` when given (the testbed is then theirs)."""
    # Not the environment of a job the tests may run in: the test says what the job has.
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_TPU_", "SLURM_JOB")) and k != "EDGETPU_VISIBLE_DEVICES"
    }
    full_env.update(env or {})
    prefix = ["runuser", "-u", user, "--"] if user else []
    return subprocess.run(
        [*prefix, "umockdev-run", "--device", str(description), "--", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=REPO,
    )


def run_probe(script: str, description: Path | str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """One of this folder's probe scripts in a testbed; its JSON answer."""
    done = in_testbed(description, [sys.executable, str(HERE / script), *args], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# libedgetpu sleeps 1 s before each attempt to open a USB device (usb_driver.cc
# kSleepTimeMicroSecondsBeforeRetry), up to 25 attempts (kMaxNumOfRetryAfterReset). Written by
# strace as "{tv_sec=1, tv_nsec=0}", by qemu-user's -strace as "{tv_sec = 1,tv_nsec = 0}".
_ATTEMPT_SLEEP = re.compile(r"nanosleep\((?:CLOCK_\w+, ?0, ?)?\{tv_sec ?= ?1, ?tv_nsec ?= ?0\}")
# Set by the arm64 leg (scripts/ci-arm64.sh): programs run under qemu-user, where ptrace (strace)
# does not work, and qemu's own syscall log (-strace) takes its place.
EMULATED = os.environ.get("SLURM_TPU_TEST_EMULATION") == "qemu-user"


def require_tracing() -> None:
    """Skip unless the syscalls of a test's program can be traced (strace, or qemu-user's log)."""
    import shutil

    import pytest

    if not EMULATED and not shutil.which("strace"):
        pytest.skip("strace is not installed (scripts/setup.sh installs it)")


def traced(argv: list[str], folder: Path, syscalls: str) -> tuple[list[str], dict[str, str]]:
    """``argv`` with its ``syscalls`` (strace's ``-e trace=`` list) traced into ``folder``: the command
    line and the environment to add. Natively strace, following forks into ``folder/trace``; under
    qemu-user emulation qemu's own log of every syscall, one file per process (``%d``: a program
    that execs starts a new qemu, which would truncate a shared file). Read with :func:`trace_of`."""
    if EMULATED:
        # Set by env(1) for the program alone: umockdev-run run as root under a traced qemu fails to
        # start its child ("Unknown error executing child process").
        return ["env", "QEMU_STRACE=1", f"QEMU_LOG_FILENAME={folder / 'qemu-%d.log'}", *argv], {}
    # --seccomp-bpf: only the traced calls stop the process, so strace adds about 0.15 s to the
    # library's time instead of about 2 s (every syscall of LiteRT's threads stopped).
    return ["strace", "-f", "--seccomp-bpf", "-qq", "-e", f"trace={syscalls}", "-o", str(folder / "trace"), *argv], {}


def trace_of(folder: Path) -> str:
    """Every line :func:`traced` wrote into ``folder``."""
    return "".join(path.read_text(errors="replace") for path in sorted(folder.iterdir()))


def run_probe_counting_attempts(
    script: str, description: Path | str, args: list[str], env: dict[str, str], trace: Path
) -> tuple[dict, int]:
    """:func:`run_probe` traced: its JSON answer and how many times libedgetpu went to open a USB
    device (its 1 s sleeps before each attempt), an observable count instead of a time."""
    trace.mkdir()
    argv, trace_env = traced([sys.executable, str(HERE / script), *args], trace, "clock_nanosleep,nanosleep")
    done = in_testbed(description, argv, {**env, **trace_env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), attempts_in(trace_of(trace))


def attempts_in(trace: str) -> int:
    """How many times libedgetpu went to open a USB device, from a trace of its nanosleeps."""
    return sum(1 for line in trace.splitlines() if _ATTEMPT_SLEEP.search(line))


def slurm_tpu(*args: str) -> list[str]:
    """The CLI, run by the tests' Python."""
    return [sys.executable, "-m", "slurm_tpu.cli", *args]


def stick_behind_a_hub_without_descriptors(tmp_path: Path) -> Path:
    """usb_stick_after with its hub (2-1) stripped of descriptors: the stick is in sysfs
    at 2-1.3, but libusb cannot link it to its hub and reports it as 2-3."""
    from helpers import HARDWARE

    hub = "P: /devices/pci0000:00/0000:00:14.0/usb2/2-1\n"
    blocks = [
        block
        if not block.startswith(hub)
        else "\n".join(line for line in block.splitlines() if not line.startswith("H: "))
        for block in (HARDWARE / "usb_stick_after.umockdev").read_text().split("\n\n")
    ]
    path = tmp_path / "hub_without_descriptors.umockdev"
    path.write_text("\n\n".join(blocks))
    return path


def library_version(path: str) -> str:
    """edgetpu_version() straight from the library (plain ctypes, not our binding)."""
    import ctypes

    function = ctypes.CDLL(path).edgetpu_version
    function.restype = ctypes.c_char_p
    return function().decode()
