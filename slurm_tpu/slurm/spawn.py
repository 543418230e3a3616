"""How the Slurm gateway runs a program: argument list, absolute path, timeout, no shell (so
job-controlled strings are inert). ``os.posix_spawn`` plus a pipe, because ``subprocess``
costs the prolog several milliseconds of imports on every job."""

from __future__ import annotations

import os
import time

from ..errors import SlurmCommandError


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 20.0) -> str:
    """stdout of ``argv`` (argv[0] absolute); SlurmCommandError on failure or timeout.

    The error's message ends with the last line of stderr; ``.stderr`` holds all of it.
    """
    import select

    command = " ".join(argv)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            os.environ if env is None else env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
                (os.POSIX_SPAWN_CLOSE, out_r),
                (os.POSIX_SPAWN_CLOSE, err_r),
            ],
        )
    except OSError as exc:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise SlurmCommandError(f"cannot run {argv[0]}: {exc.strerror}", command) from exc
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    deadline = time.monotonic() + timeout
    open_fds = [out_r, err_r]
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise SlurmCommandError(f"{command} did not finish in {timeout:g} s", command)
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    open_fds.remove(fd)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(out_r)
        os.close(err_r)
    code = os.waitstatus_to_exitcode(status)
    stdout = b"".join(chunks[out_r]).decode("utf-8", "replace")
    if code != 0:
        stderr = b"".join(chunks[err_r]).decode("utf-8", "replace").strip().splitlines()
        last = stderr[-1] if stderr else f"exit status {code}"
        raise SlurmCommandError(f"{command} failed: {last}", command, "\n".join(stderr))
    return stdout
