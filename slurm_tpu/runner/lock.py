"""Per-device lock files: one process per Edge TPU, and a clear "in use by pid N".

Two processes on one Edge TPU are not a slowdown but a failure: on USB the second
open resets the port and the first process aborts; on PCIe the second gets EPERM.
So before opening a device the runner takes an exclusive, non-blocking flock(2) on
a per-identity file containing its pid. The kernel drops the lock when the process
exits however it exits (SIGKILL included), so stale locks cannot exist.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import DeviceError
from .errors import DeviceBusyError

LOCK_DIR_ENV = "SLURM_TPU_LOCK_DIR"


def lock_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$SLURM_TPU_LOCK_DIR, else $XDG_RUNTIME_DIR/slurm-tpu, else /tmp/slurm-tpu-<uid>:
    the first that exists (or can be made) and belongs to us."""
    if environ.get(LOCK_DIR_ENV):
        candidates = [Path(environ[LOCK_DIR_ENV])]
    else:  # XDG_RUNTIME_DIR is often inherited from the login node's session: /run/user/UID may not exist here
        candidates = [Path(environ["XDG_RUNTIME_DIR"]) / "slurm-tpu"] if environ.get("XDG_RUNTIME_DIR") else []
        candidates.append(Path(f"/tmp/slurm-tpu-{os.getuid()}"))
    problems = []
    for path in candidates:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.stat().st_uid != os.getuid():
                problems.append(f"{path} belongs to uid {path.stat().st_uid}")
                continue
            return path
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
    raise DeviceError(
        f"no usable lock directory ({'; '.join(problems)}): set {LOCK_DIR_ENV} to a private writable directory", "-"
    )


class DeviceLock:
    """An exclusive lock on one device identity, held until ``release``/process exit."""

    def __init__(self, identity: str, environ: Mapping[str, str] = os.environ):
        self.identity = identity
        self.path = lock_dir(environ) / (re.sub(r"[^A-Za-z0-9._-]", "_", identity) + ".lock")
        # No O_TRUNC: the holder's pid must stay readable for the loser.
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise DeviceError(
                f"cannot open the lock file {self.path} for Edge TPU {identity} "
                f"({exc.strerror}): set {LOCK_DIR_ENV} to a private writable directory",
                identity,
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = int(os.pread(fd, 32, 0).decode().strip() or 0) or None
            except (OSError, ValueError):
                pid = None
            os.close(fd)
            holder = f"pid {pid}" if pid else "another process"
            raise DeviceBusyError(
                f"Edge TPU {identity} is in use by {holder}: one process per TPU; run all inputs "
                f"through one 'slurm-tpu infer' (or wait for it), or ask for another TPU",
                identity,
                pid,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last fd drops the flock
            self._fd = None
